//! The SLO controller over loopback: an upstream that starts timing out 30 % of its calls
//! slows the client down within a window (longer backoff, thinned retries, fewer attempts per
//! second), gauges and `PolicyChange` events say so, the factors return to 1 once it heals,
//! and a healthy upstream never moves them.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use soulbase_net_core::{
    ErrorKind, GaugeReading, NetClient, NetEvent, NetRequest, Observer, Phase,
};
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

/// Keeps every `PolicyChange` with its time since the observer was made.
#[derive(Debug)]
struct Changes {
    start: Instant,
    seen: Mutex<Vec<Change>>,
}

impl Observer for Changes {
    fn on_event(&self, ev: &NetEvent<'_>) {
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
    Script::random(
        RandomFaults::seeded(21)
            .fault(0.3, Reply::ok("late").delay(Duration::from_secs(2)))
            .otherwise(Reply::ok("ok")),
    )
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
