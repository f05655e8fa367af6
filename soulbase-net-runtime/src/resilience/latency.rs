//! A window of recent latencies and its percentiles, for hedging delays and the dynamic
//! timeout (seed 001 §V–VI).
//!
//! The client's dynamic timeout now learns from a [`LatencyHistogram`](super::LatencyHistogram)
//! per host (no lock, no copy per attempt); this exact window stays as the reference the
//! histogram is tested against, and for hedging delays to come.
#![cfg_attr(
    not(test),
    allow(dead_code, reason = "the exact reference of the histogram's tests")
)]

use std::collections::VecDeque;
use std::time::Duration;

/// The last `capacity` latencies of a host; the oldest leaves when a new one comes.
#[derive(Clone, Debug)]
pub(crate) struct LatencyWindow {
    samples: VecDeque<Duration>,
    capacity: usize,
}

impl LatencyWindow {
    /// An empty window of `capacity` samples (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            samples: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Adds a latency.
    pub(crate) fn record(&mut self, latency: Duration) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(latency);
    }

    /// How many latencies are held.
    pub(crate) fn len(&self) -> usize {
        self.samples.len()
    }

    /// The nearest-rank percentile `q` in `[0, 1]` (clamped; NaN reads as 1): the smallest
    /// sample with at least `q` of the samples at or below it. `None` when empty.
    pub(crate) fn percentile(&self, q: f64) -> Option<Duration> {
        let n = self.samples.len();
        if n == 0 {
            return None;
        }
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        let mut v: Vec<Duration> = self.samples.iter().copied().collect();
        let (_, nth, _) = v.select_nth_unstable(rank - 1);
        Some(*nth)
    }

    /// [`percentile`](Self::percentile) once at least `min_samples` latencies are known.
    pub(crate) fn percentile_after(&self, q: f64, min_samples: usize) -> Option<Duration> {
        (self.len() >= min_samples.max(1))
            .then(|| self.percentile(q))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn nearest_rank_percentiles() {
        let mut w = LatencyWindow::new(1_000);
        assert_eq!(w.percentile(0.5), None);
        for i in 1..=100u32 {
            w.record(i * MS);
        }
        assert_eq!(w.percentile(0.5), Some(50 * MS));
        assert_eq!(w.percentile(0.95), Some(95 * MS));
        assert_eq!(w.percentile(0.99), Some(99 * MS));
        assert_eq!(w.percentile(1.0), Some(100 * MS));
        assert_eq!(w.percentile(0.0), Some(MS));
        assert_eq!(w.percentile(f64::NAN), Some(100 * MS));
        assert_eq!(w.percentile_after(0.5, 101), None);
        assert_eq!(w.percentile_after(0.5, 100), Some(50 * MS));
    }

    #[test]
    fn the_oldest_sample_leaves() {
        let mut w = LatencyWindow::new(3);
        for ms in [900, 1, 2, 3] {
            w.record(ms * MS);
        }
        assert_eq!(w.len(), 3);
        assert_eq!(w.percentile(1.0), Some(3 * MS));
    }

    proptest! {
        #[test]
        fn percentile_is_a_sample_and_monotone(
            samples in proptest::collection::vec(0u64..10_000, 1..200), q in 0.0f64..1.0,
        ) {
            let mut w = LatencyWindow::new(500);
            for s in &samples {
                w.record(Duration::from_micros(*s));
            }
            let p = w.percentile(q).unwrap();
            prop_assert!(samples.contains(&(p.as_micros() as u64)));
            prop_assert!(w.percentile((q + 0.1).min(1.0)).unwrap() >= p);
        }
    }
}
