//! What went wrong: [`ErrorKind`] and the request [`Phase`] a timeout fired in.

use std::fmt;

/// The phase of a request, used to say which timeout fired and to label latencies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Phase {
    /// Resolving the host name.
    Dns,
    /// Opening the TCP connection (or the proxy tunnel).
    Connect,
    /// The TLS handshake.
    Tls,
    /// Writing the request head and body.
    Write,
    /// Waiting for the response head (time to first byte).
    Ttfb,
    /// Reading the response body (idle time between chunks).
    Read,
    /// The whole request, all attempts and backoff included.
    Total,
}

impl Phase {
    /// Every phase, in the order a request goes through them.
    pub const ALL: [Phase; 7] = [
        Phase::Dns,
        Phase::Connect,
        Phase::Tls,
        Phase::Write,
        Phase::Ttfb,
        Phase::Read,
        Phase::Total,
    ];

    /// A stable lowercase label for metrics, e.g. `"ttfb"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Dns => "dns",
            Phase::Connect => "connect",
            Phase::Tls => "tls",
            Phase::Write => "write",
            Phase::Ttfb => "ttfb",
            Phase::Read => "read",
            Phase::Total => "total",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened, independent of any message text.
///
/// Callers match on the kind (or on [`ErrorKind::code`]), never on the `Display` text.
/// The code of every kind is fixed by one table (see [`ErrorCode`](crate::ErrorCode)).
///
/// The kinds a retry can help are retried under the policy switch `retry.retry_on.<name>`
/// whose name is the kind's [`label`](ErrorKind::label) (`dns`, `connect`, `io`,
/// `status_5xx`, `status_429`; `timeout_connect` for the DNS, connect and TLS phases,
/// `timeout_ttfb`, `timeout_read`); no other kind is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The host name could not be resolved. `PROVIDER.UNAVAILABLE`. Retried under `retry_on.dns`.
    Dns,
    /// The TCP connection could not be opened (refused, unreachable, reset while dialling).
    /// `PROVIDER.UNAVAILABLE`. Retried under `retry_on.connect`.
    Connect,
    /// The TLS handshake failed for a reason other than verification (protocol, version,
    /// cipher mismatch). `PROVIDER.UNAVAILABLE`.
    Tls,
    /// The server's certificate, its pin, or our client certificate was rejected.
    /// `AUTH.FORBIDDEN`.
    TlsVerify,
    /// A deadline passed in the given phase. `PROVIDER.TIMEOUT`.
    Timeout(Phase),
    /// The circuit breaker for the host is open; the call was not attempted.
    /// `PROVIDER.UNAVAILABLE`.
    CircuitOpen,
    /// A local concurrency or rate limit refused the call. `QUOTA.RATE_LIMITED`.
    RateLimited,
    /// A byte or request quota (QoS budget) is spent. `QUOTA.RATE_LIMITED`.
    QuotaExceeded,
    /// A budget refused the call (for services and interceptors that shed load by budget).
    /// The runtime's retry budget does not produce it: when the budget refuses a retry, the
    /// call ends with the last attempt's own outcome (so the caller sees what the upstream
    /// did) and the observer gets `RetryBudgetExhausted`. `PROVIDER.UNAVAILABLE`.
    BudgetExhausted,
    /// The address guard or the host allow-list refused the destination (SSRF protection).
    /// No socket was opened to it. `AUTH.FORBIDDEN`.
    Blocked,
    /// The response body exceeded `security.max_resp_bytes`; reading stopped at the limit.
    /// `PROVIDER.UNAVAILABLE`.
    TooLarge,
    /// The request is not valid: URL, scheme, userinfo, header, body size.
    /// `SCHEMA.VALIDATION_FAILED`.
    InvalidRequest,
    /// Redirects went past the limit or looped. `PROVIDER.UNAVAILABLE`.
    RedirectLimit,
    /// The response had an error status (see `error_for_status()`); the code depends on the
    /// status, as documented on [`status_code`](crate::status_code).
    ///
    /// ```
    /// use soulbase_net_core::{ErrorKind, NetError};
    /// use http::StatusCode;
    ///
    /// let err = NetError::status(StatusCode::NOT_FOUND);
    /// assert_eq!(err.kind(), ErrorKind::Status(StatusCode::NOT_FOUND));
    /// assert!(matches!(err.kind(), ErrorKind::Status(s) if s.is_client_error()));
    /// ```
    Status(http::StatusCode),
    /// The response body could not be decoded (JSON, UTF-8). `SCHEMA.VALIDATION_FAILED`.
    Decode,
    /// Reading or writing the connection failed after it was established: reset, closed
    /// before the response was complete, or an unparsable answer. `PROVIDER.UNAVAILABLE`.
    /// Retried under `retry_on.io`.
    Io,
    /// The server provably did not process the request: it was above an HTTP/2 or HTTP/3
    /// GOAWAY's last stream, refused with `REFUSED_STREAM` or `H3_REQUEST_REJECTED`, sent on
    /// a connection already closing, or never written to an HTTP/1.1 connection that closed
    /// (RFC 9113 §8.7, RFC 9114 §4.1.1). The client sends such a request again on another
    /// connection whatever its method, without costing a retry attempt or the retry budget,
    /// and never counts it against the breaker, the SLIs or the SLO controller; a caller sees
    /// this kind only when the request could not go again (a stream body, no time left, or
    /// every resend refused too). `PROVIDER.UNAVAILABLE`.
    NotProcessed,
    /// The proxy refused or failed the tunnel. `PROVIDER.UNAVAILABLE`.
    Proxy,
    /// An interceptor failed without giving a more precise kind. `PROVIDER.UNAVAILABLE`.
    Interceptor,
    /// The caller cancelled the call (its cancel token fired); no further attempt was made.
    /// `PROVIDER.UNAVAILABLE`: the call has no answer.
    Cancelled,
}

impl ErrorKind {
    /// Every kind without a payload, plus one representative of each kind with one
    /// (a `Timeout` per phase and the statuses 429 / 503), for exhaustive tests.
    pub const ALL_SIMPLE: [ErrorKind; 20] = [
        ErrorKind::Dns,
        ErrorKind::Connect,
        ErrorKind::Tls,
        ErrorKind::TlsVerify,
        ErrorKind::Timeout(Phase::Total),
        ErrorKind::CircuitOpen,
        ErrorKind::RateLimited,
        ErrorKind::QuotaExceeded,
        ErrorKind::BudgetExhausted,
        ErrorKind::Blocked,
        ErrorKind::TooLarge,
        ErrorKind::InvalidRequest,
        ErrorKind::RedirectLimit,
        ErrorKind::Status(http::StatusCode::SERVICE_UNAVAILABLE),
        ErrorKind::Decode,
        ErrorKind::Io,
        ErrorKind::NotProcessed,
        ErrorKind::Proxy,
        ErrorKind::Interceptor,
        ErrorKind::Cancelled,
    ];

    /// Whether this is a timeout in any phase.
    pub const fn is_timeout(self) -> bool {
        matches!(self, ErrorKind::Timeout(_))
    }

    /// A stable snake_case label for metrics and logs, e.g. `"timeout_ttfb"`, `"status_5xx"`.
    pub const fn label(self) -> &'static str {
        match self {
            ErrorKind::Dns => "dns",
            ErrorKind::Connect => "connect",
            ErrorKind::Tls => "tls",
            ErrorKind::TlsVerify => "tls_verify",
            ErrorKind::Timeout(Phase::Dns) => "timeout_dns",
            ErrorKind::Timeout(Phase::Connect) => "timeout_connect",
            ErrorKind::Timeout(Phase::Tls) => "timeout_tls",
            ErrorKind::Timeout(Phase::Write) => "timeout_write",
            ErrorKind::Timeout(Phase::Ttfb) => "timeout_ttfb",
            ErrorKind::Timeout(Phase::Read) => "timeout_read",
            ErrorKind::Timeout(Phase::Total) => "timeout_total",
            ErrorKind::CircuitOpen => "circuit_open",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::QuotaExceeded => "quota_exceeded",
            ErrorKind::BudgetExhausted => "budget_exhausted",
            ErrorKind::Blocked => "blocked",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::RedirectLimit => "redirect_limit",
            ErrorKind::Status(status) => match status.as_u16() {
                429 => "status_429",
                500..=599 => "status_5xx",
                400..=499 => "status_4xx",
                _ => "status_other",
            },
            ErrorKind::Decode => "decode",
            ErrorKind::Io => "io",
            ErrorKind::NotProcessed => "not_processed",
            ErrorKind::Proxy => "proxy",
            ErrorKind::Interceptor => "interceptor",
            ErrorKind::Cancelled => "cancelled",
        }
    }

    /// A lowercase description without trailing period, used by `NetError`'s `Display`.
    pub(crate) fn describe(self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Dns => f.write_str("dns resolution failed"),
            ErrorKind::Connect => f.write_str("connection failed"),
            ErrorKind::Tls => f.write_str("tls handshake failed"),
            ErrorKind::TlsVerify => f.write_str("tls verification failed"),
            ErrorKind::Timeout(Phase::Total) => f.write_str("request deadline exceeded"),
            ErrorKind::Timeout(Phase::Ttfb) => {
                f.write_str("timed out waiting for the response head")
            }
            ErrorKind::Timeout(Phase::Read) => f.write_str("timed out reading the response body"),
            ErrorKind::Timeout(phase) => write!(f, "{phase} timed out"),
            ErrorKind::CircuitOpen => f.write_str("circuit breaker is open"),
            ErrorKind::RateLimited => f.write_str("rate limited"),
            ErrorKind::QuotaExceeded => f.write_str("quota exceeded"),
            ErrorKind::BudgetExhausted => f.write_str("retry budget exhausted"),
            ErrorKind::Blocked => f.write_str("destination blocked"),
            ErrorKind::TooLarge => f.write_str("response body too large"),
            ErrorKind::InvalidRequest => f.write_str("invalid request"),
            ErrorKind::RedirectLimit => f.write_str("too many redirects"),
            ErrorKind::Status(status) => write!(f, "http status {}", status.as_u16()),
            ErrorKind::Decode => f.write_str("response body could not be decoded"),
            ErrorKind::Io => f.write_str("connection i/o failed"),
            ErrorKind::NotProcessed => f.write_str("the server did not process the request"),
            ErrorKind::Proxy => f.write_str("proxy failed"),
            ErrorKind::Interceptor => f.write_str("interceptor failed"),
            ErrorKind::Cancelled => f.write_str("call cancelled"),
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.describe(f)
    }
}
