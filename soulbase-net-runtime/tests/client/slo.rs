//! The SLO controller over loopback: an upstream that starts timing out 30 % of its calls
//! slows the client down within a window (longer backoff, thinned retries, fewer attempts per
//! second), gauges and `PolicyChange` events say so, the factors return to 1 once it heals,
//! and a healthy upstream never moves them. Hedged copies are governed like retries: fewer
//! and later while the host is slowed down, as many as without the controller while it is
//! healthy.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use soulbase_net_core::{ErrorKind, GaugeReading, NetEvent, NetRequest, Observer, Phase};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{FaultServer, RandomFaults, Reply, Script};
use tokio::time::Instant;

use crate::support::{bounded, loopback_policy};

/// One `PolicyChange`, as received.
#[derive(Clone, Debug, PartialEq)]
struct Change {
    at: Duration,
    sli: &'static str,
    value: f64,
    target: f64,
    breached: bool,
    backoff: f64,
    rate: f64,
}

/// Keeps every `PolicyChange` with its time since the observer was made, and every hedged
/// copy with how long after its attempt group's first attempt it started.
#[derive(Debug)]
struct Changes {
    start: Instant,
    seen: Mutex<Vec<Change>>,
    hedges: Mutex<Hedges>,
}

/// The hedged copies seen.
#[derive(Debug, Default)]
struct Hedges {
    /// When each request's latest attempt that is not a hedge started, by request id.
    group_start: HashMap<u64, Instant>,
    /// For each hedged copy, the time from its group's first attempt to its start.
    gaps: Vec<Duration>,
}

impl Observer for Changes {
    fn on_event(&self, ev: &NetEvent<'_>) {
        if let NetEvent::AttemptStarted { req, hedge, .. } = *ev {
            let now = Instant::now();
            let mut h = self.hedges.lock();
            if hedge {
                let began = h.group_start.get(&req.id).copied();
                let gap = now.saturating_duration_since(began.expect("a hedge after its group"));
                h.gaps.push(gap);
            } else {
                h.group_start.insert(req.id, now);
            }
        }
        if let NetEvent::PolicyChange {
            host,
            sli,
            value,
            target,
            breached,
            backoff_factor,
            rate_factor,
        } = *ev
        {
            assert_eq!(host, "127.0.0.1");
            self.seen.lock().push(Change {
                at: self.start.elapsed(),
                sli,
                value,
                target,
                breached,
                backoff: backoff_factor,
                rate: rate_factor,
            });
        }
    }
}

/// 30 % of calls (seeded) answer after 2 s: past the attempt timeout.
fn storm() -> Script {
    late_share(21, 0.3, Duration::from_secs(2))
}

/// A server whose `/storm` is [`storm`].
async fn storm_server() -> FaultServer {
    FaultServer::http1()
        .route("/storm", storm())
        .start()
        .await
        .unwrap()
}

/// Retries on a short attempt timeout, and the controller on a 1 s window.
fn policy() -> NetPolicy {
    let mut p = loopback_policy();
    p.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    p.retry.backoff.base = Duration::from_millis(20);
    p.retry.backoff.cap = Duration::from_millis(200);
    p.timeout.ttfb = Duration::from_millis(100);
    p.timeout.connect = Duration::from_millis(100);
    p.timeout.read = Duration::from_millis(100);
    p.timeout.write = Duration::from_millis(100);
    p.timeout.attempt = Duration::from_millis(150);
    p.timeout.total = Duration::from_secs(2);
    p.slo.enabled = true;
    p.slo.window = Duration::from_secs(1);
    p.slo.interval = Duration::from_millis(200);
    p.slo.min_samples = 10;
    p.slo.recover_step = 0.5;
    p
}

fn client(p: NetPolicy) -> (Client, Arc<Changes>) {
    let changes = Arc::new(Changes {
        start: Instant::now(),
        seen: Mutex::default(),
        hedges: Mutex::default(),
    });
    let client = Client::builder()
        .policy(p)
        .observer(changes.clone())
        .build()
        .unwrap();
    (client, changes)
}

/// The SLO factors the client reports for loopback, if any.
fn factors(c: &Client) -> Option<(f64, f64)> {
    let mut out = None;
    c.gauge_source().read_gauges(&mut |r| {
        if let GaugeReading::SloFactors {
            host: "127.0.0.1",
            backoff,
            rate,
        } = r
        {
            out = Some((backoff, rate));
        }
    });
    out
}

/// Sends 50 requests a second to `url` for `span` (open loop: one request every 20 ms,
/// whatever the answers), or until `stop` holds after a tick; the requests sent and the
/// successes.
async fn drive(c: &Client, url: &str, span: Duration, stop: impl Fn() -> bool) -> (u64, u64) {
    let end = Instant::now() + span;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut calls = tokio::task::JoinSet::new();
    let mut sent = 0;
    while Instant::now() < end {
        sent += 1;
        tick.tick().await;
        let (c, url) = (c.clone(), url.to_owned());
        calls.spawn(async move { c.send(NetRequest::get(url)).await.is_ok() });
        if stop() {
            break;
        }
    }
    let ok = calls.join_all().await.into_iter().map(u64::from).sum();
    (sent, ok)
}

/// Attempts per request to `path` while `span` of open-loop load is sent to it.
async fn attempts_per_request(c: &Client, srv: &FaultServer, path: &str, span: Duration) -> f64 {
    let hits = srv.hits(path);
    let (sent, _) = drive(c, &srv.url(path), span, || false).await;
    (srv.hits(path) - hits) as f64 / sent as f64
}

/// Attempts per request with the controller off (30 % timeouts, 3 attempts: about 1.39) is
/// at least this; with it on, at its bounds (retries thinned to 1 in 4: about 1.08), at most.
const OFF_AT_LEAST: f64 = 1.25;
const ON_AT_MOST: f64 = 1.2;

#[tokio::test]
async fn a_timeout_storm_slows_the_host_down_and_the_healing_brings_it_back() {
    bounded(async {
        let mut srv = FaultServer::http1()
            .route("/ok", Reply::ok("ok"))
            .route("/storm", storm())
            .start()
            .await
            .unwrap();
        let (c, changes) = client(policy());

        // Healthy: nothing moves.
        drive(&c, &srv.url("/ok"), Duration::from_millis(1500), || false).await;
        assert!(changes.seen.lock().is_empty());
        assert_eq!(factors(&c), None);

        // The storm: 30 % of calls time out.
        let storm_start = changes.start.elapsed();
        drive(&c, &srv.url("/storm"), Duration::from_millis(2500), || {
            false
        })
        .await;
        let late = attempts_per_request(&c, &srv, "/storm", Duration::from_secs(1)).await;
        let seen = changes.seen.lock().clone();
        let first = seen.first().expect("a PolicyChange during the storm");
        assert!(first.breached, "{seen:?}");
        assert_eq!(first.sli, "timeout_rate");
        assert!(
            first.value > first.target && first.target == 0.05,
            "{first:?}"
        );
        assert_eq!((first.backoff, first.rate), (2.0, 0.5));
        // Within one window (and one interval) of the storm's start.
        assert!(
            first.at <= storm_start + Duration::from_millis(1200),
            "tightened at {:?}, the storm began at {storm_start:?}",
            first.at
        );
        assert_eq!(factors(&c), Some((4.0, 0.25)), "at the bounds: {seen:?}");
        // 50 requests a second: about 70 attempts a second without the controller (see
        // `switched_off_it_never_acts`), about 54 with it.
        assert!(
            late <= ON_AT_MOST,
            "{late:.2} attempts per request ({:.0} per second) late in the storm",
            late * 50.0
        );

        // Healed: back to 1 within (⌈1 / 0.5⌉ + 1) windows plus an interval.
        let healed_at = changes.start.elapsed();
        let back = || factors(&c) == Some((1.0, 1.0));
        drive(&c, &srv.url("/ok"), Duration::from_secs(6), back).await;
        let seen = changes.seen.lock().clone();
        let last = seen.last().unwrap();
        assert_eq!((last.backoff, last.rate), (1.0, 1.0), "{seen:?}");
        assert!(!last.breached);
        assert!(
            last.at <= healed_at + Duration::from_millis(3200),
            "back to 1 at {:?}, healed at {healed_at:?}",
            last.at
        );
        srv.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_healthy_upstream_never_moves_the_factors() {
    bounded(async {
        let mut srv = FaultServer::http1()
            .route("/ok", Reply::ok("ok"))
            .start()
            .await
            .unwrap();
        let (c, changes) = client(policy());
        let (sent, ok) = drive(&c, &srv.url("/ok"), Duration::from_secs(3), || false).await;
        assert!(sent >= 100, "{sent}");
        assert_eq!(ok, sent);
        assert!(changes.seen.lock().is_empty());
        assert_eq!(factors(&c), None);
        srv.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn switched_off_it_never_acts() {
    bounded(async {
        let mut srv = storm_server().await;
        let mut p = policy();
        p.slo.enabled = false;
        let (c, changes) = client(p);
        let off = attempts_per_request(&c, &srv, "/storm", Duration::from_secs(3)).await;
        assert!(
            off >= OFF_AT_LEAST,
            "{off:.2} attempts per request ({:.0} per second) without the controller",
            off * 50.0
        );
        assert!(changes.seen.lock().is_empty());
        assert_eq!(factors(&c), None);
        srv.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_longer_wait_never_runs_past_the_deadline() {
    bounded(async {
        let mut srv = storm_server().await;
        // Backoff up to 100 ms then 200 ms within a 1 s deadline (3 × 150 ms + 300 ms ≤ 900 ms);
        // at 8× the second wait alone can be 1.6 s, so only the controller's own deadline
        // check keeps a call from running into its total timeout.
        let mut p = policy();
        p.retry.backoff.base = Duration::from_millis(100);
        p.timeout.total = Duration::from_secs(1);
        p.slo.max_backoff_factor = 8.0;
        p.slo.tighten_factor = 8.0;
        p.slo.min_rate_factor = 1.0;
        let (c, changes) = client(p);
        let end = Instant::now() + Duration::from_secs(3);
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        let mut calls = tokio::task::JoinSet::new();
        while Instant::now() < end {
            tick.tick().await;
            let (c, url) = (c.clone(), srv.url("/storm"));
            calls.spawn(async move {
                let t = Instant::now();
                let r = c.send(NetRequest::get(url)).await;
                (r.err().map(|e| e.kind()), t.elapsed())
            });
        }
        let ends = calls.join_all().await;
        assert_eq!(factors(&c), Some((8.0, 1.0)), "{:?}", changes.seen.lock());
        let total = ends
            .iter()
            .filter(|(k, _)| *k == Some(ErrorKind::Timeout(Phase::Total)))
            .count();
        let ttfb = ends
            .iter()
            .filter(|(k, _)| *k == Some(ErrorKind::Timeout(Phase::Ttfb)))
            .count();
        assert_eq!(total, 0, "calls ran into their deadline");
        assert!(ttfb > 0, "the storm timed calls out");
        let longest = ends.iter().map(|(_, t)| *t).max().unwrap();
        assert!(longest < Duration::from_secs(1), "{longest:?}");
        srv.shutdown().await;
    })
    .await;
}

/// A policy that hedges after 20 ms (one copy), with retries off so hedges are the only
/// extra attempts, and a retry budget that never binds (hedges withdraw from it): what
/// differs between two runs is the controller alone.
fn hedging(slo: bool) -> NetPolicy {
    let mut p = policy();
    p.retry.enabled = false;
    p.retry.budget.retry_ratio = 1.0;
    p.hedge.enabled = true;
    p.hedge.delay = HEDGE_DELAY;
    p.hedge.max_hedges = 1;
    p.slo.enabled = slo;
    p
}

/// Short enough that a copy stretched 4× (80 ms) still starts before the first copy's
/// time to first byte (100 ms) runs out.
const HEDGE_DELAY: Duration = Duration::from_millis(20);

/// `share` of the answers (drawn from `seed`) come after `delay`, the others at once.
fn late_share(seed: u64, share: f64, delay: Duration) -> Script {
    Script::random(
        RandomFaults::seeded(seed)
            .fault(share, Reply::ok("late").delay(delay))
            .otherwise(Reply::ok("ok")),
    )
}

/// What a [`hedge_run`] saw.
#[derive(Debug)]
struct HedgeRun {
    /// The factors when the measured span began.
    factors_before: Option<(f64, f64)>,
    /// The factors when it ended.
    factors_after: Option<(f64, f64)>,
    /// Hedged copies per request in the measured span.
    per_request: f64,
    /// When each of those copies started after its group's first attempt.
    gaps: Vec<Duration>,
    /// Every `PolicyChange` of the run.
    changes: Vec<Change>,
}

/// Open-loop load on a route answering by `script`, through [`hedging`] with the controller
/// on or off: `warm` of it unmeasured, then `span` in which the hedged copies are counted.
async fn hedge_run(script: Script, slo: bool, warm: Duration, span: Duration) -> HedgeRun {
    let mut srv = FaultServer::http1()
        .route("/r", script)
        .start()
        .await
        .unwrap();
    let (c, seen) = client(hedging(slo));
    if !warm.is_zero() {
        drive(&c, &srv.url("/r"), warm, || false).await;
    }
    let before = (factors(&c), seen.hedges.lock().gaps.len());
    // `drive` joins every call it sent: no hedge of the warm-up is counted here.
    let (sent, _) = drive(&c, &srv.url("/r"), span, || false).await;
    let gaps = seen.hedges.lock().gaps[before.1..].to_vec();
    srv.shutdown().await;
    let changes = seen.seen.lock().clone();
    HedgeRun {
        factors_before: before.0,
        factors_after: factors(&c),
        per_request: gaps.len() as f64 / sent as f64,
        gaps,
        changes,
    }
}

#[tokio::test]
async fn hedges_are_thinned_and_later_while_the_host_is_slowed_down() {
    bounded(async {
        // Half the calls (seeded) answer after 2 s: a first copy that draws one is hedged at
        // 20 ms, and that copy times out too half the time (a call's timeout rate is 25 %).
        // 2.5 s of warm-up tighten twice (one window each), to the bounds.
        let run = |slo| {
            let storm = late_share(5, 0.5, Duration::from_secs(2));
            hedge_run(
                storm,
                slo,
                Duration::from_millis(2500),
                Duration::from_millis(1500),
            )
        };
        let (off, on) = tokio::join!(run(false), run(true));
        assert_eq!((off.factors_before, off.factors_after), (None, None));
        let bounds = Some((4.0, 0.25));
        assert_eq!(
            (on.factors_before, on.factors_after),
            (bounds, bounds),
            "at the bounds all along"
        );
        // Off: every call whose first copy drew a late answer (half) hedges. On: one in four
        // of those.
        let (off_rate, on_rate) = (off.per_request, on.per_request);
        assert!(off_rate >= 0.35, "{off_rate:.2} hedges per request off");
        assert!(
            on_rate <= off_rate / 2.0,
            "{on_rate:.2} hedges per request on, {off_rate:.2} off"
        );
        // Off, copies start 20 ms in; on, 4 × 20 ms.
        let mut off_gaps = off.gaps;
        off_gaps.sort();
        let off_median = off_gaps[off_gaps.len() / 2];
        assert!(off_median < HEDGE_DELAY * 3, "off: {off_median:?}");
        let on_first = on.gaps.iter().min().expect("some hedges still go out");
        assert!(
            *on_first >= HEDGE_DELAY * 4 - Duration::from_millis(5),
            "on: a copy after {on_first:?}"
        );
        println!(
            "hedges per request: off {off_rate:.2} (median start {off_median:?}), \
             on {on_rate:.2} (earliest start {on_first:?}, {} copies)",
            on.gaps.len()
        );
    })
    .await;
}

#[tokio::test]
async fn a_healthy_upstream_hedges_as_much_with_the_controller_as_without() {
    bounded(async {
        // A fifth of the answers (seeded) come after 80 ms: hedged at 20 ms, well within the
        // attempt timeout, so the SLIs stay healthy.
        let run = |slo| {
            let tail = late_share(9, 0.2, Duration::from_millis(80));
            hedge_run(tail, slo, Duration::ZERO, Duration::from_secs(3))
        };
        let (off, on) = tokio::join!(run(false), run(true));
        // Hedges are not retries: a healthy host that hedges a fifth of its calls keeps its
        // retry rate at 0, and its factors at 1.
        assert!(on.changes.is_empty(), "{:?}", on.changes);
        assert_eq!((on.factors_before, on.factors_after), (None, None));
        let (off_rate, on_rate) = (off.per_request, on.per_request);
        assert!(off_rate >= 0.1, "{off_rate:.2} hedges per request off");
        assert!(
            (on_rate - off_rate).abs() <= 0.08,
            "{on_rate:.2} hedges per request on, {off_rate:.2} off"
        );
        // And they start when the policy says.
        let late = on.gaps.iter().filter(|g| **g >= HEDGE_DELAY * 2).count();
        assert!(
            late * 10 <= on.gaps.len(),
            "{late} of {} copies late",
            on.gaps.len()
        );
        println!("hedges per request: off {off_rate:.2}, on {on_rate:.2}");
    })
    .await;
}
