//! The breaker's unit: failed attempts, not calls. A call retried three times is three
//! pieces of evidence about the upstream (as Envoy's outlier detection counts them), so a
//! breaker of `consecutive_failures = N` opens after N failed attempts in a row even when
//! fewer calls made them.

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Empty;
use soulbase_net_core::ErrorKind;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{FaultServer, Script};
use tower::ServiceExt;

use super::{bounded, loopback_policy, LoopbackDialer};

#[tokio::test]
async fn a_breaker_of_four_opens_after_four_failed_attempts_of_two_calls() {
    let srv = FaultServer::http1()
        .route("/down", Script::status(503))
        .start()
        .await
        .unwrap();
    let mut policy = loopback_policy();
    policy.retry.max_attempts = 3;
    let b = &mut policy.cbreaker;
    b.enabled = true;
    b.consecutive_failures = 4;
    // The ratio rule needs more samples than this test makes: only the run of failures
    // can open the circuit.
    b.min_samples = 100;
    let client = Client::builder()
        .policy(policy)
        .dialer(std::sync::Arc::new(LoopbackDialer::default()))
        .build()
        .unwrap();
    let get = || {
        http::Request::get(srv.url("/down"))
            .body(Empty::<Bytes>::new())
            .unwrap()
    };

    // One call, three failed attempts: under four, the circuit stays closed and the last
    // answer comes back.
    let res = bounded(client.clone().oneshot(get())).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(srv.hits("/down"), 3);

    // The second call's first attempt is the fourth failure in a row: the circuit opens,
    // and the call's retry is refused by it.
    let err = bounded(client.clone().oneshot(get())).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen, "{err:?}");
    assert_eq!(srv.hits("/down"), 4);

    // Open: the next call fails fast, without reaching the server.
    let err = bounded(client.clone().oneshot(get())).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen, "{err:?}");
    assert_eq!(srv.hits("/down"), 4);
    srv.join().await;
}
