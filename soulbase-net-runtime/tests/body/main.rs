//! Response bodies over real loopback sockets: hyper's `Incoming` from the testkit's
//! FaultServer, wrapped in `LimitedBody` and `decode` as the client will do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{header, Method, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use soulbase_net_core::{ErrorKind, NetError, Phase};
use soulbase_net_runtime::body::{check_content_length, collect, decode, LimitedBody};
use soulbase_net_testkit::{FaultServer, Reply};
use tokio::time::Instant;

const LIMIT: u64 = 64 * 1024;
const TEXT: &str = "soulbase-net decodes what it asked for, and no more than it allows. ";

type TestClient = Client<HttpConnector, Empty<Bytes>>;

fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn serve(reply: Reply) -> FaultServer {
    FaultServer::http1()
        .route("/r", reply)
        .start()
        .await
        .unwrap()
}

async fn fetch(srv: &FaultServer, method: Method) -> Response<Incoming> {
    let req = Request::builder()
        .method(method)
        .uri(srv.url("/r"))
        .body(Empty::new())
        .unwrap();
    client().request(req).await.unwrap()
}

/// Reads frames until the end or the first error; returns the data bytes read and the error.
async fn drain<B>(body: B) -> (u64, Option<NetError>)
where
    B: Body<Data = Bytes, Error = NetError>,
{
    let mut body = std::pin::pin!(body);
    let mut read = 0u64;
    loop {
        match body.frame().await {
            None => return (read, None),
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, |d| d.len() as u64),
            Some(Err(e)) => return (read, Some(e)),
        }
    }
}

// === size ===

#[tokio::test]
async fn a_body_of_exactly_the_limit_is_read_and_counted() {
    let srv = serve(Reply::huge(LIMIT)).await;
    let resp = fetch(&srv, Method::GET).await;
    check_content_length(resp.headers(), LIMIT).unwrap();
    let counter = Arc::new(AtomicU64::new(0));
    let body = LimitedBody::new(resp.into_body(), LIMIT).counter(Arc::clone(&counter));
    assert_eq!(collect(body).await.unwrap().len() as u64, LIMIT);
    assert_eq!(counter.load(Ordering::Relaxed), LIMIT);
    srv.join().await;
}

#[tokio::test]
async fn one_byte_over_the_limit_is_refused_by_its_declared_length() {
    let srv = serve(Reply::huge(LIMIT + 1)).await;
    let resp = fetch(&srv, Method::GET).await;
    let err = check_content_length(resp.headers(), LIMIT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    assert!(err.to_string().contains("security.max_resp_bytes"), "{err}");
    drop(resp);
    srv.join().await;
}

#[tokio::test]
async fn one_byte_over_the_limit_without_a_length_stops_at_the_limit() {
    let srv = serve(Reply::huge(LIMIT + 1).without_content_length()).await;
    let resp = fetch(&srv, Method::GET).await;
    assert!(resp.headers().get(header::CONTENT_LENGTH).is_none());
    check_content_length(resp.headers(), LIMIT).unwrap();
    let mut body = LimitedBody::new(resp.into_body(), LIMIT);
    let counter = body.bytes_counter();
    let (read, err) = drain(body).await;
    assert_eq!(err.unwrap().kind(), ErrorKind::TooLarge);
    assert!(
        read <= LIMIT && counter.load(Ordering::Relaxed) == read,
        "{read}"
    );
    srv.join().await;
}

#[tokio::test]
async fn a_huge_body_without_a_length_stops_at_the_limit() {
    let srv = serve(Reply::huge(1 << 30).without_content_length()).await;
    let resp = fetch(&srv, Method::GET).await;
    let (read, err) = drain(LimitedBody::new(resp.into_body(), LIMIT)).await;
    assert_eq!(err.unwrap().kind(), ErrorKind::TooLarge);
    assert!(read <= LIMIT, "{read}");
    srv.join().await;
}

// === lying Content-Length ===

#[tokio::test]
async fn a_length_claimed_over_the_limit_is_refused_even_for_a_small_body() {
    let srv = serve(Reply::ok("tiny").content_length(LIMIT + 1)).await;
    let resp = fetch(&srv, Method::GET).await;
    let err = check_content_length(resp.headers(), LIMIT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    srv.join().await;
}

#[tokio::test]
async fn a_length_claiming_more_than_is_sent_is_an_io_error() {
    let srv = serve(Reply::ok("short").content_length(1000)).await;
    let resp = fetch(&srv, Method::GET).await;
    check_content_length(resp.headers(), LIMIT).unwrap();
    let mut body = LimitedBody::new(resp.into_body(), LIMIT);
    let counter = body.bytes_counter();
    let err = collect(body).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(err.find_source::<hyper::Error>().is_some(), "{err:?}");
    assert_eq!(counter.load(Ordering::Relaxed), 5);
    srv.join().await;
}

// === time ===

#[tokio::test]
async fn a_body_stalled_after_the_head_hits_the_read_timeout() {
    let srv = serve(Reply::huge(1000).stall_after_head()).await;
    let resp = fetch(&srv, Method::GET).await;
    let body = LimitedBody::new(resp.into_body(), LIMIT).read_timeout(Duration::from_millis(200));
    let (read, err) = drain(body).await;
    assert_eq!(err.unwrap().kind(), ErrorKind::Timeout(Phase::Read));
    assert_eq!(read, 0);
    srv.join().await;
}

#[tokio::test]
async fn a_body_stalled_half_way_hits_the_read_timeout_after_its_bytes() {
    let srv = serve(Reply::huge(10_000).stall_after(1000)).await;
    let resp = fetch(&srv, Method::GET).await;
    let mut body =
        LimitedBody::new(resp.into_body(), LIMIT).read_timeout(Duration::from_millis(200));
    let counter = body.bytes_counter();
    let (read, err) = drain(body).await;
    assert_eq!(err.unwrap().kind(), ErrorKind::Timeout(Phase::Read));
    assert_eq!(read, 1000);
    assert_eq!(counter.load(Ordering::Relaxed), 1000);
    srv.join().await;
}

#[tokio::test]
async fn a_drip_under_the_read_timeout_hits_the_total_deadline() {
    // A chunk every 20ms never trips a 2s read timeout; the 300ms deadline stops it.
    let srv = serve(Reply::huge(10_000).slow_body(10, Duration::from_millis(20))).await;
    let resp = fetch(&srv, Method::GET).await;
    let deadline = Instant::now() + Duration::from_millis(300);
    let body = LimitedBody::new(resp.into_body(), LIMIT)
        .read_timeout(Duration::from_secs(2))
        .deadline(deadline);
    let (read, err) = drain(body).await;
    assert_eq!(err.unwrap().kind(), ErrorKind::Timeout(Phase::Total));
    assert!(Instant::now() >= deadline);
    assert!(read > 0 && read < 10_000, "{read}");
    srv.join().await;
}

// === decoding ===

#[tokio::test]
async fn gzip_and_brotli_bodies_are_decoded() {
    let text = TEXT.repeat(50);
    for reply in [Reply::gzip(&text), Reply::brotli(&text)] {
        let srv = serve(reply).await;
        let resp = fetch(&srv, Method::GET).await;
        let (mut parts, incoming) = resp.into_parts();
        let encoded_len = parts.headers[header::CONTENT_LENGTH].clone();
        let mut wire = LimitedBody::new(incoming, LIMIT);
        let wire_bytes = wire.bytes_counter();
        let body = decode(wire, &mut parts.headers, LIMIT, true).unwrap();
        assert_eq!(collect(body).await.unwrap(), text.as_bytes());
        assert!(parts.headers.get(header::CONTENT_ENCODING).is_none());
        assert!(parts.headers.get(header::CONTENT_LENGTH).is_none());
        assert_eq!(
            wire_bytes.load(Ordering::Relaxed).to_string(),
            encoded_len.to_str().unwrap()
        );
        srv.join().await;
    }
}

#[tokio::test]
async fn a_decompression_bomb_stops_at_the_limit() {
    let srv = serve(Reply::gzip_bomb(512 << 20)).await;
    let resp = fetch(&srv, Method::GET).await;
    let (mut parts, incoming) = resp.into_parts();
    let encoded: u64 = parts.headers[header::CONTENT_LENGTH]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // The compressed body itself is under the cap: only the decoded bytes are too many.
    let max = 1 << 20;
    check_content_length(&parts.headers, max).unwrap();
    let mut wire = LimitedBody::new(incoming, max);
    let wire_bytes = wire.bytes_counter();
    let (read, err) = drain(decode(wire, &mut parts.headers, max, true).unwrap()).await;
    assert_eq!(err.unwrap().kind(), ErrorKind::TooLarge);
    assert!(read <= max, "{read}");
    let consumed = wire_bytes.load(Ordering::Relaxed);
    assert!(
        consumed < encoded / 8,
        "read {consumed} of {encoded} encoded bytes"
    );
    srv.join().await;
}

#[tokio::test]
async fn a_connection_closed_inside_an_encoded_body_is_an_io_error() {
    let srv = serve(Reply::gzip(TEXT.repeat(50)).close_after(10)).await;
    let resp = fetch(&srv, Method::GET).await;
    let (mut parts, incoming) = resp.into_parts();
    let wire = LimitedBody::new(incoming, LIMIT);
    let err = collect(decode(wire, &mut parts.headers, LIMIT, true).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(err.find_source::<hyper::Error>().is_some(), "{err:?}");
    srv.join().await;
}

#[tokio::test]
async fn a_head_response_with_an_encoding_passes_through_empty() {
    let srv = serve(Reply::gzip(TEXT)).await;
    let resp = fetch(&srv, Method::HEAD).await;
    let (mut parts, incoming) = resp.into_parts();
    let body = decode(
        LimitedBody::new(incoming, LIMIT),
        &mut parts.headers,
        LIMIT,
        true,
    )
    .unwrap();
    assert!(collect(body).await.unwrap().is_empty());
    assert_eq!(parts.headers[header::CONTENT_ENCODING], "gzip");
    srv.join().await;
}
