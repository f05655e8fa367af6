//! Size limits: request bodies before any connection, response Content-Length before reading.

use soulbase_net_core::{ErrorCode, ErrorKind, NetClient, NetRequest};
use soulbase_net_policy::ByteSize;
use soulbase_net_testkit::{FaultServer, Reply};

use crate::support::{harness, loopback_policy};

#[tokio::test]
async fn request_body_over_the_limit_is_refused_before_connecting() {
    let srv = FaultServer::http1()
        .route("/up", Reply::ok("ok"))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.security.max_req_bytes = ByteSize(1024);
    let h = harness(p);
    let err = h
        .client
        .send(NetRequest::post(srv.url("/up")).body(vec![0u8; 1025]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
    assert!(err.to_string().contains("max_req_bytes"), "{err}");
    assert_eq!(srv.connections(), 0);
    let ok = h
        .client
        .send(NetRequest::post(srv.url("/up")).body(vec![0u8; 1024]))
        .await
        .unwrap();
    assert_eq!(ok.status, 200);
    srv.join().await;
}

#[tokio::test]
async fn declared_content_length_over_the_limit_is_refused_before_reading() {
    let srv = FaultServer::http1()
        .route("/big", Reply::huge(1 << 30))
        .route("/fits", Reply::huge(4096))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.security.max_resp_bytes = ByteSize(4096);
    let h = harness(p);
    let err = h
        .client
        .send(NetRequest::get(srv.url("/big")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    assert_eq!(err.code(), ErrorCode::ProviderUnavailable);
    let body = h
        .client
        .send(NetRequest::get(srv.url("/fits")))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(body.len(), 4096);
    srv.join().await;
}
