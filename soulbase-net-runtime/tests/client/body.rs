//! Response bodies through the client: the size limit while streaming, the read timeout,
//! decoding and the decompression bomb.

use std::time::Duration;

use soulbase_net_core::{ErrorKind, NetRequest, Phase, TimeoutCfg};
use soulbase_net_policy::ByteSize;
use soulbase_net_testkit::{FaultServer, Reply};

use crate::support::{harness, harness_with, loopback_policy};

#[tokio::test]
async fn the_limit_holds_while_streaming_without_content_length() {
    let srv = FaultServer::http1()
        .route("/exact", Reply::huge(8192).without_content_length())
        .route("/over", Reply::huge(8193).without_content_length())
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.security.max_resp_bytes = ByteSize(8192);
    let h = harness(p);
    let body = h
        .client
        .send(NetRequest::get(srv.url("/exact")))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(body.len(), 8192);
    let res = h
        .client
        .send(NetRequest::get(srv.url("/over")))
        .await
        .unwrap();
    assert_eq!(res.bytes().await.unwrap_err().kind(), ErrorKind::TooLarge);
    srv.join().await;
}

#[tokio::test]
async fn a_stalled_body_hits_the_read_timeout() {
    let mut srv = FaultServer::http1()
        .route("/stall", Reply::huge(1 << 20).stall_after(1000))
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    let req = NetRequest::get(srv.url("/stall"))
        .timeout(TimeoutCfg::default().with_read(Duration::from_millis(150)));
    let res = h.client.send(req).await.unwrap();
    assert_eq!(
        res.bytes().await.unwrap_err().kind(),
        ErrorKind::Timeout(Phase::Read)
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn gzip_and_brotli_are_decoded_and_a_bomb_stops_at_the_limit() {
    let srv = FaultServer::http1()
        .route("/gz", Reply::gzip(b"hello gzip"))
        .route("/br", Reply::brotli(b"hello br"))
        .route("/bomb", Reply::gzip_bomb(256 << 20))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.security.max_resp_bytes = ByteSize(1 << 20);
    let h = harness(p);
    let res = h
        .client
        .send(NetRequest::get(srv.url("/gz")))
        .await
        .unwrap();
    assert!(res.headers.get("content-encoding").is_none());
    assert_eq!(res.text().await.unwrap(), "hello gzip");
    assert_eq!(
        srv.requests("/gz")[0].header("accept-encoding"),
        Some("gzip, br, zstd")
    );
    let res = h
        .client
        .send(NetRequest::get(srv.url("/br")))
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap(), "hello br");
    let res = h
        .client
        .send(NetRequest::get(srv.url("/bomb")))
        .await
        .unwrap();
    assert_eq!(res.bytes().await.unwrap_err().kind(), ErrorKind::TooLarge);

    // Decompression off: the body arrives as sent.
    let raw = harness_with(loopback_policy(), |b| b.decompress(false));
    let res = raw
        .client
        .send(NetRequest::get(srv.url("/gz")))
        .await
        .unwrap();
    assert_eq!(res.headers["content-encoding"], "gzip");
    assert_ne!(res.bytes().await.unwrap(), "hello gzip");
    srv.join().await;
}
