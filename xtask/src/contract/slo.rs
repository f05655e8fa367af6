//! The SLO controller's contract (issue 21, seed 001 §X): under a seeded 30 % timeout storm,
//! the retries the client adds with the controller on are at most half of those without it.
//!
//! The same open-loop load (50 requests a second for 4 s, the controller's warm-up included)
//! runs twice against a FaultServer whose hits time out with probability 0.3, independently
//! of each other; the row reports retry amplification (retries per request) and the success
//! rate of both runs. With independent faults, a retry forgone is a success forgone: the
//! controller trades success for load, and the row shows by how much.
//!
//! The storm, the policy and the load are shared with the demo's SLO phase.

use std::time::Duration;

use soulbase_net_core::{NetClient, NetRequest};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{FaultServer, RandomFaults, Reply, Script};
use tokio::time::Instant;

use super::{base_policy, client, start};
use crate::table::{row, Row};

/// Retries per request and successes per request of one run.
#[derive(Clone, Copy, Debug)]
struct Run {
    amplification: f64,
    success: f64,
}

/// The row `slo.retry_amplification`.
pub(super) async fn retry_amplification() -> Result<Row, String> {
    let off = run(false).await?;
    let on = run(true).await?;
    let passed = on.amplification <= off.amplification / 2.0;
    Ok(row(
        "slo.retry_amplification",
        "30 % timeouts: retries/request with the controller ≤ ½ of without; success reported",
        format!(
            "off {:.2} retries/req ({:.1} % ok), on {:.2} ({:.1} % ok)",
            off.amplification,
            off.success * 100.0,
            on.amplification,
            on.success * 100.0
        ),
        passed,
    ))
}

/// 30 % of the hits (seeded, independent) answer after 2 s: past the attempt timeout.
pub(crate) fn storm() -> Script {
    Script::random(
        RandomFaults::seeded(21)
            .fault(0.3, Reply::ok("late").delay(Duration::from_secs(2)))
            .otherwise(Reply::ok("ok")),
    )
}

/// `p` with a short attempt timeout, fast backoff, and the controller on a 1 s window
/// when `on`.
pub(crate) fn policy(mut p: NetPolicy, on: bool) -> Result<NetPolicy, String> {
    p.retry.backoff.base = Duration::from_millis(20);
    p.retry.backoff.cap = Duration::from_millis(200);
    for t in [
        &mut p.timeout.connect,
        &mut p.timeout.ttfb,
        &mut p.timeout.read,
        &mut p.timeout.write,
    ] {
        *t = Duration::from_millis(100);
    }
    p.timeout.attempt = Duration::from_millis(150);
    p.timeout.total = Duration::from_secs(2);
    p.slo.enabled = on;
    p.slo.window = Duration::from_secs(1);
    p.slo.interval = Duration::from_millis(200);
    p.slo.min_samples = 10;
    p.validate().map_err(|e| e.to_string())?;
    Ok(p)
}

async fn run(on: bool) -> Result<Run, String> {
    let mut srv = start(FaultServer::http1().route("/storm", storm())).await?;
    let c: Client = client(policy(base_policy()?, on)?)?;
    let (sent, ok) = load(&c, &srv.url("/storm"), Duration::from_secs(4), || false).await;
    let hits = srv.hits("/storm");
    srv.shutdown().await;
    let sent_f = f64::from(sent.max(1));
    let ok = f64::from(ok);
    Ok(Run {
        amplification: (hits as f64 - sent_f).max(0.0) / sent_f,
        success: ok / sent_f,
    })
}

/// 50 requests a second to `url` (open loop: one every 20 ms, whatever the answers) for
/// `span`, or until `stop` holds before a tick; the requests sent and the successes.
pub(crate) async fn load(
    c: &Client,
    url: &str,
    span: Duration,
    stop: impl Fn() -> bool,
) -> (u32, u32) {
    let end = Instant::now() + span;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut calls = tokio::task::JoinSet::new();
    let mut sent = 0u32;
    while Instant::now() < end && !stop() {
        tick.tick().await;
        sent += 1;
        let (c, url) = (c.clone(), url.to_owned());
        calls.spawn(async move { c.send(NetRequest::get(url)).await.is_ok() });
    }
    let ok = calls.join_all().await.into_iter().map(u32::from).sum();
    (sent, ok)
}
