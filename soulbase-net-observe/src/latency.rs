//! [`Latency`]: the histogram behind `net_latency_ms` and `net_outbox_lateness_ms`.
//!
//! Why not prometheus-client's `Histogram`: every request observes two latencies (`total`
//! and `ttfb`), and that histogram takes a mutex for each and searches its buckets as
//! floats. Here an observation is a search of integer bounds and two atomic updates.
//! The text written is the same: per-bucket counts, `_sum` and `_count` in milliseconds.

use std::{
    fmt,
    iter::once,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use prometheus_client::{
    encoding::{EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::{MetricType, TypedMetric},
};

/// The upper bounds of the `net_latency_ms` buckets, in milliseconds.
pub const LATENCY_BUCKETS_MS: [f64; 13] = [
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

/// How many bounds there are ([`LATENCY_BUCKETS_MS`]); one bucket more holds the rest.
const BOUNDS: usize = LATENCY_BUCKETS_MS.len();

/// [`LATENCY_BUCKETS_MS`] in nanoseconds.
const BOUNDS_NS: [u64; BOUNDS] = {
    let mut ns = [0u64; BOUNDS];
    let mut i = 0;
    while i < BOUNDS {
        // Whole milliseconds up to 10 s: exact in nanoseconds.
        ns[i] = (LATENCY_BUCKETS_MS[i] * 1e6) as u64;
        i += 1;
    }
    ns
};

/// A histogram of durations over [`LATENCY_BUCKETS_MS`], shared by its clones (a family
/// and the registry hold the same one). Lock-free: a reader may see an observation's
/// bucket before its sum; the count is always the buckets' total.
#[derive(Clone, Default)]
pub(crate) struct Latency {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Observations per bucket: `buckets[i]` at most `BOUNDS_NS[i]` (and more than the
    /// bound before); the last, more than every bound.
    buckets: [AtomicU64; BOUNDS + 1],
    /// The sum of the observations in milliseconds, as an `f64`'s bits: a float, as
    /// prometheus-client keeps it, so that it never wraps (nanoseconds in a `u64` would
    /// after 584 years of summed latency: months for a busy service).
    sum_ms: AtomicU64,
}

impl Latency {
    /// Counts one observation of `d`.
    pub(crate) fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_NS.iter().take_while(|bound| ns > **bound).count();
        // `bucket` is at most `BOUNDS`, the last index.
        if let Some(n) = self.inner.buckets.get(bucket) {
            n.fetch_add(1, Ordering::Relaxed);
        }
        let ms = d.as_secs_f64() * 1e3;
        // The closure always gives a value: the update cannot fail.
        let _ = self
            .inner
            .sum_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + ms).to_bits())
            });
    }

    /// The sum of the observations, in milliseconds.
    fn sum_ms(&self) -> f64 {
        f64::from_bits(self.inner.sum_ms.load(Ordering::Relaxed))
    }

    /// The observations per bucket, with each bucket's upper bound in milliseconds (the
    /// last `+Inf`).
    fn buckets(&self) -> Vec<(f64, u64)> {
        LATENCY_BUCKETS_MS
            .iter()
            .copied()
            .chain(once(f64::INFINITY))
            .zip(&self.inner.buckets)
            .map(|(bound, n)| (bound, n.load(Ordering::Relaxed)))
            .collect()
    }
}

impl fmt::Debug for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Latency")
            .field("buckets", &self.buckets())
            .field("sum_ms", &self.sum_ms())
            .finish()
    }
}

impl TypedMetric for Latency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Latency {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), fmt::Error> {
        let buckets = self.buckets();
        let count = buckets.iter().map(|(_, n)| n).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum_ms(), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::{
        encoding::text::encode, metrics::histogram::Histogram, registry::Registry,
    };

    use super::*;

    /// The text of one histogram named `h` in a registry of its own.
    fn text(register: impl FnOnce(&mut Registry)) -> String {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn writes_what_prometheus_clients_histogram_writes_for_the_same_observations() {
        let ours = Latency::default();
        let theirs = Histogram::new(LATENCY_BUCKETS_MS);
        // On a bound, between bounds, below the first, above the last, zero.
        for ms in [0, 1, 2, 3, 10, 11, 999, 1_000, 10_000, 10_001, 3_600_000] {
            ours.observe(Duration::from_millis(ms));
            theirs.observe(ms as f64);
        }
        let (ours, theirs) = (
            text(|r| r.register("h", "latency", ours.clone())),
            text(|r| r.register("h", "latency", theirs.clone())),
        );
        assert_eq!(ours, theirs);
        assert!(ours.contains("h_count 11\n"), "{ours}");
        assert!(ours.contains("h_bucket{le=\"1.0\"} 2\n"), "{ours}");
        assert!(ours.contains("h_bucket{le=\"+Inf\"} 11\n"), "{ours}");
    }

    #[test]
    fn clones_share_their_counts_and_sub_millisecond_times_keep_their_fraction() {
        let h = Latency::default();
        h.clone().observe(Duration::from_micros(250));
        h.observe(Duration::from_micros(1_500));
        let out = text(|r| r.register("h", "latency", h.clone()));
        assert!(out.contains("h_sum 1.75\n"), "{out}");
        assert!(out.contains("h_bucket{le=\"1.0\"} 1\n"), "{out}");
        assert!(out.contains("h_bucket{le=\"2.0\"} 2\n"), "{out}");
    }
}
