//! [`Reply`]: one scripted response, or one fault instead of a response.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode};

use super::body::{pieces_len, Cut, FaultBody, Piece};
use super::capture::CapturedRequest;
use super::conn::ConnCtl;
use super::encode;
use super::forward::Forwarded;

/// What to do instead of sending a response head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Abort {
    /// Reset the connection (RST).
    Reset,
    /// Close the connection (FIN).
    Close,
    /// Never answer; the connection stays open until the client gives up or the server stops.
    Hang,
}

#[derive(Clone, Debug)]
enum Kind {
    Plain,
    Echo,
    Resource {
        etag: Option<String>,
        last_modified: Option<SystemTime>,
    },
    /// The upstream's answer (see [`Reply::forward`]); replaced by it before rendering.
    Forward,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Length {
    Auto,
    Omit,
    Claim(u64),
}

/// One scripted response — status, headers, body — with optional faults: a delay before the
/// head, a slow body, a stall, a reset or a close after N body bytes, or a fault instead of any
/// response at all ([`Reply::reset`], [`Reply::close`], [`Reply::hang`]).
///
/// A `Reply` is plain data: build it once, use it in any number of scripts. Unless a method
/// says otherwise a reply is `200 OK` with an empty body, sent at once, with a correct
/// `Content-Length`.
///
/// In `Location` and other header values, `{origin}` is replaced by the server's own origin
/// (`http://127.0.0.1:PORT`) and `{authority}` by `127.0.0.1:PORT`, so absolute and
/// scheme-relative redirects to the server itself can be written before it has a port.
///
/// Invalid input (a status outside 100–999, a header name or value that HTTP forbids) does not
/// panic: the reply is sent as `500` with a body naming the problem.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use soulbase_net_testkit::Reply;
///
/// let throttled = Reply::status(503).header("retry-after", "2");
/// let slow = Reply::ok("0123456789").slow_body(2, Duration::from_millis(10));
/// let cut = Reply::huge(1 << 30).reset_after(4096);
/// # let _ = (throttled, slow, cut);
/// ```
#[derive(Clone, Debug)]
pub struct Reply {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    pieces: Arc<Vec<Piece>>,
    length: Length,
    delay: Option<Duration>,
    gate: Option<super::gate::Gate>,
    abort: Option<Abort>,
    pace: Option<(usize, Duration)>,
    cut: Option<(u64, Cut)>,
    kind: Kind,
    invalid: Option<String>,
}

impl Default for Reply {
    fn default() -> Self {
        Self {
            status: StatusCode::OK,
            headers: Vec::new(),
            pieces: Arc::new(Vec::new()),
            length: Length::Auto,
            delay: None,
            gate: None,
            abort: None,
            pace: None,
            cut: None,
            kind: Kind::Plain,
            invalid: None,
        }
    }
}

// === constructors ===

impl Reply {
    /// `200 OK` with `body`.
    pub fn ok(body: impl Into<Bytes>) -> Self {
        Self::default().body(body)
    }

    /// The given status with an empty body. An invalid code gives a `500` reply (see above).
    pub fn status(code: u16) -> Self {
        let mut r = Self::default();
        match StatusCode::from_u16(code) {
            Ok(s) => r.status = s,
            Err(_) => r.invalid = Some(format!("invalid status code {code}")),
        }
        r
    }

    /// `200 OK` with `value` as JSON and `content-type: application/json`.
    pub fn json(value: &serde_json::Value) -> Self {
        Self::ok(value.to_string()).header("content-type", "application/json")
    }

    /// A redirect with the given status (301, 302, 303, 307, 308) and `Location`. The location
    /// is sent as given (relative `next`, absolute `http://host/x`, scheme-relative
    /// `//host/x`, or a private address such as `http://10.0.0.1/` — the server never dials
    /// it); `{origin}` and `{authority}` are expanded as described on [`Reply`].
    pub fn redirect(status: u16, location: impl AsRef<str>) -> Self {
        Self::status(status).header("location", location.as_ref())
    }

    /// Echo the request as JSON (see [`CapturedRequest::to_json`]), `200 OK`.
    pub fn echo() -> Self {
        Self {
            kind: Kind::Echo,
            ..Self::default()
        }
        .header("content-type", "application/json")
    }

    /// A cacheable resource: `200 OK` with `body`, and `304 Not Modified` (no body) when the
    /// request's `If-None-Match` matches the ETag, or — absent `If-None-Match` — its
    /// `If-Modified-Since` is not before the last-modified time. Set the validators with
    /// [`Reply::etag`] and [`Reply::last_modified`]; without either it never answers 304.
    pub fn resource(body: impl Into<Bytes>) -> Self {
        Self {
            kind: Kind::Resource {
                etag: None,
                last_modified: None,
            },
            ..Self::ok(body)
        }
    }

    /// A body of `len` zero bytes, generated as it is sent (gigabytes cost no memory), with
    /// `Content-Length` unless [`Reply::without_content_length`] is used.
    pub fn huge(len: u64) -> Self {
        Self {
            pieces: Arc::new(vec![Piece::Zeros(len)]),
            ..Self::default()
        }
    }

    /// `body` gzip-compressed, with `content-encoding: gzip`.
    pub fn gzip(body: impl AsRef<[u8]>) -> Self {
        match encode::gzip(body.as_ref()) {
            Ok(b) => Self::ok(b).header("content-encoding", "gzip"),
            Err(e) => Self::invalid(format!("gzip failed: {e}")),
        }
    }

    /// `body` brotli-compressed, with `content-encoding: br`.
    pub fn brotli(body: impl AsRef<[u8]>) -> Self {
        match encode::brotli(body.as_ref()) {
            Ok(b) => Self::ok(b).header("content-encoding", "br"),
            Err(e) => Self::invalid(format!("brotli failed: {e}")),
        }
    }

    /// A gzip decompression bomb: a small body (about 1 KiB per MiB) that decodes to
    /// `decoded_len` zero bytes, rounded up to a whole MiB. Streamed; costs no memory.
    pub fn gzip_bomb(decoded_len: u64) -> Self {
        match encode::gzip_bomb(decoded_len) {
            Ok((pieces, _)) => Self {
                pieces: Arc::new(pieces),
                ..Self::default()
            }
            .header("content-encoding", "gzip"),
            Err(e) => Self::invalid(format!("gzip bomb failed: {e}")),
        }
    }

    /// Pass the request on to the server's upstream (see
    /// [`FaultServerBuilder::forward_to`](crate::FaultServerBuilder::forward_to)) and answer
    /// with what it answers: its status, headers (less the hop-by-hop ones) and body.
    ///
    /// The modifiers still apply, to the upstream's answer on its way back: the request
    /// reaches the upstream first, then [`delay`](Self::delay) and [`after`](Self::after) hold
    /// the head, [`header`](Self::header) adds headers, and [`slow_body`](Self::slow_body),
    /// [`stall_after`](Self::stall_after), [`reset_after`](Self::reset_after) and
    /// [`close_after`](Self::close_after) shape the body (the upstream's `Content-Length` is
    /// kept, so a cut body is visibly incomplete). A `Location` pointing at the upstream is
    /// rewritten to point at this server, so redirects come back through it.
    ///
    /// When the upstream cannot be reached the client gets `502` with a body saying why;
    /// without an upstream, `500` naming the problem.
    ///
    /// This is the default reply of a forwarding server's unmatched paths.
    ///
    /// ```
    /// use soulbase_net_testkit::{Reply, Script};
    ///
    /// // The upstream's answer, its body dripped 16 bytes every 10 ms.
    /// let slow = Reply::forward().slow_body(16, std::time::Duration::from_millis(10));
    /// // Three 503s, then the upstream's answers.
    /// let burst = Script::status(503).times(3).then(Reply::forward());
    /// # let _ = (slow, burst);
    /// ```
    pub fn forward() -> Self {
        Self {
            kind: Kind::Forward,
            ..Self::default()
        }
    }

    /// Reset the connection (TCP RST, via `SO_LINGER 0`) instead of answering. On HTTP/2 this
    /// resets the whole connection, so every stream on it fails.
    pub fn reset() -> Self {
        Self::abort(Abort::Reset)
    }

    /// Close the connection cleanly (FIN) instead of answering.
    pub fn close() -> Self {
        Self::abort(Abort::Close)
    }

    /// Never answer: the request is read, then nothing is sent until the client gives up or
    /// the server shuts down.
    pub fn hang() -> Self {
        Self::abort(Abort::Hang)
    }

    fn abort(a: Abort) -> Self {
        Self {
            abort: Some(a),
            ..Self::default()
        }
    }

    fn invalid(msg: String) -> Self {
        Self {
            invalid: Some(msg),
            ..Self::default()
        }
    }
}

// === modifiers ===

impl Reply {
    /// Adds a response header (repeatable; values with the same name are all sent).
    pub fn header(mut self, name: impl AsRef<str>, value: impl AsRef<str>) -> Self {
        let (name, value) = (name.as_ref(), value.as_ref());
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(n), Ok(v)) => self.headers.push((n, v)),
            _ => {
                self.invalid
                    .get_or_insert_with(|| format!("invalid header {name:?}: {value:?}"));
            }
        }
        self
    }

    /// Adds `Retry-After` in seconds (`Retry-After: 2`).
    pub fn retry_after(self, after: Duration) -> Self {
        self.header("retry-after", after.as_secs().to_string())
    }

    /// Adds `Retry-After` as an HTTP-date (`Retry-After: Sun, 06 Nov 1994 08:49:37 GMT`).
    pub fn retry_after_date(self, at: SystemTime) -> Self {
        self.header("retry-after", httpdate::fmt_http_date(at))
    }

    /// Replaces the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.pieces = Arc::new(vec![Piece::Bytes(body.into())]);
        self
    }

    /// Holds the response head until `gate` is open (after any [`delay`](Self::delay)): a
    /// test acts while the request is known to be at the server, then opens the gate.
    pub fn after(mut self, gate: &super::gate::Gate) -> Self {
        self.gate = Some(gate.clone());
        self
    }

    /// Waits `delay` before sending the response head (time to first byte). Default is none.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Sends the body `chunk` bytes at a time, waiting `every` between chunks. Default is as
    /// fast as the connection takes it.
    pub fn slow_body(mut self, chunk: usize, every: Duration) -> Self {
        self.pace = Some((chunk.max(1), every));
        self
    }

    /// Sends the head, then nothing more: the body never arrives and the connection stays open.
    pub fn stall_after_head(self) -> Self {
        self.stall_after(0)
    }

    /// Sends the head and `n` body bytes, then nothing more.
    pub fn stall_after(mut self, n: u64) -> Self {
        self.cut = Some((n, Cut::Stall));
        self
    }

    /// Sends the head and `n` body bytes, then resets the connection (RST).
    pub fn reset_after(mut self, n: u64) -> Self {
        self.cut = Some((n, Cut::Reset));
        self
    }

    /// Sends the head and `n` body bytes, then closes the connection cleanly (FIN), so the
    /// message is left incomplete.
    pub fn close_after(mut self, n: u64) -> Self {
        self.cut = Some((n, Cut::Close));
        self
    }

    /// Sends no `Content-Length` (HTTP/1.1 then uses chunked encoding).
    pub fn without_content_length(mut self) -> Self {
        self.length = Length::Omit;
        self
    }

    /// Claims `Content-Length: n` whatever the body is. A claim longer than the body makes the
    /// connection close after the body (the message is incomplete); a shorter one truncates the
    /// body to `n` bytes on HTTP/1.1 (hyper refuses to send more than it announced).
    pub fn content_length(mut self, n: u64) -> Self {
        self.length = Length::Claim(n);
        self
    }

    /// Adds `n` headers `x-testkit-1: value-1` … `x-testkit-n: value-n`.
    pub fn many_headers(mut self, n: usize) -> Self {
        for i in 1..=n {
            self = self.header(format!("x-testkit-{i}"), format!("value-{i}"));
        }
        self
    }

    /// Adds one header `x-testkit-huge` whose value is `len` bytes long.
    pub fn huge_header(self, len: usize) -> Self {
        self.header("x-testkit-huge", "a".repeat(len))
    }

    /// Sets the ETag of a [`Reply::resource`] (a quoted string such as `"\"v1\""`, or a weak
    /// `W/"v1"`), and sends it as the `ETag` header of any reply.
    pub fn etag(mut self, etag: impl Into<String>) -> Self {
        let etag = etag.into();
        if let Kind::Resource { etag: e, .. } = &mut self.kind {
            *e = Some(etag.clone());
        }
        self.header("etag", etag)
    }

    /// Sets the last-modified time of a [`Reply::resource`], and sends it as the
    /// `Last-Modified` header of any reply.
    pub fn last_modified(mut self, at: SystemTime) -> Self {
        if let Kind::Resource {
            last_modified: l, ..
        } = &mut self.kind
        {
            *l = Some(at);
        }
        self.header("last-modified", httpdate::fmt_http_date(at))
    }
}

// === rendering ===

/// What the server does with a picked reply.
#[derive(Debug)]
pub(crate) enum Action {
    Abort(Abort),
    Respond(Box<Response<FaultBody>>),
}

/// Facts about the server a reply may refer to.
#[derive(Debug)]
pub(crate) struct RenderCtx<'a> {
    pub(crate) origin: &'a str,
    pub(crate) authority: &'a str,
}

impl Reply {
    pub(crate) fn delay_before_head(&self) -> Option<Duration> {
        self.delay
    }

    pub(crate) fn gate(&self) -> Option<&super::gate::Gate> {
        self.gate.as_ref()
    }

    /// Whether this reply forwards the request to the upstream (and is not a fault instead).
    pub(crate) fn is_forward(&self) -> bool {
        matches!(self.kind, Kind::Forward) && self.abort.is_none()
    }

    /// This reply with the upstream's answer (or the reason there is none) in place of its
    /// status and body; its own headers come after the upstream's, its faults stay.
    /// `upstream` is the upstream's origin: a `Location` under it now points at this server.
    pub(crate) fn with_forwarded(
        mut self,
        answer: Result<Forwarded, String>,
        upstream: &str,
    ) -> Self {
        self.kind = Kind::Plain;
        let answer = match answer {
            Ok(a) => a,
            Err(why) => {
                self.status = StatusCode::BAD_GATEWAY;
                self.pieces = Arc::new(vec![Piece::Bytes(Bytes::from(format!("testkit: {why}")))]);
                return self;
            }
        };
        self.status = answer.status;
        let mut headers = Vec::with_capacity(answer.headers.len() + self.headers.len());
        for (name, value) in &answer.headers {
            let value = match value.to_str() {
                Ok(v) if *name == header::LOCATION && v.starts_with(upstream) => {
                    let rest = &v[upstream.len()..];
                    HeaderValue::from_str(&format!("{{origin}}{rest}")).unwrap_or(value.clone())
                }
                _ => value.clone(),
            };
            headers.push((name.clone(), value));
        }
        headers.append(&mut self.headers);
        self.headers = headers;
        self.pieces = Arc::new(vec![Piece::Bytes(answer.body)]);
        self
    }

    pub(crate) fn render(
        &self,
        req: &CapturedRequest,
        cx: &RenderCtx<'_>,
        ctl: Arc<ConnCtl>,
    ) -> Action {
        if let Some(a) = self.abort {
            return Action::Abort(a);
        }
        let no_upstream;
        let invalid = match (&self.invalid, &self.kind) {
            (Some(msg), _) => Some(msg),
            (None, Kind::Forward) => {
                no_upstream = "Reply::forward() on a server without forward_to(..)".to_owned();
                Some(&no_upstream)
            }
            (None, _) => None,
        };
        if let Some(msg) = invalid {
            let mut res = Response::new(FaultBody::new(
                vec![Piece::Bytes(Bytes::from(format!("testkit: {msg}")))],
                None,
                None,
                None,
                ctl,
            ));
            *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            return Action::Respond(Box::new(res));
        }
        let mut status = self.status;
        let mut pieces: Vec<Piece> = self.pieces.as_ref().clone();
        match &self.kind {
            Kind::Plain | Kind::Forward => {}
            Kind::Echo => {
                pieces = vec![Piece::Bytes(Bytes::from(req.to_json().to_string()))];
            }
            Kind::Resource {
                etag,
                last_modified,
            } => {
                if not_modified(req, etag.as_deref(), *last_modified) {
                    status = StatusCode::NOT_MODIFIED;
                    pieces.clear();
                }
            }
        }
        let mut res = Response::builder().status(status);
        let mut claimed = match self.length {
            Length::Claim(n) => Some(n),
            _ => None,
        };
        if let Some(headers) = res.headers_mut() {
            for (name, value) in &self.headers {
                if name == header::CONTENT_LENGTH {
                    // A user-set Content-Length is a claim: never let hyper see it twice.
                    claimed = value.to_str().ok().and_then(|v| v.trim().parse().ok());
                    continue;
                }
                headers.append(name.clone(), expand(value, cx));
            }
            if let Some(n) = claimed {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            }
        }
        let body_empty = pieces_len(&pieces) == 0;
        let exact = match (self.length, claimed) {
            (_, Some(_)) | (Length::Omit, _) => None,
            _ if status == StatusCode::NOT_MODIFIED || status.is_informational() => Some(0),
            _ if self.cut.is_some() && body_empty => None,
            _ => Some(pieces_len(&pieces)),
        };
        let body = FaultBody::new(pieces, exact, self.pace, self.cut, ctl);
        match res.body(body) {
            Ok(res) => Action::Respond(Box::new(res)),
            // Unreachable: status and headers were validated when the reply was built.
            Err(_) => Action::Abort(Abort::Close),
        }
    }
}

/// Expands `{origin}` and `{authority}` in a header value.
fn expand(value: &HeaderValue, cx: &RenderCtx<'_>) -> HeaderValue {
    let Ok(s) = value.to_str() else {
        return value.clone();
    };
    if !s.contains('{') {
        return value.clone();
    }
    let s = s
        .replace("{origin}", cx.origin)
        .replace("{authority}", cx.authority);
    HeaderValue::from_str(&s).unwrap_or_else(|_| value.clone())
}

/// RFC 9110 §13.1: `If-None-Match` wins over `If-Modified-Since`; ETags compare weakly.
fn not_modified(req: &CapturedRequest, etag: Option<&str>, lm: Option<SystemTime>) -> bool {
    if let Some(inm) = req.header("if-none-match") {
        let Some(etag) = etag else { return false };
        let strip = |t: &str| t.trim().trim_start_matches("W/").to_owned();
        let ours = strip(etag);
        return inm.split(',').any(|t| t.trim() == "*" || strip(t) == ours);
    }
    match (req.header("if-modified-since"), lm) {
        (Some(ims), Some(lm)) => match httpdate::parse_http_date(ims) {
            // HTTP dates have whole seconds; compare at that precision.
            Ok(since) => secs(lm) <= secs(since),
            Err(_) => false,
        },
        _ => false,
    }
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
