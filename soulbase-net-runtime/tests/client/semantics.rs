//! Declared delivery semantics (seed 001 §VIII, P75-4) kept at run time: `at_least_once`
//! refuses an unkeyed non-idempotent request before it is sent and retries a keyed one;
//! `at_most_once` never sends again a request that may have reached the server.

use std::time::Duration;

use soulbase_net_core::{ErrorCode, ErrorKind, NetRequest};
use soulbase_net_policy::{NetPolicy, Semantics};
use soulbase_net_testkit::{FaultServer, Reply, Script};

use crate::support::{bounded, harness, loopback_policy};

/// Loopback, fast backoff, and `sem` declared for every host.
fn declaring(sem: Option<Semantics>) -> NetPolicy {
    let mut p = loopback_policy();
    p.retry.backoff.base = Duration::from_millis(5);
    p.retry.backoff.cap = Duration::from_millis(50);
    p.delivery.sem = sem;
    p.delivery.dedup_window = Some(Duration::from_secs(600));
    p
}

#[tokio::test]
async fn at_least_once_refuses_an_unkeyed_post_before_sending_it() {
    bounded(async {
        let srv = FaultServer::http1()
            .route("/charge", Reply::ok("charged"))
            .start()
            .await
            .unwrap();
        let h = harness(declaring(Some(Semantics::AtLeastOnce)));
        let err = h
            .client
            .send(NetRequest::post(srv.url("/charge")).body("{}"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err:?}");
        assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
        let msg = err.to_string();
        assert!(
            msg.contains("at_least_once") && msg.contains("P75-4"),
            "{msg}"
        );
        assert_eq!(srv.total_hits(), 0, "nothing was sent");
        assert!(h.dialer.dialled().is_empty(), "no connection was opened");
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn at_least_once_retries_a_keyed_post_with_the_same_key() {
    bounded(async {
        let srv = FaultServer::http1()
            .route(
                "/charge",
                Script::status(503).times(2).then(Reply::ok("charged")),
            )
            .route(
                "/plain",
                Script::status(503).times(1).then(Reply::ok("charged")),
            )
            .start()
            .await
            .unwrap();
        // Keyed by its header alone, not marked idempotent: the declared promise makes it
        // safe to send again.
        let req = |path: &str| {
            NetRequest::post(srv.url(path))
                .header("idempotency-key", "order-7-charge")
                .body("{}")
        };
        let h = harness(declaring(Some(Semantics::AtLeastOnce)));
        let res = h.client.send(req("/charge")).await.unwrap();
        assert_eq!((res.status.as_u16(), res.attempts), (200, 3));
        let keys: Vec<String> = srv
            .received_requests()
            .iter()
            .filter(|r| r.uri.path() == "/charge")
            .map(|r| r.header("idempotency-key").unwrap_or_default().to_owned())
            .collect();
        assert_eq!(keys, vec!["order-7-charge"; 3]);
        // Without the declaration the same request is not retried (its method is not
        // idempotent and it is not marked so).
        let plain = harness(declaring(None));
        let res = plain.client.send(req("/plain")).await.unwrap();
        assert_eq!((res.status.as_u16(), res.attempts), (503, 1));
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn at_most_once_does_not_retry_what_may_have_been_processed() {
    bounded(async {
        let srv = FaultServer::http1()
            .route("/flaky", Script::status(503).times(1).then(Reply::ok("ok")))
            .route(
                "/flaky-too",
                Script::status(503).times(1).then(Reply::ok("ok")),
            )
            .route(
                "/slow",
                Script::reply(Reply::ok("late").delay(Duration::from_secs(2)))
                    .times(1)
                    .then(Reply::ok("fast")),
            )
            .start()
            .await
            .unwrap();
        let mut p = declaring(Some(Semantics::AtMostOnce));
        p.retry.max_attempts = 2;
        p.timeout.ttfb = Duration::from_millis(300);
        let h = harness(p.clone());
        // A 5xx may come after the server acted: returned, not retried.
        let res = h
            .client
            .send(NetRequest::get(srv.url("/flaky")))
            .await
            .unwrap();
        assert_eq!((res.status.as_u16(), res.attempts), (503, 1));
        assert_eq!(srv.hits("/flaky"), 1);
        // A timed-out request may be running at the server: not sent again.
        let err = h
            .client
            .send(NetRequest::get(srv.url("/slow")))
            .await
            .unwrap_err();
        assert!(err.kind().is_timeout(), "{err:?}");
        assert_eq!(srv.hits("/slow"), 1);
        // The same policy without the declaration retries.
        p.delivery.sem = None;
        let plain = harness(p);
        let res = plain
            .client
            .send(NetRequest::get(srv.url("/flaky-too")))
            .await
            .unwrap();
        assert_eq!((res.status.as_u16(), res.attempts), (200, 2));
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn at_most_once_still_resends_what_was_never_sent() {
    bounded(async {
        let srv = FaultServer::http1()
            .route("/once", Reply::ok("once"))
            .start()
            .await
            .unwrap();
        // The name's first address has no listener: the first attempt never reaches a
        // server, so sending it again keeps the promise.
        let mut p = declaring(Some(Semantics::AtMostOnce));
        p.retry.max_attempts = 2;
        p.dns.happy_eyeballs = false;
        p.dns.shuffle = false;
        p.dns
            .static_hosts
            .insert("twice.test".to_owned(), vec!["127.0.0.1".parse().unwrap()]);
        let port = srv.addr().port();
        // A closed port on loopback refuses the connection at once.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let h = harness(p);
        let err = h
            .client
            .send(NetRequest::get(format!(
                "http://twice.test:{closed_port}/once"
            )))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Connect, "{err:?}");
        assert_eq!(err.attempts(), 2, "a refused connection was tried again");
        let res = h
            .client
            .send(NetRequest::get(format!("http://twice.test:{port}/once")))
            .await
            .unwrap();
        assert_eq!(res.status, 200);
        srv.join().await;
    })
    .await;
}
