//! `cargo xtask outbox --db STORE list | requeue ID | purge`: an outbox's dead letters, by hand;
//! and `cargo xtask outbox-worker`: one process delivering an outbox to loopback — the process
//! the crash and fleet tests kill with SIGKILL, start again, or run three of at once (`--db
//! STORE`, `--secs S` at most, default 60; it stops earlier once nothing is pending, and then
//! prints `delivered N`). STORE is a SQLite file path (or `sqlite:PATH`) or a
//! `postgres://` URL.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use soulbase_net_core::{NetEvent, Observer, OutboxStep};
use soulbase_net_outbox::{open_store, Outbox, StoreOptions};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use tokio::time::Instant;

use soulbase_net_runtime::testing::LoopbackDialer;

pub(crate) fn worker(args: &[String]) -> Result<(), String> {
    let mut db = None;
    let mut secs = 60.0f64;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--db" => db = Some(value()?),
            "--secs" => secs = value()?.parse().map_err(|e| format!("--secs: {e}"))?,
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    let db = db.ok_or("outbox-worker needs --db STORE")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let delivered = Arc::new(Delivered::default());
        let outbox = Arc::new(outbox(&db, delivered.clone()).await?);
        let running = {
            let o = outbox.clone();
            tokio::spawn(async move { o.run().await })
        };
        let until = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < until {
            if outbox.store().pending().await.map_err(|e| e.to_string())? == 0 {
                break;
            }
            // The store has no event to await from another process.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        outbox.shutdown();
        running
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        #[allow(clippy::print_stdout, reason = "the fleet test reads it")]
        {
            println!("delivered {}", delivered.0.load(Ordering::Relaxed));
        }
        Ok(())
    })
}

/// Counts this process's acknowledged deliveries.
#[derive(Debug, Default)]
struct Delivered(AtomicU64);

impl Observer for Delivered {
    fn on_event(&self, event: &NetEvent<'_>) {
        if let NetEvent::Outbox {
            step: OutboxStep::Delivered,
            ..
        } = event
        {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A loopback-only client making one attempt per delivery (the outbox retries across time).
pub(crate) fn delivery_client() -> Result<Arc<Client>, String> {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().map_err(|e| format!("{e}"))?];
    p.dns.nameservers = vec!["127.0.0.1:9".parse().map_err(|e| format!("{e}"))?];
    p.dns.prefetch.clear();
    p.retry.enabled = false;
    let client = Client::builder()
        .policy(p)
        .dialer(Arc::new(LoopbackDialer::default()))
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(client))
}

/// The outbox the crash and fleet tests run: loopback only, short leases and backoff.
async fn outbox(db: &str, observer: Arc<dyn Observer>) -> Result<Outbox, String> {
    let store = open_store(db, StoreOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    Outbox::builder()
        .store(store)
        .client(delivery_client()?)
        .observer(observer)
        .workers(16)
        .lease(Duration::from_secs(2))
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .poll(Duration::from_millis(50))
        .build()
        .map_err(|e| e.to_string())
}

/// `cargo xtask outbox --db STORE [--table NAME] list | requeue ID | purge`: the
/// `soulbase-net outbox` command, from this repository.
pub(crate) fn admin(args: &[String]) -> Result<(), String> {
    let mut all = vec!["outbox".to_owned()];
    all.extend_from_slice(args);
    crate::cli(&all)
}
