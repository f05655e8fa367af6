//! [`Times`]: how many matching requests a [`Mock`](super::Mock) expects.

use std::fmt;
use std::ops::{Bound, RangeBounds};

/// How many matching requests a [`Mock`](crate::Mock) expects: from a number (`expect(1)`) or a range
/// (`expect(1..=3)`, `expect(2..)`, `expect(..=1)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Times {
    min: u64,
    /// Inclusive; `None` is unbounded.
    max: Option<u64>,
}

impl Times {
    /// Whether exactly one request is expected (for the grammar of messages).
    pub(super) fn is_exactly_one(&self) -> bool {
        self.min == 1 && self.max == Some(1)
    }

    /// Whether `n` requests meet the expectation.
    pub fn contains(&self, n: u64) -> bool {
        n >= self.min && self.max.is_none_or(|max| n <= max)
    }
}

impl From<u64> for Times {
    fn from(n: u64) -> Self {
        Times {
            min: n,
            max: Some(n),
        }
    }
}

macro_rules! times_from_range {
    ($($t:ty),*) => {$(
        impl From<$t> for Times {
            fn from(r: $t) -> Self {
                let min = match RangeBounds::<u64>::start_bound(&r) {
                    Bound::Included(&n) => n,
                    Bound::Excluded(&n) => n.saturating_add(1),
                    Bound::Unbounded => 0,
                };
                let max = match RangeBounds::<u64>::end_bound(&r) {
                    Bound::Included(&n) => Some(n),
                    Bound::Excluded(&n) => Some(n.saturating_sub(1)),
                    Bound::Unbounded => None,
                };
                Times { min, max }
            }
        }
    )*};
}

times_from_range!(
    std::ops::Range<u64>,
    std::ops::RangeInclusive<u64>,
    std::ops::RangeFrom<u64>,
    std::ops::RangeTo<u64>,
    std::ops::RangeToInclusive<u64>,
    std::ops::RangeFull
);

impl fmt::Display for Times {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.max {
            Some(max) if max == self.min => write!(f, "exactly {max}"),
            Some(max) if self.min == 0 => write!(f, "at most {max}"),
            Some(max) => write!(f, "between {} and {max}", self.min),
            None => write!(f, "at least {}", self.min),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_from_numbers_and_ranges() {
        assert!(Times::from(2).contains(2) && !Times::from(2).contains(3));
        assert!(Times::from(1..3).contains(2) && !Times::from(1..3).contains(3));
        assert!(Times::from(1..=3).contains(3) && !Times::from(1..=3).contains(0));
        assert!(Times::from(2..).contains(99) && !Times::from(2..).contains(1));
        assert!(Times::from(..=1).contains(0) && !Times::from(..=1).contains(2));
        assert_eq!(Times::from(1..=3).to_string(), "between 1 and 3");
    }
}
