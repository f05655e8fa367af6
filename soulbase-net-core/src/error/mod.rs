//! The one error type of soulbase-net: [`NetError`], its [`ErrorKind`] and stable [`ErrorCode`].

mod boundary;
mod code;
mod grpc;
mod kind;
#[cfg(feature = "tonic")]
mod tonic_status;

use std::{error::Error as StdError, fmt, time::Duration};

pub use self::code::{status_code, ErrorCode};
pub use self::grpc::GrpcCode;
pub use self::kind::{ErrorKind, Phase};

/// The metadata (or header) entry that carries a [`NetError`]'s stable code across a service
/// boundary, e.g. `x-soulbase-error-code: PROVIDER.TIMEOUT`. Set by the `tonic` feature's
/// `From<NetError> for tonic::Status`; a service answering over HTTP may set it as a header.
pub const ERROR_CODE_HEADER: &str = "x-soulbase-error-code";

/// The metadata (or header) entry that carries a [`NetError`]'s exact kind across a service
/// boundary: the kind's [`label`](ErrorKind::label) (`timeout_read`, `circuit_open`, …), or
/// `status_` and the number for [`ErrorKind::Status`] (`status_503`). The code alone cannot
/// say which kind it was (a dozen kinds share `PROVIDER.UNAVAILABLE`); this entry can.
pub const ERROR_KIND_HEADER: &str = "x-soulbase-error-kind";

/// A boxed error that can cross threads: the source type of [`NetError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The error of every soulbase-net operation.
///
/// Opaque and one pointer wide. Match on [`NetError::kind`] or [`NetError::code`], never on
/// the text: `Display` prints what happened at this level and where (method and URL without
/// userinfo or query), never the text of the source, which is in [`StdError::source`].
///
/// # Examples
/// ```
/// use soulbase_net_core::{ErrorCode, ErrorKind, NetError, Phase};
///
/// let err = NetError::timeout(Phase::Ttfb).with_attempts(3);
/// assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Ttfb));
/// assert_eq!(err.code(), ErrorCode::ProviderTimeout);
/// assert_eq!(err.public_code(), ErrorCode::ProviderUnavailable);
/// assert_eq!(err.attempts(), 3);
/// ```
pub struct NetError {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    attempts: u32,
    message: Option<Box<str>>,
    context: Option<Box<str>>,
    retry_after: Option<Duration>,
    quota_visible: bool,
    source: Option<BoxError>,
}

// === impl NetError ===

impl NetError {
    /// An error of `kind`, with no message, context or source, and 0 attempts.
    pub fn new(kind: ErrorKind) -> Self {
        NetError {
            inner: Box::new(Inner {
                kind,
                attempts: 0,
                message: None,
                context: None,
                retry_after: None,
                quota_visible: false,
                source: None,
            }),
        }
    }

    /// An [`ErrorKind::InvalidRequest`] saying what is wrong with the request.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        NetError::new(ErrorKind::InvalidRequest).with_message(message)
    }

    /// An [`ErrorKind::Timeout`] in `phase`.
    pub fn timeout(phase: Phase) -> Self {
        NetError::new(ErrorKind::Timeout(phase))
    }

    /// An [`ErrorKind::Status`] for an HTTP error status.
    pub fn status(status: http::StatusCode) -> Self {
        NetError::new(ErrorKind::Status(status))
    }

    /// An [`ErrorKind::Decode`] caused by `source`.
    pub fn decode(source: impl Into<BoxError>) -> Self {
        NetError::new(ErrorKind::Decode).with_source(source)
    }

    /// Sets the cause, reachable through [`StdError::source`].
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    /// Sets a short lowercase message saying what went wrong, printed after the kind.
    /// It must not contain secrets; it is logged.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.inner.message = Some(message.into().into_boxed_str());
        self
    }

    /// Sets where it happened, e.g. `"GET https://api.example.com/v1/users"`.
    /// Prefer [`NetError::at`], which strips userinfo and query from the URL.
    pub fn with_context(mut self, context: impl Into<String>) -> Self {
        self.inner.context = Some(context.into().into_boxed_str());
        self
    }

    /// Sets where it happened from a method and URL; userinfo, query and fragment are
    /// removed so that no credential or token reaches a log through the error.
    pub fn at(self, method: &http::Method, url: &str) -> Self {
        let place = format!("{method} {}", redact_url(url));
        self.with_context(place)
    }

    /// Sets the number of attempts made before the error (0 when none was made).
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.inner.attempts = attempts;
        self
    }

    /// Sets when the call may be tried again (an open breaker's remaining cooldown, a
    /// limiter's wait, or the upstream's `Retry-After`).
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.inner.retry_after = Some(after);
        self
    }

    /// Makes `QUOTA.RATE_LIMITED` visible in [`NetError::public_code`]; set when QoS is on.
    pub fn with_quota_visible(mut self, visible: bool) -> Self {
        self.inner.quota_visible = visible;
        self
    }

    /// What happened.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The stable SB-02 code, e.g. `PROVIDER.TIMEOUT`. Never changes for a kind.
    pub fn code(&self) -> ErrorCode {
        self.inner.kind.code()
    }

    /// What callers outside the service may see: timeouts show as
    /// `PROVIDER.UNAVAILABLE`; rate limits too, unless QoS made them visible.
    ///
    /// This is an error *code* to show, not a status to answer with: because it folds
    /// timeouts into `PROVIDER.UNAVAILABLE`, mapping it to an HTTP status would answer 503
    /// where 504 is right. For the status (or gRPC code) a service answers its caller with,
    /// use [`NetError::http_status`] (or [`NetError::grpc_code`]).
    pub fn public_code(&self) -> ErrorCode {
        self.code().public_view_with(self.inner.quota_visible)
    }

    /// The HTTP status a service should answer its own caller with when this outbound call
    /// failed, with a gateway's meaning: 502 when the upstream failed or answered unusably,
    /// 503 when the service did not call out (or the upstream provably did not process the
    /// call), 504 when the upstream was too slow, 429 for rate limits, 403 when the
    /// service's own policy refused the destination, 400 when the request could not be
    /// built, and an upstream's 4xx (but 401/403/407/408/429) passed through.
    ///
    /// One table for every kind, with its stable [`code`](NetError::code) and the
    /// [`grpc_code`](NetError::grpc_code) of the same answer over gRPC (pinned row by row
    /// by the tests of `error/boundary.rs`):
    ///
    /// | kind | code | HTTP status | gRPC code | why |
    /// |------|------|-------------|-----------|-----|
    /// | `Dns`, `Connect`, `Tls`, `Io`, `Proxy` | `PROVIDER.UNAVAILABLE` | 502 Bad Gateway | `UNAVAILABLE` | the upstream could not be reached, or broke the exchange (nginx answers 502 for a refused or reset upstream; gRPC reports transport failures as `UNAVAILABLE`, which a retry may cure) |
    /// | `TlsVerify` | `AUTH.FORBIDDEN` | 502 Bad Gateway | `UNAVAILABLE` | the upstream's certificate or pin was refused (or it refused ours): a fault between the service and its upstream, not the caller's, where 403 would tell the caller that *it* is forbidden; gRPC's own clients report a failed handshake as `UNAVAILABLE` |
    /// | `Timeout(phase)`, every phase | `PROVIDER.TIMEOUT` | 504 Gateway Timeout | `DEADLINE_EXCEEDED` | the upstream was too slow (nginx answers 504 for its connect and read timeouts). `Timeout(Write)` fires when the request body stalls: a service streaming its caller's upload may prefer 408 |
    /// | `CircuitOpen`, `BudgetExhausted` | `PROVIDER.UNAVAILABLE` | 503 Service Unavailable | `UNAVAILABLE` | the service did not call out: no healthy upstream (Envoy's 503) or load shed. Send [`retry_after`](NetError::retry_after) as `Retry-After` |
    /// | `NotProcessed` | `PROVIDER.UNAVAILABLE` | 503 Service Unavailable | `UNAVAILABLE` | the upstream provably did not process the request (GOAWAY, `REFUSED_STREAM`), so trying again is safe, which is what 503 and `UNAVAILABLE` say |
    /// | `RateLimited`, `QuotaExceeded` | `QUOTA.RATE_LIMITED` | 429 Too Many Requests | `RESOURCE_EXHAUSTED` | a local rate, concurrency or byte limit refused the call (Envoy's local rate limit answers 429). Send `retry_after` as `Retry-After` |
    /// | `Blocked` | `AUTH.FORBIDDEN` | 403 Forbidden | `PERMISSION_DENIED` | the service's own policy (address guard, allow-list) refused to call the destination, as a proxy answers 403 for its own policy denial (Envoy's RBAC); no upstream was involved |
    /// | `InvalidRequest` | `SCHEMA.VALIDATION_FAILED` | 400 Bad Request | `INVALID_ARGUMENT` | the request could not be sent as built (URL, scheme, header, body size), usually from the caller's input, such as a URL it gave |
    /// | `TooLarge`, `RedirectLimit` | `PROVIDER.UNAVAILABLE` | 502 Bad Gateway | `INTERNAL` | the upstream's answer was unusable (over the size limit, a redirect loop); trying again will not cure it |
    /// | `Decode` | `SCHEMA.VALIDATION_FAILED` | 502 Bad Gateway | `INTERNAL` | the upstream's body was not what the service expects (gRPC answers `INTERNAL` for a message that does not decode) |
    /// | `Interceptor` | `PROVIDER.UNAVAILABLE` | 500 Internal Server Error | `INTERNAL` | a part of the service itself failed, not the upstream |
    /// | `Cancelled` | `PROVIDER.UNAVAILABLE` | 499 Client Closed Request | `CANCELLED` | the call was cancelled, usually because the caller went away (nginx's 499, the gRPC gateway's HTTP form of `CANCELLED`) |
    /// | `Status(5xx)` but 501, 505 | `PROVIDER.UNAVAILABLE` | 502 Bad Gateway | `UNAVAILABLE` | the upstream failed; a gateway answers 502 rather than pass on a 5xx of the upstream's choosing |
    /// | `Status(501/505)` | `PROVIDER.UNAVAILABLE` | 502 Bad Gateway | `INTERNAL` | the upstream cannot serve this request at all; trying again will not cure it (the client does not retry these either) |
    /// | `Status(408)` | `PROVIDER.TIMEOUT` | 504 Gateway Timeout | `DEADLINE_EXCEEDED` | the upstream timed out waiting for the request |
    /// | `Status(429)` | `QUOTA.RATE_LIMITED` | 429 Too Many Requests | `RESOURCE_EXHAUSTED` | the upstream's rate limit: the caller should slow down too (its `Retry-After` is in `retry_after`) |
    /// | `Status(401/403/407)` | `AUTH.FORBIDDEN` | 502 Bad Gateway | `INTERNAL` | the upstream refused the service's own credentials, which the caller cannot fix: a 401 would ask the caller to authenticate, and any 4xx would hide the service's broken credentials from its 5xx alerts |
    /// | `Status(404/410)` | `SCHEMA.VALIDATION_FAILED` | the same status | `NOT_FOUND` | passed through: what the caller asked about does not exist upstream |
    /// | `Status(409)` | `SCHEMA.VALIDATION_FAILED` | 409 Conflict | `ABORTED` | passed through: a conflict the caller may resolve and try again |
    /// | `Status(other 4xx)` | `SCHEMA.VALIDATION_FAILED` | the same status | `INVALID_ARGUMENT` | passed through: the upstream judged the request, usually the caller's data that the service forwarded |
    /// | `Status(1xx/2xx/3xx)`, any other | `PROVIDER.UNAVAILABLE` | 502 Bad Gateway | `UNKNOWN` | a status the client did not expect as an error |
    ///
    /// A service that knows better for one call (it built the URL itself, so an
    /// `InvalidRequest` is its own bug; it forwarded the caller's token, so a 403 is the
    /// caller's) maps that kind itself; this is the default for when it does not.
    ///
    /// # Examples
    /// ```
    /// use http::StatusCode;
    /// use soulbase_net_core::{ErrorCode, ErrorKind, GrpcCode, NetError, Phase};
    ///
    /// // A body that stopped arriving: the upstream was slow, so 504, not public_code's 503.
    /// let err = NetError::timeout(Phase::Read);
    /// assert_eq!(err.public_code(), ErrorCode::ProviderUnavailable);
    /// assert_eq!(err.http_status(), StatusCode::GATEWAY_TIMEOUT);
    /// assert_eq!(err.grpc_code(), GrpcCode::DeadlineExceeded);
    ///
    /// assert_eq!(NetError::new(ErrorKind::CircuitOpen).http_status(), StatusCode::SERVICE_UNAVAILABLE);
    /// assert_eq!(NetError::new(ErrorKind::Blocked).http_status(), StatusCode::FORBIDDEN);
    /// assert_eq!(NetError::status(StatusCode::INTERNAL_SERVER_ERROR).http_status(), StatusCode::BAD_GATEWAY);
    /// assert_eq!(NetError::status(StatusCode::NOT_FOUND).http_status(), StatusCode::NOT_FOUND);
    /// ```
    pub fn http_status(&self) -> http::StatusCode {
        self.inner.kind.http_status()
    }

    /// The gRPC code a service should answer its own caller with when this outbound call
    /// failed: `DEADLINE_EXCEEDED` for timeouts, `UNAVAILABLE` when the upstream could not
    /// be reached or the circuit is open, `RESOURCE_EXHAUSTED` for rate limits,
    /// `PERMISSION_DENIED` for the service's own policy blocks, `INVALID_ARGUMENT` for a
    /// request that could not be built, … The whole table, with the reason for each row, is
    /// on [`NetError::http_status`]. With the `tonic` feature, `tonic::Status::from(err)`
    /// uses this code.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_core::{ErrorKind, GrpcCode, NetError, Phase};
    ///
    /// assert_eq!(NetError::timeout(Phase::Ttfb).grpc_code(), GrpcCode::DeadlineExceeded);
    /// assert_eq!(NetError::new(ErrorKind::RateLimited).grpc_code(), GrpcCode::ResourceExhausted);
    /// assert_eq!(NetError::new(ErrorKind::Blocked).grpc_code() as i32, 7);
    /// ```
    pub fn grpc_code(&self) -> GrpcCode {
        self.inner.kind.grpc_code()
    }

    /// The attempts made, the one that failed included; 0 when the request never left.
    ///
    /// An error of the response body (a read timeout, a reset, the size limit while
    /// streaming) counts the attempt whose body it was: that attempt reached the server.
    pub fn attempts(&self) -> u32 {
        self.inner.attempts
    }

    /// When the call may be tried again, if known.
    pub fn retry_after(&self) -> Option<Duration> {
        self.inner.retry_after
    }

    /// The message saying what went wrong, if any.
    pub fn message(&self) -> Option<&str> {
        self.inner.message.as_deref()
    }

    /// Where it happened, if known.
    pub fn context(&self) -> Option<&str> {
        self.inner.context.as_deref()
    }

    /// The HTTP status for [`ErrorKind::Status`] errors.
    pub fn status_code(&self) -> Option<http::StatusCode> {
        match self.inner.kind {
            ErrorKind::Status(s) => Some(s),
            _ => None,
        }
    }

    /// Whether this is a timeout in any phase.
    pub fn is_timeout(&self) -> bool {
        self.inner.kind.is_timeout()
    }

    /// The chain of causes below this error, nearest first.
    pub fn chain(&self) -> impl Iterator<Item = &(dyn StdError + 'static)> {
        let mut next = self.source();
        std::iter::from_fn(move || {
            let current = next?;
            next = current.source();
            Some(current)
        })
    }

    /// Finds the first cause of type `E` in the chain, e.g. an `io::Error`.
    pub fn find_source<E: StdError + 'static>(&self) -> Option<&E> {
        self.chain().find_map(|e| e.downcast_ref::<E>())
    }
}

/// A URL fit for messages, logs, events and traces: query and fragment removed, userinfo
/// replaced by `***`, so no credential or token leaks through it.
///
/// # Examples
/// ```
/// assert_eq!(
///     soulbase_net_core::redact_url("https://u:pw@h.example/a?token=1#f"),
///     "https://***@h.example/a"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    let cut = url.find(['?', '#']).unwrap_or(url.len());
    let url = &url[..cut];
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => format!(
            "{}***@{}{}",
            &url[..scheme_end + 3],
            &authority[at + 1..],
            &rest[authority_end..]
        ),
        None => url.to_owned(),
    }
}

impl fmt::Debug for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("NetError");
        d.field("kind", &self.inner.kind)
            .field("code", &self.code().as_str());
        if self.inner.attempts > 0 {
            d.field("attempts", &self.inner.attempts);
        }
        if let Some(m) = &self.inner.message {
            d.field("message", m);
        }
        if let Some(c) = &self.inner.context {
            d.field("context", c);
        }
        if let Some(r) = &self.inner.retry_after {
            d.field("retry_after", r);
        }
        if let Some(s) = &self.inner.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.kind.describe(f)?;
        if let Some(message) = &self.inner.message {
            write!(f, ": {message}")?;
        }
        if let Some(context) = &self.inner.context {
            write!(f, " ({context})")?;
        }
        if self.inner.attempts > 1 {
            write!(f, " after {} attempts", self.inner.attempts)?;
        }
        Ok(())
    }
}

impl StdError for NetError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_ref()
            .map(|s| &**s as &(dyn StdError + 'static))
    }
}

impl From<ErrorKind> for NetError {
    fn from(kind: ErrorKind) -> Self {
        NetError::new(kind)
    }
}

#[cfg(test)]
mod tests;
