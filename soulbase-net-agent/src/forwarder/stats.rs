//! [`ForwarderStats`]: what the forwarder counted (queries received, dropped, answered, timed
//! out, failed; stray upstream packets; queries in flight and their peak) and the latency of
//! its answers as a [`LatencyHistogram`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The upper bounds of the latency buckets, ascending. From a cached answer on loopback
/// (well under a millisecond) to a slow upstream near the default 2 s timeout.
const BOUNDS: [Duration; 13] = [
    Duration::from_micros(250),
    Duration::from_micros(500),
    Duration::from_millis(1),
    Duration::from_micros(2_500),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_millis(2_500),
];

/// A snapshot of the forwarder's counters, from
/// [`Forwarder::stats`](super::Forwarder::stats).
///
/// Every query received ends as exactly one of `dropped`, `forwarded`, `timed_out` or
/// `failed`, or is still `inflight`.
///
/// # Examples
/// ```
/// use soulbase_net_agent::forwarder::ForwarderStats;
///
/// let stats = ForwarderStats::default();
/// assert_eq!(stats.received, 0);
/// assert_eq!(stats.latency.quantile(0.99), None);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForwarderStats {
    /// Datagrams read on the listening socket.
    pub received: u64,
    /// Datagrams that were not a query, never forwarded: shorter than a DNS header (12
    /// bytes, so no id to keep) or with the response bit set.
    pub dropped: u64,
    /// Queries answered: the upstream's answer, with the query's id, sent to the client.
    pub forwarded: u64,
    /// Queries the upstream did not answer within the timeout; their clients got nothing.
    pub timed_out: u64,
    /// Queries that failed otherwise: the upstream unreachable (an ICMP error on its
    /// socket), or the answer could not be sent to the client.
    pub failed: u64,
    /// Packets from the upstream that were not the awaited answer (another id, too short, not
    /// a response), ignored while the query kept waiting.
    pub mismatched: u64,
    /// Queries forwarded and not yet ended, now. Never above `max_inflight`.
    pub inflight: u64,
    /// The most queries in flight at once since the start.
    pub peak_inflight: u64,
    /// The time from reading a query to sending its answer, for the `forwarded` ones.
    pub latency: LatencyHistogram,
}

/// How long answered queries took, in fixed buckets.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use soulbase_net_agent::forwarder::ForwarderStats;
///
/// let latency = ForwarderStats::default().latency;
/// assert_eq!(latency.count, 0);
/// assert_eq!(latency.counts.len(), latency.bounds.len() + 1);
/// assert_eq!(latency.bounds[0], Duration::from_micros(250));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LatencyHistogram {
    /// The buckets' upper bounds, ascending: 250 µs, 500 µs, 1, 2.5, 5, 10, 25, 50, 100,
    /// 250, 500 ms, 1 s, 2.5 s.
    pub bounds: Vec<Duration>,
    /// Answers per bucket: `counts[i]` took at most `bounds[i]` (and more than
    /// `bounds[i - 1]`); the last, `counts[bounds.len()]`, more than the last bound.
    pub counts: Vec<u64>,
    /// Answers measured.
    pub count: u64,
    /// Their total time.
    pub sum: Duration,
    /// The longest.
    pub max: Duration,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            bounds: BOUNDS.to_vec(),
            counts: vec![0; BOUNDS.len() + 1],
            count: 0,
            sum: Duration::ZERO,
            max: Duration::ZERO,
        }
    }
}

impl LatencyHistogram {
    /// An upper estimate of the `q` quantile (`0.5` the median, `0.99` the p99): the bound of
    /// the bucket holding it, or [`max`](Self::max) when it is in the last bucket or `max`
    /// is smaller. `None` when nothing was measured.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.count == 0 {
            return None;
        }
        // The rank of the quantile among `count` answers, 1-based, at least 1.
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let bound = self.bounds.get(i).copied().unwrap_or(self.max);
                return Some(bound.min(self.max));
            }
        }
        Some(self.max)
    }
}

impl ForwarderStats {
    /// Appends the counters to `out` in the Prometheus text format, as the agent's
    /// `/metrics` shows them: `agent_dns_forwarder_{received,dropped,forwarded,timed_out,
    /// failed,mismatched}_total` (counters), `agent_dns_forwarder_inflight` and
    /// `agent_dns_forwarder_inflight_peak` (gauges), the latency as the histogram
    /// `agent_dns_forwarder_latency_seconds` (cumulative buckets, `_sum`, `_count`) and its
    /// `agent_dns_forwarder_latency_seconds_max`.
    pub(crate) fn write_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        for (name, help, v) in [
            ("received", "Datagrams read.", self.received),
            (
                "dropped",
                "Datagrams that were not a query, never forwarded.",
                self.dropped,
            ),
            ("forwarded", "Queries answered.", self.forwarded),
            (
                "timed_out",
                "Queries the upstream did not answer in time.",
                self.timed_out,
            ),
            ("failed", "Queries that failed otherwise.", self.failed),
            (
                "mismatched",
                "Upstream packets that were not the awaited answer.",
                self.mismatched,
            ),
        ] {
            let name = format!("agent_dns_forwarder_{name}_total");
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP agent_dns_forwarder_inflight Queries out at the upstream.\n\
             # TYPE agent_dns_forwarder_inflight gauge\nagent_dns_forwarder_inflight {}\n\
             # HELP agent_dns_forwarder_inflight_peak The most queries out at once.\n\
             # TYPE agent_dns_forwarder_inflight_peak gauge\nagent_dns_forwarder_inflight_peak {}",
            self.inflight, self.peak_inflight
        );
        let h = &self.latency;
        let name = "agent_dns_forwarder_latency_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} From a query read to its answer sent.\n# TYPE {name} histogram"
        );
        let mut seen = 0;
        for (i, n) in h.counts.iter().enumerate() {
            seen += n;
            let le = h
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| b.as_secs_f64().to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {seen}");
        }
        let _ = writeln!(
            out,
            "{name}_sum {}\n{name}_count {}\n# TYPE {name}_max gauge\n{name}_max {}",
            h.sum.as_secs_f64(),
            h.count,
            h.max.as_secs_f64()
        );
    }
}

/// The live counters behind [`ForwarderStats`], shared by the loop and its queries.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) received: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) forwarded: AtomicU64,
    pub(super) timed_out: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) mismatched: AtomicU64,
    inflight: AtomicU64,
    peak_inflight: AtomicU64,
    buckets: [AtomicU64; BOUNDS.len() + 1],
    count: AtomicU64,
    sum_micros: AtomicU64,
    max_micros: AtomicU64,
}

impl Counters {
    /// Adds one to `counter`.
    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// One more query in flight, until the guard is dropped.
    pub(super) fn enter(self: &Arc<Self>) -> InFlight {
        let now = self.inflight.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak_inflight.fetch_max(now, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }

    /// Counts an answered query that took `took`.
    pub(super) fn answered(&self, took: Duration) {
        let bucket = BOUNDS
            .iter()
            .position(|b| took <= *b)
            .unwrap_or(BOUNDS.len());
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
        self.max_micros.fetch_max(micros, Ordering::Relaxed);
        Self::bump(&self.forwarded);
    }

    /// A snapshot. Each value is read on its own, so a snapshot taken while queries run may
    /// be a moment apart between fields.
    pub(super) fn snapshot(&self) -> ForwarderStats {
        let get = |c: &AtomicU64| c.load(Ordering::Acquire);
        ForwarderStats {
            received: get(&self.received),
            dropped: get(&self.dropped),
            forwarded: get(&self.forwarded),
            timed_out: get(&self.timed_out),
            failed: get(&self.failed),
            mismatched: get(&self.mismatched),
            inflight: get(&self.inflight),
            peak_inflight: get(&self.peak_inflight),
            latency: LatencyHistogram {
                bounds: BOUNDS.to_vec(),
                counts: self.buckets.iter().map(get).collect(),
                count: get(&self.count),
                sum: Duration::from_micros(get(&self.sum_micros)),
                max: Duration::from_micros(get(&self.max_micros)),
            },
        }
    }
}

/// A query in flight: counted from [`Counters::enter`] until dropped.
#[derive(Debug)]
pub(super) struct InFlight(Arc<Counters>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_land_in_their_buckets_and_quantiles_are_upper_bounds() {
        let counters = Counters::default();
        for micros in [100, 250, 251, 900, 40_000, 3_000_000] {
            counters.answered(Duration::from_micros(micros));
        }
        let stats = counters.snapshot();
        let latency = &stats.latency;
        assert_eq!(stats.forwarded, 6);
        assert_eq!(latency.count, 6);
        assert_eq!(latency.counts[0], 2, "100 and 250 µs are within 250 µs");
        assert_eq!(latency.counts[1], 1, "251 µs");
        assert_eq!(latency.counts[2], 1, "900 µs");
        assert_eq!(latency.counts[7], 1, "40 ms is within 50 ms");
        assert_eq!(latency.counts[13], 1, "3 s is past the last bound");
        assert_eq!(latency.counts.iter().sum::<u64>(), 6);
        assert_eq!(latency.max, Duration::from_secs(3));
        assert_eq!(latency.sum, Duration::from_micros(3_041_501));
        assert_eq!(latency.quantile(0.0), Some(Duration::from_micros(250)));
        assert_eq!(latency.quantile(0.5), Some(Duration::from_micros(500)));
        assert_eq!(latency.quantile(0.8), Some(Duration::from_millis(50)));
        assert_eq!(latency.quantile(1.0), Some(Duration::from_secs(3)));
    }

    #[test]
    fn metrics_are_prometheus_lines_with_cumulative_buckets() {
        let counters = Counters::default();
        Counters::bump(&counters.received);
        Counters::bump(&counters.received);
        counters.answered(Duration::from_micros(100));
        counters.answered(Duration::from_millis(3));
        let mut out = String::new();
        counters.snapshot().write_metrics(&mut out);
        for line in [
            "agent_dns_forwarder_received_total 2",
            "agent_dns_forwarder_forwarded_total 2",
            "agent_dns_forwarder_timed_out_total 0",
            "agent_dns_forwarder_inflight 0",
            "agent_dns_forwarder_latency_seconds_bucket{le=\"0.00025\"} 1",
            "agent_dns_forwarder_latency_seconds_bucket{le=\"0.0025\"} 1",
            "agent_dns_forwarder_latency_seconds_bucket{le=\"0.005\"} 2",
            "agent_dns_forwarder_latency_seconds_bucket{le=\"+Inf\"} 2",
            "agent_dns_forwarder_latency_seconds_count 2",
            "agent_dns_forwarder_latency_seconds_sum 0.0031",
            "agent_dns_forwarder_latency_seconds_max 0.003",
        ] {
            assert!(out.lines().any(|l| l == line), "no `{line}` in\n{out}");
        }
    }

    #[test]
    fn a_quantile_is_never_above_the_longest_answer() {
        let counters = Counters::default();
        counters.answered(Duration::from_micros(300));
        assert_eq!(
            counters.snapshot().latency.quantile(0.99),
            Some(Duration::from_micros(300))
        );
    }

    #[test]
    fn in_flight_counts_while_held_and_keeps_its_peak() {
        let counters = Arc::new(Counters::default());
        let a = counters.enter();
        let b = counters.enter();
        assert_eq!(counters.snapshot().inflight, 2);
        drop(a);
        let c = counters.enter();
        drop(b);
        drop(c);
        let stats = counters.snapshot();
        assert_eq!((stats.inflight, stats.peak_inflight), (0, 2));
    }
}
