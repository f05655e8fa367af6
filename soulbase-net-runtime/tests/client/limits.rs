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

#[tokio::test]
async fn response_heads_over_the_header_limits_are_refused() {
    let srv = FaultServer::http1()
        .route("/many", Reply::ok("x").many_headers(500))
        .route("/huge", Reply::ok("x").huge_header(1 << 20))
        .route("/fine", Reply::ok("x").many_headers(50))
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    for path in ["/many", "/huge"] {
        let err = h
            .client
            .send(NetRequest::get(srv.url(path)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TooLarge, "{path}: {err}");
    }
    assert_eq!(
        h.client
            .send(NetRequest::get(srv.url("/fine")))
            .await
            .unwrap()
            .status,
        200
    );
    srv.join().await;
}

#[tokio::test]
async fn a_streamed_request_body_is_cut_at_the_limit_while_sending() {
    let srv = FaultServer::http1()
        .route("/up", Reply::ok("ok"))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.security.max_req_bytes = ByteSize(10_000);
    let h = harness(p);
    // A body of unknown length: 20 chunks of 1000 bytes.
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(32);
    for _ in 0..20 {
        tx.send(bytes::Bytes::from(vec![7u8; 1000])).await.unwrap();
    }
    drop(tx);
    let body = ChannelBody(rx);
    let err = h
        .client
        .send(NetRequest::put(srv.url("/up")).body(soulbase_net_core::Body::stream(body)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(err.to_string().contains("max_req_bytes"), "{err}");
    srv.join().await;
}

/// A request body fed from a channel: its length is unknown until it ends.
struct ChannelBody(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
    }
}
