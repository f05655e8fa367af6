//! The form a request takes on its connection: the `Host` header, origin form for a direct
//! HTTP/1.1 connection and the absolute form again for a resend, the size of a response
//! head, and which methods are idempotent.

use http::{
    uri::{Authority, Parts},
    HeaderValue, Response, Uri,
};
use soulbase_net_core::NetError;

use super::Origin;

/// Whether `method` is idempotent by definition (RFC 9110 §9.2.2).
pub(super) fn is_idempotent(method: &http::Method) -> bool {
    use http::Method;
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The most an HTTP/1.1 connection reads at once, and so the largest response head it can
/// parse: hyper's own default (8 KiB + 100 × 4 KiB), or the head limit when that is larger.
/// hyper grows its reads toward it, so a large body arrives in a few large frames rather than
/// many small ones (with a 64 KiB buffer a 1 MiB body took 16 reads, frames and buffer
/// splits). The head limit itself is checked on the parsed head ([`head_len`]).
pub(super) const READ_BUF_MAX: usize = 8192 + 4096 * 100;

/// The size of an HTTP/1.1 response head as it came, near enough: a status line without its
/// reason phrase, each field as `name: value` and CRLF, and the blank line.
pub(super) fn head_len<B>(res: &Response<B>) -> usize {
    const STATUS_LINE: usize = "HTTP/1.1 200 \r\n".len();
    let fields: usize = res
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    STATUS_LINE + fields + 2
}

/// The `Host` header for `authority`, read into its `host` and `port` (see
/// [`host_port`](crate::transport::authority::host_port)): the host, and the port unless it
/// is the scheme's default (RFC 9110 §7.2); userinfo never (the request was validated
/// without it).
pub(super) fn host_header(
    authority: &Authority,
    host: &str,
    port: Option<u16>,
    https: bool,
) -> Result<HeaderValue, NetError> {
    let default_port = if https { 443 } else { 80 };
    let host = match port {
        Some(port) if port != default_port => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    HeaderValue::try_from(host).map_err(|e| {
        NetError::invalid_request(format!("`{authority}` is not a valid Host header"))
            .with_source(e)
    })
}

/// The absolute form of `path` (an origin-form target) at `origin`: what [`origin_form`]
/// took away, for a request that goes again on another connection.
pub(super) fn absolute_form<B>(origin: &Origin<B>, path: &Uri) -> Result<Uri, NetError> {
    let mut parts = Parts::default();
    parts.scheme = Some(if origin.https {
        http::uri::Scheme::HTTPS
    } else {
        http::uri::Scheme::HTTP
    });
    parts.authority =
        Some(Authority::try_from(origin.host.as_bytes()).map_err(|e| {
            NetError::invalid_request("the origin is not an authority").with_source(e)
        })?);
    parts.path_and_query = path.path_and_query().cloned();
    Uri::from_parts(parts).map_err(|e| {
        NetError::invalid_request("url path is not a valid request target").with_source(e)
    })
}

/// Puts `uri` in origin form (path and query) for a direct HTTP/1.1 connection; returns the
/// absolute form it had.
pub(super) fn origin_form(uri: &mut Uri) -> Result<Uri, NetError> {
    let origin_form = match uri.path_and_query() {
        Some(path) if path.as_str() != "/" => {
            let mut parts = Parts::default();
            parts.path_and_query = Some(path.clone());
            Uri::from_parts(parts).map_err(|e| {
                NetError::invalid_request("url path is not a valid request target").with_source(e)
            })?
        }
        _ => Uri::from_static("/"),
    };
    Ok(std::mem::replace(uri, origin_form))
}
