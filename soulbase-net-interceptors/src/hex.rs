//! Lower-case hex and random identifiers shared by the interceptors. Table lookups rather
//! than `format!`: these run for every request (trace and request ids, span ids, keys).

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends `bytes` to `out` as lower-case hex.
#[cfg(feature = "idempotency")]
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

/// `bytes` as lower-case hex.
/// Writes `bytes` as lowercase hex into `out`, which holds exactly two bytes per input byte.
#[cfg(feature = "trace")]
pub(crate) fn write_hex(out: &mut [u8], bytes: &[u8]) {
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0x0f)];
    }
}

#[cfg(feature = "idempotency")]
pub(crate) fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    out
}

#[cfg(all(test, feature = "idempotency", feature = "trace"))]
mod tests {
    use super::*;

    #[test]
    fn hex_matches_the_formatter() {
        for bytes in [&[][..], &[0], &[0x0f, 0xf0, 0xab], &[255; 20]] {
            let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(encode(bytes), expected);
        }
    }

    #[test]
    fn write_hex_matches_encode() {
        let bytes = [0x00, 0x0f, 0xf0, 0xab, 0xff];
        let mut out = [0u8; 10];
        write_hex(&mut out, &bytes);
        assert_eq!(std::str::from_utf8(&out).unwrap(), encode(&bytes));
    }
}
