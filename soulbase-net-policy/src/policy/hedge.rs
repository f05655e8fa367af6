//! Hedging policy: extra attempts started while the first is still running.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::validate::Checker;

/// Hedged requests: for idempotent requests with a replayable body, when no
/// answer has come after `delay`, up to `max_hedges` extra attempts start; the first success
/// wins and the others are cancelled. All share one idempotency key.
///
/// Default: off, 50ms, one hedge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HedgePolicy {
    /// Whether requests are hedged. Default is `false`.
    pub enabled: bool,
    /// Wait before each extra attempt (typically the host's p95 latency). Default is 50ms.
    #[serde(with = "humantime_serde")]
    pub delay: Duration,
    /// Extra attempts at most. Default is 1.
    pub max_hedges: u32,
}

impl Default for HedgePolicy {
    fn default() -> Self {
        Self {
            enabled: false,
            delay: Duration::from_millis(50),
            max_hedges: 1,
        }
    }
}

impl HedgePolicy {
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        if self.enabled {
            c.at_least_one(self.max_hedges.into(), "max_hedges");
            c.nonzero(self.delay, "delay");
        }
    }
}
