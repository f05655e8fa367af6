//! Phase timeouts: connect, time to first byte, total.

use std::time::Duration;

use soulbase_net_core::{ErrorCode, ErrorKind, NetClient, NetRequest, Phase, TimeoutCfg};
use soulbase_net_runtime::{DialFuture, Dialer};
use soulbase_net_testkit::{FaultServer, Reply};

use crate::support::{harness, harness_with, loopback_policy};

#[tokio::test]
async fn ttfb_timeout_fires_when_the_head_is_late() {
    let mut srv = FaultServer::http1()
        .route("/slow", Reply::ok("late").delay(Duration::from_secs(5)))
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    let req = NetRequest::get(srv.url("/slow"))
        .timeout(TimeoutCfg::default().with_ttfb(Duration::from_millis(150)));
    let started = tokio::time::Instant::now();
    let err = h.client.send(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Ttfb));
    assert_eq!(err.code(), ErrorCode::ProviderTimeout);
    assert_eq!(err.public_code(), ErrorCode::ProviderUnavailable);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(h.events.seen.lock().contains(&"timeout ttfb".to_owned()));
    srv.shutdown().await;
}

#[tokio::test]
async fn the_total_deadline_caps_the_ttfb_timeout() {
    let mut srv = FaultServer::http1()
        .route("/slow", Reply::ok("late").delay(Duration::from_secs(5)))
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    let req = NetRequest::get(srv.url("/slow")).total_timeout(Duration::from_millis(150));
    let err = h.client.send(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Total));
    srv.shutdown().await;
}

/// A dialer whose connections never complete.
#[derive(Debug)]
struct Silent;

impl Dialer for Silent {
    fn dial(&self, _addr: std::net::SocketAddr) -> DialFuture {
        Box::pin(std::future::pending())
    }
}

/// The shared test dialer (loopback only) after a fixed delay: a slow network.
#[derive(Debug)]
struct SlowConnect(Duration);

impl Dialer for SlowConnect {
    fn dial(&self, addr: std::net::SocketAddr) -> DialFuture {
        let delay = self.0;
        let dial = crate::support::RecordingDialer::default().dial(addr);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            dial.await
        })
    }
}

#[tokio::test]
async fn the_first_byte_clock_starts_when_the_connection_takes_the_request() {
    let mut srv = FaultServer::http1()
        .route("/now", Reply::ok("at once"))
        .route("/late", Reply::ok("late").delay(Duration::from_millis(600)))
        .start()
        .await
        .unwrap();
    let connect = Duration::from_millis(400);
    let ttfb = Duration::from_millis(250);
    // Connecting takes longer than the first-byte timeout: not a first-byte timeout.
    let h = harness_with(loopback_policy(), |b| {
        b.dialer(std::sync::Arc::new(SlowConnect(connect)))
    });
    let req = NetRequest::get(srv.url("/now")).timeout(TimeoutCfg::default().with_ttfb(ttfb));
    let res = h.client.send(req).await.unwrap();
    assert_eq!(res.status, 200);
    assert!(res.elapsed.ttfb() >= connect, "{:?}", res.elapsed);
    // A late head after a slow connect: the timeout counts from the request's start on the
    // connection, so it fires no earlier than connect + ttfb. One attempt, so the upper
    // bound is that one attempt's connect + ttfb with room for a loaded machine.
    let mut one_attempt = loopback_policy();
    one_attempt.retry.enabled = false;
    let h = harness_with(one_attempt, |b| {
        b.dialer(std::sync::Arc::new(SlowConnect(connect)))
    });
    let started = tokio::time::Instant::now();
    let req = NetRequest::get(srv.url("/late")).timeout(TimeoutCfg::default().with_ttfb(ttfb));
    let err = h.client.send(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Ttfb));
    let waited = started.elapsed();
    assert!(waited >= connect + ttfb, "{waited:?}");
    assert!(
        waited < connect + ttfb + Duration::from_secs(1),
        "{waited:?}"
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn connect_timeout_fires_when_no_connection_opens() {
    let mut p = loopback_policy();
    p.timeout.connect = Duration::from_millis(100);
    let h = harness_with(p, |b| b.dialer(std::sync::Arc::new(Silent)));
    let err = h
        .client
        .send(NetRequest::get("http://127.0.0.1:9/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Connect));
    assert_eq!(err.code(), ErrorCode::ProviderTimeout);
}

/// A request body that never produces its second chunk.
struct StalledBody(bool);

impl http_body::Body for StalledBody {
    type Data = bytes::Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>> {
        if self.0 {
            std::task::Poll::Pending
        } else {
            self.0 = true;
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(
                b"first",
            )))))
        }
    }
}

#[tokio::test]
async fn a_stalled_request_body_hits_the_write_timeout() {
    let mut srv = FaultServer::http1()
        .route("/w", Reply::ok("ok"))
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    let req = NetRequest::put(srv.url("/w"))
        .body(soulbase_net_core::Body::stream(StalledBody(false)))
        .timeout(TimeoutCfg::default().with_write(Duration::from_millis(150)));
    let err = h.client.send(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Write), "{err}");
    srv.shutdown().await;
}

#[tokio::test]
async fn a_request_total_shorter_than_the_retry_schedule_is_clamped_and_says_so() {
    let mut srv = FaultServer::http1()
        .route("/down", Reply::status(503))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.retry.max_attempts = 3;
    p.timeout.attempt = Duration::from_secs(2);
    p.timeout.dynamic.max = Duration::from_secs(2);
    p.timeout.ttfb = Duration::from_secs(2);
    p.timeout.read = Duration::from_secs(2);
    p.timeout.write = Duration::from_secs(2);
    p.retry.backoff.base = Duration::from_millis(200);
    p.retry.backoff.cap = Duration::from_millis(200);
    let h = harness(p);
    // The policy's own schedule fits its total: nothing to report.
    let res = h
        .client
        .send(NetRequest::get(srv.url("/down")))
        .await
        .unwrap();
    assert_eq!(res.status, 503);
    let clamped = |h: &crate::support::Harness| {
        h.events
            .seen
            .lock()
            .iter()
            .filter(|e| e.starts_with("DeadlineClamped"))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert!(clamped(&h).is_empty(), "{:?}", clamped(&h));
    // 3 × 2 s of attempts do not fit 300 ms: the call runs, bounded by its own total, and the
    // clamp is reported.
    let started = tokio::time::Instant::now();
    let res = h
        .client
        .send(NetRequest::get(srv.url("/down")).total_timeout(Duration::from_millis(300)))
        .await
        .unwrap();
    assert_eq!(res.status, 503);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let seen = clamped(&h);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].contains("total: 300ms"), "{seen:?}");
    srv.shutdown().await;
}

#[tokio::test]
async fn a_wait_for_a_slot_ends_at_the_calls_deadline() {
    let gate = soulbase_net_testkit::Gate::new();
    let srv = FaultServer::http1()
        .route("/held", Reply::ok("x").after(&gate))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.limits.per_host_concurrency = 1;
    p.limits.max_wait = Duration::from_secs(10);
    let h = harness(p);
    let client = std::sync::Arc::new(h.client);
    let first = {
        let (client, url) = (client.clone(), srv.url("/held"));
        tokio::spawn(async move { client.send(NetRequest::get(url)).await })
    };
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/held", 1))
        .await
        .unwrap();
    // The only slot is held; this call may wait 10 s for one, but its own deadline is 300 ms.
    let started = tokio::time::Instant::now();
    let err = client
        .send(NetRequest::get(srv.url("/held")).total_timeout(Duration::from_millis(300)))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Total), "{err}");
    assert_eq!(err.code(), ErrorCode::ProviderTimeout);
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    assert_eq!(srv.hits("/held"), 1);
    gate.open();
    assert_eq!(first.await.unwrap().unwrap().status, 200);
    srv.join().await;
}

/// An interceptor that takes its time in `before` and `after`: the call's `w(proc)`.
struct Slow {
    before: Duration,
    after: Duration,
}

#[async_trait::async_trait]
impl soulbase_net_core::Interceptor for Slow {
    async fn before(&self, _req: &mut NetRequest) -> Result<(), soulbase_net_core::NetError> {
        tokio::time::sleep(self.before).await;
        Ok(())
    }

    async fn after(
        &self,
        _req: &NetRequest,
        _res: &mut soulbase_net_core::NetResponse,
    ) -> Result<(), soulbase_net_core::NetError> {
        tokio::time::sleep(self.after).await;
        Ok(())
    }
}

/// Keeps the `elapsed` of every `RequestFinished`.
#[derive(Default)]
struct Finished(parking_lot::Mutex<Vec<soulbase_net_core::Elapsed>>);

impl soulbase_net_core::Observer for Finished {
    fn on_event(&self, ev: &soulbase_net_core::NetEvent<'_>) {
        if let soulbase_net_core::NetEvent::RequestFinished { elapsed, .. } = ev {
            self.0.lock().push(*elapsed);
        }
    }
}

/// Seed 001 S75-4: `W_q_in + w(proc) + W_q_out + W_net ≤ timeout`, each segment measured per
/// call where its time went. Two calls at once under a host limit of one: the first connects
/// (80 ms, a slow network: its `queue_out`), runs 50 + 30 ms of interceptors (`processing`)
/// and waits 120 ms for the head (`network`); the second waits for the first's slot
/// (`queue_in`) and then reuses its connection (`queue_out` near zero).
#[tokio::test]
async fn each_segment_of_a_call_is_measured_where_its_time_went() {
    let mut srv = FaultServer::http1()
        .route("/s", Reply::ok("s").delay(Duration::from_millis(120)))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.limits.per_host_concurrency = 1;
    p.limits.max_wait = Duration::from_secs(5);
    let finished = std::sync::Arc::new(Finished::default());
    let h = harness_with(p, |b| {
        b.dialer(std::sync::Arc::new(SlowConnect(Duration::from_millis(80))))
            .interceptor(Slow {
                before: Duration::from_millis(50),
                after: Duration::from_millis(30),
            })
            .observer(finished.clone())
    });
    let timeout = Duration::from_secs(10);
    let call = |client: soulbase_net_runtime::Client| {
        let url = srv.url("/s");
        async move {
            let began = tokio::time::Instant::now();
            let res = client
                .send(NetRequest::get(url).total_timeout(timeout))
                .await
                .unwrap();
            (res.elapsed, began.elapsed())
        }
    };
    let first = tokio::spawn(call(h.client.clone()));
    // The second asks once the first holds the host's only slot.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = tokio::spawn(call(h.client.clone()));
    let (a, took_a) = first.await.unwrap();
    let (b, took_b) = second.await.unwrap();
    let ms = Duration::from_millis;
    // Each segment is at least what was spent in it, and at most that plus scheduling.
    let near = |got: Duration, spent: Duration| got >= spent && got <= spent + ms(150);
    assert!(a.queue_in() < ms(30), "{a:?}");
    assert!(near(a.processing(), ms(80)), "{a:?}");
    assert!(
        near(a.queue_out(), ms(80)) && a.queue_out() >= a.connect(),
        "{a:?}"
    );
    assert!(near(a.network(), ms(120)), "{a:?}");
    // The second waited for the first to end (its whole call, after hooks included).
    assert!(
        b.queue_in() + ms(20) >= took_a.saturating_sub(ms(30)),
        "{b:?} {took_a:?}"
    );
    assert!(near(b.processing(), ms(80)), "{b:?}");
    assert!(b.connect().is_zero() && b.queue_out() < ms(30), "{b:?}");
    assert!(near(b.network(), ms(120)), "{b:?}");
    // The budget closes: the segments fit in what the caller saw, which fits the timeout.
    for (e, took) in [(a, took_a), (b, took_b)] {
        assert!(e.segments() <= took && took <= timeout, "{e:?} {took:?}");
    }
    // Events carry the same figures as the responses.
    let seen = finished.0.lock().clone();
    assert!(seen.contains(&a) && seen.contains(&b), "{seen:?}");
    srv.shutdown().await;
}
