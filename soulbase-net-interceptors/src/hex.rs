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

/// Writes `bytes` as lowercase hex into `out`, which holds exactly two bytes per input byte.
/// Eight bytes at a time (see [`hex16`]), the rest one by one: a trace id, a span id and a
/// request id are written for every request.
#[cfg(feature = "trace")]
pub(crate) fn write_hex(out: &mut [u8], bytes: &[u8]) {
    let mut outs = out.chunks_exact_mut(16);
    let mut ins = bytes.chunks_exact(8);
    for (o, i) in (&mut outs).zip(&mut ins) {
        let mut word = [0u8; 8];
        // `chunks_exact(8)`: always eight bytes.
        word.copy_from_slice(i);
        o.copy_from_slice(&hex16(u64::from_be_bytes(word)));
    }
    for (pair, b) in outs
        .into_remainder()
        .chunks_exact_mut(2)
        .zip(ins.remainder())
    {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0x0f)];
    }
}

/// `x` as 16 lowercase hex digits, most significant first, without a loop or a table: each
/// nibble is spread to a byte of its own, then every byte becomes its digit at once
/// (`'0' + n`, plus `'a' - '0' - 10` where `n > 9`). No byte ever carries into the next.
#[cfg(feature = "trace")]
fn hex16(x: u64) -> [u8; 16] {
    const fn every_byte(b: u8) -> u128 {
        u128::from_ne_bytes([b; 16])
    }
    let mut v = u128::from(x);
    v = (v | (v << 32)) & 0x0000_0000_ffff_ffff_0000_0000_ffff_ffff;
    v = (v | (v << 16)) & 0x0000_ffff_0000_ffff_0000_ffff_0000_ffff;
    v = (v | (v << 8)) & 0x00ff_00ff_00ff_00ff_00ff_00ff_00ff_00ff;
    v = (v | (v << 4)) & every_byte(0x0f);
    let letters = ((v + every_byte(0x06)) >> 4) & every_byte(0x01);
    (v + every_byte(b'0') + letters * u128::from(b'a' - b'0' - 10)).to_be_bytes()
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
    fn write_hex_matches_the_formatter_at_every_length() {
        // A fixed pseudo-random sequence: every length from 0 to 40, every nibble value.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for len in 0..=40 {
            for _ in 0..50 {
                let bytes: Vec<u8> = (0..len).map(|_| next().to_le_bytes()[0]).collect();
                let mut out = vec![0u8; len * 2];
                write_hex(&mut out, &bytes);
                let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                assert_eq!(std::str::from_utf8(&out).unwrap(), expected);
            }
        }
        for x in [0, 1, 9, 10, 15, 16, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(std::str::from_utf8(&hex16(x)).unwrap(), format!("{x:016x}"));
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
