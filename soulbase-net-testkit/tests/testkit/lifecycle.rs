//! FaultServer connection lifecycle: retirement after N requests (nginx `keepalive_requests`)
//! or on demand (`nginx -s reload`), and HTTP/2 streams refused with `REFUSED_STREAM`, seen by
//! plain hyper connections over loopback.

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use soulbase_net_testkit::{CertKit, FaultServer, Reply};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::timeout;

use crate::support::*;
use crate::tls::connect;

/// Bound on each test (generous: the machine may be loaded).
const BOUND: Duration = Duration::from_secs(10);

type Conn = JoinHandle<Result<(), hyper::Error>>;

/// One HTTP/2 connection over `io`, its driver spawned.
async fn h2_over<I>(io: I) -> (http2::SendRequest<Empty<Bytes>>, Conn)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .unwrap();
    (send, tokio::spawn(conn))
}

/// One HTTP/2 prior-knowledge connection to `addr`.
async fn h2_to(addr: SocketAddr) -> (http2::SendRequest<Empty<Bytes>>, Conn) {
    h2_over(TcpStream::connect(addr).await.unwrap()).await
}

/// One HTTP/1.1 connection to `addr`.
async fn h1_to(addr: SocketAddr) -> (http1::SendRequest<Empty<Bytes>>, Conn) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = http1::handshake(TokioIo::new(tcp)).await.unwrap();
    (send, tokio::spawn(conn))
}

fn get_req(url: &str) -> Request<Empty<Bytes>> {
    Request::get(url).body(Empty::new()).unwrap()
}

/// A GET on the HTTP/2 connection `send`.
async fn h2_get(
    send: &mut http2::SendRequest<Empty<Bytes>>,
    url: &str,
) -> Result<Response<Incoming>, hyper::Error> {
    send.ready().await?;
    send.send_request(get_req(url)).await
}

/// The HTTP/2 error code somewhere in the chain of `e`.
fn h2_reason(e: &(dyn StdError + 'static)) -> Option<h2::Reason> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h2e) = err.downcast_ref::<h2::Error>() {
            return h2e.reason();
        }
        cur = err.source();
    }
    None
}

#[tokio::test]
async fn retire_after_sends_goaway_over_h2() {
    timeout(BOUND, async {
        let srv = FaultServer::http2()
            .route("/x", Reply::ok("x"))
            .retire_after(5)
            .start()
            .await
            .unwrap();
        let (mut send, conn) = h2_to(srv.addr()).await;
        for _ in 0..5 {
            let res = h2_get(&mut send, &srv.url("/x")).await.unwrap();
            assert_eq!(body(res).await.unwrap(), "x");
        }
        // The GOAWAY went out before the 5th response: the 6th never reaches the server.
        assert!(h2_get(&mut send, &srv.url("/x")).await.is_err());
        conn.await.unwrap().unwrap();
        assert_eq!(srv.hits("/x"), 5);
        assert_eq!(srv.retired(), 1);
        srv.wait_for_open_at_most(0).await;
        srv.join().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn retire_after_closes_http1_after_the_nth_response() {
    timeout(BOUND, async {
        let srv = FaultServer::http1()
            .route("/x", Reply::ok("x"))
            .retire_after(5)
            .start()
            .await
            .unwrap();
        let (mut send, conn) = h1_to(srv.addr()).await;
        for i in 1..=5 {
            send.ready().await.unwrap();
            let res = send.send_request(get_req("/x")).await.unwrap();
            let close = res
                .headers()
                .get("connection")
                .is_some_and(|v| v == "close");
            assert_eq!(close, i == 5, "request {i}");
            assert_eq!(body(res).await.unwrap(), "x");
        }
        conn.await.unwrap().unwrap();
        assert!(send.ready().await.is_err());
        assert_eq!(srv.hits("/x"), 5);
        assert_eq!(srv.retired(), 1);
        assert_eq!(srv.connections(), 1);
        srv.join().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn retire_connections_sends_goaway_to_idle_connections() {
    timeout(BOUND, async {
        let srv = FaultServer::builder()
            .route("/x", Reply::ok("x"))
            .start()
            .await
            .unwrap();
        let (mut h2_send, h2_conn) = h2_to(srv.addr()).await;
        let (mut h1_send, h1_conn) = h1_to(srv.addr()).await;
        // One request each, so both are served and idle.
        h2_get(&mut h2_send, &srv.url("/x")).await.unwrap();
        h1_send.ready().await.unwrap();
        h1_send.send_request(get_req("/x")).await.unwrap();
        assert_eq!(srv.retired(), 0);

        srv.retire_connections();
        h2_conn.await.unwrap().unwrap();
        assert!(h2_send.is_closed());
        h1_conn.await.unwrap().unwrap();
        assert_eq!(srv.retired(), 2);
        srv.wait_for_open_at_most(0).await;

        // The listener goes on; a connection accepted later is not concerned.
        let (mut send, _conn) = h2_to(srv.addr()).await;
        let res = h2_get(&mut send, &srv.url("/x")).await.unwrap();
        assert_eq!(body(res).await.unwrap(), "x");
        assert_eq!(srv.retired(), 2);
        assert_eq!(srv.hits("/x"), 3);
        srv.join().await;
    })
    .await
    .unwrap();
}

/// Sends `n` GETs one after the other on `send`: the body of each answered, the HTTP/2 error
/// code of each that failed.
async fn sequential(
    send: &mut http2::SendRequest<Empty<Bytes>>,
    url: &str,
    n: usize,
) -> Vec<Result<Bytes, Option<h2::Reason>>> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(match h2_get(send, url).await {
            Ok(res) => Ok(body(res).await.unwrap()),
            Err(e) => Err(h2_reason(&e)),
        });
    }
    out
}

#[tokio::test]
async fn refuse_streams_resets_every_nth_stream_unread() {
    timeout(BOUND, async {
        let srv = FaultServer::http2()
            .route("/x", Reply::ok("x"))
            .refuse_streams(2)
            .start()
            .await
            .unwrap();
        let (mut send, _conn) = h2_to(srv.addr()).await;
        let got = sequential(&mut send, &srv.url("/x"), 10).await;
        for (i, r) in got.iter().enumerate() {
            if (i + 1) % 2 == 0 {
                assert_eq!(
                    r,
                    &Err(Some(h2::Reason::REFUSED_STREAM)),
                    "request {}",
                    i + 1
                );
            } else {
                assert_eq!(r, &Ok(Bytes::from("x")), "request {}", i + 1);
            }
        }
        assert_eq!(srv.hits("/x"), 5);
        assert_eq!(srv.refused(), 5);
        assert_eq!(srv.received_requests().len(), 5);
        assert_eq!(srv.connections(), 1);
        srv.join().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn refuse_streams_over_tls_and_with_retirement() {
    timeout(BOUND, async {
        let kit = CertKit::new().unwrap();
        let srv = FaultServer::builder()
            .tls(kit.localhost().unwrap().server_config().unwrap())
            .route("/x", Reply::ok("x"))
            .refuse_streams(3)
            .retire_after(3)
            .start()
            .await
            .unwrap();
        let tls = connect(
            srv.addr(),
            kit.client_config().unwrap(),
            "localhost",
            &[b"h2"],
        )
        .await
        .unwrap();
        let (mut send, conn) = h2_over(tls).await;
        let got = sequential(&mut send, &srv.url("/x"), 4).await;
        // Streams 1, 2 answered, 3 refused (not a request), 4 answered: the third request,
        // which retires the connection.
        let x = Ok(Bytes::from("x"));
        assert_eq!(
            got[..3],
            [x.clone(), x.clone(), Err(Some(h2::Reason::REFUSED_STREAM))]
        );
        assert_eq!(got[3], x);
        assert!(h2_get(&mut send, &srv.url("/x")).await.is_err());
        conn.await.unwrap().unwrap();
        assert_eq!((srv.hits("/x"), srv.refused(), srv.retired()), (3, 1, 1));
        srv.join().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn lifecycle_faults_are_validated_at_start() {
    let kind = |r: std::io::Result<FaultServer>| r.unwrap_err().kind();
    let invalid = std::io::ErrorKind::InvalidInput;
    assert_eq!(
        kind(FaultServer::http1().refuse_streams(2).start().await),
        invalid
    );
    // Auto on plain TCP could be HTTP/1.1.
    assert_eq!(
        kind(FaultServer::builder().refuse_streams(2).start().await),
        invalid
    );
    assert_eq!(
        kind(FaultServer::http2().refuse_streams(0).start().await),
        invalid
    );
    assert_eq!(
        kind(FaultServer::http2().retire_after(0).start().await),
        invalid
    );
}
