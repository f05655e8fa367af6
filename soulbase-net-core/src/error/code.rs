//! Stable SB-02 error codes and the one table that maps every [`ErrorKind`] to its code.
//!
//! Why one table: callers outside the service match on these codes, so a kind must never
//! change code by accident. Every row is pinned by a test below.

use std::fmt;

use super::kind::ErrorKind;

/// A stable error code, the same for a kind of failure in every release (`PROVIDER.TIMEOUT`,
/// `AUTH.FORBIDDEN`, …).
///
/// The string form ([`ErrorCode::as_str`]) never changes for a variant; services report it,
/// alert on it and map it to their own domain codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `PROVIDER.UNAVAILABLE`: the upstream could not be reached or did not answer usefully
    /// (DNS, connect, TLS handshake, I/O, 5xx, breaker open, retries spent, response too large).
    ProviderUnavailable,
    /// `PROVIDER.TIMEOUT`: a connect, first-byte, read, write or total deadline passed.
    /// Its public view is `PROVIDER.UNAVAILABLE`.
    ProviderTimeout,
    /// `AUTH.FORBIDDEN`: the call was refused for security reasons (certificate or pin
    /// verification, mTLS, SSRF guard, allow-list, 401/403 from the upstream).
    AuthForbidden,
    /// `SCHEMA.VALIDATION_FAILED`: the request (URL, headers, body size) or the response
    /// body (JSON decoding) was not valid, or the upstream rejected it with a 4xx.
    SchemaValidationFailed,
    /// `QUOTA.RATE_LIMITED`: a local limit (concurrency, rate, byte budget) or the upstream
    /// (429) refused the call. Its public view is `PROVIDER.UNAVAILABLE` unless QoS is on.
    QuotaRateLimited,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 5] = [
        ErrorCode::ProviderUnavailable,
        ErrorCode::ProviderTimeout,
        ErrorCode::AuthForbidden,
        ErrorCode::SchemaValidationFailed,
        ErrorCode::QuotaRateLimited,
    ];

    /// The stable string form, e.g. `"PROVIDER.TIMEOUT"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ProviderUnavailable => "PROVIDER.UNAVAILABLE",
            ErrorCode::ProviderTimeout => "PROVIDER.TIMEOUT",
            ErrorCode::AuthForbidden => "AUTH.FORBIDDEN",
            ErrorCode::SchemaValidationFailed => "SCHEMA.VALIDATION_FAILED",
            ErrorCode::QuotaRateLimited => "QUOTA.RATE_LIMITED",
        }
    }

    /// What callers outside the service may see, with QoS off:
    /// timeouts and rate limits both show as `PROVIDER.UNAVAILABLE`.
    pub const fn public_view(self) -> ErrorCode {
        self.public_view_with(false)
    }

    /// The public view when QoS is `qos_enabled`: with QoS on, `QUOTA.RATE_LIMITED` stays
    /// visible so callers can back off; timeouts are always `PROVIDER.UNAVAILABLE`.
    pub const fn public_view_with(self, qos_enabled: bool) -> ErrorCode {
        match self {
            ErrorCode::ProviderTimeout => ErrorCode::ProviderUnavailable,
            ErrorCode::QuotaRateLimited if !qos_enabled => ErrorCode::ProviderUnavailable,
            other => other,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The code of an HTTP status met by `error_for_status()` and the JSON helpers.
///
/// | status            | code                       | why |
/// |-------------------|----------------------------|-----|
/// | 401, 403, 407     | `AUTH.FORBIDDEN`           | the upstream refused our identity |
/// | 408               | `PROVIDER.TIMEOUT`         | the upstream timed out reading the request |
/// | 429               | `QUOTA.RATE_LIMITED`       | the upstream's rate limit |
/// | other 4xx         | `SCHEMA.VALIDATION_FAILED` | the upstream rejected the request as invalid |
/// | 5xx               | `PROVIDER.UNAVAILABLE`     | the upstream failed |
/// | anything else     | `PROVIDER.UNAVAILABLE`     | a status the client did not expect (1xx/3xx) |
pub const fn status_code(status: u16) -> ErrorCode {
    match status {
        401 | 403 | 407 => ErrorCode::AuthForbidden,
        408 => ErrorCode::ProviderTimeout,
        429 => ErrorCode::QuotaRateLimited,
        400..=499 => ErrorCode::SchemaValidationFailed,
        _ => ErrorCode::ProviderUnavailable,
    }
}

/// The code of a kind: the single mapping table of the workspace.
pub(crate) const fn kind_code(kind: ErrorKind) -> ErrorCode {
    match kind {
        ErrorKind::Dns
        | ErrorKind::Connect
        | ErrorKind::Tls
        | ErrorKind::Io
        | ErrorKind::NotProcessed
        | ErrorKind::Proxy
        | ErrorKind::CircuitOpen
        | ErrorKind::BudgetExhausted
        | ErrorKind::TooLarge
        | ErrorKind::RedirectLimit
        | ErrorKind::Interceptor
        | ErrorKind::Cancelled => ErrorCode::ProviderUnavailable,
        ErrorKind::Timeout(_) => ErrorCode::ProviderTimeout,
        ErrorKind::TlsVerify | ErrorKind::Blocked => ErrorCode::AuthForbidden,
        ErrorKind::InvalidRequest | ErrorKind::Decode => ErrorCode::SchemaValidationFailed,
        ErrorKind::RateLimited | ErrorKind::QuotaExceeded => ErrorCode::QuotaRateLimited,
        ErrorKind::Status(status) => status_code(status.as_u16()),
    }
}

impl ErrorKind {
    /// The stable SB-02 code of this kind.
    pub const fn code(self) -> ErrorCode {
        kind_code(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Phase;
    use ErrorCode::*;

    /// A status by number, in a `const` table.
    const fn st(n: u16) -> http::StatusCode {
        match http::StatusCode::from_u16(n) {
            Ok(s) => s,
            Err(_) => panic!("not a status"),
        }
    }

    /// Seed 000 §8.2, row by row: (kind, code, public view with QoS off, with QoS on).
    const TABLE: &[(ErrorKind, ErrorCode, ErrorCode, ErrorCode)] = &[
        (
            ErrorKind::Dns,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Connect,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Tls,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Io,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Proxy,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::CircuitOpen,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::BudgetExhausted,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::TooLarge,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::RedirectLimit,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::NotProcessed,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Cancelled,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Interceptor,
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Timeout(Phase::Dns),
            ProviderTimeout,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Timeout(Phase::Connect),
            ProviderTimeout,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Timeout(Phase::Tls),
            ProviderTimeout,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Timeout(Phase::Write),
            ProviderTimeout,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Timeout(Phase::Ttfb),
            ProviderTimeout,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Timeout(Phase::Read),
            ProviderTimeout,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Timeout(Phase::Total),
            ProviderTimeout,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::TlsVerify,
            AuthForbidden,
            AuthForbidden,
            AuthForbidden,
        ),
        (
            ErrorKind::Blocked,
            AuthForbidden,
            AuthForbidden,
            AuthForbidden,
        ),
        (
            ErrorKind::InvalidRequest,
            SchemaValidationFailed,
            SchemaValidationFailed,
            SchemaValidationFailed,
        ),
        (
            ErrorKind::Decode,
            SchemaValidationFailed,
            SchemaValidationFailed,
            SchemaValidationFailed,
        ),
        (
            ErrorKind::RateLimited,
            QuotaRateLimited,
            ProviderUnavailable,
            QuotaRateLimited,
        ),
        (
            ErrorKind::QuotaExceeded,
            QuotaRateLimited,
            ProviderUnavailable,
            QuotaRateLimited,
        ),
        (
            ErrorKind::Status(st(500)),
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Status(st(503)),
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Status(st(429)),
            QuotaRateLimited,
            ProviderUnavailable,
            QuotaRateLimited,
        ),
        (
            ErrorKind::Status(st(401)),
            AuthForbidden,
            AuthForbidden,
            AuthForbidden,
        ),
        (
            ErrorKind::Status(st(403)),
            AuthForbidden,
            AuthForbidden,
            AuthForbidden,
        ),
        (
            ErrorKind::Status(st(407)),
            AuthForbidden,
            AuthForbidden,
            AuthForbidden,
        ),
        (
            ErrorKind::Status(st(408)),
            ProviderTimeout,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
        (
            ErrorKind::Status(st(400)),
            SchemaValidationFailed,
            SchemaValidationFailed,
            SchemaValidationFailed,
        ),
        (
            ErrorKind::Status(st(404)),
            SchemaValidationFailed,
            SchemaValidationFailed,
            SchemaValidationFailed,
        ),
        (
            ErrorKind::Status(st(422)),
            SchemaValidationFailed,
            SchemaValidationFailed,
            SchemaValidationFailed,
        ),
        (
            ErrorKind::Status(st(302)),
            ProviderUnavailable,
            ProviderUnavailable,
            ProviderUnavailable,
        ),
    ];

    #[test]
    fn every_row_of_the_table() {
        for &(kind, code, public, public_qos) in TABLE {
            assert_eq!(kind.code(), code, "code of {kind:?}");
            assert_eq!(kind.code().public_view(), public, "public view of {kind:?}");
            assert_eq!(
                kind.code().public_view_with(true),
                public_qos,
                "public view with QoS of {kind:?}"
            );
        }
    }

    #[test]
    fn table_covers_every_kind() {
        for kind in ErrorKind::ALL_SIMPLE {
            assert!(
                TABLE.iter().any(|row| row.0 == kind),
                "{kind:?} has no row in the code table test"
            );
        }
    }

    #[test]
    fn code_strings_are_stable_and_unique() {
        let strings: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            strings,
            [
                "PROVIDER.UNAVAILABLE",
                "PROVIDER.TIMEOUT",
                "AUTH.FORBIDDEN",
                "SCHEMA.VALIDATION_FAILED",
                "QUOTA.RATE_LIMITED"
            ]
        );
        let mut dedup = strings.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), strings.len());
        assert_eq!(ErrorCode::ProviderTimeout.to_string(), "PROVIDER.TIMEOUT");
    }
}
