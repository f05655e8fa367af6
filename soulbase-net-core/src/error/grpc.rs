//! [`GrpcCode`]: the seventeen gRPC status codes, without a dependency on a gRPC crate.
//!
//! Why our own type: a service that answers over gRPC with another stack than tonic (or that
//! only logs the code) should not have to build tonic to learn which code an outbound failure
//! maps to. With the `tonic` feature, `GrpcCode` converts to and from `tonic::Code`.

use std::fmt;

/// A gRPC status code, as the gRPC specification numbers them (`doc/statuscodes.md`).
///
/// `code as i32` is the number sent in `grpc-status`. The set is closed by the
/// specification, so the enum is exhaustive: callers may match every code.
///
/// # Examples
/// ```
/// use soulbase_net_core::GrpcCode;
///
/// assert_eq!(GrpcCode::DeadlineExceeded as i32, 4);
/// assert_eq!(GrpcCode::from_i32(14), GrpcCode::Unavailable);
/// assert_eq!(GrpcCode::from_i32(99), GrpcCode::Unknown);
/// assert_eq!(GrpcCode::ResourceExhausted.as_str(), "RESOURCE_EXHAUSTED");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i32)]
pub enum GrpcCode {
    /// `OK` (0): not an error.
    Ok = 0,
    /// `CANCELLED` (1): the operation was cancelled, typically by the caller.
    Cancelled = 1,
    /// `UNKNOWN` (2): an error without enough information to say more.
    Unknown = 2,
    /// `INVALID_ARGUMENT` (3): the caller gave an invalid argument.
    InvalidArgument = 3,
    /// `DEADLINE_EXCEEDED` (4): the deadline passed before the operation completed.
    DeadlineExceeded = 4,
    /// `NOT_FOUND` (5): a requested entity was not found.
    NotFound = 5,
    /// `ALREADY_EXISTS` (6): the entity the caller tried to create already exists.
    AlreadyExists = 6,
    /// `PERMISSION_DENIED` (7): the caller may not do this.
    PermissionDenied = 7,
    /// `RESOURCE_EXHAUSTED` (8): a quota or other resource is exhausted.
    ResourceExhausted = 8,
    /// `FAILED_PRECONDITION` (9): the system is not in the state the operation needs.
    FailedPrecondition = 9,
    /// `ABORTED` (10): aborted, typically by a concurrency conflict.
    Aborted = 10,
    /// `OUT_OF_RANGE` (11): past the valid range.
    OutOfRange = 11,
    /// `UNIMPLEMENTED` (12): not implemented or not supported.
    Unimplemented = 12,
    /// `INTERNAL` (13): an invariant of the serving system is broken.
    Internal = 13,
    /// `UNAVAILABLE` (14): transiently unavailable; a retry with backoff may succeed.
    Unavailable = 14,
    /// `DATA_LOSS` (15): unrecoverable data loss or corruption.
    DataLoss = 15,
    /// `UNAUTHENTICATED` (16): the caller's credentials are missing or invalid.
    Unauthenticated = 16,
}

// === impl GrpcCode ===

impl GrpcCode {
    /// Every code, in numeric order.
    pub const ALL: [GrpcCode; 17] = [
        GrpcCode::Ok,
        GrpcCode::Cancelled,
        GrpcCode::Unknown,
        GrpcCode::InvalidArgument,
        GrpcCode::DeadlineExceeded,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::PermissionDenied,
        GrpcCode::ResourceExhausted,
        GrpcCode::FailedPrecondition,
        GrpcCode::Aborted,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
        GrpcCode::Unauthenticated,
    ];

    /// The code numbered `n`; a number outside 0–16 is `Unknown`, as the specification says a
    /// receiver must treat it.
    pub const fn from_i32(n: i32) -> GrpcCode {
        if n >= 0 && n < GrpcCode::ALL.len() as i32 {
            GrpcCode::ALL[n as usize]
        } else {
            GrpcCode::Unknown
        }
    }

    /// The specification's name, e.g. `"DEADLINE_EXCEEDED"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            GrpcCode::Ok => "OK",
            GrpcCode::Cancelled => "CANCELLED",
            GrpcCode::Unknown => "UNKNOWN",
            GrpcCode::InvalidArgument => "INVALID_ARGUMENT",
            GrpcCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            GrpcCode::NotFound => "NOT_FOUND",
            GrpcCode::AlreadyExists => "ALREADY_EXISTS",
            GrpcCode::PermissionDenied => "PERMISSION_DENIED",
            GrpcCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GrpcCode::FailedPrecondition => "FAILED_PRECONDITION",
            GrpcCode::Aborted => "ABORTED",
            GrpcCode::OutOfRange => "OUT_OF_RANGE",
            GrpcCode::Unimplemented => "UNIMPLEMENTED",
            GrpcCode::Internal => "INTERNAL",
            GrpcCode::Unavailable => "UNAVAILABLE",
            GrpcCode::DataLoss => "DATA_LOSS",
            GrpcCode::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<GrpcCode> for i32 {
    fn from(code: GrpcCode) -> i32 {
        code as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_the_specification() {
        for (n, code) in GrpcCode::ALL.into_iter().enumerate() {
            assert_eq!(code as i32, n as i32, "{code}");
            assert_eq!(GrpcCode::from_i32(n as i32), code);
        }
        assert_eq!(GrpcCode::Unauthenticated as i32, 16);
        assert_eq!(GrpcCode::from_i32(-1), GrpcCode::Unknown);
        assert_eq!(GrpcCode::from_i32(17), GrpcCode::Unknown);
    }

    #[test]
    fn names_are_the_specifications() {
        let names: Vec<&str> = GrpcCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            names,
            [
                "OK",
                "CANCELLED",
                "UNKNOWN",
                "INVALID_ARGUMENT",
                "DEADLINE_EXCEEDED",
                "NOT_FOUND",
                "ALREADY_EXISTS",
                "PERMISSION_DENIED",
                "RESOURCE_EXHAUSTED",
                "FAILED_PRECONDITION",
                "ABORTED",
                "OUT_OF_RANGE",
                "UNIMPLEMENTED",
                "INTERNAL",
                "UNAVAILABLE",
                "DATA_LOSS",
                "UNAUTHENTICATED",
            ]
        );
    }
}
