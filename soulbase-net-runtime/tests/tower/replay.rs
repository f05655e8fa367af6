//! Bodies the tower face keeps (`retry.replay_buffer`) and when it sends a request again: a
//! refused HTTP/2 stream whatever the method, an attempt that never left the client whatever
//! the method, any retryable outcome for a request with an `Idempotency-Key` — and never a
//! body over the buffer, nor a POST whose attempt may have reached the server.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use soulbase_net_core::{ErrorKind, NetError, Phase};
use soulbase_net_policy::{ByteSize, NetPolicy};
use soulbase_net_runtime::{Client, DialFuture, Dialer};
use soulbase_net_testkit::{FaultServer, Reply, Script};
use tower::ServiceExt;

use super::{bounded, loopback_policy, LoopbackDialer};

/// A gRPC unary request's body: one length-prefixed message.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(message);
    Bytes::from(frame)
}

/// A gRPC-shaped POST: what a tonic unary call sends, with its body whole and at hand.
fn grpc_post(url: String, body: Bytes) -> http::Request<Full<Bytes>> {
    http::Request::post(url)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(body))
        .unwrap()
}

/// The loopback policy speaking h2c to every host (`pool.http2_prior_knowledge`).
fn h2c_policy() -> NetPolicy {
    let mut p = loopback_policy();
    p.pool.http2_prior_knowledge = Some(true);
    p
}

fn client(policy: NetPolicy) -> Client {
    client_with(policy, Arc::new(LoopbackDialer::default()))
}

fn client_with(policy: NetPolicy, dialer: Arc<dyn Dialer>) -> Client {
    Client::builder()
        .policy(policy)
        .dialer(dialer)
        .build()
        .unwrap()
}

/// Sends `req` through the tower face; the status and the body read whole.
async fn call<B>(client: &Client, req: http::Request<B>) -> Result<(StatusCode, Bytes), NetError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<soulbase_net_core::BoxError>,
{
    let res = bounded(client.clone().oneshot(req)).await?;
    let status = res.status();
    let body = res.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// Opens the client's HTTP/2 connection to `srv` with a GET: the next request is the
/// connection's second stream.
async fn warm_up(client: &Client, srv: &FaultServer) {
    let req = http::Request::get(srv.url("/warm"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let (status, _) = call(client, req).await.unwrap();
    assert_eq!(status, StatusCode::OK);
}

const QUOTE: &str = "/pricing.v1.Pricing/Quote";

async fn refusing_server() -> FaultServer {
    // Every second stream of a connection is refused (REFUSED_STREAM, not processed).
    FaultServer::http2()
        .refuse_streams(2)
        .route("/warm", Reply::ok("warm"))
        .route(
            QUOTE,
            Reply::ok("quoted").header("content-type", "application/grpc"),
        )
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_grpc_post_whose_stream_was_refused_goes_again_with_its_body() {
    let srv = refusing_server().await;
    let mut policy = h2c_policy();
    // Not what sends it again: a refused stream goes outside the retry accounting.
    policy.retry.max_attempts = 2;
    let client = client(policy);
    warm_up(&client, &srv).await;

    let body = grpc_frame(b"\x0a\x03sku");
    let (status, answer) = call(&client, grpc_post(srv.url(QUOTE), body.clone()))
        .await
        .unwrap();

    assert_eq!((status, &answer[..]), (StatusCode::OK, &b"quoted"[..]));
    // The server saw two attempts: the refused stream, then the one it answered — which
    // carried the whole body, read once from the caller and kept.
    assert_eq!(srv.refused(), 1);
    assert_eq!(srv.hits(QUOTE), 1);
    let seen = srv.requests(QUOTE);
    assert_eq!(seen[0].method, Method::POST);
    assert_eq!(seen[0].body, body);
    assert_eq!(seen[0].version, http::Version::HTTP_2);
    srv.join().await;
}

#[tokio::test]
async fn a_body_over_the_replay_buffer_is_sent_once() {
    let srv = refusing_server().await;
    let mut policy = h2c_policy();
    policy.retry.replay_buffer = ByteSize::b(16);
    let client = client(policy);
    warm_up(&client, &srv).await;

    let body = grpc_frame(&[7u8; 32]);
    let err = call(&client, grpc_post(srv.url(QUOTE), body))
        .await
        .unwrap_err();

    // Over 16 bytes: streamed, so the refused request cannot go again; the caller learns
    // that the server did not process it.
    assert_eq!(err.kind(), ErrorKind::NotProcessed, "{err:?}");
    assert_eq!(srv.refused(), 1);
    assert_eq!(srv.hits(QUOTE), 0);

    // Within the buffer, the same call goes again: after another warm-up, its stream is
    // refused too, and it is sent again on the next one.
    warm_up(&client, &srv).await;
    let small = grpc_frame(b"ok");
    let (status, _) = call(&client, grpc_post(srv.url(QUOTE), small.clone()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(srv.refused(), 2);
    assert_eq!(srv.hits(QUOTE), 1);
    assert_eq!(srv.requests(QUOTE)[0].body, small);
    srv.join().await;
}

#[tokio::test]
async fn an_idempotency_key_lets_max_attempts_apply_to_a_post() {
    let srv = FaultServer::http1()
        .route(
            "/keyed",
            Script::status(503).times(1).then(Reply::ok("charged")),
        )
        .route(
            "/plain",
            Script::status(503).times(1).then(Reply::ok("charged")),
        )
        .start()
        .await
        .unwrap();
    let mut policy = loopback_policy();
    policy.retry.max_attempts = 2;
    let client = client(policy);

    let keyed = http::Request::post(srv.url("/keyed"))
        .header("idempotency-key", "order-42")
        .body(Full::new(Bytes::from_static(b"amount=5")))
        .unwrap();
    let (status, body) = call(&client, keyed).await.unwrap();
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"charged"[..]));
    assert_eq!(srv.hits("/keyed"), 2);
    let seen = srv.requests("/keyed");
    assert!(seen.iter().all(|r| r.body == "amount=5"), "{seen:?}");
    assert!(seen
        .iter()
        .all(|r| r.header("idempotency-key") == Some("order-42")));

    // Without a key the server may have acted on the POST: its 503 comes back as it is.
    let plain = http::Request::post(srv.url("/plain"))
        .body(Full::new(Bytes::from_static(b"amount=5")))
        .unwrap();
    let (status, _) = call(&client, plain).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(srv.hits("/plain"), 1);
    srv.join().await;
}

/// Refuses the first `fail` dials (connection refused), then dials loopback; counts dials.
#[derive(Debug)]
struct FailFirst {
    fail: u64,
    dials: AtomicU64,
}

impl Dialer for FailFirst {
    fn dial(&self, addr: SocketAddr) -> DialFuture {
        let n = self.dials.fetch_add(1, Ordering::SeqCst);
        if n < self.fail {
            return Box::pin(async move {
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!("test dialer refuses dial {n} to {addr}"),
                ))
            });
        }
        LoopbackDialer::default().dial(addr)
    }
}

#[tokio::test]
async fn a_post_that_never_left_the_client_goes_again_and_one_that_timed_out_does_not() {
    let srv = FaultServer::http1()
        .route("/orders", Reply::ok("placed"))
        .route("/slow", Reply::ok("late").delay(Duration::from_secs(2)))
        .start()
        .await
        .unwrap();
    let dialer = Arc::new(FailFirst {
        fail: 1,
        dials: AtomicU64::new(0),
    });
    let mut policy = loopback_policy();
    policy.retry.max_attempts = 2;
    let t = &mut policy.timeout;
    (t.connect, t.read, t.write) = (Duration::from_millis(500), t.attempt, t.attempt);
    t.ttfb = Duration::from_millis(200);
    let client = client_with(policy, dialer.clone());

    // The first dial is refused: nothing was sent, so the POST goes again.
    let post = http::Request::post(srv.url("/orders"))
        .body(Full::new(Bytes::from_static(b"one order")))
        .unwrap();
    let (status, _) = call(&client, post).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(dialer.dials.load(Ordering::SeqCst), 2);
    assert_eq!(srv.hits("/orders"), 1);
    assert_eq!(srv.requests("/orders")[0].body, "one order");

    // The request reached the server and no answer came in time: it may have been acted
    // on, so it is not sent again.
    let post = http::Request::post(srv.url("/slow"))
        .body(Full::new(Bytes::from_static(b"one order")))
        .unwrap();
    let err = call(&client, post).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Ttfb), "{err:?}");
    assert_eq!(srv.hits("/slow"), 1);
    srv.join().await;
}
