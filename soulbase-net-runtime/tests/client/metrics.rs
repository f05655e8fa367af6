//! The observe crate's metrics fed by the real client: scripted scenarios and the exact
//! counter and gauge values they must leave in the exposition, hedges, and the SLIs
//! (timeout rate, p50 / p99) of calls with known outcomes and delays.

use std::{sync::Arc, time::Duration};

use soulbase_net_core::{ErrorKind, NetEvent, NetRequest, Observer, Phase, Takes};
use soulbase_net_observe::{Fanout, Metrics};
use soulbase_net_policy::AimdScope;
use soulbase_net_testkit::{FaultServer, Reply, Script};
use tokio::sync::Semaphore;

use crate::support::{harness_with, loopback_policy, slow_then_fast};

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .trim()
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

#[tokio::test]
async fn a_scripted_scenario_leaves_exact_counters() {
    let srv = FaultServer::http1()
        .route("/ok", Reply::ok("x"))
        .route("/flaky", Script::status(503).times(1).then(Reply::ok("y")))
        .route("/moved", Reply::redirect(302, "/ok"))
        .start()
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let mut p = loopback_policy();
    p.retry.backoff.base = std::time::Duration::from_millis(2);
    let h = harness_with(p, |b| b.observer(metrics.clone()));
    for path in ["/ok", "/ok", "/flaky", "/moved"] {
        let res = h.client.send(NetRequest::get(srv.url(path))).await.unwrap();
        assert_eq!(res.status, 200, "{path}");
        res.bytes().await.unwrap();
    }
    let text = metrics.encode();
    let ok = r#"net_requests_total{tenant="",host="127.0.0.1",method="GET",scheme="http",outcome="ok",version="h1"}"#;
    assert_eq!(sample(&text, ok), Some(4.0), "{text}");
    assert_eq!(
        sample(&text, r#"net_retry_total{reason="status_5xx"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"net_redirect_total{host="127.0.0.1"}"#),
        Some(1.0),
        "{text}"
    );
    let slis = metrics.slis();
    assert_eq!(slis.requests, 4);
    assert!((slis.retry_rate - 0.25).abs() < 1e-9, "{slis:?}");
    assert_eq!(slis.error_ratio, 0.0);
    srv.join().await;
}

/// Hands out one permit per attempt started, so a test can await "n attempts are running".
#[derive(Debug)]
struct Started(Semaphore);

impl Observer for Started {
    fn on_event(&self, ev: &NetEvent<'_>) {
        if let NetEvent::AttemptStarted { .. } = ev {
            self.0.add_permits(1);
        }
    }
}

impl Started {
    async fn wait(&self, n: u32) {
        self.0.acquire_many(n).await.unwrap().forget();
    }
}

/// `n` GET requests to `url`, each on its own task.
fn spawn_gets(
    client: &soulbase_net_runtime::Client,
    url: &str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Result<soulbase_net_core::NetResponse, soulbase_net_core::NetError>>>
{
    (0..n)
        .map(|_| {
            let client = client.clone();
            let req = NetRequest::get(url);
            tokio::spawn(async move { client.send(req).await })
        })
        .collect()
}

fn metrics_and_starts() -> (Arc<Metrics>, Arc<Started>, Arc<Fanout>) {
    let metrics = Arc::new(Metrics::new());
    let started = Arc::new(Started(Semaphore::new(0)));
    let fanout = Arc::new(Fanout::new().with(metrics.clone()).with(started.clone()));
    (metrics, started, fanout)
}

const IN_FLIGHT: &str = r#"net_limiter_in_flight{host="127.0.0.1"}"#;
const WINDOW: &str = r#"net_limiter_window{host="127.0.0.1"}"#;
const TOKENS: &str = r#"net_retry_budget_tokens{tenant="",host="127.0.0.1"}"#;

#[tokio::test]
async fn limiter_and_budget_gauges_show_exact_values() {
    let srv = FaultServer::http1()
        // Long enough to outlast the scrape once all three are running; never waited on
        // for synchronisation (the attempts' start events are).
        .route("/slow", Reply::ok("x").delay(Duration::from_millis(800)))
        .route("/flaky", Script::status(503).times(2).then(Reply::ok("y")))
        .start()
        .await
        .unwrap();
    let (metrics, started, fanout) = metrics_and_starts();
    let mut p = loopback_policy();
    p.retry.backoff.base = Duration::from_millis(2);
    p.retry.budget.retry_ratio = 0.5;
    p.retry.budget.min_retries_per_sec = 0;
    p.retry.budget.window = Duration::from_secs(600);
    p.limits.aimd.enabled = true;
    p.limits.aimd.initial = 8;
    let h = harness_with(p, |b| b.observer(fanout));
    assert_eq!(sample(&metrics.encode(), IN_FLIGHT), None, "no host yet");

    let calls = spawn_gets(&h.client, &srv.url("/slow"), 3);
    started.wait(3).await;
    let text = metrics.encode();
    assert_eq!(sample(&text, IN_FLIGHT), Some(3.0), "{text}");
    assert_eq!(sample(&text, WINDOW), Some(8.0), "{text}");
    // Three requests deposited: 0.5 × 3 = 1.5 → 1 whole retry.
    assert_eq!(sample(&text, TOKENS), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, r#"net_limiter_queued{host="127.0.0.1"}"#),
        Some(0.0),
        "{text}"
    );
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status, 200);
    }
    let text = metrics.encode();
    assert_eq!(sample(&text, IN_FLIGHT), Some(0.0), "{text}");
    assert_eq!(sample(&text, WINDOW), Some(11.0), "+1 per success: {text}");

    // A fourth request (0.5 × 4 = 2 tokens) retried twice spends both.
    let res = h
        .client
        .send(NetRequest::get(srv.url("/flaky")))
        .await
        .unwrap();
    assert_eq!((res.status.as_u16(), res.attempts), (200, 3));
    let text = metrics.encode();
    assert_eq!(sample(&text, TOKENS), Some(0.0), "{text}");
    assert_eq!(
        sample(&text, r#"net_retry_total{reason="status_5xx"}"#),
        Some(2.0),
        "{text}"
    );
    assert_eq!(sample(&text, IN_FLIGHT), Some(0.0), "{text}");
    srv.join().await;
}

#[tokio::test]
async fn pool_gauges_count_open_and_idle_connections() {
    const OPEN: &str = r#"net_pool_open_connections{host="127.0.0.1"}"#;
    const IDLE: &str = r#"net_pool_idle_connections{host="127.0.0.1"}"#;
    let srv = FaultServer::http1()
        .route("/slow", Reply::ok("x").delay(Duration::from_millis(500)))
        .start()
        .await
        .unwrap();
    let (metrics, _started, fanout) = metrics_and_starts();
    let h = harness_with(loopback_policy(), |b| {
        b.observer(fanout).pool_max_idle_per_host(2)
    });
    assert_eq!(sample(&metrics.encode(), OPEN), None, "no connection yet");

    // Three at once, all at the server: three connections open, none idle.
    let calls = spawn_gets(&h.client, &srv.url("/slow"), 3);
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/slow", 3))
        .await
        .unwrap();
    let text = metrics.encode();
    assert_eq!(sample(&text, OPEN), Some(3.0), "{text}");
    assert_eq!(sample(&text, IDLE), Some(0.0), "{text}");
    // Answered and dropped (each response gives its connection back as it is dropped): two
    // are kept idle, the maximum; the third is closed.
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status, 200);
    }
    let text = metrics.encode();
    assert_eq!(sample(&text, IDLE), Some(2.0), "{text}");
    // The third one's slot frees when its connection task has ended, which nothing here can
    // await: looked at every 10 ms, for at most 5 s.
    let mut open = None;
    for _ in 0..500 {
        open = sample(&metrics.encode(), OPEN);
        if open == Some(2.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(open, Some(2.0));
    assert_eq!(srv.connections(), 3);
    // The server closes the two idle connections: neither open nor idle any more, though
    // the pool has not yet looked at them (looked at every 10 ms, for at most 5 s).
    let mut srv = srv;
    srv.shutdown().await;
    let mut open = None;
    for _ in 0..500 {
        open = sample(&metrics.encode(), OPEN);
        if open == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let text = metrics.encode();
    assert_eq!(open, Some(0.0), "{text}");
    assert_eq!(sample(&text, IDLE), Some(0.0), "{text}");
}

#[tokio::test]
async fn an_http2_connection_without_requests_on_it_is_idle() {
    const OPEN: &str = r#"net_pool_open_connections{host="127.0.0.1"}"#;
    const IDLE: &str = r#"net_pool_idle_connections{host="127.0.0.1"}"#;
    let srv = FaultServer::http2()
        .route("/slow", Reply::ok("x").delay(Duration::from_millis(300)))
        .start()
        .await
        .unwrap();
    let (metrics, _started, fanout) = metrics_and_starts();
    let h = harness_with(loopback_policy(), |b| {
        b.observer(fanout).http2_prior_knowledge(true)
    });
    // Two requests share the connection: open, not idle.
    let calls = spawn_gets(&h.client, &srv.url("/slow"), 2);
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/slow", 2))
        .await
        .unwrap();
    let text = metrics.encode();
    assert_eq!(sample(&text, OPEN), Some(1.0), "{text}");
    assert_eq!(sample(&text, IDLE), Some(0.0), "{text}");
    // Both answered and their bodies dropped: the connection is idle.
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status, 200);
    }
    let text = metrics.encode();
    assert_eq!(sample(&text, OPEN), Some(1.0), "{text}");
    assert_eq!(sample(&text, IDLE), Some(1.0), "{text}");
    assert_eq!(srv.connections(), 1);
    srv.join().await;
}

#[tokio::test]
async fn tenant_gauges_count_the_calls_each_tenant_holds() {
    let srv = FaultServer::http1()
        .route("/slow", Reply::ok("x").delay(Duration::from_millis(800)))
        .start()
        .await
        .unwrap();
    let (metrics, started, fanout) = metrics_and_starts();
    let h = harness_with(loopback_policy(), |b| b.observer(fanout));
    let t1 = r#"net_limiter_tenant_in_flight{tenant="t1"}"#;
    let t2 = r#"net_limiter_tenant_in_flight{tenant="t2"}"#;
    assert_eq!(sample(&metrics.encode(), t1), None, "no tenant yet");
    let calls: Vec<_> = ["t1", "t1", "t2"]
        .into_iter()
        .map(|tenant| {
            let client = h.client.clone();
            let req = NetRequest::get(srv.url("/slow")).tenant(tenant);
            tokio::spawn(async move { client.send(req).await })
        })
        .collect();
    started.wait(3).await;
    let text = metrics.encode();
    assert_eq!(sample(&text, t1), Some(2.0), "{text}");
    assert_eq!(sample(&text, t2), Some(1.0), "{text}");
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status, 200);
    }
    let text = metrics.encode();
    assert_eq!(
        (sample(&text, t1), sample(&text, t2)),
        (Some(0.0), Some(0.0))
    );
    srv.join().await;
}

#[tokio::test]
async fn cancelled_calls_free_their_slots_and_a_dropped_client_leaves_no_gauges() {
    let srv = FaultServer::http1()
        .route("/hang", Reply::hang())
        .start()
        .await
        .unwrap();
    let (metrics, started, fanout) = metrics_and_starts();
    let mut p = loopback_policy();
    p.limits.aimd.enabled = true;
    p.limits.aimd.scope = AimdScope::Global;
    p.limits.aimd.initial = 5;
    let h = harness_with(p, |b| b.observer(fanout));
    let calls = spawn_gets(&h.client, &srv.url("/hang"), 2);
    started.wait(2).await;
    let text = metrics.encode();
    assert_eq!(sample(&text, IN_FLIGHT), Some(2.0), "{text}");
    assert_eq!(
        sample(&text, "net_limiter_global_window"),
        Some(5.0),
        "{text}"
    );
    assert_eq!(sample(&text, WINDOW), None, "no per-host window: {text}");
    for call in calls {
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
    }
    let text = metrics.encode();
    assert_eq!(sample(&text, IN_FLIGHT), Some(0.0), "{text}");
    drop(h);
    let text = metrics.encode();
    assert_eq!(sample(&text, IN_FLIGHT), None, "{text}");
    assert_eq!(sample(&text, "net_limiter_global_window"), None, "{text}");
    assert!(
        text.contains("# TYPE net_limiter_in_flight gauge"),
        "{text}"
    );
    drop(srv);
}

#[tokio::test]
async fn a_hedged_copy_is_counted() {
    let srv = FaultServer::http1()
        .route("/h", slow_then_fast())
        .start()
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let mut p = loopback_policy();
    p.hedge.enabled = true;
    p.hedge.delay = Duration::from_millis(50);
    p.hedge.max_hedges = 1;
    let h = harness_with(p, |b| b.observer(metrics.clone()));
    let res = h.client.send(NetRequest::get(srv.url("/h"))).await.unwrap();
    assert_eq!(res.text().await.unwrap(), "fast");
    let text = metrics.encode();
    assert_eq!(
        sample(&text, r#"net_hedge_total{host="127.0.0.1"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, "net_sli_hedge_rate"), Some(1.0), "{text}");
    let slis = metrics.slis();
    assert_eq!((slis.requests, slis.hedge_rate), (1, 1.0), "{slis:?}");
    srv.join().await;
}

#[tokio::test]
async fn timeout_rate_is_the_share_of_calls_that_timed_out() {
    // Late replies come long after the ttfb timeout; nothing waits for them.
    let srv = FaultServer::http1()
        .route("/ok", Reply::ok("x"))
        .route("/late", Reply::ok("late").delay(Duration::from_secs(5)))
        .start()
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let mut p = loopback_policy();
    p.retry.enabled = false;
    p.timeout.ttfb = Duration::from_millis(300);
    let h = harness_with(p, |b| b.observer(metrics.clone()));
    let paths = [
        "/ok", "/late", "/ok", "/ok", "/late", "/ok", "/ok", "/ok", "/late", "/ok",
    ];
    for path in paths {
        match h.client.send(NetRequest::get(srv.url(path))).await {
            Ok(res) => {
                assert_eq!((path, res.status.as_u16()), ("/ok", 200));
                res.bytes().await.unwrap();
            }
            Err(e) => assert_eq!((path, e.kind()), ("/late", ErrorKind::Timeout(Phase::Ttfb))),
        }
    }
    let slis = metrics.slis();
    assert_eq!(slis.requests, 10);
    assert_eq!(slis.timeout_rate, 3.0 / 10.0, "{slis:?}");
    assert_eq!(slis.error_ratio, 3.0 / 10.0, "{slis:?}");
    assert_eq!(slis.retry_rate, 0.0, "{slis:?}");
    let text = metrics.encode();
    assert_eq!(
        sample(&text, r#"net_timeouts_total{phase="ttfb"}"#),
        Some(3.0),
        "{text}"
    );
    assert_eq!(sample(&text, "net_sli_timeout_rate"), Some(0.3), "{text}");
    srv.join().await;
}

#[tokio::test]
async fn latency_percentiles_follow_the_server_delays() {
    let srv = FaultServer::http1()
        .route("/fast", Reply::ok("x"))
        .route("/slow", Reply::ok("x").delay(Duration::from_millis(300)))
        .start()
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let h = harness_with(loopback_policy(), |b| b.observer(metrics.clone()));
    // Nine fast calls and one 300 ms late: by nearest rank over ten samples, p99 is the
    // slowest call and p50 the fifth fastest.
    for i in 0..10 {
        let path = if i == 6 { "/slow" } else { "/fast" };
        let res = h.client.send(NetRequest::get(srv.url(path))).await.unwrap();
        res.bytes().await.unwrap();
    }
    let slis = metrics.slis();
    assert_eq!(slis.requests, 10);
    // The bounds are wide for a loaded machine: the server's delay is a floor, and a
    // loopback reply takes about a millisecond.
    assert!(slis.p99_ms >= 300.0, "{slis:?}");
    assert!(slis.p50_ms < 100.0, "{slis:?}");
    srv.join().await;
}

#[tokio::test]
async fn observers_add_up_and_each_sees_every_event() {
    let srv = FaultServer::http1()
        .route("/ok", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    // The harness gives the client its own event recorder; a second observer is added to it,
    // not put in its place.
    let metrics = Arc::new(Metrics::new());
    let h = harness_with(loopback_policy(), |b| b.observer(metrics.clone()));
    let res = h
        .client
        .send(NetRequest::get(srv.url("/ok")))
        .await
        .unwrap();
    res.bytes().await.unwrap();
    let text = metrics.encode();
    let ok = r#"net_requests_total{tenant="",host="127.0.0.1",method="GET",scheme="http",outcome="ok",version="h1"}"#;
    assert_eq!(sample(&text, ok), Some(1.0), "{text}");
    let seen = h.events.seen.lock().clone();
    assert!(
        seen.iter().any(|e| e.starts_with("finish ok")),
        "the first observer still sees the call: {seen:?}"
    );
    // The gauges reach both as well (the metrics' limiter gauge needs the source).
    assert!(text.contains("net_pool_open_connections"), "{text}");
}

/// Keeps the kind of every event, and takes what it is told to.
struct Kinds {
    takes: Takes,
    seen: parking_lot::Mutex<Vec<&'static str>>,
}

impl Kinds {
    fn new(takes: Takes) -> Arc<Self> {
        Arc::new(Kinds {
            takes,
            seen: parking_lot::Mutex::default(),
        })
    }

    fn seen(&self) -> Vec<&'static str> {
        self.seen.lock().clone()
    }
}

impl Observer for Kinds {
    fn on_event(&self, event: &NetEvent<'_>) {
        let kind = match event {
            NetEvent::RequestStarted { .. } => "request started",
            NetEvent::AttemptStarted { hedge: true, .. } => "hedge started",
            NetEvent::AttemptStarted { .. } => "attempt started",
            NetEvent::AttemptFinished { .. } => "attempt finished",
            NetEvent::RequestFinished { .. } => "request finished",
            _ => return,
        };
        self.seen.lock().push(kind);
    }

    fn takes(&self) -> Takes {
        self.takes
    }
}

/// The start events are built only for an observer that takes them; then every observer
/// gets them, as before. A hedge's start is told whatever the observers take.
#[tokio::test]
async fn start_events_go_only_where_an_observer_takes_them() {
    let srv = FaultServer::http1()
        .route("/ok", Reply::ok("x"))
        .route("/h", slow_then_fast())
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.hedge.enabled = true;
    p.hedge.delay = Duration::from_millis(50);
    p.hedge.max_hedges = 1;

    // Alone, an observer that takes none of them sees neither start (not the harness: its
    // own observer takes them all). `/ok` answers before the hedge is due.
    let none = Kinds::new(Takes::NONE);
    let client = soulbase_net_runtime::Client::builder()
        .policy(p.clone())
        .dialer(Arc::new(crate::support::RecordingDialer::default()))
        .observer(none.clone())
        .build()
        .unwrap();
    let res = client.send(NetRequest::get(srv.url("/ok"))).await.unwrap();
    assert_eq!(res.text().await.unwrap(), "x");
    assert_eq!(none.seen(), ["attempt finished", "request finished"]);
    // A hedge's start comes anyway.
    let res = client.send(NetRequest::get(srv.url("/h"))).await.unwrap();
    assert_eq!(res.text().await.unwrap(), "fast");
    assert!(none.seen().contains(&"hedge started"), "{:?}", none.seen());
    assert!(
        !none.seen().contains(&"attempt started"),
        "{:?}",
        none.seen()
    );

    // Beside one that takes the request's start, both get it, and neither the attempt's.
    let (quiet, starts) = (Kinds::new(Takes::NONE), Kinds::new(Takes::REQUEST_STARTED));
    let client = soulbase_net_runtime::Client::builder()
        .policy(p)
        .dialer(Arc::new(crate::support::RecordingDialer::default()))
        .observer(quiet.clone())
        .observer(starts.clone())
        .build()
        .unwrap();
    let res = client.send(NetRequest::get(srv.url("/ok"))).await.unwrap();
    assert_eq!(res.text().await.unwrap(), "x");
    let expected = ["request started", "attempt finished", "request finished"];
    assert_eq!(quiet.seen(), expected);
    assert_eq!(starts.seen(), expected);
    drop(srv);
}
