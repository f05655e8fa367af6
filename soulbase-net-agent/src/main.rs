//! `soulbase-net-agent`: runs the control plane or an agent.
//!
//! ```text
//! soulbase-net-agent control [--listen ADDR] [--database PATH|sqlite:PATH|postgres://…] [--lease-secs N] [--missed-heartbeats N]
//! soulbase-net-agent agent            # configured by AGENT_* environment variables
//! soulbase-net-agent probe 'SPEC'     # one probe (a TaskSpec as JSON) here, its result as JSON
//! ```
//!
//! The control plane's admin token, when wanted, comes from `AGENT_ADMIN_TOKEN`; an agent
//! serves its metrics on `AGENT_METRICS_LISTEN` (`ip:port`) when set, grants its HTTP probes
//! the networks in `AGENT_PROBE_GRANTS` (comma-separated CIDRs, e.g. `10.0.0.0/8`: the address
//! guard refuses private and loopback targets otherwise), and runs the UDP DNS
//! forwarder on `AGENT_DNS_LISTEN` when set (see `soulbase_net_agent::forwarder`). Logs go to
//! standard error, filtered by `RUST_LOG` (e.g. `RUST_LOG=debug`,
//! `RUST_LOG=info,soulbase_net_agent=debug`; `info` and above when unset, `debug` for `probe`).
//! `control` and `agent` stop gracefully on SIGINT (Ctrl-C) or SIGTERM alike: the control
//! plane closes; the agent stops claiming and lets its probes finish and their reports be
//! acknowledged, within 10 s.

use std::time::Duration;

use soulbase_net_agent::agent::{self, AgentConfig};
use soulbase_net_agent::control::{ControlConfig, ControlPlane};
use soulbase_net_agent::forwarder::Forwarder;

const USAGE: &str = "usage: soulbase-net-agent control [--listen ADDR] [--database DB] [--lease-secs N] [--missed-heartbeats N]\n         (DB: a SQLite file path or sqlite:PATH, or with the `postgres` feature a postgres:// URL; in memory when not given.\n          An agent is stale, its leases returned, after N heartbeat periods without one: default 3)\n       soulbase-net-agent agent   (AGENT_CONTROL_PLANE, AGENT_ID, AGENT_AUTH_TOKEN, AGENT_MAX_INFLIGHT, AGENT_POOL_<KIND>_SIZE, AGENT_DNS_SERVERS, AGENT_METRICS_LISTEN, AGENT_PROBE_GRANTS, AGENT_DNS_LISTEN, AGENT_DNS_UPSTREAM, AGENT_DNS_UPSTREAM_TIMEOUT, AGENT_TRACE_RUNTIME_WORKERS (ping/trace runtime threads, at least 2); or AGENT_CONFIG=FILE.toml)\n       soulbase-net-agent probe '<TaskSpec JSON>'   (runs one probe here and prints its result as JSON; exit 0 when ok, 1 when not)\n       RUST_LOG filters the logs (standard error; default info, debug for probe); control and agent stop gracefully on SIGINT or SIGTERM";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // A one-off probe logs each echo and hop (debug) as it goes.
    let probing = args.first().is_some_and(|a| a == "probe");
    // `RUST_LOG` when set (its directives that do not read are ignored), else the default.
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(
            if probing {
                tracing::Level::DEBUG
            } else {
                tracing::Level::INFO
            }
            .into(),
        )
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .init();
    let code = match args.first().map(String::as_str) {
        Some("control") => control(&args[1..]).await,
        Some("agent") => run_agent().await,
        Some("probe") => probe(&args[1..]).await,
        _ => {
            eprintln!("{USAGE}");
            2
        }
    };
    std::process::exit(code);
}

async fn control(args: &[String]) -> i32 {
    let stop = stop_signal();
    let mut config = ControlConfig::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            eprintln!("{flag} needs a value\n{USAGE}");
            return 2;
        };
        match flag.as_str() {
            "--listen" => match value.parse() {
                Ok(addr) => config = config.listen(addr),
                Err(_) => {
                    eprintln!("--listen: `{value}` is not an address");
                    return 2;
                }
            },
            "--database" => config = config.database(value),
            "--missed-heartbeats" => match value.parse::<u32>() {
                Ok(n) if n > 0 => config = config.missed_heartbeats(n),
                _ => {
                    eprintln!("--missed-heartbeats: `{value}` is not a positive number");
                    return 2;
                }
            },
            "--lease-secs" => match value.parse::<u64>() {
                Ok(n) if n > 0 => config = config.lease(Duration::from_secs(n)),
                _ => {
                    eprintln!("--lease-secs: `{value}` is not a positive number");
                    return 2;
                }
            },
            _ => {
                eprintln!("unknown flag {flag}\n{USAGE}");
                return 2;
            }
        }
    }
    if let Ok(token) = std::env::var("AGENT_ADMIN_TOKEN") {
        config = config.admin_token(token);
    }
    let control = match ControlPlane::start(config).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("control plane: {e}");
            return 1;
        }
    };
    eprintln!("control plane listening on {}", control.url());
    stop.await;
    control.shutdown().await;
    0
}

async fn run_agent() -> i32 {
    let mut stop = std::pin::pin!(stop_signal());
    let mut config = match AgentConfig::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return 2;
        }
    };
    // Private or loopback targets the operator lets HTTP probes reach.
    if let Ok(list) = std::env::var("AGENT_PROBE_GRANTS") {
        for cidr in list.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            match cidr.parse() {
                Ok(net) => config.probe_policy.security.grants.cidrs.push(net),
                Err(_) => {
                    eprintln!("AGENT_PROBE_GRANTS: `{cidr}` is not a CIDR\n{USAGE}");
                    return 2;
                }
            }
        }
    }
    // The UDP DNS forwarder beside the agent, when AGENT_DNS_LISTEN is set: it serves
    // whether or not the control plane is up (dropped, it stops).
    let forwarder = match config.dns_forwarder.clone() {
        Some(forwarder) => match Forwarder::start(forwarder).await {
            Ok(f) => {
                eprintln!("dns forwarder on udp {}", f.local_addr());
                Some(f)
            }
            Err(e) => {
                eprintln!("agent: {e}");
                return 1;
            }
        },
        None => None,
    };
    // The control plane may not be up yet: register until it answers (or refuses).
    let mut wait = Duration::from_millis(200);
    let handle = loop {
        let started = tokio::select! {
            started = agent::start(config.clone()) => started,
            () = stop.as_mut() => {
                if let Some(forwarder) = forwarder {
                    forwarder.shutdown().await;
                }
                return 0;
            }
        };
        match started {
            Ok(h) => break h,
            Err(e)
                if e.kind() == soulbase_net_core::ErrorKind::InvalidRequest
                    || e.kind() == soulbase_net_core::ErrorKind::Blocked =>
            {
                eprintln!("agent: {e}");
                return 1;
            }
            Err(e) => {
                tracing::warn!(error = %e, "registration failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = stop.as_mut() => {
                        if let Some(forwarder) = forwarder {
                            forwarder.shutdown().await;
                        }
                        return 0;
                    }
                }
                wait = (wait * 2).min(Duration::from_secs(10));
            }
        }
    };
    let mut handle = handle;
    if let Some(forwarder) = &forwarder {
        // The forwarder's counters on the agent's `/metrics`.
        handle.attach_forwarder(forwarder);
    }
    if let Ok(listen) = std::env::var("AGENT_METRICS_LISTEN") {
        let served = match listen.parse() {
            Ok(addr) => handle.serve_metrics(addr).await,
            Err(_) => Err(soulbase_net_core::NetError::invalid_request(format!(
                "AGENT_METRICS_LISTEN: `{listen}` is not an ip:port"
            ))),
        };
        match served {
            Ok(addr) => eprintln!("agent metrics on http://{addr}/metrics"),
            Err(e) => {
                eprintln!("agent: {e}");
                handle.kill();
                return 1;
            }
        }
    }
    stop.await;
    if let Some(forwarder) = forwarder {
        forwarder.shutdown().await;
    }
    handle.shutdown(Duration::from_secs(10)).await;
    0
}

/// A future that ends at SIGINT (Ctrl-C) or, on Unix, SIGTERM (what `kill`, systemd and
/// container runtimes send): `control` and `agent` stop the same way on either. The handlers
/// are installed when this is called, not when the future is first polled, so a signal that
/// comes while the service starts stops it gracefully too.
fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(int), Ok(term)) => Some((int, term)),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "SIGTERM cannot be handled; stopping on Ctrl-C only");
                None
            }
        }
    };
    async move {
        #[cfg(unix)]
        if let Some((mut int, mut term)) = signals {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `probe 'SPEC'`: runs the probe a `TaskSpec` (JSON) describes, with the default probe
/// policy and the system's DNS configuration, and prints `{"status", "observations",
/// "error"}` as JSON on standard output. 0 when the probe is ok, 1 when not, 2 on bad usage.
async fn probe(args: &[String]) -> i32 {
    let [spec] = args else {
        eprintln!("probe takes one TaskSpec as JSON\n{USAGE}");
        return 2;
    };
    let spec: soulbase_net_agent::protocol::TaskSpec = match serde_json::from_str(spec) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("probe: not a TaskSpec: {e}");
            return 2;
        }
    };
    let probes =
        match soulbase_net_agent::workers::Probes::new(&AgentConfig::default_probe_policy(), &[]) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("probe: {e}");
                return 1;
            }
        };
    let result = probes.run(&spec).await;
    let out = serde_json::json!({
        "status": result.status,
        "observations": result.observations,
        "error": result.error,
    });
    #[allow(
        clippy::print_stdout,
        reason = "the probe's result is the command's output"
    )]
    {
        println!("{out}");
    }
    i32::from(result.status != soulbase_net_agent::protocol::ReportStatus::Ok)
}
