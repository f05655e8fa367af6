//! The dynamic per-attempt timeout (seed 001 §V): a percentile of recent latency times a
//! safety factor, clamped.

use std::time::Duration;

use soulbase_net_policy::DynamicTimeout;

use super::LatencyWindow;

/// Recent latencies that can tell a percentile: the host's
/// [`LatencyHistogram`](super::LatencyHistogram) in the client, or the exact
/// [`LatencyWindow`].
pub(crate) trait Percentile {
    /// The percentile `q` (in `[0, 1]`) once at least `min_samples` latencies are known.
    fn percentile_after(&self, q: f64, min_samples: usize) -> Option<Duration>;
}

impl Percentile for LatencyWindow {
    fn percentile_after(&self, q: f64, min_samples: usize) -> Option<Duration> {
        LatencyWindow::percentile_after(self, q, min_samples)
    }
}

/// The timeout for the next attempt to a host whose recent latencies are `window`.
///
/// When `cfg.enabled` and at least `min_samples` latencies are known:
/// `percentile(q) × factor`, clamped to `[min, max]`; otherwise `fixed` (the policy's
/// `timeout.attempt`). Never above `fixed` either, so the deadline closure, which counts
/// attempts at `timeout.attempt`, still holds. A factor below 1 or NaN counts as 1.
pub(crate) fn attempt_timeout(
    cfg: &DynamicTimeout,
    window: &impl Percentile,
    fixed: Duration,
) -> Duration {
    if !cfg.enabled {
        return fixed;
    }
    let min_samples = usize::try_from(cfg.min_samples).unwrap_or(usize::MAX);
    let Some(p) = window.percentile_after(cfg.percentile, min_samples) else {
        return fixed;
    };
    let factor = if cfg.factor >= 1.0 { cfg.factor } else { 1.0 };
    let learnt = Duration::try_from_secs_f64(p.as_secs_f64() * factor).unwrap_or(Duration::MAX);
    learnt.max(cfg.min).min(cfg.max).min(fixed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resilience::LatencyHistogram;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);
    const FIXED: Duration = Duration::from_secs(9);

    fn cfg() -> DynamicTimeout {
        let mut c = DynamicTimeout::default(); // p99 × 1.5 in 100ms..9s after 50
        c.enabled = true;
        c
    }

    fn window(latencies_ms: impl IntoIterator<Item = u64>) -> LatencyWindow {
        let mut w = LatencyWindow::new(1_000);
        for ms in latencies_ms {
            w.record(Duration::from_millis(ms));
        }
        w
    }

    #[test]
    fn percentile_times_factor_once_enough_samples() {
        let w = window(1..=100);
        // p99 = 99ms, × 1.5 (within a microsecond of float rounding).
        let t = attempt_timeout(&cfg(), &w, FIXED);
        assert!(
            t.abs_diff(Duration::from_micros(148_500)) <= Duration::from_micros(1),
            "{t:?}"
        );
        let few = window(1..=49);
        assert_eq!(
            attempt_timeout(&cfg(), &few, FIXED),
            FIXED,
            "below min_samples"
        );
        let mut off = cfg();
        off.enabled = false;
        assert_eq!(attempt_timeout(&off, &w, FIXED), FIXED);
    }

    #[test]
    fn clamped_to_min_max_and_fixed() {
        assert_eq!(attempt_timeout(&cfg(), &window([1; 60]), FIXED), 100 * MS);
        assert_eq!(attempt_timeout(&cfg(), &window([60_000; 60]), FIXED), FIXED);
        let mut wide = cfg();
        wide.max = Duration::from_secs(60);
        assert_eq!(attempt_timeout(&wide, &window([30_000; 60]), FIXED), FIXED);
        let mut odd = cfg();
        odd.factor = f64::NAN;
        odd.min = Duration::from_secs(2);
        odd.max = Duration::from_secs(1);
        assert!(attempt_timeout(&odd, &window([500; 60]), FIXED) <= FIXED);
    }

    fn histogram(latencies_ms: impl IntoIterator<Item = u64>) -> LatencyHistogram {
        let h = LatencyHistogram::new();
        for ms in latencies_ms {
            h.record(Duration::from_millis(ms));
        }
        h
    }

    /// The client's estimator gives the exact window's timeouts within its error: never
    /// shorter, at most 1/16 longer (before clamping).
    #[test]
    fn the_histogram_gives_the_same_timeouts_within_one_sixteenth() {
        let exact = attempt_timeout(&cfg(), &window(1..=100), FIXED);
        let est = attempt_timeout(&cfg(), &histogram(1..=100), FIXED);
        assert!(
            est >= exact && est <= exact * 17 / 16,
            "{est:?} vs {exact:?}"
        );
        assert_eq!(attempt_timeout(&cfg(), &histogram(1..=49), FIXED), FIXED);
        assert_eq!(
            attempt_timeout(&cfg(), &histogram([1; 60]), FIXED),
            100 * MS
        );
        assert_eq!(
            attempt_timeout(&cfg(), &histogram([60_000; 60]), FIXED),
            FIXED
        );
    }

    proptest! {
        #[test]
        fn always_within_bounds(
            lat in proptest::collection::vec(0u64..100_000, 0..120), q in 0.01f64..0.999,
            factor in 1.0f64..5.0, min_ms in 1u64..1_000, span_ms in 0u64..20_000,
        ) {
            let mut c = cfg();
            c.percentile = q;
            c.factor = factor;
            c.min = Duration::from_millis(min_ms);
            c.max = Duration::from_millis(min_ms + span_ms);
            let t = attempt_timeout(&c, &window(lat.iter().copied()), FIXED);
            prop_assert!(t <= FIXED);
            if lat.len() >= 50 {
                prop_assert!(t >= c.min.min(FIXED));
                prop_assert!(t <= c.max);
            } else {
                prop_assert_eq!(t, FIXED);
            }
        }
    }
}
