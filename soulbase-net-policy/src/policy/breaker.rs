//! Circuit breaker policy: when to open, how long to stay open, how to probe.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::validate::{unit_half_open, Checker};

/// Opens the circuit for a host after `consecutive_failures` failed attempts in a row, or when
/// the failure ratio over `window` reaches `failure_ratio` with at least `min_samples`
/// attempts recorded (the slow-call rule follows resilience4j). The unit is the attempt, not
/// the call: each failed attempt is evidence about the upstream (as Envoy's outlier detection
/// counts), so a call that failed 3 attempts counts 3; a request the server did not process,
/// a cancelled one and the client's own refusals count nothing.
///
/// While open, calls fail fast with `CircuitOpen` (`PROVIDER.UNAVAILABLE`) until `cooldown`
/// elapses; then `half_open_probes` probes are let through: once `half_open_success_ratio`
/// of them succeeded the circuit closes, and as soon as too many failed for that, it opens
/// again (with the default ratio 1.0: every probe must succeed, one failure reopens). The key map is bounded (`max_keys`, `idle_evict`) so that a
/// million distinct hosts cannot exhaust memory.
///
/// Default is off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CircuitBreakerPolicy {
    /// Whether the breaker runs. Default is `false`.
    pub enabled: bool,
    /// Sliding window over which the failure ratio is computed. Default is 10s.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Failure ratio in `(0, 1]` at which the circuit opens. Default is 0.5.
    pub failure_ratio: f64,
    /// Attempts recorded in the window before the ratio counts. Default is 20.
    pub min_samples: u32,
    /// Failed attempts in a row that open the circuit regardless of the ratio; 0 turns this
    /// rule off. Default is 5.
    pub consecutive_failures: u32,
    /// How long the circuit stays open before probing. Default is 30s.
    #[serde(with = "humantime_serde")]
    pub cooldown: Duration,
    /// Probes let through while half-open. Default is 3.
    pub half_open_probes: u32,
    /// Share of the half-open probes, in `(0, 1]`, that must succeed for the circuit to close
    /// (rounded up to whole probes). Default is 1.0: all of them.
    pub half_open_success_ratio: f64,
    /// What a circuit is kept per. Default is [`CbKey::Host`].
    pub key_by: CbKey,
    /// Count slow calls as failures. Default is `None` (off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_call: Option<SlowCallCfg>,
    /// Whether 5xx responses count as failures (429 never does). Default is `true`.
    pub count_5xx: bool,
    /// Most circuits kept at once; the least recently used go first. Default is 10 000.
    pub max_keys: u32,
    /// A circuit unused this long is dropped. Default is 10m.
    #[serde(with = "humantime_serde")]
    pub idle_evict: Duration,
}

/// What a circuit is kept per. Default is `Host`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CbKey {
    /// One circuit per host (authority). The default.
    #[default]
    Host,
    /// One circuit per (host, tenant).
    HostTenant,
}

/// The slow-call rule: calls slower than `threshold` count as failures once they make up
/// `ratio` of the window (resilience4j's `slowCallDurationThreshold`/`slowCallRateThreshold`).
///
/// Default is 5s and 0.5.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SlowCallCfg {
    /// A call at least this slow is slow. Default is 5s.
    #[serde(with = "humantime_serde")]
    pub threshold: Duration,
    /// Share of slow calls in `(0, 1]` that opens the circuit. Default is 0.5.
    pub ratio: f64,
}

// === impl CircuitBreakerPolicy ===

impl Default for CircuitBreakerPolicy {
    fn default() -> Self {
        Self {
            enabled: false,
            window: Duration::from_secs(10),
            failure_ratio: 0.5,
            min_samples: 20,
            consecutive_failures: 5,
            cooldown: Duration::from_secs(30),
            half_open_probes: 3,
            half_open_success_ratio: 1.0,
            key_by: CbKey::Host,
            slow_call: None,
            count_5xx: true,
            max_keys: 10_000,
            idle_evict: Duration::from_secs(600),
        }
    }
}

impl CircuitBreakerPolicy {
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        if !self.enabled {
            return;
        }
        c.when(!unit_half_open(self.failure_ratio), "failure_ratio", || {
            format!("must be in (0, 1], got {}", self.failure_ratio)
        });
        c.at_least_one(self.min_samples.into(), "min_samples");
        c.at_least_one(self.half_open_probes.into(), "half_open_probes");
        c.when(
            !unit_half_open(self.half_open_success_ratio),
            "half_open_success_ratio",
            || format!("must be in (0, 1], got {}", self.half_open_success_ratio),
        );
        c.at_least_one(self.max_keys.into(), "max_keys");
        c.nonzero(self.window, "window");
        c.nonzero(self.cooldown, "cooldown");
        c.nonzero(self.idle_evict, "idle_evict");
        if let Some(slow) = &self.slow_call {
            let mut s = c.nested("slow_call");
            s.when(!unit_half_open(slow.ratio), "ratio", || {
                format!("must be in (0, 1], got {}", slow.ratio)
            });
            s.nonzero(slow.threshold, "threshold");
        }
    }
}

impl Default for SlowCallCfg {
    fn default() -> Self {
        Self {
            threshold: Duration::from_secs(5),
            ratio: 0.5,
        }
    }
}
