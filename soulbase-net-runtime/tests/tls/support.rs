//! Shared helpers: a TLS test server, connecting, one request over the stream, pins.

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig};
use soulbase_net_core::ErrorKind;
use soulbase_net_policy::TlsPolicy;
use soulbase_net_runtime::tls::classify_error;
use soulbase_net_testkit::{CertKit, FaultServer, Reply};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::client::TlsStream;

pub(crate) type BoxError = Box<dyn StdError + Send + Sync>;

/// Every test finishes within this bound, or fails.
const LIMIT: Duration = Duration::from_secs(10);

/// Runs `f`, failing the test if it takes longer than [`LIMIT`].
pub(crate) async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test exceeded its time bound")
}

/// A TLS FaultServer on 127.0.0.1 answering `GET /` with `200 hello`.
pub(crate) async fn server(cfg: Arc<ServerConfig>) -> FaultServer {
    FaultServer::builder()
        .tls(cfg)
        .route("/", Reply::ok("hello"))
        .start()
        .await
        .unwrap()
}

/// A policy trusting the kit's root through `extra_roots_pem`.
pub(crate) fn trusting(kit: &CertKit) -> TlsPolicy {
    let mut p = TlsPolicy::default();
    p.extra_roots_pem = vec![kit.root_pem()];
    p
}

/// TCP + TLS handshake to `srv`, verifying the server as `name`.
pub(crate) async fn connect(
    cfg: Arc<ClientConfig>,
    srv: &FaultServer,
    name: &str,
) -> io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(srv.addr()).await?;
    let name = ServerName::try_from(name.to_owned()).unwrap();
    tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
}

/// `GET /` over an established stream (HTTP/2 if ALPN chose it): status and body.
pub(crate) async fn get(tls: TlsStream<TcpStream>) -> Result<(u16, Bytes), BoxError> {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    let io = TokioIo::new(tls);
    if h2 {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        let conn = tokio::spawn(conn);
        let req = http::Request::get("https://localhost/").body(Empty::<Bytes>::new())?;
        finish(send.send_request(req).await, conn).await
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await?;
        let conn = tokio::spawn(conn);
        let req = http::Request::get("/")
            .header(http::header::HOST, "localhost")
            .body(Empty::<Bytes>::new())?;
        finish(send.send_request(req).await, conn).await
    }
}

async fn finish(
    res: Result<http::Response<Incoming>, hyper::Error>,
    conn: JoinHandle<Result<(), hyper::Error>>,
) -> Result<(u16, Bytes), BoxError> {
    match res {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok((status, body))
        }
        Err(e) => {
            // When the request's error does not carry the TLS cause, the connection's does.
            if classify_error(&e).is_none() {
                if let Ok(Err(conn_err)) = conn.await {
                    return Err(conn_err.into());
                }
            }
            Err(e.into())
        }
    }
}

/// Handshake then `GET /`: the first error of either.
pub(crate) async fn attempt(
    cfg: Arc<ClientConfig>,
    srv: &FaultServer,
    name: &str,
) -> Result<(u16, Bytes), BoxError> {
    let tls = connect(cfg, srv, name).await?;
    get(tls).await
}

/// The kind `classify_error` gives a boxed error.
pub(crate) fn kind_of(err: &BoxError) -> Option<ErrorKind> {
    classify_error(&**err)
}

/// The first `rustls::Error` in the chain (looking inside `io::Error`s).
pub(crate) fn rustls_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        next = match e.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    None
}

/// Standard base64 (with padding), enough for 32-byte pins.
pub(crate) fn b64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn b64_matches_the_testkit() {
    let kit = CertKit::new().unwrap();
    let leaf = kit.localhost().unwrap();
    assert_eq!(b64(&leaf.spki_sha256_bytes()), leaf.spki_sha256());
    assert_eq!(b64(b"ab"), "YWI=");
    assert_eq!(b64(b"a"), "YQ==");
}
