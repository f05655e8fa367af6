//! Forwarding to an upstream (see [`FaultServerBuilder::forward_to`](super::FaultServerBuilder::forward_to)):
//! a [`FaultServer`](super::FaultServer) in front of another server — a wiremock `MockServer`,
//! a local service — passing requests on and answers back, with its faults around them.
//!
//! Why buffered: the request body is already read whole (it is captured), and buffering the
//! upstream's answer lets every fault of a [`Reply`](super::Reply) — pacing, stalls, cuts after
//! N bytes, a lying length — apply to it unchanged. Mock upstreams answer small bodies.
//!
//! It never dials anything but loopback: the upstream must be `http://` on a loopback IP or
//! `localhost`, checked when the server starts.

use std::io;
use std::net::IpAddr;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::capture::CapturedRequest;

/// Headers that belong to one connection (RFC 9110 §7.6.1), never passed on; plus `Host`,
/// which names the upstream on the way there.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// The upstream a server forwards to, with a pooled HTTP/1.1 client of its own.
pub(crate) struct Upstream {
    /// `http://127.0.0.1:PORT`, without a trailing slash.
    origin: String,
    /// What the upstream URL adds before every request path (`/base` of `http://h:p/base`).
    base_path: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// What the upstream answered, ready to become a reply.
#[derive(Debug)]
pub(crate) struct Forwarded {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Upstream {
    /// An upstream at `url`: `http://` on a loopback address or `localhost`, any port, and
    /// an optional base path.
    pub(crate) fn new(url: &str) -> io::Result<Self> {
        let invalid = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("forward_to({url:?}): {why}"),
            )
        };
        let uri: Uri = url.parse().map_err(|_| invalid("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(invalid("only http:// upstreams are supported"));
        }
        let host = uri.host().ok_or_else(|| invalid("no host"))?;
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host.eq_ignore_ascii_case("localhost")
            || literal.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return Err(invalid("the testkit only dials loopback"));
        }
        if uri.query().is_some() {
            return Err(invalid("the upstream URL cannot have a query"));
        }
        let authority = uri.authority().ok_or_else(|| invalid("no host"))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Ok(Self {
            origin: format!("http://{authority}"),
            base_path: uri.path().trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// The upstream's origin, `http://host:port`.
    pub(crate) fn origin(&self) -> &str {
        &self.origin
    }

    /// Sends `req` (whose whole body is `body`) to the upstream: the same method, path and
    /// query (after the upstream's base path), headers less the hop-by-hop ones, and body.
    ///
    /// # Errors
    /// A message saying why no answer came (refused, reset, a bad request head).
    pub(crate) async fn forward(
        &self,
        req: &CapturedRequest,
        body: Bytes,
    ) -> Result<Forwarded, String> {
        let target = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let uri = format!("{}{}{target}", self.origin, self.base_path);
        let mut out = Request::builder()
            .method(req.method.clone())
            .uri(uri)
            .body(Full::new(body))
            .map_err(|e| format!("cannot build the upstream request: {e}"))?;
        *out.headers_mut() = end_to_end(&req.headers);
        // The client names the upstream in `Host` and counts the body itself.
        out.headers_mut().remove(header::HOST);
        out.headers_mut().remove(header::CONTENT_LENGTH);
        let res = self
            .client
            .request(out)
            .await
            .map_err(|e| format!("upstream {} did not answer: {}", self.origin, chain(&e)))?;
        let (parts, body) = res.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("upstream {} body failed: {}", self.origin, chain(&e)))?
            .to_bytes();
        Ok(Forwarded {
            status: parts.status,
            headers: end_to_end(&parts.headers),
            body,
        })
    }
}

/// `headers` without the hop-by-hop ones, nor those the `Connection` header names.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .collect();
    let mut out = headers.clone();
    for h in &HOP_BY_HOP {
        out.remove(h);
    }
    out.remove(header::UPGRADE);
    for name in named {
        out.remove(name.as_str());
    }
    out
}

/// An error and its sources, `a: b: c`.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("origin", &self.origin)
            .field("base_path", &self.base_path)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_http_upstreams() {
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost:1/",
            "http://[::1]:9/base",
        ] {
            assert!(Upstream::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "https://127.0.0.1:8080",
            "http://10.0.0.1/",
            "http://example.com/",
            "http://127.0.0.1:1/?q=1",
            "not a url",
        ] {
            let err = Upstream::new(bad).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-hop"),
            ("keep-alive", "timeout=5"),
            ("x-hop", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("proxy-authorization", "Basic eA=="),
            ("upgrade", "h2c"),
            ("x-kept", "yes"),
            ("authorization", "Bearer t"),
        ] {
            h.append(HeaderName::from_static(k), v.parse().unwrap());
        }
        let out = end_to_end(&h);
        let mut names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["authorization", "x-kept"]);
    }
}
