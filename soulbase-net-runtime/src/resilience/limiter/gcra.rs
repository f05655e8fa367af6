//! GCRA (the generic cell rate algorithm, a token bucket kept as one timestamp), on an
//! injected clock.
//!
//! Implemented here rather than with `governor` so the state machine takes `now` like the
//! others and a bounded wait can reserve a future slot.

use std::time::Duration;

use tokio::time::Instant;

/// A per-host rate: `rate` per second with bursts of `burst`.
///
/// Over any interval of length `t`, at most `burst + t × rate` calls are admitted.
#[derive(Clone, Debug)]
pub(crate) struct Gcra {
    rate: u32,
    burst: u32,
    /// One call's share of a second, rounded up so the rate is never exceeded.
    interval: Duration,
    /// How far ahead of `now` the theoretical arrival time may run: `interval × (burst − 1)`.
    tolerance: Duration,
    /// The theoretical arrival time of the next call; `None` before the first.
    tat: Option<Instant>,
}

impl Gcra {
    /// `rate` per second (at least 1) with bursts of `burst` (at least 1).
    pub(crate) fn new(rate: u32, burst: u32) -> Self {
        let (rate, burst) = (rate.max(1), burst.max(1));
        let interval = Duration::from_nanos(1_000_000_000u64.div_ceil(u64::from(rate)));
        Self {
            rate,
            burst,
            interval,
            tolerance: interval.saturating_mul(burst - 1),
            tat: None,
        }
    }

    /// Whether this bucket was built for `rate` and `burst`.
    pub(crate) fn is(&self, rate: u32, burst: u32) -> bool {
        self.rate == rate.max(1) && self.burst == burst.max(1)
    }

    /// Admits a call at `now`, or says how long until one would be admitted.
    #[cfg(test)]
    pub(crate) fn check(&mut self, now: Instant) -> Result<(), Duration> {
        self.reserve(now, Duration::ZERO).map(|_| ())
    }

    /// Reserves the next slot if it comes within `max_wait` of `now`, returning the wait
    /// (zero: go now); otherwise reserves nothing and returns the wait that would be needed.
    pub(crate) fn reserve(
        &mut self,
        now: Instant,
        max_wait: Duration,
    ) -> Result<Duration, Duration> {
        let tat = self.tat.map_or(now, |t| t.max(now));
        let earliest = tat.checked_sub(self.tolerance).unwrap_or(now).max(now);
        let wait = earliest - now;
        if wait > max_wait {
            return Err(wait);
        }
        self.tat = Some(tat.checked_add(self.interval).unwrap_or(tat));
        Ok(wait)
    }

    /// Whether the bucket is full again at `now` (forgetting it loses nothing).
    pub(crate) fn is_idle(&self, now: Instant) -> bool {
        self.tat.is_none_or(|t| t <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut g = Gcra::new(10, 3);
        assert!((0..3).all(|_| g.check(t0).is_ok()));
        assert_eq!(g.check(t0), Err(100 * MS));
        assert_eq!(g.check(t0 + 99 * MS), Err(MS));
        assert!(g.check(t0 + 100 * MS).is_ok());
        assert!(g.check(t0 + 100 * MS).is_err());
        // Idle long enough, the burst is back.
        let t1 = t0 + Duration::from_secs(10);
        assert!(g.is_idle(t1));
        assert!((0..3).all(|_| g.check(t1).is_ok()));
        assert!(g.check(t1).is_err());
    }

    #[test]
    fn bounded_wait_reserves_a_future_slot() {
        let t0 = Instant::now();
        let mut g = Gcra::new(10, 1);
        assert_eq!(g.reserve(t0, 50 * MS), Ok(Duration::ZERO));
        assert_eq!(g.reserve(t0, 50 * MS), Err(100 * MS));
        assert_eq!(g.reserve(t0, 100 * MS), Ok(100 * MS));
        assert_eq!(g.reserve(t0, 150 * MS), Err(200 * MS));
    }

    #[test]
    fn zero_rate_and_burst_are_clamped() {
        let t0 = Instant::now();
        let mut g = Gcra::new(0, 0);
        assert!(g.check(t0).is_ok());
        assert!(g.check(t0).is_err());
        assert!(g.is(1, 1));
    }

    proptest! {
        #[test]
        fn never_more_than_rate_times_t_plus_burst(
            rate in 1u32..2_000, burst in 1u32..50,
            gaps in proptest::collection::vec(0u64..20_000, 1..400),
            window_us in 1u64..2_000_000,
        ) {
            let t0 = Instant::now();
            let mut g = Gcra::new(rate, burst);
            let mut now = t0;
            let mut admitted = Vec::new();
            for gap in gaps {
                now += Duration::from_micros(gap);
                if g.check(now).is_ok() {
                    admitted.push(now);
                }
            }
            // Every window [s, s + t] starting at an admission holds at most burst + rate·t.
            let t = Duration::from_micros(window_us);
            let bound = f64::from(burst) + f64::from(rate) * t.as_secs_f64();
            for (i, s) in admitted.iter().enumerate() {
                let n = admitted[i..].iter().take_while(|a| **a <= *s + t).count();
                prop_assert!(n as f64 <= bound, "{} in {:?} > {}", n, t, bound);
            }
        }
    }
}
