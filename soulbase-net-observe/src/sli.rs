//! The SLIs of seed 001 §X (retry rate, timeout rate, error ratio, dedup drop rate, p50 / p99
//! latency) and the hedge rate (§IX), computed from the same events as the metrics.
//!
//! Rates are over the lifetime of the [`Metrics`](crate::Metrics) (the seed's
//! `retries_total / requests_total`), all with finished requests as the denominator;
//! percentiles are over a sliding sample of the most recent
//! request latencies, so they follow the current behaviour of the dependency.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::gauge::ConstGauge,
};
use soulbase_net_core::Outcome;

/// A snapshot of the service level indicators, from [`Metrics::slis`](crate::Metrics::slis).
///
/// With no finished request, every rate and percentile is `0.0`; check [`Slis::requests`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Slis {
    /// Requests finished (`RequestFinished` events).
    pub requests: u64,
    /// Retries scheduled per finished request (`retries_total / requests_total`).
    pub retry_rate: f64,
    /// Share of finished requests that ended in a timeout of any phase.
    pub timeout_rate: f64,
    /// Share of finished requests that ended in an error or a 5xx response.
    pub error_ratio: f64,
    /// Share of finished requests dropped as duplicates: answered from a dedup window
    /// instead of being sent. A drop is a [`NetEvent::Answered`] whose `by` is
    /// `"idempotency_key"` (`IdempotencyKey`'s window) or a name given to
    /// [`MetricsBuilder::dedup_by`](crate::MetricsBuilder::dedup_by); other answers, such as
    /// cache hits, are not drops. A dropped call still finishes, so it counts among the
    /// requests too: two identical calls, the second dropped, make `0.5`.
    ///
    /// [`NetEvent::Answered`]: soulbase_net_core::NetEvent::Answered
    pub dup_drop_rate: f64,
    /// Hedged copies started per finished request (`AttemptStarted` with `hedge`): the extra
    /// load hedging puts on the dependencies.
    pub hedge_rate: f64,
    /// Median total latency of the sampled requests, in milliseconds.
    pub p50_ms: f64,
    /// 99th percentile total latency of the sampled requests, in milliseconds.
    pub p99_ms: f64,
}

/// Counters and the latency sample behind [`Slis`]; shared with the registry as a collector.
#[derive(Debug)]
pub(crate) struct SliState {
    requests: AtomicU64,
    retries: AtomicU64,
    timeouts: AtomicU64,
    errors: AtomicU64,
    dedup_drops: AtomicU64,
    hedges: AtomicU64,
    window: usize,
    /// The last `window` total latencies (ms, as `f64` bits), a ring filled without a lock:
    /// `written` counts every sample, and sample `n` goes to slot `n % window`. A reader may
    /// see a slot a writer has claimed but not yet filled (its older value): an SLI is an
    /// estimate, and the hot path never waits.
    latencies_ms: Box<[AtomicU64]>,
    written: AtomicU64,
}

impl SliState {
    pub(crate) fn new(window: usize) -> Self {
        SliState {
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            dedup_drops: AtomicU64::new(0),
            hedges: AtomicU64::new(0),
            window,
            latencies_ms: (0..window).map(|_| AtomicU64::new(0)).collect(),
            written: AtomicU64::new(0),
        }
    }

    pub(crate) fn on_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn on_finished(&self, outcome: &Outcome, total_ms: f64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Error(kind) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                if kind.is_timeout() {
                    self.timeouts.fetch_add(1, Ordering::Relaxed);
                }
            }
            Outcome::Response(status) if status.is_server_error() => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Response(_) => {}
        }
        if self.window == 0 {
            return;
        }
        let n = self.written.fetch_add(1, Ordering::Relaxed);
        // `n % window` is below `window`, the ring's length, so the slot exists.
        if let Some(slot) = self.latencies_ms.get((n % self.window as u64) as usize) {
            slot.store(total_ms.to_bits(), Ordering::Relaxed);
        }
    }

    pub(crate) fn on_dedup_drop(&self) {
        self.dedup_drops.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn on_hedge(&self) {
        self.hedges.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Slis {
        let requests = self.requests.load(Ordering::Relaxed);
        let ratio = |n: &AtomicU64| {
            if requests == 0 {
                0.0
            } else {
                n.load(Ordering::Relaxed) as f64 / requests as f64
            }
        };
        let filled = usize::try_from(self.written.load(Ordering::Relaxed))
            .unwrap_or(usize::MAX)
            .min(self.window);
        let mut sorted: Vec<f64> = self.latencies_ms[..filled]
            .iter()
            .map(|slot| f64::from_bits(slot.load(Ordering::Relaxed)))
            .collect();
        sorted.sort_by(f64::total_cmp);
        Slis {
            requests,
            retry_rate: ratio(&self.retries),
            timeout_rate: ratio(&self.timeouts),
            error_ratio: ratio(&self.errors),
            dup_drop_rate: ratio(&self.dedup_drops),
            hedge_rate: ratio(&self.hedges),
            p50_ms: percentile(&sorted, 0.50),
            p99_ms: percentile(&sorted, 0.99),
        }
    }
}

/// The nearest-rank percentile of a sorted sample: the smallest value with at least `q` of the
/// sample at or below it; `0.0` for an empty sample.
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Writes the SLIs as gauges at scrape time, so they are never stale.
#[derive(Debug)]
pub(crate) struct SliCollector(pub(crate) std::sync::Arc<SliState>);

impl Collector for SliCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = self.0.snapshot();
        let gauges = [
            (
                "net_sli_retry_rate",
                "Retries scheduled per finished request.",
                s.retry_rate,
            ),
            (
                "net_sli_timeout_rate",
                "Share of finished requests that timed out.",
                s.timeout_rate,
            ),
            (
                "net_sli_error_ratio",
                "Share of finished requests ending in an error or 5xx.",
                s.error_ratio,
            ),
            (
                "net_sli_dup_drop_rate",
                "Share of finished requests answered from a dedup window.",
                s.dup_drop_rate,
            ),
            (
                "net_sli_hedge_rate",
                "Hedged copies started per finished request.",
                s.hedge_rate,
            ),
            (
                "net_sli_p50_latency_ms",
                "Median total latency of recent requests, in ms.",
                s.p50_ms,
            ),
            (
                "net_sli_p99_latency_ms",
                "99th percentile total latency of recent requests, in ms.",
                s.p99_ms,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let sample: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sample, 0.50), 50.0);
        assert_eq!(percentile(&sample, 0.99), 99.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn the_sample_keeps_only_the_most_recent_latencies() {
        let state = SliState::new(3);
        let ok = Outcome::Response(soulbase_net_core::http::StatusCode::OK);
        for ms in [1000.0, 1.0, 2.0, 3.0] {
            state.on_finished(&ok, ms);
        }
        let s = state.snapshot();
        assert_eq!(s.requests, 4);
        assert_eq!(s.p99_ms, 3.0);
        assert_eq!(s.p50_ms, 2.0);
        assert_eq!((s.dup_drop_rate, s.hedge_rate), (0.0, 0.0));
    }
}
