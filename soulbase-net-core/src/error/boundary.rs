//! What a service answers its own caller when an outbound call failed: the HTTP status and the
//! gRPC code of every [`ErrorKind`], in one table (documented on
//! [`NetError::http_status`](super::NetError::http_status)).
//!
//! Why a table of its own next to the code table: the stable codes say *what* failed and are
//! folded for outside callers (`public_code`), which loses the difference between "the
//! upstream was slow" (504) and "the upstream is down" (502/503). The status a gateway answers
//! is a separate question with its own conventions (Envoy, nginx, gRPC's status codes), so it
//! gets its own match, pinned row by row by the tests below.

use http::StatusCode;

use super::grpc::GrpcCode;
use super::kind::ErrorKind;

/// nginx's `499 Client Closed Request`: the caller went away before the answer (the gRPC
/// gateway's HTTP form of `CANCELLED` too). Not in the `http` crate's constants.
const CLIENT_CLOSED_REQUEST: StatusCode = match StatusCode::from_u16(499) {
    Ok(status) => status,
    // Unreachable: every number in 100..=999 is a valid status.
    Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
};

/// The HTTP status and gRPC code a service answers with when an outbound call failed with
/// `kind`: the single table behind `http_status()` and `grpc_code()`.
pub(crate) const fn boundary(kind: ErrorKind) -> (StatusCode, GrpcCode) {
    use GrpcCode as G;
    match kind {
        ErrorKind::Dns
        | ErrorKind::Connect
        | ErrorKind::Tls
        | ErrorKind::TlsVerify
        | ErrorKind::Io
        | ErrorKind::Proxy => (StatusCode::BAD_GATEWAY, G::Unavailable),
        ErrorKind::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, G::DeadlineExceeded),
        ErrorKind::CircuitOpen | ErrorKind::BudgetExhausted | ErrorKind::NotProcessed => {
            (StatusCode::SERVICE_UNAVAILABLE, G::Unavailable)
        }
        ErrorKind::RateLimited | ErrorKind::QuotaExceeded => {
            (StatusCode::TOO_MANY_REQUESTS, G::ResourceExhausted)
        }
        ErrorKind::Blocked => (StatusCode::FORBIDDEN, G::PermissionDenied),
        ErrorKind::InvalidRequest => (StatusCode::BAD_REQUEST, G::InvalidArgument),
        ErrorKind::TooLarge | ErrorKind::RedirectLimit | ErrorKind::Decode => {
            (StatusCode::BAD_GATEWAY, G::Internal)
        }
        ErrorKind::Interceptor => (StatusCode::INTERNAL_SERVER_ERROR, G::Internal),
        ErrorKind::Cancelled => (CLIENT_CLOSED_REQUEST, G::Cancelled),
        ErrorKind::Status(status) => upstream_status(status),
    }
}

/// The answer to an upstream's error status: see the `Status(…)` rows of the table.
const fn upstream_status(status: StatusCode) -> (StatusCode, GrpcCode) {
    use GrpcCode as G;
    match status.as_u16() {
        408 => (StatusCode::GATEWAY_TIMEOUT, G::DeadlineExceeded),
        429 => (StatusCode::TOO_MANY_REQUESTS, G::ResourceExhausted),
        401 | 403 | 407 => (StatusCode::BAD_GATEWAY, G::Internal),
        404 | 410 => (status, G::NotFound),
        409 => (status, G::Aborted),
        400..=499 => (status, G::InvalidArgument),
        501 | 505 => (StatusCode::BAD_GATEWAY, G::Internal),
        500..=599 => (StatusCode::BAD_GATEWAY, G::Unavailable),
        _ => (StatusCode::BAD_GATEWAY, G::Unknown),
    }
}

impl ErrorKind {
    /// The HTTP status a service answers its own caller with when an outbound call failed
    /// with this kind; the table is on [`NetError::http_status`](crate::NetError::http_status).
    ///
    /// ```
    /// use soulbase_net_core::{ErrorKind, Phase};
    ///
    /// assert_eq!(ErrorKind::Timeout(Phase::Read).http_status(), http::StatusCode::GATEWAY_TIMEOUT);
    /// ```
    pub const fn http_status(self) -> http::StatusCode {
        boundary(self).0
    }

    /// The gRPC code a service answers its own caller with when an outbound call failed with
    /// this kind; the table is on [`NetError::http_status`](crate::NetError::http_status).
    ///
    /// ```
    /// use soulbase_net_core::{ErrorKind, GrpcCode};
    ///
    /// assert_eq!(ErrorKind::CircuitOpen.grpc_code(), GrpcCode::Unavailable);
    /// ```
    pub const fn grpc_code(self) -> GrpcCode {
        boundary(self).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorCode, Phase};
    use ErrorCode::*;
    use GrpcCode as G;

    /// A status by number, in a `const` table.
    const fn st(n: u16) -> StatusCode {
        match StatusCode::from_u16(n) {
            Ok(s) => s,
            Err(_) => panic!("not a status"),
        }
    }

    /// The table of `NetError::http_status`'s rustdoc, row by row:
    /// (kind, stable code, HTTP status, gRPC code).
    const TABLE: &[(ErrorKind, ErrorCode, u16, GrpcCode)] = &[
        (ErrorKind::Dns, ProviderUnavailable, 502, G::Unavailable),
        (ErrorKind::Connect, ProviderUnavailable, 502, G::Unavailable),
        (ErrorKind::Tls, ProviderUnavailable, 502, G::Unavailable),
        (ErrorKind::TlsVerify, AuthForbidden, 502, G::Unavailable),
        (ErrorKind::Io, ProviderUnavailable, 502, G::Unavailable),
        (ErrorKind::Proxy, ProviderUnavailable, 502, G::Unavailable),
        (
            ErrorKind::Timeout(Phase::Dns),
            ProviderTimeout,
            504,
            G::DeadlineExceeded,
        ),
        (
            ErrorKind::Timeout(Phase::Connect),
            ProviderTimeout,
            504,
            G::DeadlineExceeded,
        ),
        (
            ErrorKind::Timeout(Phase::Tls),
            ProviderTimeout,
            504,
            G::DeadlineExceeded,
        ),
        (
            ErrorKind::Timeout(Phase::Write),
            ProviderTimeout,
            504,
            G::DeadlineExceeded,
        ),
        (
            ErrorKind::Timeout(Phase::Ttfb),
            ProviderTimeout,
            504,
            G::DeadlineExceeded,
        ),
        (
            ErrorKind::Timeout(Phase::Read),
            ProviderTimeout,
            504,
            G::DeadlineExceeded,
        ),
        (
            ErrorKind::Timeout(Phase::Total),
            ProviderTimeout,
            504,
            G::DeadlineExceeded,
        ),
        (
            ErrorKind::CircuitOpen,
            ProviderUnavailable,
            503,
            G::Unavailable,
        ),
        (
            ErrorKind::BudgetExhausted,
            ProviderUnavailable,
            503,
            G::Unavailable,
        ),
        (
            ErrorKind::NotProcessed,
            ProviderUnavailable,
            503,
            G::Unavailable,
        ),
        (
            ErrorKind::RateLimited,
            QuotaRateLimited,
            429,
            G::ResourceExhausted,
        ),
        (
            ErrorKind::QuotaExceeded,
            QuotaRateLimited,
            429,
            G::ResourceExhausted,
        ),
        (ErrorKind::Blocked, AuthForbidden, 403, G::PermissionDenied),
        (
            ErrorKind::InvalidRequest,
            SchemaValidationFailed,
            400,
            G::InvalidArgument,
        ),
        (ErrorKind::TooLarge, ProviderUnavailable, 502, G::Internal),
        (
            ErrorKind::RedirectLimit,
            ProviderUnavailable,
            502,
            G::Internal,
        ),
        (ErrorKind::Decode, SchemaValidationFailed, 502, G::Internal),
        (
            ErrorKind::Interceptor,
            ProviderUnavailable,
            500,
            G::Internal,
        ),
        (ErrorKind::Cancelled, ProviderUnavailable, 499, G::Cancelled),
        (
            ErrorKind::Status(st(500)),
            ProviderUnavailable,
            502,
            G::Unavailable,
        ),
        (
            ErrorKind::Status(st(502)),
            ProviderUnavailable,
            502,
            G::Unavailable,
        ),
        (
            ErrorKind::Status(st(503)),
            ProviderUnavailable,
            502,
            G::Unavailable,
        ),
        (
            ErrorKind::Status(st(504)),
            ProviderUnavailable,
            502,
            G::Unavailable,
        ),
        (
            ErrorKind::Status(st(501)),
            ProviderUnavailable,
            502,
            G::Internal,
        ),
        (
            ErrorKind::Status(st(505)),
            ProviderUnavailable,
            502,
            G::Internal,
        ),
        (
            ErrorKind::Status(st(429)),
            QuotaRateLimited,
            429,
            G::ResourceExhausted,
        ),
        (
            ErrorKind::Status(st(408)),
            ProviderTimeout,
            504,
            G::DeadlineExceeded,
        ),
        (ErrorKind::Status(st(401)), AuthForbidden, 502, G::Internal),
        (ErrorKind::Status(st(403)), AuthForbidden, 502, G::Internal),
        (ErrorKind::Status(st(407)), AuthForbidden, 502, G::Internal),
        (
            ErrorKind::Status(st(404)),
            SchemaValidationFailed,
            404,
            G::NotFound,
        ),
        (
            ErrorKind::Status(st(410)),
            SchemaValidationFailed,
            410,
            G::NotFound,
        ),
        (
            ErrorKind::Status(st(409)),
            SchemaValidationFailed,
            409,
            G::Aborted,
        ),
        (
            ErrorKind::Status(st(400)),
            SchemaValidationFailed,
            400,
            G::InvalidArgument,
        ),
        (
            ErrorKind::Status(st(422)),
            SchemaValidationFailed,
            422,
            G::InvalidArgument,
        ),
        (
            ErrorKind::Status(st(413)),
            SchemaValidationFailed,
            413,
            G::InvalidArgument,
        ),
        (
            ErrorKind::Status(st(302)),
            ProviderUnavailable,
            502,
            G::Unknown,
        ),
        (
            ErrorKind::Status(st(103)),
            ProviderUnavailable,
            502,
            G::Unknown,
        ),
    ];

    #[test]
    fn every_row_of_the_table() {
        for &(kind, code, status, grpc) in TABLE {
            assert_eq!(kind.code(), code, "code of {kind:?}");
            assert_eq!(kind.http_status().as_u16(), status, "status of {kind:?}");
            assert_eq!(kind.grpc_code(), grpc, "gRPC code of {kind:?}");
        }
    }

    #[test]
    fn table_covers_every_kind_and_phase() {
        let kinds = ErrorKind::ALL_SIMPLE
            .into_iter()
            .chain(Phase::ALL.map(ErrorKind::Timeout));
        for kind in kinds {
            assert!(
                TABLE.iter().any(|row| row.0 == kind),
                "{kind:?} has no row in the boundary table test"
            );
        }
    }

    #[test]
    fn every_status_gets_an_answer_a_caller_can_read() {
        // Every status the http crate accepts: the answer is an error status, and an
        // upstream's 5xx never reaches the caller as a 5xx of the upstream's choosing.
        for n in 100..=999 {
            let (status, grpc) = upstream_status(st(n));
            assert!(
                status.is_client_error() || status.is_server_error(),
                "{n} -> {status}"
            );
            assert_ne!(grpc, G::Ok, "{n}");
            if (500..=599).contains(&n) {
                assert_eq!(status, StatusCode::BAD_GATEWAY, "{n}");
            }
        }
    }

    #[test]
    fn timeouts_are_never_folded_into_unavailable() {
        // The reason the table exists: a slow body is 504, not the 503 of `public_code`.
        for phase in Phase::ALL {
            let kind = ErrorKind::Timeout(phase);
            assert_eq!(kind.code().public_view(), ProviderUnavailable);
            assert_eq!(kind.http_status(), StatusCode::GATEWAY_TIMEOUT);
            assert_eq!(kind.grpc_code(), G::DeadlineExceeded);
        }
    }
}
