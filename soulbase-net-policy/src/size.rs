//! Byte sizes written the way people write them: `32MiB`, `10MB`, `512KiB` or a plain integer.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of bytes.
///
/// Deserialises from an integer (`33554432`) or a string with an optional unit: `B`, decimal
/// `kB`/`KB`, `MB`, `GB`, `TB`, `PB`, `EB` (powers of 1000) and binary `KiB`, `MiB`, `GiB`,
/// `TiB`, `PiB`, `EiB` (powers of 1024). Units are case-insensitive, amounts are whole numbers,
/// and whitespace between number and unit is allowed (`"32 MiB"`).
///
/// Serialises as a string in the largest unit that divides it exactly (`"32MiB"`, `"10MB"`,
/// `"1500B"`), so a value always round-trips exactly through TOML and JSON.
///
/// # Examples
/// ```
/// use soulbase_net_policy::ByteSize;
/// let s: ByteSize = "32MiB".parse().unwrap();
/// assert_eq!(s, ByteSize::mib(32));
/// assert_eq!(s.to_string(), "32MiB");
/// assert_eq!("10MB".parse::<ByteSize>().unwrap().as_u64(), 10_000_000);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

/// Units from largest to smallest; on equal size no conflict arises (no unit pair is equal).
const UNITS: [(&str, u64); 13] = [
    ("EiB", 1 << 60),
    ("EB", 1_000_000_000_000_000_000),
    ("PiB", 1 << 50),
    ("PB", 1_000_000_000_000_000),
    ("TiB", 1 << 40),
    ("TB", 1_000_000_000_000),
    ("GiB", 1 << 30),
    ("GB", 1_000_000_000),
    ("MiB", 1 << 20),
    ("MB", 1_000_000),
    ("KiB", 1 << 10),
    ("kB", 1_000),
    ("B", 1),
];

const EXPECTED: &str =
    "a whole number of bytes, optionally with a unit (B, kB, MB, GB, KiB, MiB, GiB, …), e.g. \"32MiB\"";

// === impl ByteSize ===

impl ByteSize {
    /// `n` bytes.
    pub const fn b(n: u64) -> Self {
        Self(n)
    }

    /// `n` KiB (`n × 1024` bytes), saturating.
    pub const fn kib(n: u64) -> Self {
        Self(n.saturating_mul(1 << 10))
    }

    /// `n` MiB (`n × 1024²` bytes), saturating.
    pub const fn mib(n: u64) -> Self {
        Self(n.saturating_mul(1 << 20))
    }

    /// `n` GiB (`n × 1024³` bytes), saturating.
    pub const fn gib(n: u64) -> Self {
        Self(n.saturating_mul(1 << 30))
    }

    /// The number of bytes.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

impl From<u64> for ByteSize {
    fn from(n: u64) -> Self {
        Self(n)
    }
}

impl From<ByteSize> for u64 {
    fn from(s: ByteSize) -> Self {
        s.0
    }
}

/// Why a string is not a byte size.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid byte size `{input}`: {reason}")]
pub struct ParseByteSizeError {
    input: String,
    reason: &'static str,
}

impl FromStr for ByteSize {
    type Err = ParseByteSizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseByteSizeError {
            input: s.to_owned(),
            reason,
        };
        let t = s.trim();
        let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(digits_end);
        if num.is_empty() {
            return Err(err("expected a whole number of bytes before the unit"));
        }
        let n: u64 = num.parse().map_err(|_| err("the number is too large"))?;
        let unit = unit.trim();
        let mult = if unit.is_empty() {
            1
        } else {
            UNITS
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(unit))
                .map(|&(_, m)| m)
                .ok_or_else(|| {
                    err("unknown unit; use B, kB, MB, GB, TB, PB, EB, KiB, MiB, GiB, TiB, PiB or EiB")
                })?
        };
        n.checked_mul(mult)
            .map(Self)
            .ok_or_else(|| err("the size does not fit in 64 bits"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n == 0 {
            return f.write_str("0B");
        }
        // UNITS ends with ("B", 1), which always divides.
        for &(name, mult) in &UNITS {
            if n.is_multiple_of(mult) {
                return write!(f, "{}{name}", n / mult);
            }
        }
        write!(f, "{n}B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ByteSizeVisitor)
    }
}

struct ByteSizeVisitor;

impl Visitor<'_> for ByteSizeVisitor {
    type Value = ByteSize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
        Ok(ByteSize(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
        u64::try_from(v)
            .map(ByteSize)
            .map_err(|_| E::custom("a byte size cannot be negative"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
        v.parse().map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_units() {
        let cases = [
            ("0", 0),
            ("1024", 1024),
            ("32MiB", 32 << 20),
            ("32 mib", 32 << 20),
            ("10MB", 10_000_000),
            ("512KiB", 512 << 10),
            ("1GiB", 1 << 30),
            ("7kb", 7_000),
            ("15B", 15),
            ("2EiB", 2 << 60),
        ];
        for (s, n) in cases {
            assert_eq!(s.parse::<ByteSize>().unwrap(), ByteSize(n), "{s}");
        }
    }

    #[test]
    fn rejects_nonsense() {
        for s in [
            "",
            "MiB",
            "-1",
            "1.5MiB",
            "12XB",
            "20EiB",
            "99999999999999999999",
        ] {
            assert!(s.parse::<ByteSize>().is_err(), "{s}");
        }
    }

    #[test]
    fn displays_in_the_largest_exact_unit() {
        assert_eq!(ByteSize::mib(32).to_string(), "32MiB");
        assert_eq!(ByteSize(10_000_000).to_string(), "10MB");
        assert_eq!(ByteSize(1_500).to_string(), "1500B");
        assert_eq!(ByteSize(1_024_000).to_string(), "1000KiB");
        assert_eq!(ByteSize(0).to_string(), "0B");
        assert_eq!(ByteSize(u64::MAX).to_string(), "18446744073709551615B");
    }

    #[test]
    fn deserialises_integers_and_strings() {
        let v: ByteSize = serde_json::from_str("1048576").unwrap();
        assert_eq!(v, ByteSize::mib(1));
        let v: ByteSize = serde_json::from_str("\"1MiB\"").unwrap();
        assert_eq!(v, ByteSize::mib(1));
        assert!(serde_json::from_str::<ByteSize>("-5").is_err());
        assert!(serde_json::from_str::<ByteSize>("1.5").is_err());
    }

    proptest! {
        #[test]
        fn display_round_trips(n in any::<u64>()) {
            let s = ByteSize(n).to_string();
            prop_assert_eq!(s.parse::<ByteSize>().unwrap(), ByteSize(n));
        }

        #[test]
        fn round_trips_whole_units(n in 0u64..1_000_000, unit in 0usize..UNITS.len()) {
            let v = ByteSize(n.saturating_mul(UNITS[unit].1));
            let json = serde_json::to_string(&v).unwrap();
            prop_assert_eq!(serde_json::from_str::<ByteSize>(&json).unwrap(), v);
        }
    }
}
