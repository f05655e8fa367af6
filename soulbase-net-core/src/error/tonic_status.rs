//! A [`NetError`] across a gRPC boundary (feature `tonic`): `From<NetError> for tonic::Status`
//! and [`NetError::from_status`] back.
//!
//! Why metadata and not only the code: tonic turns any other error into `Code::Unknown`, and
//! even the right gRPC code is shared by many kinds (`UNAVAILABLE` for a refused connection, an
//! open circuit, a reset). The status carries the stable code ([`ERROR_CODE_HEADER`]) and the
//! exact kind ([`ERROR_KIND_HEADER`]), so the service on the other side restores the same
//! kind, and the `Retry-After` as gRPC's `grpc-retry-pushback-ms`.

use std::{error::Error as StdError, fmt, sync::Arc, time::Duration};

use tonic::metadata::{MetadataMap, MetadataValue};

use super::{ErrorKind, GrpcCode, NetError, Phase, ERROR_CODE_HEADER, ERROR_KIND_HEADER};

/// gRPC's server pushback (gRFC A6): how long the client should wait before trying again, in
/// milliseconds.
const PUSHBACK: &str = "grpc-retry-pushback-ms";

// === impl From<NetError> for tonic::Status ===

/// The status a service answers its caller with when an outbound call failed: the code is
/// [`NetError::grpc_code`]; the message is the stable code and what happened
/// (`"PROVIDER.TIMEOUT: timed out reading the response body"`), without the place (the
/// upstream's URL stays inside the service); the metadata holds the stable code
/// (`x-soulbase-error-code`), the exact kind (`x-soulbase-error-kind`) and, when the error
/// has one, the `Retry-After` as `grpc-retry-pushback-ms`. The error itself is the status's
/// source, for this process's own logs.
///
/// # Examples
/// ```
/// use soulbase_net_core::{NetError, Phase};
///
/// let status = tonic::Status::from(NetError::timeout(Phase::Read));
/// assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
/// assert_eq!(status.message(), "PROVIDER.TIMEOUT: timed out reading the response body");
/// assert_eq!(status.metadata().get("x-soulbase-error-code").unwrap(), "PROVIDER.TIMEOUT");
/// assert_eq!(status.metadata().get("x-soulbase-error-kind").unwrap(), "timeout_read");
/// ```
impl From<NetError> for tonic::Status {
    fn from(err: NetError) -> tonic::Status {
        let kind = err.kind();
        let mut metadata = MetadataMap::new();
        metadata.insert(
            ERROR_CODE_HEADER,
            MetadataValue::from_static(err.code().as_str()),
        );
        if let Ok(token) = MetadataValue::try_from(kind_token(kind)) {
            metadata.insert(ERROR_KIND_HEADER, token);
        }
        if let Some(after) = err.retry_after() {
            metadata.insert(PUSHBACK, MetadataValue::from(millis(after)));
        }
        let message = format!("{}: {}", err.code(), Described(&err));
        let mut status =
            tonic::Status::with_metadata(tonic::Code::from(err.grpc_code()), message, metadata);
        status.set_source(Arc::new(err));
        status
    }
}

impl From<GrpcCode> for tonic::Code {
    fn from(code: GrpcCode) -> tonic::Code {
        tonic::Code::from_i32(code as i32)
    }
}

impl From<tonic::Code> for GrpcCode {
    fn from(code: tonic::Code) -> GrpcCode {
        GrpcCode::from_i32(code as i32)
    }
}

// === impl NetError ===

impl NetError {
    /// The error a gRPC status stands for, the way back of `tonic::Status::from(NetError)`.
    ///
    /// In this order:
    /// 1. a [`NetError`] in the status's source chain (tonic wraps a channel's error as
    ///    `Code::Unknown` with the error as its source; `From<NetError>` keeps it there too):
    ///    that error's kind, message, context, attempts and `Retry-After` (its own source
    ///    stays with the status);
    /// 2. the kind named by the `x-soulbase-error-kind` metadata, when a soulbase service
    ///    sent the status; `grpc-retry-pushback-ms` gives the `Retry-After`;
    /// 3. otherwise the closest kind to the gRPC code: `CANCELLED` is [`ErrorKind::Cancelled`],
    ///    `DEADLINE_EXCEEDED` is `Timeout(Total)`, and every other code is the upstream's
    ///    answer, so [`ErrorKind::Status`] with the HTTP status the gRPC gateway gives that
    ///    code (`UNAVAILABLE` → 503, `PERMISSION_DENIED` → 403, `RESOURCE_EXHAUSTED` → 429,
    ///    `INVALID_ARGUMENT` → 400, `NOT_FOUND` → 404, `UNAUTHENTICATED` → 401, …), whose
    ///    stable code follows [`status_code`](crate::status_code). Not `Blocked` or
    ///    `RateLimited`: those say that this client refused the call, which it did not. `OK`,
    ///    which is no error, is [`ErrorKind::Io`] (an answer that made no sense).
    ///
    /// In cases 2 and 3 the error's message names the gRPC code and its source holds the
    /// status's message; attempts are 0, as no attempt of this process's client is known.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_core::{ErrorKind, NetError, Phase};
    ///
    /// // Across the wire: only the code, the message and the metadata travel.
    /// let sent = tonic::Status::from(NetError::timeout(Phase::Ttfb));
    /// let received = tonic::Status::with_metadata(sent.code(), sent.message(), sent.metadata().clone());
    /// assert_eq!(NetError::from_status(&received).kind(), ErrorKind::Timeout(Phase::Ttfb));
    ///
    /// // From a server that is not a soulbase service: the closest kind to the code.
    /// let status = tonic::Status::unavailable("overloaded");
    /// assert_eq!(NetError::from_status(&status).kind(), ErrorKind::Status(http::StatusCode::SERVICE_UNAVAILABLE));
    /// ```
    pub fn from_status(status: &tonic::Status) -> NetError {
        let chain = std::iter::successors(
            Some(status as &(dyn StdError + 'static)),
            |e: &&(dyn StdError + 'static)| (*e).source(),
        );
        if let Some(found) = chain.filter_map(|e| e.downcast_ref::<NetError>()).next() {
            return found.copy_without_source();
        }
        let code = GrpcCode::from(status.code());
        let metadata = status.metadata();
        let kind = metadata
            .get(ERROR_KIND_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(kind_from_token)
            .unwrap_or_else(|| closest_kind(code));
        let mut err = NetError::new(kind)
            .with_message(format!("grpc status {code}"))
            .with_source(RemoteStatus {
                code,
                message: status.message().to_owned(),
            });
        let pushback = metadata
            .get(PUSHBACK)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(ms) = pushback {
            err = err.with_retry_after(Duration::from_millis(ms));
        }
        err
    }

    /// This error's facts without its source, which cannot be copied.
    fn copy_without_source(&self) -> NetError {
        let inner = &self.inner;
        let mut err = NetError::new(inner.kind)
            .with_attempts(inner.attempts)
            .with_quota_visible(inner.quota_visible);
        err.inner.message = inner.message.clone();
        err.inner.context = inner.context.clone();
        err.inner.retry_after = inner.retry_after;
        err
    }
}

/// The kind's `Display` without the place and attempts: what happened, and the message.
struct Described<'a>(&'a NetError);

impl fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.inner.kind.describe(f)?;
        match &self.0.inner.message {
            Some(message) => write!(f, ": {message}"),
            None => Ok(()),
        }
    }
}

/// A status's code and message, kept as the source of the error made from it.
#[derive(Debug)]
struct RemoteStatus {
    code: GrpcCode,
    message: String,
}

impl fmt::Display for RemoteStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "grpc status {}: {}", self.code, self.message)
    }
}

impl StdError for RemoteStatus {}

/// A duration in whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The value of `x-soulbase-error-kind` for `kind`: its label, or `status_` and the number.
fn kind_token(kind: ErrorKind) -> String {
    match kind {
        ErrorKind::Status(status) => format!("status_{}", status.as_u16()),
        other => other.label().to_owned(),
    }
}

/// The kind a `x-soulbase-error-kind` value names, if it names one.
fn kind_from_token(token: &str) -> Option<ErrorKind> {
    if let Some(number) = token.strip_prefix("status_") {
        let status = http::StatusCode::from_u16(number.parse().ok()?).ok()?;
        return Some(ErrorKind::Status(status));
    }
    ErrorKind::ALL_SIMPLE
        .into_iter()
        .filter(|k| !matches!(k, ErrorKind::Status(_)))
        .chain(Phase::ALL.map(ErrorKind::Timeout))
        .find(|k| k.label() == token)
}

/// The closest kind to a gRPC code from a status without soulbase metadata (see
/// [`NetError::from_status`]); the statuses are the gRPC gateway's HTTP forms of the codes.
fn closest_kind(code: GrpcCode) -> ErrorKind {
    use http::StatusCode as S;
    let status = match code {
        GrpcCode::Ok => return ErrorKind::Io,
        GrpcCode::Cancelled => return ErrorKind::Cancelled,
        GrpcCode::DeadlineExceeded => return ErrorKind::Timeout(Phase::Total),
        GrpcCode::InvalidArgument | GrpcCode::FailedPrecondition | GrpcCode::OutOfRange => {
            S::BAD_REQUEST
        }
        GrpcCode::NotFound => S::NOT_FOUND,
        GrpcCode::AlreadyExists | GrpcCode::Aborted => S::CONFLICT,
        GrpcCode::PermissionDenied => S::FORBIDDEN,
        GrpcCode::Unauthenticated => S::UNAUTHORIZED,
        GrpcCode::ResourceExhausted => S::TOO_MANY_REQUESTS,
        GrpcCode::Unimplemented => S::NOT_IMPLEMENTED,
        GrpcCode::Unavailable => S::SERVICE_UNAVAILABLE,
        GrpcCode::Unknown | GrpcCode::Internal | GrpcCode::DataLoss => S::INTERNAL_SERVER_ERROR,
    };
    ErrorKind::Status(status)
}

#[cfg(test)]
mod tests;
