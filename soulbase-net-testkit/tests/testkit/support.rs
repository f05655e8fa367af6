//! Plain hyper-util clients and error classification for the tests.

use std::error::Error as StdError;
use std::io;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub(crate) type H1Client = Client<HttpConnector, Full<Bytes>>;

/// A pooled HTTP/1.1 client that never retries on its own.
pub(crate) fn h1() -> H1Client {
    Client::builder(TokioExecutor::new())
        .retry_canceled_requests(false)
        .build_http()
}

/// A pooled HTTP/2 prior-knowledge client.
pub(crate) fn h2c() -> H1Client {
    Client::builder(TokioExecutor::new())
        .retry_canceled_requests(false)
        .http2_only(true)
        .build_http()
}

pub(crate) async fn get(
    c: &H1Client,
    url: &str,
) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
    c.get(url.parse().unwrap()).await
}

pub(crate) fn req(method: &str, url: &str) -> http::request::Builder {
    Request::builder().method(method).uri(url)
}

pub(crate) fn empty() -> Full<Bytes> {
    Full::new(Bytes::new())
}

/// Reads the whole body.
pub(crate) async fn body(res: Response<Incoming>) -> Result<Bytes, hyper::Error> {
    Ok(res.into_body().collect().await?.to_bytes())
}

/// Reads the body frame by frame, counting bytes, until it ends or fails.
pub(crate) async fn drain(res: Response<Incoming>) -> (u64, Option<hyper::Error>) {
    let mut body = res.into_body();
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => n += f.data_ref().map_or(0, |d| d.len() as u64),
            Err(e) => return (n, Some(e)),
        }
    }
    (n, None)
}

/// The io::ErrorKind somewhere in the source chain, if any.
pub(crate) fn io_kind(e: &(dyn StdError + 'static)) -> Option<io::ErrorKind> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(ioe) = err.downcast_ref::<io::Error>() {
            return Some(ioe.kind());
        }
        cur = err.source();
    }
    None
}

pub(crate) fn is_reset(e: &(dyn StdError + 'static)) -> bool {
    io_kind(e) == Some(io::ErrorKind::ConnectionReset)
}

/// A hyper error somewhere in the chain.
pub(crate) fn hyper_err<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a hyper::Error> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            return Some(h);
        }
        cur = err.source();
    }
    None
}

/// An upper bound for what must happen promptly (generous: the machine may be loaded).
pub(crate) const SHORT: Duration = Duration::from_secs(2);
