//! Retry policy: attempts, exponential backoff with jitter, what to retry on, and the retry budget.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::validate::{unit_closed, Checker};

mod backoff;

pub use self::backoff::{BackoffCfg, JitterMode};

/// Retries of idempotent requests (seed 000 §3 and §5.1, budget from seed 001 §VIII).
///
/// A request is retried only when it is idempotent (or GET/HEAD/OPTIONS), its body can be
/// replayed, the outcome is listed in [`retry_on`](Self::retry_on), attempts remain, the
/// [`budget`](Self::budget) allows it and the next attempt can still finish before the total
/// deadline.
///
/// Default: on, 3 attempts, 100ms × 2ⁿ full-jitter backoff capped at 5s, every retryable
/// outcome, `Retry-After` respected, a 20 % retry budget.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Whether failed attempts are retried at all. Default is `true`.
    pub enabled: bool,
    /// Attempts including the first; only idempotent requests get more than one.
    /// Default is 3.
    pub max_attempts: u32,
    /// Delay between attempts. Default is 100ms × 2ⁿ with full jitter, capped at 5s.
    pub backoff: BackoffCfg,
    /// Which outcomes are retried. Default is all of them.
    pub retry_on: RetryOn,
    /// Whether a `Retry-After` header on 429/503 (seconds or HTTP date) replaces the computed
    /// backoff when it is not longer than `backoff.cap`. Default is `true`.
    pub respect_retry_after: bool,
    /// The retry budget: how much extra traffic retries may add. Default is 20 % with a
    /// floor of 10 retries per second over a 10s window, per host.
    pub budget: RetryBudget,
}

/// Which outcomes are retried (seed 000 §5.1). Default is every one of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetryOn {
    /// HTTP 5xx responses, except 501 and 505 (they repeat). Default is `true`.
    pub http_5xx: bool,
    /// HTTP 429 responses. Default is `true`.
    pub http_429: bool,
    /// DNS resolution failures. Default is `true`.
    pub dns_err: bool,
    /// Connection failures: refused, or reset or closed before the response was complete (the
    /// request may have reached the server; only idempotent, replayable requests are retried).
    /// Default is `true`.
    pub connect_err: bool,
    /// Timeouts in the DNS, connect and TLS phases. Default is `true`.
    pub connect_timeout: bool,
    /// Time-to-first-byte timeouts. Default is `true`.
    pub ttfb_timeout: bool,
    /// Idle timeouts while reading the body. Default is `true`.
    pub read_timeout: bool,
}

/// A retry budget (seed 001 §VIII, after Finagle's `RetryBudget` and gRPC retry throttling):
/// retries may add at most `retry_ratio` of the requests seen in `window`, plus
/// `min_retries_per_sec`, so that retries cannot multiply load during an outage.
///
/// Default is on, 20 %, 10 retries per second floor, 10s window, per host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetryBudget {
    /// Whether the budget is enforced. Default is `true`.
    pub enabled: bool,
    /// Retries allowed per request, in `[0, 1]`. Default is 0.2.
    pub retry_ratio: f64,
    /// Retries always allowed per second, whatever the ratio. Default is 10.
    pub min_retries_per_sec: u32,
    /// How long a deposit stays in the budget. Default is 10s.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Keep one budget per (host, tenant) instead of per host. Default is `false`.
    pub per_tenant: bool,
}

// === impl RetryPolicy ===

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            max_attempts: 3,
            backoff: BackoffCfg::default(),
            retry_on: RetryOn::default(),
            respect_retry_after: true,
            budget: RetryBudget::default(),
        }
    }
}

impl RetryPolicy {
    /// The attempts a request may make: `max_attempts` when retries are enabled, else 1.
    /// Never 0.
    pub fn effective_attempts(&self) -> u32 {
        if self.enabled {
            self.max_attempts.max(1)
        } else {
            1
        }
    }

    /// Sum of the worst-case backoff delays before retries `1..attempts`.
    pub fn worst_case_backoff(&self) -> Duration {
        self.backoff.total_max_delay(self.effective_attempts() - 1)
    }

    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        c.when(self.max_attempts == 0, "max_attempts", || {
            "must be at least 1 (it counts the first attempt); use `enabled = false` to turn retries off"
                .to_owned()
        });
        self.backoff.check(&mut c.nested("backoff"));
        let mut b = c.nested("budget");
        let budget = &self.budget;
        b.when(!unit_closed(budget.retry_ratio), "retry_ratio", || {
            format!("must be between 0 and 1, got {}", budget.retry_ratio)
        });
        if budget.enabled {
            b.nonzero(budget.window, "window");
        }
    }
}

// === impl RetryOn, RetryBudget ===

impl Default for RetryOn {
    fn default() -> Self {
        Self {
            http_5xx: true,
            http_429: true,
            dns_err: true,
            connect_err: true,
            connect_timeout: true,
            ttfb_timeout: true,
            read_timeout: true,
        }
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self {
            enabled: true,
            retry_ratio: 0.2,
            min_retries_per_sec: 10,
            window: Duration::from_secs(10),
            per_tenant: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_attempts() {
        let mut r = RetryPolicy::default();
        assert_eq!(r.effective_attempts(), 3);
        r.enabled = false;
        assert_eq!(r.effective_attempts(), 1);
        r.enabled = true;
        r.max_attempts = 0;
        assert_eq!(r.effective_attempts(), 1);
    }
}
