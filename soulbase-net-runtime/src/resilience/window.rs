//! A sliding time window of ten buckets, shared by the retry budget and the breaker.
//!
//! A bucket covers `window / 10`; a value recorded at `now` lands in the bucket of `now`, and
//! a sum at `now` covers the current bucket and the nine before it. So an old sample leaves
//! the window at most one bucket width early, never late, and memory is fixed.

use std::time::Duration;

use tokio::time::Instant;

const BUCKETS: usize = 10;

/// A ring of ten time buckets over `window`.
#[derive(Debug)]
pub(crate) struct Buckets<T> {
    slots: [Slot<T>; BUCKETS],
    epoch: Instant,
    /// A bucket's width in nanoseconds (at least 1).
    width: u64,
    window: Duration,
}

#[derive(Clone, Copy, Debug)]
struct Slot<T> {
    /// The bucket number (time since `epoch` / `width`) the value belongs to.
    index: u64,
    value: T,
}

/// The index of a slot that holds nothing yet.
const EMPTY: u64 = u64::MAX;

// === impl Buckets ===

impl<T: Default + Copy> Buckets<T> {
    /// An empty window of length `window` starting at `now`.
    pub(crate) fn new(window: Duration, now: Instant) -> Self {
        Self {
            slots: [Slot {
                index: EMPTY,
                value: T::default(),
            }; BUCKETS],
            epoch: now,
            width: nanos(window / BUCKETS as u32).max(1),
            window,
        }
    }

    /// Starts over when the configured window changed (a policy reload).
    pub(crate) fn reconfigure(&mut self, window: Duration, now: Instant) {
        if window != self.window {
            *self = Self::new(window, now);
        }
    }

    /// Forgets every sample.
    pub(crate) fn clear(&mut self) {
        for s in &mut self.slots {
            s.index = EMPTY;
        }
    }

    /// The bucket for `now`, emptied first if it still held an older bucket's values.
    pub(crate) fn current(&mut self, now: Instant) -> &mut T {
        let index = self.index(now);
        let slot = &mut self.slots[(index % BUCKETS as u64) as usize];
        if slot.index != index {
            slot.index = index;
            slot.value = T::default();
        }
        &mut slot.value
    }

    /// Folds the buckets inside the window at `now` with `add`.
    pub(crate) fn sum<A: Default>(&self, now: Instant, mut add: impl FnMut(&mut A, &T)) -> A {
        let index = self.index(now);
        let mut acc = A::default();
        for s in &self.slots {
            if s.index != EMPTY && s.index <= index && index - s.index < BUCKETS as u64 {
                add(&mut acc, &s.value);
            }
        }
        acc
    }

    fn index(&self, now: Instant) -> u64 {
        // `EMPTY` is never a real index: a window would have to run for 584 years at 1ns.
        (nanos(now.saturating_duration_since(self.epoch)) / self.width).min(EMPTY - 1)
    }
}

/// `d` in nanoseconds, saturating at `u64::MAX` (584 years): 64-bit arithmetic, where
/// `Duration::as_nanos` would make every bucket lookup a 128-bit division.
fn nanos(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(b: &Buckets<u32>, now: Instant) -> u32 {
        b.sum(now, |a: &mut u32, v| *a += v)
    }

    #[test]
    fn samples_leave_after_the_window() {
        let t0 = Instant::now();
        let mut b = Buckets::<u32>::new(Duration::from_secs(10), t0);
        *b.current(t0) += 1;
        *b.current(t0 + Duration::from_millis(4_500)) += 2;
        assert_eq!(total(&b, t0 + Duration::from_millis(9_999)), 3);
        assert_eq!(total(&b, t0 + Duration::from_secs(10)), 2, "bucket 0 left");
        // The 4.5s sample is in bucket 4 (4s..5s), which leaves at 14s: up to one bucket early.
        assert_eq!(total(&b, t0 + Duration::from_millis(13_999)), 2);
        assert_eq!(total(&b, t0 + Duration::from_secs(14)), 0);
    }

    #[test]
    fn a_reused_slot_is_emptied_first() {
        let t0 = Instant::now();
        let mut b = Buckets::<u32>::new(Duration::from_secs(10), t0);
        *b.current(t0) += 5;
        *b.current(t0 + Duration::from_secs(10)) += 1;
        assert_eq!(total(&b, t0 + Duration::from_secs(10)), 1);
    }

    #[test]
    fn clock_before_epoch_and_zero_window_are_safe() {
        let t0 = Instant::now() + Duration::from_secs(5);
        let mut b = Buckets::<u32>::new(Duration::ZERO, t0);
        *b.current(t0 - Duration::from_secs(1)) += 1;
        assert_eq!(total(&b, t0), 1);
        b.clear();
        assert_eq!(total(&b, t0), 0);
    }
}
