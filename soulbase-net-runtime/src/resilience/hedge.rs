//! The hedging schedule (seed 001 §VI, DESIGN §4 "Hedging"): when to start each extra copy of
//! an idempotent request while the first is still running.
//!
//! The client races the copies, keeps the first success and drops the rest (dropping cancels
//! them); every copy carries the request's idempotency key and withdraws from the retry
//! budget like a retry. While the SLO controller slows a host down, the copies start later
//! ([`HedgeSchedule::stretched`]) and are thinned like retries.

use std::time::Duration;

use soulbase_net_policy::HedgePolicy;

use super::slo::Factors;

/// When the extra attempts of one request start, measured from the first attempt's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HedgeSchedule {
    delay: Duration,
    max_hedges: u32,
}

impl HedgeSchedule {
    /// The schedule for a request, or `None` when it is not hedged: hedging off, no hedges
    /// allowed, or a request that may not be sent twice (`replayable` is
    /// `NetRequest::is_replayable`).
    ///
    /// The delay is `learnt` when given (e.g. the host's p95 from a
    /// [`LatencyWindow`](super::LatencyWindow) once it has enough samples), else
    /// `hedge.delay`; a zero delay counts as 1ms so copies never start all at once.
    pub(crate) fn new(p: &HedgePolicy, replayable: bool, learnt: Option<Duration>) -> Option<Self> {
        if !p.enabled || !replayable || p.max_hedges == 0 {
            return None;
        }
        Some(Self {
            delay: learnt.unwrap_or(p.delay).max(Duration::from_millis(1)),
            max_hedges: p.max_hedges,
        })
    }

    /// The same schedule with its delay stretched by the SLO controller's backoff factor
    /// (seed 001 §VIII: while a host misses its targets, extra attempts come later, like
    /// retries); unchanged at a factor of 1.
    ///
    /// The copies that a longer delay pushes past the deadline are not started:
    /// [`starts_within`](Self::starts_within) leaves them out.
    pub(crate) fn stretched(self, factors: Factors) -> Self {
        Self {
            delay: factors.stretch(self.delay),
            ..self
        }
    }

    /// When hedge `n` (from 1) starts, after the first attempt's start; `None` past
    /// `max_hedges`.
    pub(crate) fn start_of(&self, n: u32) -> Option<Duration> {
        (1..=self.max_hedges)
            .contains(&n)
            .then(|| self.delay.saturating_mul(n))
    }

    /// The hedges worth starting when the first attempt started with `time_left` before the
    /// deadline and each copy may run `attempt_timeout`: those whose start plus timeout still
    /// fits, so a copy never starts that could not finish in time.
    pub(crate) fn starts_within(
        &self,
        time_left: Duration,
        attempt_timeout: Duration,
    ) -> impl Iterator<Item = Duration> + '_ {
        (1..=self.max_hedges)
            .filter_map(|n| self.start_of(n))
            .take_while(move |s| s.saturating_add(attempt_timeout) <= time_left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn policy(max_hedges: u32) -> HedgePolicy {
        let mut p = HedgePolicy::default();
        p.enabled = true;
        p.max_hedges = max_hedges;
        p
    }

    #[test]
    fn not_hedged_when_off_or_not_replayable() {
        assert_eq!(
            HedgeSchedule::new(&HedgePolicy::default(), true, None),
            None
        );
        assert_eq!(HedgeSchedule::new(&policy(2), false, None), None);
        assert_eq!(HedgeSchedule::new(&policy(0), true, None), None);
    }

    #[test]
    fn copies_start_every_delay_up_to_max_hedges() {
        let s = HedgeSchedule::new(&policy(3), true, None).unwrap();
        assert_eq!(s.delay, 50 * MS);
        let starts: Vec<_> = (0..=4).map(|n| s.start_of(n)).collect();
        assert_eq!(
            starts,
            [None, Some(50 * MS), Some(100 * MS), Some(150 * MS), None]
        );
    }

    #[test]
    fn a_learnt_percentile_replaces_the_fixed_delay() {
        let s = HedgeSchedule::new(&policy(1), true, Some(120 * MS)).unwrap();
        assert_eq!(s.start_of(1), Some(120 * MS));
        let s = HedgeSchedule::new(&policy(1), true, Some(Duration::ZERO)).unwrap();
        assert_eq!(s.delay, MS);
    }

    #[test]
    fn the_slo_backoff_factor_stretches_the_delay_but_never_past_the_deadline() {
        let s = HedgeSchedule::new(&policy(3), true, None).unwrap();
        assert_eq!(s.stretched(Factors::NONE), s);
        let slowed = s.stretched(Factors {
            backoff: 4.0,
            rate: 0.25,
        });
        let starts: Vec<_> = (1..=3).map(|n| slowed.start_of(n)).collect();
        assert_eq!(starts, [Some(200 * MS), Some(400 * MS), Some(600 * MS)]);
        // 1 s left and 650 ms per copy: three copies fit 50 ms apart, one 200 ms apart.
        assert_eq!(s.starts_within(1_000 * MS, 650 * MS).count(), 3);
        let fit: Vec<_> = slowed.starts_within(1_000 * MS, 650 * MS).collect();
        assert_eq!(fit, [200 * MS]);
        // A huge factor saturates rather than wraps, and starts nothing.
        let stalled = s.stretched(Factors {
            backoff: f64::MAX,
            rate: 1.0,
        });
        assert_eq!(
            stalled.starts_within(Duration::from_secs(3600), MS).count(),
            0
        );
    }

    #[test]
    fn hedges_that_cannot_finish_are_not_started() {
        let s = HedgeSchedule::new(&policy(5), true, None).unwrap();
        let starts: Vec<_> = s.starts_within(1_000 * MS, 880 * MS).collect();
        assert_eq!(starts, [50 * MS, 100 * MS]);
        assert_eq!(s.starts_within(MS, MS).count(), 0);
    }
}
