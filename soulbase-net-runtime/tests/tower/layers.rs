//! tower and tower-http layers in front of the client.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use soulbase_net_core::{ErrorCode, ErrorKind};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{CapturedLogs, FaultServer, Reply, Script};
use tower::{ServiceBuilder, ServiceExt};
use tower_http::{set_header::SetRequestHeaderLayer, trace::TraceLayer};

use super::{bounded, loopback_policy, LoopbackDialer};

fn client(policy: NetPolicy) -> Client {
    Client::builder()
        .policy(policy)
        .dialer(std::sync::Arc::new(LoopbackDialer::default()))
        .build()
        .unwrap()
}

#[tokio::test]
async fn tower_http_layers_compose_and_the_policy_retries_under_them() {
    let srv = FaultServer::builder()
        .route("/flaky", Script::status(503).times(1).then(Reply::ok("hi")))
        .start()
        .await
        .unwrap();
    let (log, _guard) = CapturedLogs::start(tracing::Level::DEBUG);

    let svc = ServiceBuilder::new()
        .layer(TraceLayer::new_for_http())
        .layer(SetRequestHeaderLayer::overriding(
            HeaderName::from_static("x-team"),
            HeaderValue::from_static("payments"),
        ))
        .service(client(loopback_policy()));
    let req = http::Request::get(srv.url("/flaky"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let res = bounded(svc.oneshot(req)).await.unwrap();

    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "hi");
    // The client's retry policy ran under the layers: the 503 was retried, and the layer's
    // header went out on both attempts.
    assert_eq!(srv.hits("/flaky"), 2);
    let seen = srv.requests("/flaky");
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|r| r.header("x-team") == Some("payments")));
    // TraceLayer saw one request and its final answer (the retry is the client's business).
    let text = log.text();
    assert_eq!(
        text.matches("finished processing request").count(),
        1,
        "{text}"
    );
    assert!(text.contains("status=200"), "{text}");
    srv.join().await;
}

#[tokio::test]
async fn bodies_go_out_through_the_layers_and_are_sent_once() {
    let srv = FaultServer::builder()
        .route("/echo", Reply::echo())
        .route(
            "/down",
            Script::status(503).times(1).then(Reply::ok("late")),
        )
        .start()
        .await
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(SetRequestHeaderLayer::if_not_present(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain"),
        ))
        .service(client(loopback_policy()));

    let req = http::Request::post(srv.url("/echo"))
        .body(Full::new(Bytes::from_static(b"payload")))
        .unwrap();
    let res = bounded(svc.clone().oneshot(req)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = srv.requests("/echo");
    assert_eq!(seen[0].body, "payload");
    assert_eq!(seen[0].header("content-type"), Some("text/plain"));

    // The body is kept (small and at hand), but a PUT is not idempotent to the client
    // without an `Idempotency-Key`: answered 503, it is not sent again.
    let req = http::Request::put(srv.url("/down"))
        .body(Full::new(Bytes::from_static(b"once")))
        .unwrap();
    let res = bounded(svc.oneshot(req)).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(srv.hits("/down"), 1);
    srv.join().await;
}

#[tokio::test]
async fn the_policys_refusals_come_back_as_net_errors_through_the_layers() {
    let srv = FaultServer::builder()
        .route("/", Reply::ok("never"))
        .start()
        .await
        .unwrap();
    // The default policy: loopback is refused by the address guard.
    let mut policy = NetPolicy::default();
    policy.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    let svc = ServiceBuilder::new()
        .layer(TraceLayer::new_for_http())
        .service(client(policy));
    let req = http::Request::get(srv.url("/"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let Err(err) = bounded(svc.clone().oneshot(req)).await else {
        panic!("a denied address answered");
    };
    assert_eq!(err.kind(), ErrorKind::Blocked);
    assert_eq!(err.code(), ErrorCode::AuthForbidden);
    assert_eq!(srv.connections(), 0);

    // A URI without an authority cannot be sent anywhere.
    let req = http::Request::get("/relative")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let Err(err) = bounded(svc.oneshot(req)).await else {
        panic!("a relative uri was sent");
    };
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    srv.join().await;
}
