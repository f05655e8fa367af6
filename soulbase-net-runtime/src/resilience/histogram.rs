//! A host's recent latencies as a histogram of log-spaced buckets with atomic counters, for
//! the dynamic timeout (seed 001 §V): recorded and read without a lock and without copying
//! samples.
//!
//! Buckets: below 16µs one per microsecond; above, 16 per power of two (each 1/16 of its
//! octave's start wide), up to 2^36µs (about 19 hours; longer latencies count in the last
//! bucket). A percentile is the **upper edge** of the bucket holding the nearest-rank
//! sample, so it is never below the exact nearest-rank percentile of the samples counted and
//! at most 1/16 (6.25%) above it (exact below 16µs; latencies are rounded up to whole
//! microseconds).
//!
//! Recency: two halves of `WINDOW` samples each. Samples go into the current half; when it
//! has `WINDOW`, the other half is emptied and becomes the current one. The percentile reads
//! both, so it covers the last `WINDOW` to `2 × WINDOW` samples (the [`LatencyWindow`] it
//! replaces kept the last 512).
//!
//! Concurrent recorders and readers never wait for each other; a sample recorded while a
//! half is being emptied may be lost or land in the emptied half, a difference of a few
//! samples in a window of hundreds.
//!
//! [`LatencyWindow`]: super::LatencyWindow

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use super::dynamic::Percentile;

/// Buckets below 16µs, one per microsecond.
const LINEAR: u64 = 16;
/// Sub-buckets per power of two above them (log2).
const SUB_BITS: u32 = 4;
/// Powers of two covered above the linear part: 2^4µs up to 2^36µs.
const OCTAVES: u32 = 32;
/// All buckets.
const BUCKETS: usize = LINEAR as usize + (OCTAVES as usize) * (1 << SUB_BITS);

/// Samples per half (see the module docs).
pub(crate) const WINDOW: u32 = 512;

/// One half: a count per bucket, and how many samples it holds.
#[derive(Debug)]
struct Half {
    buckets: Box<[AtomicU32]>,
    count: AtomicU32,
}

/// A host's recent latencies; see the module docs.
#[derive(Debug)]
pub(crate) struct LatencyHistogram {
    halves: [Half; 2],
    /// Which half takes new samples.
    current: AtomicUsize,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Half {
    fn new() -> Self {
        Half {
            buckets: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            count: AtomicU32::new(0),
        }
    }

    fn clear(&self) {
        for b in self.buckets.iter() {
            b.store(0, Ordering::Relaxed);
        }
        self.count.store(0, Ordering::Relaxed);
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    pub(crate) fn new() -> Self {
        LatencyHistogram {
            halves: [Half::new(), Half::new()],
            current: AtomicUsize::new(0),
        }
    }

    /// Adds a latency.
    pub(crate) fn record(&self, latency: Duration) {
        let i = self.current.load(Ordering::Relaxed) & 1;
        let half = &self.halves[i];
        if let Some(b) = half.buckets.get(bucket_of(latency)) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        // Only the recorder that fills the half turns the window.
        if half.count.fetch_add(1, Ordering::Relaxed) + 1 == WINDOW {
            let other = 1 - i;
            self.halves[other].clear();
            self.current.store(other, Ordering::Relaxed);
        }
    }

    /// How many latencies are counted (both halves).
    pub(crate) fn len(&self) -> usize {
        let n: u64 = self
            .halves
            .iter()
            .map(|h| u64::from(h.count.load(Ordering::Relaxed)))
            .sum();
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// The nearest-rank percentile `q` in `[0, 1]` (clamped; NaN reads as 1), as the upper
    /// edge of its bucket; `None` when empty.
    pub(crate) fn percentile(&self, q: f64) -> Option<Duration> {
        let counts = |b: usize| -> u64 {
            self.halves
                .iter()
                .map(|h| u64::from(h.buckets[b].load(Ordering::Relaxed)))
                .sum()
        };
        // The buckets, not the halves' counts, so a racing recorder cannot skew the rank.
        let n: u64 = (0..BUCKETS).map(counts).sum();
        if n == 0 {
            return None;
        }
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for b in 0..BUCKETS {
            seen += counts(b);
            if seen >= rank {
                return Some(Duration::from_micros(upper_edge(b)));
            }
        }
        Some(Duration::from_micros(upper_edge(BUCKETS - 1)))
    }
}

impl Percentile for LatencyHistogram {
    fn percentile_after(&self, q: f64, min_samples: usize) -> Option<Duration> {
        (self.len() >= min_samples.max(1))
            .then(|| self.percentile(q))
            .flatten()
    }
}

/// The bucket of `latency`, rounded up to whole microseconds.
fn bucket_of(latency: Duration) -> usize {
    let us = u64::try_from(latency.as_nanos().div_ceil(1_000)).unwrap_or(u64::MAX);
    if us < LINEAR {
        return us as usize;
    }
    let octave = 63 - us.leading_zeros(); // >= 4
    if octave >= SUB_BITS + OCTAVES {
        return BUCKETS - 1;
    }
    let sub = (us >> (octave - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    LINEAR as usize + ((octave - SUB_BITS) as usize) * (1 << SUB_BITS) + sub as usize
}

/// The largest whole microsecond in bucket `b`.
fn upper_edge(b: usize) -> u64 {
    let b = b as u64;
    if b < LINEAR {
        return b;
    }
    let i = b - LINEAR;
    let octave = i >> SUB_BITS; // 0 for [16, 32)
    let sub = i & ((1 << SUB_BITS) - 1);
    let width = 1u64 << octave;
    ((1 << SUB_BITS) + sub) * width + width - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resilience::LatencyWindow;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn buckets_cover_their_edges() {
        for us in [
            0u64,
            1,
            15,
            16,
            17,
            31,
            32,
            33,
            1_000,
            99_000,
            1 << 35,
            (1 << 36) - 1,
        ] {
            let b = bucket_of(Duration::from_micros(us));
            assert!(upper_edge(b) >= us, "{us}µs in bucket {b}");
            if b > 0 {
                assert!(
                    upper_edge(b - 1) < us,
                    "{us}µs: bucket {b} is the first holding it"
                );
            }
        }
        assert_eq!(bucket_of(Duration::from_secs(1_000_000)), BUCKETS - 1);
        assert_eq!(bucket_of(Duration::from_nanos(1_001)), 2, "rounded up");
    }

    /// Against the exact nearest-rank percentile of the same samples (the window the
    /// estimator replaced): never below, at most 6.25% above.
    #[test]
    fn percentiles_of_a_known_distribution_are_within_one_sixteenth() {
        // Log-normal-ish latencies around 20ms with a long tail, from a fixed seed.
        let mut rng = fastrand::Rng::with_seed(7);
        let h = LatencyHistogram::new();
        let mut exact = LatencyWindow::new(WINDOW as usize);
        for _ in 0..WINDOW {
            let z: f64 = (0..12).map(|_| rng.f64()).sum::<f64>() - 6.0;
            let us = (20_000.0 * (0.8 * z).exp()) as u64;
            h.record(Duration::from_micros(us));
            exact.record(Duration::from_micros(us));
        }
        for q in [0.5, 0.9, 0.95, 0.99, 0.999, 1.0] {
            let want = exact.percentile(q).unwrap().as_secs_f64();
            let got = h.percentile(q).unwrap().as_secs_f64();
            assert!(got >= want, "p{q}: {got} below {want}");
            assert!(got <= want * (1.0 + 1.0 / 16.0), "p{q}: {got} vs {want}");
        }
        // The uniform 1..=100ms of the dynamic timeout's tests: p99 = 99ms.
        let u = LatencyHistogram::new();
        for i in 1..=100u32 {
            u.record(i * MS);
        }
        let p99 = u.percentile(0.99).unwrap();
        assert!(p99 >= 99 * MS && p99 <= 99 * MS * 17 / 16, "{p99:?}");
        assert_eq!(u.percentile_after(0.99, 101), None);
    }

    #[test]
    fn the_window_turns_and_old_latencies_leave() {
        let h = LatencyHistogram::new();
        for _ in 0..WINDOW {
            h.record(900 * MS);
        }
        assert_eq!(h.len(), WINDOW as usize);
        for _ in 0..WINDOW {
            h.record(MS);
        }
        // The 900ms half was emptied when the 1ms half filled.
        assert_eq!(h.len(), WINDOW as usize);
        assert!(h.percentile(1.0).unwrap() < 2 * MS);
    }

    #[test]
    fn recorders_on_many_threads_lose_nothing_between_turns() {
        let h = LatencyHistogram::new();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let h = &h;
                s.spawn(move || {
                    for i in 0..100u64 {
                        h.record(Duration::from_micros(t * 1_000 + i));
                    }
                });
            }
        });
        assert_eq!(h.len(), 400);
        assert_eq!(
            h.percentile(1.0),
            Some(Duration::from_micros(upper_edge(bucket_of(
                Duration::from_micros(3_099)
            ))))
        );
    }

    proptest! {
        #[test]
        fn within_one_sixteenth_of_the_exact_percentile(
            samples in proptest::collection::vec(0u64..10_000_000, 1..400), q in 0.0f64..1.0,
        ) {
            let h = LatencyHistogram::new();
            let mut w = LatencyWindow::new(WINDOW as usize);
            for s in &samples {
                h.record(Duration::from_micros(*s));
                w.record(Duration::from_micros(*s));
            }
            let want = w.percentile(q).unwrap().as_micros() as u64;
            let got = h.percentile(q).unwrap().as_micros() as u64;
            prop_assert!(got >= want);
            prop_assert!(got <= want + want / 16, "{} vs {}", got, want);
        }
    }
}
