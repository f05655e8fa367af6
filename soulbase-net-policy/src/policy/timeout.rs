//! Timeout policy: phase timeouts, the per-attempt and total deadlines, the dynamic timeout,
//! and seed 001's deadline closure.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::policy::retry::RetryPolicy;
use crate::validate::{fmt_duration, Checker};

/// Timeouts: per phase, per attempt and in total.
///
/// `total` bounds the whole call, retries and backoff included. A policy must be able to keep
/// it: validation requires
/// `Σ backoff.max_delay(k) + attempts × attempt ≤ total − margin`
/// (see [`worst_case_latency`](Self::worst_case_latency)), checked before any request runs.
///
/// Default: connect 2s, first byte 8s, read and write 8s, 9s per attempt, 30s in total with a
/// 100ms margin; dynamic timeout off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TimeoutPolicy {
    /// TCP connect (per address tried) plus TLS handshake. Default is 2s.
    #[serde(with = "humantime_serde")]
    pub connect: Duration,
    /// From the request written to the response head. Default is 8s.
    #[serde(with = "humantime_serde")]
    pub ttfb: Duration,
    /// Longest idle gap between response body chunks. Default is 8s.
    #[serde(with = "humantime_serde")]
    pub read: Duration,
    /// Longest time to write the request (head and body). Default is 8s.
    #[serde(with = "humantime_serde")]
    pub write: Duration,
    /// One attempt, from its start (connect included) to the response head — the part that
    /// can be retried; the body that follows is bounded by `read` and `total`. Default is 9s.
    #[serde(with = "humantime_serde")]
    pub attempt: Duration,
    /// The whole call, all attempts and backoff included. Default is 30s.
    #[serde(with = "humantime_serde")]
    pub total: Duration,
    /// Slack kept below `total` by the deadline check (the worst case must fit in
    /// `total − margin`). Default is 100ms.
    #[serde(with = "humantime_serde")]
    pub margin: Duration,
    /// The dynamic per-attempt timeout. Default is off.
    pub dynamic: DynamicTimeout,
}

/// A per-attempt timeout learnt from recent latency: the `percentile` of the
/// host's recent latencies × `factor`, clamped to `[min, max]`, used once `min_samples`
/// latencies are known (before that, `attempt` applies).
///
/// Default: off, p99 × 1.5, clamped to 100ms..9s, after 50 samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DynamicTimeout {
    /// Whether the dynamic timeout replaces `attempt`. Default is `false`.
    pub enabled: bool,
    /// Latency percentile in `(0, 1)`. Default is 0.99.
    pub percentile: f64,
    /// Safety factor, ≥ 1. Default is 1.5.
    pub factor: f64,
    /// Lower clamp. Default is 100ms.
    #[serde(with = "humantime_serde")]
    pub min: Duration,
    /// Upper clamp; at most `attempt`, so the deadline closure still holds. Default is 9s.
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    /// Latencies needed before the learnt value is used. Default is 50.
    pub min_samples: u32,
}

impl Default for TimeoutPolicy {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(2),
            ttfb: Duration::from_secs(8),
            read: Duration::from_secs(8),
            write: Duration::from_secs(8),
            attempt: Duration::from_secs(9),
            total: Duration::from_secs(30),
            margin: Duration::from_millis(100),
            dynamic: DynamicTimeout::default(),
        }
    }
}

impl Default for DynamicTimeout {
    fn default() -> Self {
        Self {
            enabled: false,
            percentile: 0.99,
            factor: 1.5,
            min: Duration::from_millis(100),
            max: Duration::from_secs(9),
            min_samples: 50,
        }
    }
}

impl TimeoutPolicy {
    /// These timeouts with the ones a request sets itself (its `TimeoutCfg`) taking
    /// precedence, field by field.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use soulbase_net_core::TimeoutCfg;
    /// use soulbase_net_policy::TimeoutPolicy;
    ///
    /// let per_request = TimeoutCfg::default().with_ttfb(Duration::from_millis(250));
    /// let t = TimeoutPolicy::default().with_request(&per_request);
    /// assert_eq!(t.ttfb, Duration::from_millis(250));
    /// assert_eq!(t.connect, TimeoutPolicy::default().connect);
    /// ```
    pub fn with_request(&self, req: &soulbase_net_core::TimeoutCfg) -> TimeoutPolicy {
        let mut t = self.clone();
        t.connect = req.connect.unwrap_or(t.connect);
        t.ttfb = req.ttfb.unwrap_or(t.ttfb);
        t.read = req.read.unwrap_or(t.read);
        t.write = req.write.unwrap_or(t.write);
        t.total = req.total.unwrap_or(t.total);
        t
    }

    /// The longest a call can take under `retry`:
    /// `Σ_{k=1}^{attempts-1} backoff.max_delay(k) + attempts × attempt`, saturating.
    ///
    /// `Retry-After` may ask for a longer wait (up to `backoff.cap`); the runtime still never
    /// starts an attempt that cannot finish before `total`.
    pub fn worst_case_latency(&self, retry: &RetryPolicy) -> Duration {
        let attempts = retry.effective_attempts();
        let attempts_time = self.attempt.checked_mul(attempts).unwrap_or(Duration::MAX);
        retry.worst_case_backoff().saturating_add(attempts_time)
    }

    /// What the deadline closure allows: `total − margin` (zero when margin ≥ total).
    pub fn budget(&self) -> Duration {
        self.total.saturating_sub(self.margin)
    }

    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        for (field, d) in [
            ("connect", self.connect),
            ("ttfb", self.ttfb),
            ("read", self.read),
            ("write", self.write),
            ("attempt", self.attempt),
            ("total", self.total),
        ] {
            c.nonzero(d, field);
        }
        for (field, d) in [
            ("connect", self.connect),
            ("ttfb", self.ttfb),
            ("read", self.read),
            ("write", self.write),
        ] {
            c.when(d > self.attempt, field, || {
                format!(
                    "must not exceed attempt ({} > {})",
                    fmt_duration(d),
                    fmt_duration(self.attempt)
                )
            });
        }
        c.when(self.attempt > self.total, "attempt", || {
            format!(
                "must not exceed total ({} > {})",
                fmt_duration(self.attempt),
                fmt_duration(self.total)
            )
        });
        c.when(self.margin >= self.total, "margin", || {
            format!(
                "must be less than total ({} ≥ {})",
                fmt_duration(self.margin),
                fmt_duration(self.total)
            )
        });
        self.dynamic.check(self.attempt, &mut c.nested("dynamic"));
    }
}

impl DynamicTimeout {
    fn check(&self, attempt: Duration, c: &mut Checker<'_>) {
        c.when(
            !(self.percentile > 0.0 && self.percentile < 1.0),
            "percentile",
            || format!("must be in (0, 1), got {}", self.percentile),
        );
        c.when(
            !self.factor.is_finite() || self.factor < 1.0,
            "factor",
            || format!("must be a finite number ≥ 1, got {}", self.factor),
        );
        c.when(self.min > self.max, "min", || {
            format!(
                "must not exceed max ({} > {})",
                fmt_duration(self.min),
                fmt_duration(self.max)
            )
        });
        if self.enabled {
            c.nonzero(self.min, "min");
            c.when(self.max > attempt, "max", || {
                format!(
                    "must not exceed timeout.attempt ({} > {}): the deadline closure counts attempts at timeout.attempt",
                    fmt_duration(self.max),
                    fmt_duration(attempt)
                )
            });
        }
    }
}

/// Seed 001's deadline closure: the worst case must fit in `total − margin`.
pub(crate) fn check_deadline(retry: &RetryPolicy, timeout: &TimeoutPolicy, c: &mut Checker<'_>) {
    let worst = timeout.worst_case_latency(retry);
    let budget = timeout.budget();
    if worst > budget {
        c.push(
            "retry",
            format!(
                "worst case {}×{} + {} backoff = {} exceeds timeout.total − margin = {}",
                retry.effective_attempts(),
                fmt_duration(timeout.attempt),
                fmt_duration(retry.worst_case_backoff()),
                fmt_duration(worst),
                fmt_duration(budget),
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_worst_case_is_27_3s() {
        let t = TimeoutPolicy::default();
        let r = RetryPolicy::default();
        assert_eq!(t.worst_case_latency(&r), Duration::from_millis(27_300));
        assert_eq!(t.budget(), Duration::from_millis(29_900));
    }

    #[test]
    fn worst_case_saturates() {
        let t = TimeoutPolicy {
            attempt: Duration::MAX,
            ..TimeoutPolicy::default()
        };
        assert_eq!(t.worst_case_latency(&RetryPolicy::default()), Duration::MAX);
        let r = RetryPolicy {
            max_attempts: u32::MAX,
            ..RetryPolicy::default()
        };
        assert!(TimeoutPolicy::default().worst_case_latency(&r) > Duration::from_secs(1 << 30));
    }
}
