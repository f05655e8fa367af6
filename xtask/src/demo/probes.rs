//! The demo's probe-agent phase (seed 002): a control plane and one agent on loopback, a few
//! probes of each kind, their observations printed.

use soulbase_net_agent::{
    agent::{self, AgentConfig},
    control::{ControlConfig, ControlPlane},
    protocol::{CreateTask, ReportStatus, TaskResult, TaskSpec, TaskState},
};
use soulbase_net_testkit::{refused_addr, MockDns};

use super::*;

/// The phase's name in the report.
const NAME: &str = "(k) probe agent";
/// How long the phase waits for every probe's report.
const PROBES_WITHIN: Duration = Duration::from_secs(8);

/// One probe of the phase: its task, what to show of its result, and whether it is right.
struct Probe {
    kind: &'static str,
    id: &'static str,
    spec: serde_json::Value,
    /// The observations printed (those present).
    show: &'static [&'static str],
    /// Whether the result is the one expected.
    expect: fn(&TaskResult) -> bool,
}

/// The value of observation `name`, if reported.
fn obs<'a>(r: &'a TaskResult, name: &str) -> Option<&'a serde_json::Value> {
    r.observations
        .iter()
        .find(|o| o.name == name)
        .map(|o| &o.value)
}

/// Whether observation `name` is `value`.
fn is(r: &TaskResult, name: &str, value: serde_json::Value) -> bool {
    obs(r, name) == Some(&value)
}

/// Ping and trace need a raw ICMP socket (root or `CAP_NET_RAW`): without one the probe is
/// an error saying so, which the demo shows rather than fails on.
fn no_raw_socket(r: &TaskResult) -> bool {
    r.status == ReportStatus::Error && is(r, "error_kind", serde_json::json!("permission"))
}

/// The probes: HTTP (200, a name through MockDns, 418), DNS (A, NXDOMAIN), TCP (open,
/// refused), ping and trace of 127.0.0.1.
fn probes(web: &FaultServer, open: u16, closed: u16) -> Vec<Probe> {
    use serde_json::json;
    let port = web.addr().port();
    vec![
        Probe {
            kind: "http",
            id: "http-ok",
            spec: json!({"kind": "http", "url": web.url("/ok"), "timeout_ms": 3000}),
            show: &["status", "total_ms", "body_bytes"],
            expect: |r| r.status == ReportStatus::Ok && is(r, "status", json!(200)),
        },
        Probe {
            kind: "http",
            id: "http-by-name",
            spec: json!({"kind": "http", "url": format!("http://web.demo.test:{port}/ok"), "timeout_ms": 3000}),
            show: &["status", "total_ms", "connect_ms"],
            expect: |r| r.status == ReportStatus::Ok && is(r, "status", json!(200)),
        },
        Probe {
            kind: "http",
            id: "http-teapot",
            spec: json!({"kind": "http", "url": web.url("/teapot"), "timeout_ms": 3000}),
            show: &["status", "total_ms"],
            expect: |r| r.status == ReportStatus::Error && is(r, "status", json!(418)),
        },
        Probe {
            kind: "dns",
            id: "dns-a",
            spec: json!({"kind": "dns", "name": "web.demo.test", "record_types": ["A"], "timeout_ms": 2000}),
            show: &["a", "a_ttl_s", "a_ms"],
            expect: |r| r.status == ReportStatus::Ok && is(r, "a", json!(["127.0.0.1"])),
        },
        Probe {
            kind: "dns",
            id: "dns-nxdomain",
            spec: json!({"kind": "dns", "name": "missing.demo.test", "record_types": ["A"], "timeout_ms": 2000}),
            show: &["rcode", "a_ms"],
            expect: |r| r.status == ReportStatus::Error && is(r, "rcode", json!("NXDOMAIN")),
        },
        Probe {
            kind: "tcp",
            id: "tcp-open",
            spec: json!({"kind": "tcp", "host": "127.0.0.1", "port": open, "timeout_ms": 2000}),
            show: &["connected", "connect_ms"],
            expect: |r| r.status == ReportStatus::Ok && is(r, "connected", json!(true)),
        },
        Probe {
            kind: "tcp",
            id: "tcp-closed",
            spec: json!({"kind": "tcp", "host": "127.0.0.1", "port": closed, "timeout_ms": 2000}),
            show: &["connected", "error_kind"],
            expect: |r| r.status == ReportStatus::Error && is(r, "error_kind", json!("refused")),
        },
        Probe {
            kind: "ping",
            id: "ping",
            spec: json!({"kind": "ping", "host": "127.0.0.1", "count": 3, "interval_ms": 100, "timeout_ms": 1000}),
            show: &["sent", "received", "loss", "rtt_avg_ms", "error_kind"],
            expect: |r| {
                (r.status == ReportStatus::Ok && is(r, "received", json!(3))) || no_raw_socket(r)
            },
        },
        Probe {
            kind: "trace",
            id: "trace",
            spec: json!({"kind": "trace", "host": "127.0.0.1", "max_hops": 4, "timeout_ms": 1000}),
            show: &["hop_count", "reached", "hops", "error_kind"],
            expect: |r| {
                (r.status == ReportStatus::Ok && is(r, "reached", json!(true))) || no_raw_socket(r)
            },
        },
    ]
}

/// (k) The probe agent (seed 002): a control plane and one agent on loopback (in process),
/// targets from the testkit (a fault server, MockDns, an open and a closed port); a few probes
/// of each kind, each reported once, their observations printed.
pub(super) async fn phase_probes(progress: Progress) -> Result<PhaseResult, String> {
    let started = Instant::now();
    progress.update(NAME, "starting a control plane, an agent and their targets");
    let web = FaultServer::http1()
        .route("/ok", Reply::ok("hello"))
        .route("/teapot", Reply::status(418))
        .start()
        .await
        .map_err(|e| format!("could not start the probes' fault server: {e}"))?;
    let dns = MockDns::start()
        .await
        .map_err(|e| format!("could not start MockDns: {e}"))?;
    dns.set_ips("web.demo.test", &[[127, 0, 0, 1].into()], 60);
    let open = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .await
        .and_then(|l| Ok((l.local_addr()?.port(), l)))
        .map_err(|e| format!("could not open a TCP port: {e}"))?;
    let closed = refused_addr()
        .await
        .map_err(|e| format!("could not find a closed port: {e}"))?;
    let control = ControlPlane::start(
        ControlConfig::default()
            .lease(Duration::from_secs(5))
            .heartbeat_every(Duration::from_millis(200)),
    )
    .await
    .map_err(|e| format!("could not start the control plane: {e}"))?;
    let mut config = AgentConfig::new(control.url(), "demo-agent", "demo-agent-token");
    config.heartbeat_every = Duration::from_millis(200);
    config.claim_backoff_min = Duration::from_millis(10);
    config.claim_backoff_max = Duration::from_millis(100);
    config.dns_servers = vec![dns.addr()];
    // Loopback granted to the HTTP probes, and nothing else private.
    config.probe_policy.security.grants.cidrs = "127.0.0.1/32".parse().into_iter().collect();
    let agent = match agent::start(config).await {
        Ok(a) => a,
        Err(e) => {
            control.shutdown().await;
            return Err(format!("could not start the agent: {e}"));
        }
    };
    let probes = probes(&web, open.0, closed.port());
    let outcome = run_probes(&control, &probes, progress).await;
    agent.shutdown(Duration::from_secs(1)).await;
    control.shutdown().await;
    let (measured, passed, rows) = match outcome {
        Ok(m) => m,
        Err(e) => (e, false, String::new()),
    };
    let result = PhaseResult {
        name: NAME,
        expected: "each kind observed right, each task reported once".to_owned(),
        measured,
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    if progress.live {
        print!("{rows}");
    }
    Ok(result)
}

/// Creates the probes' tasks, waits for their reports; (measured, passed, the table).
async fn run_probes(
    control: &ControlPlane,
    probes: &[Probe],
    progress: Progress,
) -> Result<(String, bool, String), String> {
    for p in probes {
        let spec: TaskSpec = serde_json::from_value(p.spec.clone())
            .map_err(|e| format!("{}: not a task: {e}", p.id))?;
        control
            .create_task(CreateTask {
                spec,
                every_secs: None,
                id: Some(p.id.to_owned()),
            })
            .await
            .map_err(|e| format!("creating {}: {e}", p.id))?;
    }
    let until = Instant::now() + PROBES_WITHIN;
    let mut pending: Vec<&str> = probes.iter().map(|p| p.id).collect();
    while !pending.is_empty() {
        progress.update(
            NAME,
            &format!(
                "{} of {} probes reported",
                probes.len() - pending.len(),
                probes.len()
            ),
        );
        let mut still = Vec::new();
        for id in pending {
            let view = control.task(id).await.map_err(|e| e.to_string())?;
            if !view.is_some_and(|v| v.state == TaskState::Done) {
                still.push(id);
            }
        }
        pending = still;
        if !pending.is_empty() {
            if Instant::now() >= until {
                return Err(format!(
                    "not reported within {PROBES_WITHIN:?}: {}",
                    pending.join(", ")
                ));
            }
            // The control plane's store holds the state: no event to await.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut rows = String::from("      kind   task          status  observations\n");
    let (mut right, mut once, mut no_raw) = (0, 0, false);
    for p in probes {
        let results = control.results(p.id, 10).await.map_err(|e| e.to_string())?;
        once += usize::from(results.len() == 1);
        let Some(r) = results.first() else { continue };
        let ok = (p.expect)(r);
        right += usize::from(ok);
        no_raw |= no_raw_socket(r);
        let shown: Vec<String> = p
            .show
            .iter()
            .filter_map(|&name| Some(format!("{name}={}", compact(obs(r, name)?))))
            .collect();
        let status = match r.status {
            ReportStatus::Ok => "ok",
            ReportStatus::Error => "error",
        };
        let _ = writeln!(
            rows,
            "      {:<6} {:<13} {status:<7} {}{}",
            p.kind,
            p.id,
            shown.join(" "),
            if ok { "" } else { "   <- not as expected" }
        );
    }
    let n = probes.len();
    let mut measured = format!("{right} of {n} probes observed right, {once} of {n} reported once");
    if no_raw {
        measured.push_str(" (ping/trace: no raw ICMP socket here, shown as `permission`)");
    }
    Ok((measured, right == n && once == n, rows))
}

/// A JSON value on one short line: strings bare, a trace's hops as their addresses.
fn compact(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items)
            if items.iter().all(|i| i.get("ttl").is_some()) && !items.is_empty() =>
        {
            let hops: Vec<String> = items
                .iter()
                .map(|h| h["address"].as_str().unwrap_or("*").to_owned())
                .collect();
            format!("[{}]", hops.join(" "))
        }
        other => other.to_string(),
    }
}
