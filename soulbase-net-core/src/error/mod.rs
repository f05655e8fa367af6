//! The one error type of soulbase-net: [`NetError`], its [`ErrorKind`] and stable [`ErrorCode`].

mod code;
mod kind;

use std::{error::Error as StdError, fmt, time::Duration};

pub use self::code::{status_code, ErrorCode};
pub use self::kind::{ErrorKind, Phase};

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
    pub fn public_code(&self) -> ErrorCode {
        self.code().public_view_with(self.inner.quota_visible)
    }

    /// The attempts made before this error; 0 when the request never left.
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
