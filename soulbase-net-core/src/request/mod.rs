//! Outbound requests: [`NetRequest`], its builder methods and its validation.

use std::{borrow::Cow, fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{header::HeaderName, HeaderMap, HeaderValue, Method};
use serde::Serialize;
use url::Url;

use crate::{
    body::Body,
    error::NetError,
    recent::{recall, Recent},
    timeout::TimeoutCfg,
};

/// One outbound HTTP request: method, URL, headers, query, body, timeouts, idempotency,
/// and the tenant and policy key that choose its policy.
///
/// Built with chained methods that take and return `self`. A mistake made while building
/// (an invalid header, a body that cannot be serialised) is kept and reported by
/// [`NetRequest::validate`], which every client runs before anything is sent, as
/// `SCHEMA.VALIDATION_FAILED`.
///
/// # Examples
/// ```
/// use soulbase_net_core::{ErrorCode, NetRequest};
///
/// let req = NetRequest::post("https://api.example.com/v1/orders")
///     .header("x-team", "payments")
///     .query("dry_run", "true")
///     .json(&serde_json::json!({"sku": "A-1", "qty": 2}))?
///     .idempotent(true)
///     .tenant("t1");
/// let url = req.validate(1024 * 1024)?;
/// assert_eq!(url.as_str(), "https://api.example.com/v1/orders?dry_run=true");
/// assert!(req.is_retryable_method());
///
/// let bad = NetRequest::get("ftp://files.example.com/x");
/// assert_eq!(bad.validate(1024).unwrap_err().code(), ErrorCode::SchemaValidationFailed);
/// # Ok::<(), soulbase_net_core::NetError>(())
/// ```
pub struct NetRequest {
    /// The method. GET, HEAD and OPTIONS are retried by default; others need
    /// [`NetRequest::idempotent`].
    pub method: Method,
    /// The absolute `http` or `https` URL.
    pub url: String,
    /// Headers; names are case-insensitive.
    pub headers: HeaderMap,
    /// Query pairs appended to the URL; a pair replaces every pair of the same name that is
    /// already in the URL.
    pub query: Vec<(String, String)>,
    /// The body. Default is empty.
    pub body: Body,
    /// Timeouts for this request; `None` fields come from the policy.
    pub timeout: TimeoutCfg,
    /// Whether the call may be repeated without a second side effect. Default is false;
    /// GET, HEAD and OPTIONS are treated as idempotent regardless.
    pub idempotent: bool,
    /// A named policy to apply on top of the host's and tenant's layers: the policy
    /// document's `[keys.<name>]` section (a request naming a key the document does not
    /// define is refused with `SCHEMA.VALIDATION_FAILED`). Default is none.
    pub policy_key: Option<String>,
    /// The tenant the call is made for; selects tenant policies, limits and budgets.
    /// Default is none.
    pub tenant: Option<String>,
    /// Typed values that interceptors attach to the request for each other.
    pub extensions: http::Extensions,
    /// The first mistake made while building, reported by `validate`.
    invalid: Option<Box<str>>,
}

// === impl NetRequest ===

impl NetRequest {
    /// A request with `method` to `url`, no headers and an empty body.
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        NetRequest {
            method,
            url: url.into(),
            headers: HeaderMap::new(),
            query: Vec::new(),
            body: Body::Empty,
            timeout: TimeoutCfg::default(),
            idempotent: false,
            policy_key: None,
            tenant: None,
            extensions: http::Extensions::new(),
            invalid: None,
        }
    }

    /// A GET request.
    pub fn get(url: impl Into<String>) -> Self {
        NetRequest::new(Method::GET, url)
    }

    /// A HEAD request.
    pub fn head(url: impl Into<String>) -> Self {
        NetRequest::new(Method::HEAD, url)
    }

    /// A POST request (not retried unless marked [`idempotent`](NetRequest::idempotent)).
    pub fn post(url: impl Into<String>) -> Self {
        NetRequest::new(Method::POST, url)
    }

    /// A PUT request.
    pub fn put(url: impl Into<String>) -> Self {
        NetRequest::new(Method::PUT, url)
    }

    /// A PATCH request.
    pub fn patch(url: impl Into<String>) -> Self {
        NetRequest::new(Method::PATCH, url)
    }

    /// A DELETE request.
    pub fn delete(url: impl Into<String>) -> Self {
        NetRequest::new(Method::DELETE, url)
    }

    /// An OPTIONS request.
    pub fn options(url: impl Into<String>) -> Self {
        NetRequest::new(Method::OPTIONS, url)
    }

    /// Sets a header, replacing any value it had. An invalid name or value (CR, LF, NUL,
    /// other control characters) is reported by [`NetRequest::validate`].
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        let parsed_name = match HeaderName::from_bytes(name.as_bytes()) {
            Ok(n) => n,
            Err(_) => {
                let shown = name.escape_debug();
                self.note_invalid(|| format!("header name `{shown}` is not a valid token"));
                return self;
            }
        };
        match HeaderValue::from_bytes(value.as_ref()) {
            Ok(v) => {
                self.headers.insert(parsed_name, v);
            }
            Err(_) => self.note_invalid(|| {
                format!("header `{parsed_name}` has an invalid value (CR, LF, NUL or a control character)")
            }),
        }
        self
    }

    /// Adds every header of `headers`, replacing values of the same names.
    pub fn headers(mut self, headers: HeaderMap) -> Self {
        let mut last = None;
        for (name, value) in headers {
            if let Some(name) = name {
                last = Some(name);
            }
            if let Some(name) = &last {
                self.headers.insert(name.clone(), value);
            }
        }
        self
    }

    /// Appends a query pair; it replaces pairs of the same name already in the URL.
    pub fn query(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.query.push((key.into(), value.into()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Body>) -> Self {
        self.body = body.into();
        self
    }

    /// Sets a JSON body from any serialisable value.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidRequest`](crate::ErrorKind::InvalidRequest) if `value` cannot be
    /// represented as JSON (e.g. a map with non-string keys).
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Result<Self, NetError> {
        let value = serde_json::to_value(value).map_err(|e| {
            NetError::invalid_request("body could not be serialised as json")
                .with_source(e)
                .at(&self.method, &self.url)
        })?;
        self.body = Body::Json(value);
        Ok(self)
    }

    /// Sets the per-request timeouts; fields left `None` come from the policy.
    pub fn timeout(mut self, timeout: TimeoutCfg) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the total deadline of this call, retries included.
    ///
    /// A total shorter than the policy's retry schedule needs is not refused: the call is
    /// clamped to it (no attempt starts that cannot finish in time), and the client reports
    /// [`NetEvent::DeadlineClamped`](crate::NetEvent::DeadlineClamped).
    pub fn total_timeout(mut self, total: Duration) -> Self {
        self.timeout.total = Some(total);
        self
    }

    /// Marks the call as safe to repeat (POST/PATCH also need an `Idempotency-Key`, which
    /// the `IdempotencyKey` interceptor adds). Default is false.
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = idempotent;
        self
    }

    /// Sends `key` as the `Idempotency-Key` header and marks the call idempotent, in one
    /// step: a POST or PATCH carrying a key may be retried (the upstream dedups by the key),
    /// and the `IdempotencyKey` interceptor keeps a key that is already there.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_core::NetRequest;
    ///
    /// let req = NetRequest::post("https://pay.example/charges").idempotency_key("order-42-charge");
    /// assert!(req.is_retryable_method());
    /// assert_eq!(req.headers["idempotency-key"], "order-42-charge");
    /// ```
    pub fn idempotency_key(self, key: impl AsRef<[u8]>) -> Self {
        self.header("idempotency-key", key).idempotent(true)
    }

    /// Sets the tenant.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Names the policy to apply on top of the host's and tenant's layers (the policy
    /// document's `[keys.<name>]` section), e.g. a stricter one for payment calls.
    pub fn policy_key(mut self, key: impl Into<String>) -> Self {
        self.policy_key = Some(key.into());
        self
    }

    /// Whether the method allows retries: `idempotent` is set, or the method is GET, HEAD or
    /// OPTIONS (the methods HTTP defines as idempotent and safe to repeat).
    pub fn is_retryable_method(&self) -> bool {
        self.idempotent || matches!(self.method, Method::GET | Method::HEAD | Method::OPTIONS)
    }

    /// Whether the request may be sent more than once: a retryable method and a replayable
    /// body.
    pub fn is_replayable(&self) -> bool {
        self.is_retryable_method() && self.body.is_replayable()
    }

    /// A copy of the request for another attempt; `None` when the body is a stream.
    pub fn try_clone(&self) -> Option<NetRequest> {
        Some(NetRequest {
            method: self.method.clone(),
            url: self.url.clone(),
            headers: self.headers.clone(),
            query: self.query.clone(),
            body: self.body.try_clone()?,
            timeout: self.timeout,
            idempotent: self.idempotent,
            policy_key: self.policy_key.clone(),
            tenant: self.tenant.clone(),
            extensions: self.extensions.clone(),
            invalid: self.invalid.clone(),
        })
    }

    /// Checks the request and returns the URL to send it to (query pairs merged).
    ///
    /// Refused, as [`ErrorKind::InvalidRequest`](crate::ErrorKind::InvalidRequest)
    /// (`SCHEMA.VALIDATION_FAILED`) with a message naming the problem: a mistake made while
    /// building; a URL that is relative, unparsable, not `http`/`https`, without a host, with
    /// userinfo, or whose host looks numeric without being a canonical IPv4 address
    /// (`2130706433`, `0x7f.1`, `127.1` — forms used to slip past address filters); a header
    /// value with CR, LF or NUL; a body whose known size is over `max_req_bytes` (a stream of
    /// unknown size is checked while it is sent).
    ///
    /// # Errors
    /// As above.
    pub fn validate(&self, max_req_bytes: u64) -> Result<Url, NetError> {
        self.validate_shared(max_req_bytes)
            .map(Arc::unwrap_or_clone)
    }

    /// [`validate`](Self::validate), with the URL shared: a URL this thread checked recently
    /// is handed out as it was remembered (a reference count, where [`validate`](Self::validate)
    /// copies it). For a client that checks every request it sends.
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_core::NetRequest;
    ///
    /// let req = NetRequest::get("https://api.example.com/v1/items");
    /// let (a, b) = (req.validate_shared(0).unwrap(), req.validate_shared(0).unwrap());
    /// assert_eq!(a.host_str(), Some("api.example.com"));
    /// assert!(std::sync::Arc::ptr_eq(&a, &b)); // the same parse, remembered
    /// ```
    pub fn validate_shared(&self, max_req_bytes: u64) -> Result<Arc<Url>, NetError> {
        let fail = |msg: String| NetError::invalid_request(msg).at(&self.method, &self.url);
        if let Some(problem) = &self.invalid {
            return Err(fail(problem.to_string()));
        }
        let url = self.target_url().map_err(fail)?;
        self.check_headers()?;
        self.check_body_size(max_req_bytes)?;
        Ok(url)
    }

    /// Checks that no header value contains CR, LF or NUL (the header part of
    /// [`validate`](Self::validate)).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidRequest`](crate::ErrorKind::InvalidRequest) naming the header.
    pub fn check_headers(&self) -> Result<(), NetError> {
        for (name, value) in &self.headers {
            if memchr::memchr3(b'\r', b'\n', 0, value.as_bytes()).is_some() {
                return Err(NetError::invalid_request(format!(
                    "header `{name}` contains CR, LF or NUL"
                ))
                .at(&self.method, &self.url));
            }
        }
        Ok(())
    }

    /// Checks that the body's known size is at most `max_req_bytes` (a stream of unknown size
    /// is checked while it is sent).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidRequest`](crate::ErrorKind::InvalidRequest) naming both sizes.
    pub fn check_body_size(&self, max_req_bytes: u64) -> Result<(), NetError> {
        let size = match &self.body {
            Body::Empty => Some(0),
            Body::Bytes(b) => Some(b.len() as u64),
            Body::Stream(s) => s.exact_len(),
            json => json
                .to_bytes()
                .map_err(|e| e.at(&self.method, &self.url))?
                .map(|b| b.len() as u64),
        };
        match size {
            Some(size) if size > max_req_bytes => Err(NetError::invalid_request(format!(
                "body is {size} bytes, over the limit of {max_req_bytes} bytes (security.max_req_bytes)"
            ))
            .at(&self.method, &self.url)),
            _ => Ok(()),
        }
    }

    /// Parses the URL, checks it, and merges the query pairs.
    fn target_url(&self) -> Result<Arc<Url>, String> {
        let url = checked_url(&self.url)?;
        if self.query.is_empty() {
            return Ok(url);
        }
        let mut url = Arc::unwrap_or_clone(url);
        let kept: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(k, _)| !self.query.iter().any(|(q, _)| q == k))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let mut pairs = url.query_pairs_mut();
        pairs.clear();
        pairs.extend_pairs(kept.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        pairs.extend_pairs(self.query.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        drop(pairs);
        Ok(Arc::new(url))
    }

    fn note_invalid(&mut self, problem: impl FnOnce() -> String) {
        if self.invalid.is_none() {
            self.invalid = Some(problem().into_boxed_str());
        }
    }

    /// The serialised body for a replayable request, as it will be sent.
    ///
    /// # Errors
    /// As [`Body::to_bytes`].
    pub fn body_bytes(&self) -> Result<Option<Bytes>, NetError> {
        self.body.to_bytes()
    }
}

/// URLs this thread checked recently, with their parse: services call the same few URLs
/// over and over, and parsing is most of what validating a request costs.
const RECENT_URLS: usize = 8;

thread_local! {
    static RECENT: Recent<Arc<Url>> = const { Recent::new() };
}

/// [`parse_checked`], remembered per thread for the last [`RECENT_URLS`] URLs that passed.
fn checked_url(raw: &str) -> Result<Arc<Url>, String> {
    recall(&RECENT, RECENT_URLS, raw, |raw| {
        parse_checked(raw).map(Arc::new)
    })
}

/// Parses `raw` and refuses what a request URL may not be (see [`check_url`]).
fn parse_checked(raw: &str) -> Result<Url, String> {
    checked(None, raw)
}

/// Resolves `reference` (a request URL, or a redirect's `Location` against the URL it came
/// from) and refuses what a request URL may not be: relative without a base, not http(s),
/// with userinfo, without a host, or with an IPv4 host spelt other than canonically
/// (`2130706433`, `0x7f.1`, `127.1`, `0177.0.0.1`: the URL parser would read each as an
/// address, and an allow-list or a reader of logs would not).
///
/// The host that is checked is the one the URL parser takes: the text of the reference's own
/// authority, found the way the parser finds it (after `scheme://`, after `//` in a
/// scheme-relative reference, or after a special scheme's `:` with any slashes); a reference
/// without an authority keeps the base's host, which was checked when the base was.
/// Redirect hops go through this same check.
///
/// # Errors
/// [`ErrorKind::InvalidRequest`](crate::ErrorKind::InvalidRequest) saying what is wrong.
///
/// # Examples
/// ```
/// use soulbase_net_core::{check_url, url::Url};
///
/// assert!(check_url(None, "http://93.184.216.34/").is_ok());
/// // A dword host, hidden behind a query that looks like an authority.
/// assert!(check_url(None, "http:0x5db8d822/?://93.184.216.34").is_err());
/// let base = Url::parse("http://api.example.com/a").unwrap();
/// assert_eq!(check_url(Some(&base), "/b").unwrap().as_str(), "http://api.example.com/b");
/// assert!(check_url(Some(&base), "//2130706433/").is_err());
/// ```
pub fn check_url(base: Option<&Url>, reference: &str) -> Result<Url, crate::NetError> {
    checked(base, reference).map_err(crate::NetError::invalid_request)
}

fn checked(base: Option<&Url>, raw: &str) -> Result<Url, String> {
    let parsed = match base {
        Some(base) => base.join(raw),
        None => Url::parse(raw),
    };
    let url = parsed.map_err(|e| match e {
        url::ParseError::RelativeUrlWithoutBase => {
            "url is relative; an absolute http or https url is required".to_owned()
        }
        other => format!("url cannot be parsed: {other}"),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "url scheme `{}` is not http or https",
            url.scheme()
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("url has userinfo; send credentials in a header instead".to_owned());
    }
    match url.host() {
        None => return Err("url has no host".to_owned()),
        Some(url::Host::Ipv4(ip)) => {
            // std's parser takes only the canonical dotted quad (no octal, hex, shortened or
            // integer forms), so equality means the URL spelt it canonically. No authority of
            // its own: the host is the base's (there is a base, or the parse would have
            // failed), checked when the base was.
            if let Some(raw) = raw_host(raw, base.map(Url::scheme)) {
                if raw.parse::<std::net::Ipv4Addr>() != Ok(ip) {
                    return Err(format!(
                        "host `{raw}` is not a canonical IPv4 address (it would mean {ip})"
                    ));
                }
            }
        }
        Some(_) => {}
    }
    Ok(url)
}

/// The host as written in the reference's own authority (without userinfo or port), found
/// the way the WHATWG URL parser that `url` implements finds it; `None` when the reference
/// has no authority of its own (a path, query or fragment relative to its base).
///
/// - After the scheme (ASCII letter, then letters, digits, `+`, `-`, `.`, then `:`), a
///   special scheme (`http`, `https`) takes its authority after any number of `/` or `\`,
///   unless it is the base's scheme and no `//` follows (then it is relative to the base).
/// - Without a scheme, `//` (or `\`, or a mix) starts an authority.
fn raw_host(reference: &str, base_scheme: Option<&str>) -> Option<String> {
    // The parser drops leading C0 controls and spaces, and every tab and newline.
    let text = reference.trim_start_matches(|c: char| c <= ' ');
    let text: Cow<'_, str> = if text.contains(['\t', '\n', '\r']) {
        Cow::Owned(text.replace(['\t', '\n', '\r'], ""))
    } else {
        Cow::Borrowed(text)
    };
    let text = &*text;
    let is_slash = |c: char| c == '/' || c == '\\';
    let scheme_end = text.find(':').filter(|&i| {
        let scheme = &text[..i];
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    let rest = match scheme_end {
        Some(i) => {
            let (scheme, rest) = (&text[..i], &text[i + 1..]);
            let two_slashes = rest.chars().take(2).filter(|c| is_slash(*c)).count() == 2;
            let same_as_base = base_scheme.is_some_and(|b| b.eq_ignore_ascii_case(scheme));
            if same_as_base && !two_slashes {
                return None;
            }
            rest.trim_start_matches(is_slash)
        }
        None => {
            let two_slashes = text.chars().take(2).filter(|c| is_slash(*c)).count() == 2;
            if !two_slashes {
                return None;
            }
            text.trim_start_matches(is_slash)
        }
    };
    let authority = rest.split(['/', '?', '#', '\\']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.starts_with('[') {
        return Some(host_port.to_owned());
    }
    Some(
        host_port
            .rsplit_once(':')
            .map_or(host_port, |(h, _)| h)
            .to_owned(),
    )
}

impl fmt::Debug for NetRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetRequest")
            .field("method", &self.method)
            .field("url", &crate::error::redact_url(&self.url))
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field(
                "query",
                &self.query.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("body", &self.body)
            .field("timeout", &self.timeout)
            .field("idempotent", &self.idempotent)
            .field("policy_key", &self.policy_key)
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
