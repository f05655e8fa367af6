//! The server's Prometheus metrics (the seed's 监控), in the text exposition format: counters
//! kept as the server works, gauges read at scrape time.

use std::{
    fmt::Write as _,
    sync::atomic::{AtomicU64, Ordering},
};

/// Upper bounds (ms) of the fire-lateness histogram's buckets.
const LATENESS_BUCKETS_MS: [u64; 11] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000];

/// Counters and the lateness histogram.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) scheduled: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) delivered: AtomicU64,
    pub(crate) acked: AtomicU64,
    pub(crate) redelivered: AtomicU64,
    pub(crate) acks_ignored: AtomicU64,
    lateness: [AtomicU64; LATENESS_BUCKETS_MS.len() + 1],
    lateness_sum_ms: AtomicU64,
    lateness_count: AtomicU64,
}

/// What is read when scraped.
pub(crate) struct Gauges {
    pub(crate) pending: Option<u64>,
    pub(crate) in_flight: usize,
    pub(crate) due_undelivered: u64,
    pub(crate) ready: u64,
    pub(crate) connections: Vec<(String, usize)>,
}

impl Metrics {
    /// Counts one.
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A first delivery `late_ms` after its `fire_at` (0 when on time or early).
    pub(crate) fn observe_lateness(&self, late_ms: u64) {
        let bucket = LATENESS_BUCKETS_MS
            .iter()
            .position(|b| late_ms <= *b)
            .unwrap_or(LATENESS_BUCKETS_MS.len());
        self.lateness[bucket].fetch_add(1, Ordering::Relaxed);
        self.lateness_sum_ms.fetch_add(late_ms, Ordering::Relaxed);
        self.lateness_count.fetch_add(1, Ordering::Relaxed);
    }

    /// The exposition, with `gauges`.
    pub(crate) fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::with_capacity(2048);
        let counters: [(&str, &str, &AtomicU64); 7] = [
            ("delay_scheduled_total", "Tasks stored (acknowledged to their client).", &self.scheduled),
            ("delay_duplicates_total", "Schedules of an id already stored (kept as it was).", &self.duplicates),
            ("delay_refused_total", "Lines answered with an error.", &self.refused),
            ("delay_delivered_total", "Deliveries written to a connection.", &self.delivered),
            ("delay_acked_total", "Deliveries acknowledged by a client.", &self.acked),
            ("delay_redelivered_total", "Deliveries due again: no connection, a full queue, a closed connection or no ack in time.", &self.redelivered),
            ("delay_acks_ignored_total", "Acks of no delivery waiting on their connection (another connection's, timed out, repeated): nothing deleted.", &self.acks_ignored),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        if let Some(pending) = gauges.pending {
            let _ = writeln!(out, "# HELP delay_pending Tasks in the store (claimed or not).\n# TYPE delay_pending gauge\ndelay_pending {pending}");
        }
        let _ = writeln!(out, "# HELP delay_in_flight Deliveries waiting for their ack.\n# TYPE delay_in_flight gauge\ndelay_in_flight {}", gauges.in_flight);
        let _ = writeln!(out, "# HELP delay_due_undelivered Tasks in the store, every server's, whose fire_at has passed and that no client has acknowledged: delivered and waiting for their ack, waiting for a retry, or waiting for a connection of their route.\n# TYPE delay_due_undelivered gauge\ndelay_due_undelivered {}", gauges.due_undelivered);
        let _ = writeln!(out, "# HELP delay_ready Tasks claimed ahead, waiting in memory to fire.\n# TYPE delay_ready gauge\ndelay_ready {}", gauges.ready);
        let _ = writeln!(out, "# HELP delay_route_connections Connections registered per route.\n# TYPE delay_route_connections gauge");
        for (route, n) in &gauges.connections {
            let route = route.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(out, "delay_route_connections{{route=\"{route}\"}} {n}");
        }
        let name = "delay_fire_lateness_ms";
        let _ = writeln!(out, "# HELP {name} How long after fire_at a task's first delivery was written.\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, bound) in LATENESS_BUCKETS_MS.iter().enumerate() {
            cumulative += self.lateness[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.lateness[LATENESS_BUCKETS_MS.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.lateness_sum_ms.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "{name}_count {}",
            self.lateness_count.load(Ordering::Relaxed)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_counters_gauges_and_a_cumulative_histogram() {
        let m = Metrics::default();
        Metrics::add(&m.scheduled);
        m.observe_lateness(0);
        m.observe_lateness(7);
        m.observe_lateness(9000);
        let text = m.render(&Gauges {
            pending: Some(3),
            in_flight: 1,
            due_undelivered: 4,
            ready: 2,
            connections: vec![("a\"b".into(), 2)],
        });
        assert!(text.contains("delay_scheduled_total 1\n"), "{text}");
        assert!(text.contains("delay_pending 3\n"));
        assert!(text.contains("delay_due_undelivered 4\n"), "{text}");
        assert!(text.contains("delay_acks_ignored_total 0\n"), "{text}");
        assert!(text.contains("delay_route_connections{route=\"a\\\"b\"} 2\n"));
        assert!(text.contains("delay_fire_lateness_ms_bucket{le=\"1\"} 1\n"));
        assert!(text.contains("delay_fire_lateness_ms_bucket{le=\"10\"} 2\n"));
        assert!(text.contains("delay_fire_lateness_ms_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("delay_fire_lateness_ms_sum 9007\n"));
    }
}
