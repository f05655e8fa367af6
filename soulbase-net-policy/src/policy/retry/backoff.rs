//! Exponential backoff with jitter, and the worst-case delays the deadline closure counts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::validate::{fmt_duration, unit_closed, Checker};

/// Exponential backoff: retry `k` (k ≥ 1) waits up to `min(cap, base × factor^(k-1))`.
///
/// Default is 100ms base, × 2, full jitter (`jitter = 1.0`), 5s cap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BackoffCfg {
    /// The delay before the first retry, before jitter. Default is 100ms.
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    /// Growth per retry; must be ≥ 1. Default is 2.0.
    pub factor: f64,
    /// Fraction of the delay that is randomised, in `[0, 1]`: the wait is drawn from
    /// `[d × (1 − jitter), d]`. Default is 1.0 (full jitter).
    pub jitter: f64,
    /// Upper bound of any single delay. Default is 5s.
    #[serde(with = "humantime_serde")]
    pub cap: Duration,
    /// How jitter is applied. Default is [`JitterMode::Full`].
    pub mode: JitterMode,
}

/// How the random part of a backoff delay is drawn (see the AWS "Exponential Backoff And
/// Jitter" analysis). Default is `Full`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum JitterMode {
    /// Uniform in `[d × (1 − jitter), d]`; with `jitter = 1` that is `[0, d]`. The default.
    #[default]
    Full,
    /// Half fixed, half random: uniform in `[d − d × jitter / 2, d]`.
    Equal,
    /// No randomness: always `d`.
    None,
}

// === impl BackoffCfg ===

impl Default for BackoffCfg {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(100),
            factor: 2.0,
            jitter: 1.0,
            cap: Duration::from_secs(5),
            mode: JitterMode::Full,
        }
    }
}

impl BackoffCfg {
    /// The longest wait before retry `k` (k ≥ 1): `min(cap, base × factor^(k-1))`.
    ///
    /// Jitter only shortens a wait, so this is the worst case. Saturates at `cap` and never
    /// panics, whatever `k` and `factor` are; `k = 0` (no retry) is zero.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use soulbase_net_policy::BackoffCfg;
    /// let b = BackoffCfg::default();
    /// assert_eq!(b.max_delay(1), Duration::from_millis(100));
    /// assert_eq!(b.max_delay(2), Duration::from_millis(200));
    /// assert_eq!(b.max_delay(1_000), Duration::from_secs(5));
    /// ```
    pub fn max_delay(&self, k: u32) -> Duration {
        if k == 0 {
            return Duration::ZERO;
        }
        let exp = i32::try_from(k - 1).unwrap_or(i32::MAX);
        let nanos = self.base.as_nanos() as f64 * self.factor.powi(exp);
        let cap_nanos = self.cap.as_nanos() as f64;
        // NaN (factor NaN) and anything at or above the cap give the cap.
        if nanos.is_nan() || nanos >= cap_nanos {
            return self.cap;
        }
        if nanos <= 0.0 {
            return Duration::ZERO;
        }
        // Below the cap, so it fits in a Duration; `as` saturates rather than panicking.
        let nanos = nanos.round() as u128;
        let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
        Duration::new(secs, (nanos % 1_000_000_000) as u32)
    }

    /// Sum of [`max_delay`](Self::max_delay) over retries `1..=retries`, saturating.
    pub fn total_max_delay(&self, retries: u32) -> Duration {
        let mut total = Duration::ZERO;
        let mut k = 1;
        // Delays grow until they reach the cap (factor ≥ 1); from there every term is `cap`.
        // A bounded loop keeps absurd configurations cheap: the rest is counted at the cap,
        // which over-estimates, so the bound stays an upper bound.
        while k <= retries && k <= 1_000 {
            let d = self.max_delay(k);
            total = total.saturating_add(d);
            k += 1;
            if d == self.cap {
                break;
            }
        }
        let rest = retries.saturating_sub(k - 1);
        total.saturating_add(self.cap.checked_mul(rest).unwrap_or(Duration::MAX))
    }

    pub(super) fn check(&self, c: &mut Checker<'_>) {
        c.when(!unit_closed(self.jitter), "jitter", || {
            format!(
                "must be between 0 and 1 (a fraction of the delay), got {}",
                self.jitter
            )
        });
        c.when(
            !self.factor.is_finite() || self.factor < 1.0,
            "factor",
            || format!("must be a finite number ≥ 1, got {}", self.factor),
        );
        c.when(self.cap < self.base, "cap", || {
            format!(
                "must not be less than base ({} < {})",
                fmt_duration(self.cap),
                fmt_duration(self.base)
            )
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn backoff(base_ms: u64, factor: f64, cap_ms: u64) -> BackoffCfg {
        BackoffCfg {
            base: Duration::from_millis(base_ms),
            factor,
            cap: Duration::from_millis(cap_ms),
            ..BackoffCfg::default()
        }
    }

    #[test]
    fn max_delay_is_capped_exponential() {
        let b = BackoffCfg::default();
        let got: Vec<_> = (0..=8).map(|k| b.max_delay(k).as_millis()).collect();
        assert_eq!(got, [0, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(b.max_delay(u32::MAX), b.cap);
    }

    #[test]
    fn max_delay_never_panics_on_odd_inputs() {
        for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -3.0, 0.0, 1e308] {
            let b = backoff(100, f, 5_000);
            for k in [1, 2, 3, 1_000, u32::MAX] {
                assert!(b.max_delay(k) <= b.cap);
            }
        }
        let huge = BackoffCfg {
            base: Duration::MAX,
            cap: Duration::MAX,
            ..BackoffCfg::default()
        };
        assert_eq!(huge.max_delay(5), Duration::MAX);
    }

    #[test]
    fn total_max_delay_sums_and_saturates() {
        let b = BackoffCfg::default();
        assert_eq!(b.total_max_delay(0), Duration::ZERO);
        assert_eq!(b.total_max_delay(2), Duration::from_millis(300));
        // 100+200+400+800+1600+3200 = 6300, then 4 × 5000
        assert_eq!(b.total_max_delay(10), Duration::from_millis(26_300));
        let slow = backoff(1, 1.000_000_1, 5_000);
        assert!(slow.total_max_delay(u32::MAX) > Duration::from_secs(1_000));
        let huge = BackoffCfg {
            cap: Duration::MAX,
            base: Duration::MAX,
            ..BackoffCfg::default()
        };
        assert_eq!(huge.total_max_delay(3), Duration::MAX);
    }

    proptest! {
        #[test]
        fn max_delay_is_monotonic_and_bounded(
            base in 0u64..10_000, factor in 1.0f64..10.0, cap in 0u64..60_000, k in 1u32..200,
        ) {
            let b = backoff(base, factor, cap);
            let d = b.max_delay(k);
            prop_assert!(d <= b.cap);
            prop_assert!(b.max_delay(k + 1) >= d);
            if k == 1 {
                prop_assert_eq!(d, b.base.min(b.cap));
            }
        }
    }
}
