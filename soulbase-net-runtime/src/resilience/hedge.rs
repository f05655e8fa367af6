//! The hedging schedule (seed 001 §VI, DESIGN §4 "Hedging"): when to start each extra copy of
//! an idempotent request while the first is still running.
//!
//! The client races the copies, keeps the first success and drops the rest (dropping cancels
//! them); every copy carries the request's idempotency key and withdraws from the retry
//! budget like a retry.

use std::time::Duration;

use soulbase_net_policy::HedgePolicy;

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
    fn hedges_that_cannot_finish_are_not_started() {
        let s = HedgeSchedule::new(&policy(5), true, None).unwrap();
        let starts: Vec<_> = s.starts_within(1_000 * MS, 880 * MS).collect();
        assert_eq!(starts, [50 * MS, 100 * MS]);
        assert_eq!(s.starts_within(MS, MS).count(), 0);
    }
}
