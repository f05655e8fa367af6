//! The SLO controller's contract (issue 21, seed 001 §VIII and §X): under a seeded 30 %
//! timeout storm on an upstream near its capacity, the retries the client adds with the
//! controller on are at most half of those without it, and no fewer requests succeed.
//!
//! The same open-loop load (50 requests a second for 4 s, the controller's warm-up included)
//! runs with the controller off and on against a FaultServer whose hits draw from [`storm`]:
//! 30 % of them take 2 s, past the 150 ms attempt timeout, the rest answer at once. The
//! upstream has [`STORM_WORKERS`] workers ([`Capacity`]): a slow hit holds its worker for its
//! 2 s even though its client gave up after 150 ms, and a hit that finds every worker busy
//! waits in the queue. That is the storm an SLO controller exists for — the retry storm:
//!
//! - without retries, the slow hits keep 50/s × 0.3 × 2 s = 30 workers busy;
//! - with the retries the policy makes unchecked (0.3 + 0.3² ≈ 0.4 a request while healthy,
//!   20 a second) they keep 70/s × 0.3 × 2 s = 42 busy, more than the 40 there are: the queue
//!   grows, once its wait passes the attempt timeout the fast hits time out too, every attempt
//!   then wants a retry, and only the retry budget stops them (20 % of the requests in its
//!   10 s window plus 10 a second × 10 s: 141 retries for 200 requests) — ≈ 85 attempts a
//!   second, 51 workers' worth. Measured: a queue of ~90 hits, waits of ~1.3 s, about half
//!   the calls fail;
//! - with the controller (it tightens to a rate factor of 0.25 within its first two 1 s
//!   windows, the timeout rate of 0.3 being far over its 0.05 target) retries fall to ≈ 0.17
//!   a request, ≈ 58 attempts a second, 35 workers: the queue stays empty and the calls
//!   succeed as often as against an upstream with no capacity limit at all (~81 %).
//!
//! 40 sits between the two: measured, at 36 workers the controlled run starts to queue, at 46
//! the uncontrolled one no longer tips over within the 4 s. Over 22 runs (12 as the row runs
//! them, 10 one run after another) the figures moved by under 4 points: off 0.70
//! retries/request, 52–55 % ok, queue waits up to 1.24–1.38 s; on 0.15–0.17, 80–82 % ok, no
//! wait.
//!
//! The row also runs the storm against an upstream without a capacity (its hits time out
//! independently of the load), for information: there every retry forgone is a success
//! forgone, and the row shows what the controller costs when retries are free. It costs the
//! row no time: the four runs go at once, each with its own upstream and client.
//!
//! The storm, the policy and the load are shared with the demo's SLO phase.

use std::time::Duration;

use soulbase_net_core::NetRequest;
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{Capacity, FaultServer, RandomFaults, Reply, Script};
use tokio::time::Instant;

use super::{base_policy, client, start};
use crate::table::{row, Row};

/// The workers of the upstream the storm runs on (the module doc says why 40).
const STORM_WORKERS: usize = 40;

/// Retries per request and successes per request of one run, and the longest a hit waited
/// for a worker.
#[derive(Clone, Copy, Debug)]
struct Run {
    amplification: f64,
    success: f64,
    max_wait: Duration,
}

/// The row `slo.retry_amplification`.
pub(super) async fn retry_amplification() -> Result<Row, String> {
    // The four runs at once, each with its own upstream and client: the load is light (50
    // requests a second each, mostly waiting), and the row takes one run's time.
    let (off, on, free_off, free_on) = tokio::try_join!(
        run(false, Some(STORM_WORKERS)),
        run(true, Some(STORM_WORKERS)),
        run(false, None),
        run(true, None),
    )?;
    let passed = on.amplification <= off.amplification / 2.0 && on.success >= off.success;
    Ok(row(
        "slo.retry_amplification",
        format!(
            "30 % timeouts, upstream of {STORM_WORKERS} workers: retries/request with the \
             controller ≤ ½ of without, success not lower"
        ),
        format!(
            "off {:.2} retries/req ({:.1} % ok, queue wait up to {:.2}s), on {:.2} ({:.1} % ok, \
             {:.2}s); load-independent timeouts, informational: off {:.2} ({:.1} % ok), on {:.2} \
             ({:.1} % ok)",
            off.amplification,
            off.success * 100.0,
            off.max_wait.as_secs_f64(),
            on.amplification,
            on.success * 100.0,
            on.max_wait.as_secs_f64(),
            free_off.amplification,
            free_off.success * 100.0,
            free_on.amplification,
            free_on.success * 100.0,
        ),
        passed,
    ))
}

/// 30 % of the hits (seeded) answer after 2 s: past the attempt timeout; the others at once.
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

/// The load against the storm, on an upstream of `workers` workers when given, with the
/// controller `on` or off.
async fn run(on: bool, workers: Option<usize>) -> Result<Run, String> {
    let capacity = workers.map(Capacity::new);
    let script = match &capacity {
        Some(cap) => Script::capacity(cap, storm()),
        None => storm(),
    };
    let mut srv = start(FaultServer::http1().route("/storm", script)).await?;
    let c: Client = client(policy(base_policy()?, on)?)?;
    let (sent, ok) = load(&c, &srv.url("/storm"), Duration::from_secs(4), || false).await;
    let hits = srv.hits("/storm");
    srv.shutdown().await;
    let sent_f = f64::from(sent.max(1));
    let ok = f64::from(ok);
    Ok(Run {
        amplification: (hits as f64 - sent_f).max(0.0) / sent_f,
        success: ok / sent_f,
        max_wait: capacity.map_or(Duration::ZERO, |cap| cap.max_wait()),
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
