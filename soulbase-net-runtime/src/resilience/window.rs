//! A sliding time window of ten buckets, shared by the retry budget and the breaker.
//!
//! A bucket covers `window / 10`; a value recorded at `now` lands in the bucket of `now`, and
//! a sum at `now` covers the current bucket and the nine before it. So an old sample leaves
//! the window at most one bucket width early, never late, and memory is fixed.

use std::time::Duration;

use tokio::time::Instant;

const BUCKETS: usize = 10;

/// What a bucket counts: values that add up, bucket by bucket, to the window's total.
pub(crate) trait Tally: Copy + Default {
    /// Adds `other` into `self` (saturating: a counter pinned at its maximum stays there).
    fn add(&mut self, other: &Self);
}

/// A ring of ten time buckets over `window`, with the total of the buckets inside the window
/// kept as values are added.
///
/// Why the kept total: the breaker asks for it after every call it records, and summing ten
/// buckets each time was a fifth of its cost. The total is valid for one bucket number at a
/// time; it is summed again only when the clock has moved into another bucket (at most ten
/// times a window) or a bucket was reused.
#[derive(Debug)]
pub(crate) struct Buckets<T> {
    slots: [Slot<T>; BUCKETS],
    epoch: Instant,
    /// A bucket's width in nanoseconds (at least 1).
    width: u64,
    window: Duration,
    /// The total of the buckets inside the window as seen from bucket number `at`; `at` is
    /// `EMPTY` when no total is kept.
    total: Slot<T>,
    /// The bucket the clock was last in: its number and the instants it covers (`from`
    /// included, `until` not). A call in the same bucket compares two instants instead of
    /// measuring the time since `epoch` again (a subtraction and a division per call).
    last: Last,
}

#[derive(Clone, Copy, Debug)]
struct Last {
    index: u64,
    from: Instant,
    until: Instant,
}

impl Last {
    /// Covers no instant: the next call measures.
    fn none(at: Instant) -> Self {
        Last {
            index: EMPTY,
            from: at,
            until: at,
        }
    }
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

impl<T: Tally> Buckets<T> {
    /// An empty window of length `window` starting at `now`.
    pub(crate) fn new(window: Duration, now: Instant) -> Self {
        let empty = Slot {
            index: EMPTY,
            value: T::default(),
        };
        Self {
            slots: [empty; BUCKETS],
            epoch: now,
            width: nanos(window / BUCKETS as u32).max(1),
            window,
            total: empty,
            last: Last::none(now),
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
        self.total.index = EMPTY;
    }

    /// Adds `value` to the bucket of `now` (emptied first if it still held an older bucket's
    /// values), and to the kept total when that bucket counts in it.
    pub(crate) fn add(&mut self, now: Instant, value: T) {
        let index = self.index_kept(now);
        let slot = &mut self.slots[(index % BUCKETS as u64) as usize];
        if slot.index != index {
            // What the slot held leaves the window: the kept total may have counted it.
            slot.index = index;
            slot.value = T::default();
            self.total.index = EMPTY;
        }
        slot.value.add(&value);
        if self.total.index != EMPTY && live(index, self.total.index) {
            self.total.value.add(&value);
        }
    }

    /// The total of the buckets inside the window at `now`, kept for the next call in the
    /// same bucket.
    pub(crate) fn total(&mut self, now: Instant) -> T {
        let index = self.index_kept(now);
        if self.total.index != index {
            self.total = Slot {
                index,
                value: self.sum_at(index),
            };
        }
        self.total.value
    }

    /// The total of the buckets inside the window at `now`, summed (for readers that may not
    /// keep it: gauges).
    pub(crate) fn sum(&self, now: Instant) -> T {
        self.sum_at(self.index(now))
    }

    fn sum_at(&self, index: u64) -> T {
        let mut acc = T::default();
        for s in &self.slots {
            if s.index != EMPTY && live(s.index, index) {
                acc.add(&s.value);
            }
        }
        acc
    }

    /// [`Self::index`], kept for the calls that follow in the same bucket.
    fn index_kept(&mut self, now: Instant) -> u64 {
        let last = self.last;
        if last.from <= now && now < last.until {
            return last.index;
        }
        let index = self.index(now);
        // The bucket's bounds; none kept when `now` is before the epoch (bucket 0 then
        // covers it without starting at it) or a bound does not fit in an instant.
        let from = Duration::from_nanos(index.saturating_mul(self.width));
        self.last = match self.epoch.checked_add(from) {
            Some(start) if start <= now => {
                match start.checked_add(Duration::from_nanos(self.width)) {
                    Some(until) => Last {
                        index,
                        from: start,
                        until,
                    },
                    None => Last::none(now),
                }
            }
            _ => Last::none(now),
        };
        index
    }

    fn index(&self, now: Instant) -> u64 {
        // `EMPTY` is never a real index: a window would have to run for 584 years at 1ns.
        (nanos(now.saturating_duration_since(self.epoch)) / self.width).min(EMPTY - 1)
    }
}

/// Whether bucket number `bucket` is inside the window seen from bucket number `at`: it is
/// `at` or one of the nine before it.
fn live(bucket: u64, at: u64) -> bool {
    bucket <= at && at - bucket < BUCKETS as u64
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
    use proptest::prelude::*;

    impl Tally for u32 {
        fn add(&mut self, other: &Self) {
            *self = self.saturating_add(*other);
        }
    }

    #[test]
    fn samples_leave_after_the_window() {
        let t0 = Instant::now();
        let mut b = Buckets::<u32>::new(Duration::from_secs(10), t0);
        b.add(t0, 1);
        b.add(t0 + Duration::from_millis(4_500), 2);
        assert_eq!(b.total(t0 + Duration::from_millis(9_999)), 3);
        assert_eq!(b.total(t0 + Duration::from_secs(10)), 2, "bucket 0 left");
        // The 4.5s sample is in bucket 4 (4s..5s), which leaves at 14s: up to one bucket early.
        assert_eq!(b.total(t0 + Duration::from_millis(13_999)), 2);
        assert_eq!(b.total(t0 + Duration::from_secs(14)), 0);
    }

    #[test]
    fn a_reused_slot_is_emptied_first() {
        let t0 = Instant::now();
        let mut b = Buckets::<u32>::new(Duration::from_secs(10), t0);
        b.add(t0, 5);
        assert_eq!(b.total(t0), 5);
        b.add(t0 + Duration::from_secs(10), 1);
        assert_eq!(b.total(t0 + Duration::from_secs(10)), 1);
        assert_eq!(b.sum(t0 + Duration::from_secs(10)), 1);
    }

    #[test]
    fn the_kept_total_follows_adds_in_its_bucket() {
        let t0 = Instant::now();
        let mut b = Buckets::<u32>::new(Duration::from_secs(10), t0);
        b.add(t0, 1);
        assert_eq!(b.total(t0), 1);
        b.add(t0 + Duration::from_millis(10), 2);
        assert_eq!(b.total(t0 + Duration::from_millis(20)), 3);
        // A later bucket is not in the total kept for an earlier one, and is counted once
        // the clock reaches it.
        b.add(t0 + Duration::from_secs(3), 4);
        assert_eq!(b.total(t0 + Duration::from_millis(30)), 3);
        assert_eq!(b.total(t0 + Duration::from_secs(3)), 7);
    }

    #[test]
    fn clock_before_epoch_and_zero_window_are_safe() {
        let t0 = Instant::now() + Duration::from_secs(5);
        let mut b = Buckets::<u32>::new(Duration::ZERO, t0);
        b.add(t0 - Duration::from_secs(1), 1);
        assert_eq!(b.total(t0), 1);
        b.clear();
        assert_eq!(b.total(t0), 0);
        assert_eq!(b.sum(t0), 0);
    }

    proptest! {
        /// Whatever the order of adds and reads (the clock may step back a little between
        /// callers), the kept total equals the buckets summed.
        #[test]
        fn the_kept_total_is_the_sum(
            steps in proptest::collection::vec((0u64..2_500, any::<bool>(), 1u32..5, any::<bool>()), 1..200),
        ) {
            let t0 = Instant::now();
            let mut b = Buckets::<u32>::new(Duration::from_secs(1), t0);
            let mut clock = 0u64;
            for (step, back, value, read) in steps {
                // Mostly forward, by up to 2.5 buckets; sometimes back by up to 50 ms.
                clock = if back { clock.saturating_sub(step / 50) } else { clock + step / 10 };
                let now = t0 + Duration::from_millis(clock);
                if read {
                    prop_assert_eq!(b.total(now), b.sum(now));
                } else {
                    b.add(now, value);
                }
                prop_assert_eq!(b.total(now), b.sum(now));
            }
        }

        /// The kept bucket number is the one measured from the epoch, whichever way the
        /// clock steps (back before the epoch too) and whatever the bucket's width.
        #[test]
        fn the_kept_bucket_is_the_measured_one(
            width_ns in 1u64..5_000_000,
            steps in proptest::collection::vec((0u64..20_000_000, any::<bool>()), 1..200),
        ) {
            let t0 = Instant::now() + Duration::from_millis(100);
            let mut b = Buckets::<u32>::new(Duration::from_nanos(width_ns * 10), t0);
            let mut clock = 100_000_000u64;
            for (step, back) in steps {
                clock = if back { clock.saturating_sub(step) } else { clock + step };
                let now = t0 - Duration::from_millis(100) + Duration::from_nanos(clock);
                prop_assert_eq!(b.index_kept(now), b.index(now));
                prop_assert_eq!(b.index_kept(now), b.index(now), "asked again");
            }
        }
    }
}
