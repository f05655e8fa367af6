//! IdempotencyKey: the key as it arrives, constant across retries, and the dedup window.

use std::{sync::Arc, time::Duration};

use soulbase_net_core::NetRequest;
use soulbase_net_interceptors::IdempotencyKey;
use soulbase_net_testkit::{FaultServer, Reply, Script};

use crate::support::client;

#[tokio::test]
async fn key_is_constant_across_retries() {
    let srv = FaultServer::http1()
        .route("/o", Script::status(503).times(1).then(Reply::echo()))
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(IdempotencyKey::random())]);
    let req = NetRequest::post(srv.url("/o")).idempotent(true).body("x");
    assert_eq!(c.send(req).await.unwrap().status, 200);
    let seen = srv.requests("/o");
    assert_eq!(seen.len(), 2);
    let key = seen[0].header("idempotency-key").unwrap();
    assert_eq!(key.len(), 32);
    assert_eq!(seen[1].header("idempotency-key"), Some(key));
    srv.join().await;
}

#[tokio::test]
async fn non_idempotent_post_gets_no_key() {
    let srv = FaultServer::http1()
        .route("/o", Reply::echo())
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(IdempotencyKey::random())]);
    c.send(NetRequest::post(srv.url("/o")).body("x"))
        .await
        .unwrap();
    assert_eq!(srv.requests("/o")[0].header("idempotency-key"), None);
    srv.join().await;
}

#[tokio::test]
async fn a_repeat_inside_the_window_is_answered_without_sending() {
    let srv = FaultServer::http1()
        .route("/o", Reply::echo())
        .start()
        .await
        .unwrap();
    let keys = Arc::new(
        IdempotencyKey::derived(Duration::from_secs(3600)).dedup_window(Duration::from_secs(60)),
    );
    let c = client(vec![keys.clone()]);
    let req = || {
        NetRequest::post(srv.url("/o"))
            .idempotent(true)
            .tenant("t1")
            .body("pay 5")
    };
    let first = c.send(req()).await.unwrap().text().await.unwrap();
    let second = c.send(req()).await.unwrap().text().await.unwrap();
    assert_eq!(first, second);
    assert_eq!(srv.hits("/o"), 1);
    assert_eq!(keys.dedup_drops(), 1);
    // Another tenant is another call.
    c.send(req().tenant("t2")).await.unwrap();
    assert_eq!(srv.hits("/o"), 2);
    assert_eq!(keys.dedup_drops(), 1);
    srv.join().await;
}

#[tokio::test]
async fn a_repeat_in_flight_joins_the_first() {
    let srv = FaultServer::http1()
        .route("/slow", Reply::echo().delay(Duration::from_millis(300)))
        .start()
        .await
        .unwrap();
    let keys = Arc::new(IdempotencyKey::random().dedup_window(Duration::from_secs(60)));
    let c = client(vec![keys.clone()]);
    let req = || {
        NetRequest::post(srv.url("/slow"))
            .idempotent(true)
            .header("idempotency-key", "order-1")
            .body("x")
    };
    let (a, b) = tokio::join!(c.send(req()), c.send(req()));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.status, 200);
    assert_eq!(a.bytes().await.unwrap(), b.bytes().await.unwrap());
    assert_eq!(srv.hits("/slow"), 1);
    assert_eq!(keys.dedup_drops(), 1);
    srv.join().await;
}

#[tokio::test]
async fn a_full_window_drops_its_oldest_entry() {
    let srv = FaultServer::http1()
        .route("/o", Reply::echo())
        .start()
        .await
        .unwrap();
    let keys = Arc::new(
        IdempotencyKey::random()
            .dedup_window(Duration::from_secs(60))
            .dedup_max_entries(1),
    );
    let c = client(vec![keys.clone()]);
    let req = |key: &str| {
        NetRequest::post(srv.url("/o"))
            .idempotent(true)
            .header("idempotency-key", key)
            .body(key.to_owned())
    };
    c.send(req("a")).await.unwrap();
    let b = c.send(req("b")).await.unwrap().text().await.unwrap();
    // b took a's place: b is answered from the window, a is sent again.
    assert_eq!(c.send(req("b")).await.unwrap().text().await.unwrap(), b);
    assert_eq!((srv.hits("/o"), keys.dedup_drops()), (2, 1));
    c.send(req("a")).await.unwrap();
    assert_eq!((srv.hits("/o"), keys.dedup_drops()), (3, 1));
    srv.join().await;
}

#[cfg(feature = "trace")]
#[tokio::test]
async fn request_id_and_key_constant_while_span_changes() {
    use soulbase_net_interceptors::TraceUa;
    let srv = FaultServer::http1()
        .route("/o", Script::status(503).times(1).then(Reply::echo()))
        .start()
        .await
        .unwrap();
    let c = client(vec![
        Arc::new(TraceUa::new()),
        Arc::new(IdempotencyKey::random()),
    ]);
    c.send(NetRequest::patch(srv.url("/o")).idempotent(true).body("x"))
        .await
        .unwrap();
    let seen = srv.requests("/o");
    assert_eq!(seen.len(), 2);
    for h in ["idempotency-key", "x-request-id"] {
        assert!(seen[0].header(h).is_some(), "{h}");
        assert_eq!(seen[0].header(h), seen[1].header(h), "{h}");
    }
    assert_ne!(seen[0].header("traceparent"), seen[1].header("traceparent"));
    srv.join().await;
}

#[cfg(feature = "trace")]
#[tokio::test]
async fn a_hedge_carries_the_same_key_and_request_id_with_its_own_span() {
    use soulbase_net_interceptors::TraceUa;
    let mut srv = FaultServer::http1()
        .route(
            "/h",
            Script::reply(Reply::ok("slow").delay(Duration::from_secs(3)))
                .times(1)
                .then(Reply::echo()),
        )
        .start()
        .await
        .unwrap();
    let (c, _) = crate::support::client_with(
        vec![
            Arc::new(TraceUa::new()),
            Arc::new(IdempotencyKey::derived(Duration::from_secs(60))),
        ],
        |p| {
            p.hedge.enabled = true;
            p.hedge.delay = Duration::from_millis(50);
            p.hedge.max_hedges = 1;
        },
    );
    let req = NetRequest::post(srv.url("/h")).idempotent(true).body("x");
    assert_eq!(c.send(req).await.unwrap().status, 200);
    let seen = srv.requests("/h");
    assert_eq!(seen.len(), 2);
    let key = seen[0].header("idempotency-key").unwrap();
    assert_eq!(key.len(), 64, "the derived key, not another one: {key}");
    assert_eq!(seen[1].header("idempotency-key"), Some(key));
    assert_eq!(
        seen[0].header("x-request-id"),
        seen[1].header("x-request-id")
    );
    let (a, b) = (
        seen[0].header("traceparent").unwrap(),
        seen[1].header("traceparent").unwrap(),
    );
    assert_eq!(a[..36], b[..36], "same trace id");
    assert_ne!(a, b, "own span id");
    srv.shutdown().await;
}

/// Seed 001 P75-5: a route's declared dedup window is the dedup store's window. With the
/// client's own store (this interceptor's window), a call whose policy declares another one
/// is refused before it is sent; the same window passes, and the interceptor's key makes an
/// `at_least_once` POST sendable.
#[tokio::test]
async fn the_declared_dedup_window_must_be_the_stores() {
    let srv = FaultServer::http1()
        .route("/pay", Reply::ok("paid"))
        .start()
        .await
        .unwrap();
    let store = || -> Vec<Arc<dyn soulbase_net_core::Interceptor>> {
        vec![Arc::new(
            IdempotencyKey::derived(Duration::from_secs(1)).dedup_window(Duration::from_secs(60)),
        )]
    };
    let declaring = |window: u64| {
        move |p: &mut soulbase_net_policy::NetPolicy| {
            p.delivery.sem = Some(soulbase_net_policy::Semantics::AtLeastOnce);
            p.delivery.dedup_window = Some(Duration::from_secs(window));
        }
    };
    let pay = || NetRequest::post(srv.url("/pay")).idempotent(true).body("x");
    let (other, _) = crate::support::client_with(store(), declaring(600));
    let err = other.send(pay()).await.unwrap_err();
    assert_eq!(err.kind(), soulbase_net_core::ErrorKind::InvalidRequest);
    let msg = err.to_string();
    assert!(
        msg.contains("P75-5") && msg.contains("600s") && msg.contains("60s"),
        "{msg}"
    );
    assert_eq!(srv.hits("/pay"), 0, "nothing was sent");
    let (same, _) = crate::support::client_with(store(), declaring(60));
    assert_eq!(same.send(pay()).await.unwrap().status, 200);
    assert_eq!(srv.hits("/pay"), 1);
    srv.join().await;
}
