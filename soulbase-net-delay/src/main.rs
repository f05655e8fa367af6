//! `soulbase-net-delay`: the delay server. Reads `config.json` (or the file
//! `HYPER_DELAY_CONFIG` names; `--store URL` overrides its store), serves until SIGINT or
//! SIGTERM, then stops accepting, gives what it was delivering back to the store and exits.

use std::process::ExitCode;

use soulbase_net_delay::{Config, DelayServer, HttpTasks};
use soulbase_net_store::delay::{open_delay_store, DelayStoreOptions};

fn main() -> ExitCode {
    // `RUST_LOG=debug` (a level: error, warn, info, debug, trace); info by default.
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|l| l.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::INFO);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .init();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soulbase-net-delay: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let (mut config, from) = Config::load().map_err(|e| e.to_string())?;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--store" => config.store = Some(args.next().ok_or("--store needs a URL")?),
            "--bind" => {
                config.bind_addr = args
                    .next()
                    .ok_or("--bind needs an address")?
                    .parse()
                    .map_err(|e| format!("--bind: {e}"))?;
            }
            other => {
                return Err(format!(
                    "unknown option `{other}` (--store URL, --bind ADDR)"
                ))
            }
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let url = config.store_url();
        let store = open_delay_store(&url, DelayStoreOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let outbox = match &config.http_tasks {
            Some(h) => Some(http_outbox(&config, h).await?),
            None => None,
        };
        let server = DelayServer::start_with_http_tasks(config, store, outbox)
            .await
            .map_err(|e| e.to_string())?;
        let shown = if url.starts_with("postgres") {
            "postgres"
        } else {
            url.as_str()
        };
        tracing::info!(
            addr = %server.local_addr(),
            store = shown,
            config = from.as_ref().map_or("defaults".to_owned(), |p| p.display().to_string()),
            "soulbase-net-delay listening"
        );
        #[allow(clippy::print_stdout, reason = "the startup line scripts wait for")]
        {
            println!("soulbase-net-delay listening on {}", server.local_addr());
        }
        wait_for_signal().await;
        server.shutdown().await;
        Ok(())
    })
}

/// The outbox HTTP tasks go to, with a client on the configured policy.
async fn http_outbox(
    config: &Config,
    h: &HttpTasks,
) -> Result<std::sync::Arc<soulbase_net_outbox::Outbox>, String> {
    use std::sync::Arc;
    let url = h
        .outbox
        .clone()
        .unwrap_or_else(|| config.data_dir.join("outbox.db").display().to_string());
    let store = soulbase_net_outbox::open_store(&url, soulbase_net_outbox::StoreOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut client = soulbase_net_runtime::Client::builder();
    if let Some(path) = &h.policy {
        let resolver = soulbase_net_policy::SnapshotResolver::from_path(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        client = client.policy_resolver(Arc::new(resolver));
    }
    let client = client.build().map_err(|e| e.to_string())?;
    let outbox = soulbase_net_outbox::Outbox::builder()
        .store(store)
        .client(Arc::new(client))
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(outbox))
}

/// SIGINT or SIGTERM.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
