//! Lower-case hex and random identifiers shared by the interceptors.

/// `bytes` as lower-case hex.
#[cfg(feature = "idempotency")]
pub(crate) fn encode(bytes: &[u8]) -> String {
    use std::fmt::Write as _;

    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// 16 random bytes as 32 hex characters; never all zero.
#[cfg(any(feature = "trace", feature = "idempotency"))]
pub(crate) fn random_128() -> String {
    let mut v = fastrand::u128(..);
    if v == 0 {
        v = 1;
    }
    format!("{v:032x}")
}
