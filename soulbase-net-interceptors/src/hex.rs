//! Lower-case hex and random identifiers shared by the interceptors. Table lookups and
//! word-at-a-time arithmetic rather than `format!`: these run for every request (trace and
//! request ids, span ids, keys).

#[cfg(any(feature = "idempotency", feature = "otel"))]
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

/// Writes `bytes` as lowercase hex into `out`, which holds exactly two bytes per input byte.
#[cfg(any(
    feature = "otel",
    all(test, feature = "trace", feature = "idempotency")
))]
pub(crate) fn write_hex(out: &mut [u8], bytes: &[u8]) {
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0x0f)];
    }
}

/// `x` as 16 lowercase hex digits, most significant first: a span id.
#[cfg(feature = "trace")]
pub(crate) fn hex_u64(x: u64) -> [u8; 16] {
    // The halves of `x`: truncation is the point.
    let (high, low) = (hex8((x >> 32) as u32), hex8(x as u32));
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&high.to_be_bytes());
    out[8..].copy_from_slice(&low.to_be_bytes());
    out
}

/// `x` as 32 lowercase hex digits, most significant first: a trace id, a request id.
#[cfg(feature = "trace")]
pub(crate) fn hex_u128(x: u128) -> [u8; 32] {
    // The halves of `x`: truncation is the point.
    let (high, low) = (hex_u64((x >> 64) as u64), hex_u64(x as u64));
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(&high);
    out[16..].copy_from_slice(&low);
    out
}

/// `x` as 8 lowercase hex digits (most significant first once written big-endian), without
/// a loop or a table: each nibble is spread to a byte of its own, then every byte becomes
/// its digit at once (`'0' + n`, plus `'a' - '0' - 10` where `n > 9`). No byte ever carries
/// into the next.
#[cfg(feature = "trace")]
fn hex8(x: u32) -> u64 {
    const fn every_byte(b: u8) -> u64 {
        u64::from_ne_bytes([b; 8])
    }
    let mut v = u64::from(x);
    v = (v | (v << 16)) & 0x0000_ffff_0000_ffff;
    v = (v | (v << 8)) & 0x00ff_00ff_00ff_00ff;
    v = (v | (v << 4)) & every_byte(0x0f);
    let letters = ((v + every_byte(0x06)) >> 4) & every_byte(0x01);
    v + every_byte(b'0') + letters * u64::from(b'a' - b'0' - 10)
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
    fn the_fixed_width_forms_match_the_formatter() {
        // A fixed pseudo-random sequence, plus the edges of every nibble.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut xs = vec![0, 1, 9, 10, 15, 16, u64::MAX, 0x0123_4567_89ab_cdef];
        xs.extend((0..500).map(|_| next()));
        for &x in &xs {
            assert_eq!(
                std::str::from_utf8(&hex_u64(x)).unwrap(),
                format!("{x:016x}")
            );
            let wide = (u128::from(x) << 64) | u128::from(x.rotate_left(17));
            assert_eq!(
                std::str::from_utf8(&hex_u128(wide)).unwrap(),
                format!("{wide:032x}")
            );
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
