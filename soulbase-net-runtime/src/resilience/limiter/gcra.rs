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
#[derive(Clone, Debug, PartialEq, Eq)]
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

    /// This bucket at `rate` and `burst` from `now` on, keeping how full it is; nothing
    /// changes when it already has them.
    ///
    /// The calls the bucket owes at `now` (how far its theoretical arrival time runs ahead,
    /// in emission intervals) are rescaled in proportion to the bursts and carried over at
    /// the new interval, and never to fewer than would leave more calls admissible at once
    /// than before the change. So a drained bucket stays drained, a full one stays full up
    /// to the smaller burst, and no change — down or up — lets a burst through.
    ///
    /// Why not a new bucket: it starts full, and a host the SLO controller slows down is
    /// usually one running at its rate, with an empty bucket; rebuilding it would admit a
    /// whole burst at the moment the controller asked for less.
    pub(crate) fn retune(&mut self, rate: u32, burst: u32, now: Instant) {
        if self.is(rate, burst) {
            return;
        }
        let old = std::mem::replace(self, Self::new(rate, burst));
        // What the old bucket owed, in time; never used or idle, nothing.
        let debt = old
            .tat
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
        let debt = rescale(debt, (old.interval, old.burst), (self.interval, self.burst));
        self.tat = if debt.is_zero() {
            None
        } else {
            // Past the clock's range the old time is as far as it gets.
            Some(now.checked_add(debt).or(old.tat).unwrap_or(now))
        };
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

/// The debt (how far the theoretical arrival time runs ahead of now) of a bucket of
/// `(interval, burst)` carried to one of `(to_interval, to_burst)`, as
/// [`Gcra::retune`] says: the calls owed, `debt / interval`, scaled by `to_burst / burst`, but
/// at least as many as keep `to_burst − owed` (the calls admissible at once) from exceeding
/// `burst − debt / interval`. Exact in nanoseconds, rounded up.
fn rescale(debt: Duration, (interval, burst): (Duration, u32), to: (Duration, u32)) -> Duration {
    let (to_interval, to_burst) = (to.0.as_nanos(), u128::from(to.1));
    let (debt, interval, burst) = (
        debt.as_nanos(),
        interval.as_nanos().max(1),
        u128::from(burst),
    );
    let ceil_div = |n: u128, d: u128| n.div_ceil(d.max(1));
    // The owed calls at the new interval.
    let owed = ceil_div(debt.saturating_mul(to_interval), interval);
    let proportional = ceil_div(owed.saturating_mul(to_burst), burst);
    // (to_burst − burst) intervals more owed than before, when the burst grows.
    let no_more_at_once = (owed + to_burst.saturating_mul(to_interval))
        .saturating_sub(burst.saturating_mul(to_interval));
    let nanos = proportional.max(no_more_at_once);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
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

    /// Calls admitted from `from` to `from + span` (both included), trying every millisecond.
    fn admitted(g: &mut Gcra, from: Instant, span: Duration) -> usize {
        let ms = span.as_millis() as u32;
        (0..=ms).filter(|i| g.check(from + MS * *i).is_ok()).count()
    }

    /// A bucket of 100 per second (bursts of 100, the policy's default of one second's
    /// worth) run at its rate for 2 s: empty.
    fn drained(t0: Instant) -> Gcra {
        let mut g = Gcra::new(100, 100);
        assert_eq!(admitted(&mut g, t0, 2_000 * MS), 100 + 200);
        g
    }

    #[test]
    fn a_lower_rate_keeps_a_drained_bucket_drained() {
        let t0 = Instant::now();
        let t1 = t0 + 2_000 * MS;
        // The SLO controller scales 100 to 25 (the burst follows when the policy sets none).
        let mut g = drained(t0);
        g.retune(25, 25, t1);
        assert!(g.is(25, 25));
        let kept = admitted(&mut g, t1, 1_000 * MS);
        assert!(kept <= 25 + 1, "{kept} in the second after the change");
        assert!(kept >= 24, "{kept}: the new rate still flows");
        // What a new bucket let through: the rate and a whole burst on top.
        let mut fresh = Gcra::new(25, 25);
        assert_eq!(admitted(&mut fresh, t1, 1_000 * MS), 25 + 25);
        // With a burst the policy sets (10), the same.
        let mut g = Gcra::new(100, 10);
        assert_eq!(admitted(&mut g, t0, 2_000 * MS), 10 + 200);
        g.retune(25, 10, t1);
        assert!(admitted(&mut g, t1, 1_000 * MS) <= 25 + 1);
    }

    #[test]
    fn a_full_bucket_keeps_at_most_the_new_burst() {
        let t0 = Instant::now();
        // Full, 100 → 25: the second after admits the rate plus the policy's burst, no more.
        let mut g = Gcra::new(100, 100);
        g.retune(25, 25, t0);
        assert_eq!(admitted(&mut g, t0, 1_000 * MS), 25 + 25);
        let mut g = Gcra::new(100, 10);
        assert!(g.check(t0).is_ok());
        g.retune(25, 10, t0 + Duration::from_secs(5));
        assert_eq!(
            admitted(&mut g, t0 + Duration::from_secs(5), 1_000 * MS),
            10 + 25
        );
        // Half used, 100 → 25: half the new burst at once.
        let mut g = Gcra::new(100, 100);
        assert!((0..50).all(|_| g.check(t0).is_ok()));
        g.retune(25, 25, t0);
        let at_once = (0..100).filter(|_| g.check(t0).is_ok()).count();
        assert!((12..=13).contains(&at_once), "{at_once}");
    }

    #[test]
    fn a_higher_rate_never_lets_more_through_at_once() {
        let t0 = Instant::now();
        // The controller steps back, 25 → 100: the 25 left stay 25, then it refills at 100.
        let mut g = Gcra::new(25, 25);
        g.retune(100, 100, t0);
        let at_once = (0..200).filter(|_| g.check(t0).is_ok()).count();
        assert_eq!(at_once, 25);
        assert!(g.check(t0 + 10 * MS).is_ok());
        // A drained bucket stays drained: the next call after one new interval.
        let mut g = Gcra::new(25, 25);
        assert!((0..25).all(|_| g.check(t0).is_ok()));
        g.retune(100, 100, t0);
        assert_eq!(g.check(t0), Err(10 * MS));
        // Never used, either way: the smaller burst at once.
        let mut g = Gcra::new(25, 25);
        g.retune(100, 100, t0);
        assert_eq!((0..200).filter(|_| g.check(t0).is_ok()).count(), 25);
        let mut g = Gcra::new(100, 100);
        g.retune(25, 25, t0);
        assert_eq!((0..200).filter(|_| g.check(t0).is_ok()).count(), 25);
    }

    #[test]
    fn the_same_rate_leaves_the_bucket_as_it_was() {
        let t0 = Instant::now();
        let mut g = Gcra::new(10, 3);
        assert!(g.check(t0).is_ok());
        let before = g.clone();
        g.retune(10, 3, t0 + 50 * MS);
        assert_eq!(g, before);
        // Clamped values are the same rate too.
        let mut z = Gcra::new(0, 0);
        let before = z.clone();
        z.retune(1, 1, t0);
        assert_eq!(z, before);
        // The limiter retunes before every reservation: at one rate, it is the bucket of
        // `burst_then_rate`.
        let mut g = Gcra::new(10, 3);
        let mut retuned = |at: Instant| {
            g.retune(10, 3, at);
            g.check(at)
        };
        assert!((0..3).all(|_| retuned(t0).is_ok()));
        assert_eq!(retuned(t0), Err(100 * MS));
        assert!(retuned(t0 + 100 * MS).is_ok());
        assert!(retuned(t0 + 100 * MS).is_err());
    }

    /// A window `[s, s + window_us µs]` starting at an admission that holds more than
    /// `burst + rate × t` of `admitted`: how many it holds, and its start.
    fn most_in_a_window(
        admitted: &[Instant],
        window_us: u64,
        rate: u32,
        burst: u32,
    ) -> Option<(usize, Instant)> {
        let t = Duration::from_micros(window_us);
        let bound = f64::from(burst) + f64::from(rate) * t.as_secs_f64();
        admitted.iter().enumerate().find_map(|(i, s)| {
            let n = admitted[i..].iter().take_while(|a| **a <= *s + t).count();
            (n as f64 > bound).then_some((n, *s))
        })
    }

    proptest! {
        #[test]
        fn after_a_change_never_more_than_the_new_rate_times_t_plus_burst(
            rates in (1u32..1_000, 1u32..50, 1u32..1_000, 1u32..50),
            gaps in proptest::collection::vec(0u64..20_000, 2..400),
            change_at in 0usize..400,
            window_us in 1u64..2_000_000,
        ) {
            let (r1, b1, r2, b2) = rates;
            let t0 = Instant::now();
            let mut g = Gcra::new(r1, b1);
            let mut now = t0;
            let mut admitted = Vec::new();
            let mut at_change = None;
            for (i, gap) in gaps.iter().enumerate() {
                now += Duration::from_micros(*gap);
                if i == change_at.min(gaps.len() - 1) {
                    // Admissible at once after the change: never more than before it.
                    let mut probe = g.clone();
                    let before = (0..=b1).take_while(|_| probe.check(now).is_ok()).count();
                    g.retune(r2, b2, now);
                    let mut probe = g.clone();
                    let after = (0..=b2).take_while(|_| probe.check(now).is_ok()).count();
                    prop_assert!(after <= before, "{} at once after, {} before", after, before);
                    at_change = Some(now);
                }
                if at_change.is_some() && g.check(now).is_ok() {
                    admitted.push(now);
                }
            }
            prop_assert_eq!(most_in_a_window(&admitted, window_us, r2, b2), None);
        }
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
            prop_assert_eq!(most_in_a_window(&admitted, window_us, rate, burst), None);
        }
    }
}
