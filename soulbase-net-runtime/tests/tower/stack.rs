//! The resilience state machines as tower layers (`soulbase_net_runtime::layer`), stacked by
//! a tower user in front of a service: here the client's own tower face with its breaker off,
//! so the layer's circuits are the only ones.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Empty;
use parking_lot::Mutex;
use soulbase_net_core::{BreakerState, ErrorKind, NetError, NetEvent, Observer};
use soulbase_net_runtime::{layer::CircuitBreakerLayer, Client};
use soulbase_net_testkit::{FaultServer, Reply, Script};
use tower::{Layer, ServiceExt};

use super::{bounded, loopback_policy, LoopbackDialer};

/// Keeps every transition the layer reports.
#[derive(Default)]
struct Transitions(Mutex<Vec<(String, BreakerState, BreakerState)>>);

impl Observer for Transitions {
    fn on_event(&self, ev: &NetEvent<'_>) {
        if let NetEvent::BreakerTransition { key, from, to } = ev {
            self.0.lock().push(((*key).to_owned(), *from, *to));
        }
    }
}

#[tokio::test]
async fn a_breaker_layer_opens_per_origin_refuses_without_calling_and_probes_after_its_cooldown() {
    bounded(async {
        let down = FaultServer::http1()
            .route("/x", Script::status(503))
            .start()
            .await
            .unwrap();
        let up = FaultServer::http1()
            .route("/x", Reply::ok("ok"))
            .start()
            .await
            .unwrap();
        let mut policy = loopback_policy();
        policy.retry.max_attempts = 1;
        policy.cbreaker.enabled = false;
        let client = Client::builder()
            .policy(policy)
            .dialer(Arc::new(LoopbackDialer::default()))
            .build()
            .unwrap();
        let mut breaker = soulbase_net_policy::CircuitBreakerPolicy::default();
        breaker.enabled = true;
        breaker.consecutive_failures = 3;
        breaker.half_open_probes = 1;
        breaker.min_samples = 100;
        breaker.cooldown = std::time::Duration::from_millis(300);
        let seen = Arc::new(Transitions::default());
        let layer = CircuitBreakerLayer::with_observer(breaker, seen.clone());
        let svc = layer.layer(client);
        let get = |url: String| http::Request::get(url).body(Empty::<Bytes>::new()).unwrap();
        for _ in 0..3 {
            let res = svc.clone().oneshot(get(down.url("/x"))).await.unwrap();
            assert_eq!(res.status(), 503);
        }
        // Open: refused at once, the server not called.
        let refused = svc.clone().oneshot(get(down.url("/x"))).await.unwrap_err();
        let refused = refused.downcast_ref::<NetError>().unwrap();
        assert_eq!(refused.kind(), ErrorKind::CircuitOpen);
        assert!(refused.retry_after().is_some_and(|d| !d.is_zero()));
        assert_eq!(down.hits("/x"), 3);
        // Another origin of the same host (another port) is not affected.
        let res = svc.clone().oneshot(get(up.url("/x"))).await.unwrap();
        assert_eq!(res.status(), 200);
        // After the cooldown, a probe reaches the server (and fails: open again).
        tokio::time::sleep(std::time::Duration::from_millis(350)).await;
        let probe = svc.clone().oneshot(get(down.url("/x"))).await.unwrap();
        assert_eq!(probe.status(), 503);
        assert_eq!(down.hits("/x"), 4);
        let seen = seen.0.lock().clone();
        let origin = format!("http://{}", down.addr());
        use BreakerState::{Closed, HalfOpen, Open};
        assert_eq!(
            seen,
            [
                (origin.clone(), Closed, Open),
                (origin.clone(), Open, HalfOpen),
                (origin, HalfOpen, Open),
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn a_limit_layer_refuses_past_its_concurrency_or_queues_within_max_wait() {
    use soulbase_net_runtime::layer::LimitLayer;
    bounded(async {
        let srv = FaultServer::http1()
            .route(
                "/slow",
                Reply::ok("ok").delay(std::time::Duration::from_millis(200)),
            )
            .start()
            .await
            .unwrap();
        let mut policy = loopback_policy();
        policy.retry.max_attempts = 1;
        let client = Client::builder()
            .policy(policy)
            .dialer(Arc::new(LoopbackDialer::default()))
            .build()
            .unwrap();
        let get = || {
            http::Request::get(srv.url("/slow"))
                .body(Empty::<Bytes>::new())
                .unwrap()
        };
        let mut limits = soulbase_net_policy::LimitsPolicy::default();
        limits.per_host_concurrency = 1;
        // No wait: the second of two calls at once is refused, and never sent.
        let svc = LimitLayer::new(limits.clone()).layer(client.clone());
        let (a, b) = tokio::join!(svc.clone().oneshot(get()), svc.clone().oneshot(get()));
        let (ok, refused) = if a.is_ok() { (a, b) } else { (b, a) };
        assert_eq!(ok.unwrap().status(), 200);
        let refused = refused.unwrap_err();
        let refused = refused.downcast_ref::<NetError>().unwrap();
        assert_eq!(refused.kind(), ErrorKind::RateLimited);
        assert_eq!(srv.hits("/slow"), 1);
        // With a wait allowed, the second waits for the first's slot and is served after it.
        limits.max_wait = std::time::Duration::from_secs(2);
        let svc = LimitLayer::new(limits).layer(client);
        let began = tokio::time::Instant::now();
        let (a, b) = tokio::join!(svc.clone().oneshot(get()), svc.clone().oneshot(get()));
        assert_eq!(a.unwrap().status(), 200);
        assert_eq!(b.unwrap().status(), 200);
        assert!(began.elapsed() >= std::time::Duration::from_millis(400));
        assert_eq!(srv.hits("/slow"), 3);
    })
    .await;
}
