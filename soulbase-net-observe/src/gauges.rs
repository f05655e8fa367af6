//! The clients' limiter, retry-budget, connection-pool and SLO-controller gauges, read from their
//! [`GaugeSource`]s at scrape time and written with the same bounded host and tenant labels
//! as the other metrics.
//!
//! Why at scrape time: the values are the client's own state (and a budget's window slides
//! with time), so a read when Prometheus asks is exact, and the request path pays nothing.

use std::{
    collections::BTreeMap,
    sync::{Arc, Weak},
};

use parking_lot::Mutex;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{gauge::ConstGauge, MetricType},
};
use soulbase_net_core::{GaugeReading, GaugeSource};

use crate::labels::{HostLabels, Label, LabelCap, TenantHostLabels, TenantLabels};

/// The sources attached by clients, and the label caps shared with the other metrics.
#[derive(Debug)]
pub(crate) struct GaugeState {
    sources: Mutex<Vec<Weak<dyn GaugeSource>>>,
    hosts: Arc<LabelCap>,
    tenants: Arc<LabelCap>,
    no_tenant: Label,
}

/// One scrape's readings, summed by label: hosts past the cap share `"_other"`, and several
/// clients reporting the same host add up.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Totals {
    pub(crate) in_flight: BTreeMap<Label, u64>,
    pub(crate) tenant_in_flight: BTreeMap<Label, u64>,
    pub(crate) queued: BTreeMap<Label, u64>,
    pub(crate) window: BTreeMap<Label, u64>,
    pub(crate) global_window: Option<u64>,
    pub(crate) tokens: BTreeMap<(Label, Label), u64>,
    pub(crate) pool_open: BTreeMap<Label, u64>,
    pub(crate) pool_idle: BTreeMap<Label, u64>,
    pub(crate) outbox_pending: Option<u64>,
    pub(crate) outbox_oldest_age: Option<u64>,
    /// The SLO controller's factors per host; several clients reporting a host keep the
    /// strongest (largest backoff, smallest rate).
    pub(crate) slo_backoff: BTreeMap<Label, f64>,
    pub(crate) slo_rate: BTreeMap<Label, f64>,
}

// === impl GaugeState ===

impl GaugeState {
    pub(crate) fn new(hosts: Arc<LabelCap>, tenants: Arc<LabelCap>) -> Self {
        GaugeState {
            sources: Mutex::new(Vec::new()),
            hosts,
            tenants,
            no_tenant: Label::new(""),
        }
    }

    /// Keeps a weak handle on `source`; handles of dropped clients are forgotten.
    pub(crate) fn attach(&self, source: &Arc<dyn GaugeSource>) {
        let mut sources = self.sources.lock();
        sources.retain(|s| s.strong_count() > 0);
        sources.push(Arc::downgrade(source));
    }

    /// Reads every live source now.
    pub(crate) fn read(&self) -> Totals {
        // Upgrade under the lock, read outside it: a source takes its client's locks.
        let live: Vec<Arc<dyn GaugeSource>> = {
            let mut sources = self.sources.lock();
            sources.retain(|s| s.strong_count() > 0);
            sources.iter().filter_map(Weak::upgrade).collect()
        };
        let mut totals = Totals::default();
        for source in live {
            source.read_gauges(&mut |reading| self.add(&mut totals, reading));
        }
        totals
    }

    fn add(&self, totals: &mut Totals, reading: GaugeReading<'_>) {
        match reading {
            GaugeReading::LimiterInFlight { host, value } => {
                *totals.in_flight.entry(self.hosts.admit(host)).or_default() += value;
            }
            GaugeReading::TenantInFlight { tenant, value } => {
                *totals
                    .tenant_in_flight
                    .entry(self.tenants.admit(tenant))
                    .or_default() += value;
            }
            GaugeReading::LimiterQueued { host, value } => {
                *totals.queued.entry(self.hosts.admit(host)).or_default() += value;
            }
            GaugeReading::LimiterWindow {
                host: Some(host),
                value,
            } => {
                *totals.window.entry(self.hosts.admit(host)).or_default() += value;
            }
            GaugeReading::LimiterWindow { host: None, value } => {
                *totals.global_window.get_or_insert(0) += value;
            }
            GaugeReading::RetryBudgetTokens {
                host,
                tenant,
                value,
            } => {
                let tenant =
                    tenant.map_or_else(|| self.no_tenant.clone(), |t| self.tenants.admit(t));
                *totals
                    .tokens
                    .entry((tenant, self.hosts.admit(host)))
                    .or_default() += value;
            }
            GaugeReading::PoolOpen { host, value } => {
                *totals.pool_open.entry(self.hosts.admit(host)).or_default() += value;
            }
            GaugeReading::PoolIdle { host, value } => {
                *totals.pool_idle.entry(self.hosts.admit(host)).or_default() += value;
            }
            GaugeReading::SloFactors {
                host,
                backoff,
                rate,
            } => {
                let host = self.hosts.admit(host);
                let b = totals.slo_backoff.entry(host.clone()).or_insert(backoff);
                *b = b.max(backoff);
                let r = totals.slo_rate.entry(host).or_insert(rate);
                *r = r.min(rate);
            }
            GaugeReading::OutboxPending { value } => {
                *totals.outbox_pending.get_or_insert(0) += value;
            }
            GaugeReading::OutboxOldestPendingAge { value } => {
                let oldest = totals.outbox_oldest_age.get_or_insert(0);
                *oldest = (*oldest).max(value);
            }
            _ => {}
        }
    }
}

/// Writes [`GaugeState::read`] as gauges.
#[derive(Debug)]
pub(crate) struct GaugeCollector(pub(crate) Arc<GaugeState>);

impl Collector for GaugeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let t = self.0.read();
        let by_host = |map: BTreeMap<Label, u64>| {
            map.into_iter()
                .map(|(host, v)| (HostLabels { host }, v))
                .collect::<Vec<_>>()
        };
        family(
            &mut encoder,
            "net_limiter_in_flight",
            "Calls holding a host's concurrency slot",
            by_host(t.in_flight),
        )?;
        let by_tenant = t
            .tenant_in_flight
            .into_iter()
            .map(|(tenant, v)| (TenantLabels { tenant }, v))
            .collect();
        family(
            &mut encoder,
            "net_limiter_tenant_in_flight",
            "Calls holding a tenant's concurrency slot",
            by_tenant,
        )?;
        family(
            &mut encoder,
            "net_limiter_queued",
            "Calls waiting for a place under a host's limits",
            by_host(t.queued),
        )?;
        family(
            &mut encoder,
            "net_limiter_window",
            "The per-host AIMD window: calls allowed in flight",
            by_host(t.window),
        )?;
        for (value, name, help) in [
            (
                t.outbox_pending,
                "net_outbox_pending",
                "Items waiting in the outbox",
            ),
            (
                t.outbox_oldest_age,
                "net_outbox_oldest_pending_age_seconds",
                "How long the oldest due item has waited past its time",
            ),
        ] {
            if let Some(value) = value {
                let gauge = ConstGauge::new(gauge_value(value));
                let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
                gauge.encode(metric)?;
            }
        }
        if let Some(window) = t.global_window {
            let gauge = ConstGauge::new(gauge_value(window));
            let metric = encoder.encode_descriptor(
                "net_limiter_global_window",
                "The client-wide AIMD window: calls allowed in flight",
                None,
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        let tokens = t
            .tokens
            .into_iter()
            .map(|((tenant, host), v)| (TenantHostLabels { tenant, host }, v))
            .collect();
        family(
            &mut encoder,
            "net_retry_budget_tokens",
            "Retries the retry budget allows now",
            tokens,
        )?;
        family(
            &mut encoder,
            "net_pool_open_connections",
            "Connections open to a host, in use or idle",
            by_host(t.pool_open),
        )?;
        family(
            &mut encoder,
            "net_pool_idle_connections",
            "Idle connections kept for a host",
            by_host(t.pool_idle),
        )?;
        for (name, help, map) in [
            (
                "net_slo_backoff_factor",
                "What the SLO controller multiplies a host's backoff by (1: the policy's own)",
                t.slo_backoff,
            ),
            (
                "net_slo_rate_factor",
                "What the SLO controller multiplies a host's rate by (1: the policy's own)",
                t.slo_rate,
            ),
        ] {
            if map.is_empty() {
                continue;
            }
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (host, value) in map {
                ConstGauge::new(value).encode(metric.encode_family(&HostLabels { host })?)?;
            }
        }
        Ok(())
    }
}

fn family<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: Vec<(L, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in &series {
        ConstGauge::new(gauge_value(*value)).encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<GaugeReading<'static>>);

    impl GaugeSource for Fixed {
        fn read_gauges(&self, visit: &mut dyn FnMut(GaugeReading<'_>)) {
            self.0.iter().for_each(|r| visit(*r));
        }
    }

    #[test]
    fn readings_past_the_cap_and_across_clients_add_up() {
        let state = GaugeState::new(Arc::new(LabelCap::new(1)), Arc::new(LabelCap::new(1)));
        let a: Arc<dyn GaugeSource> = Arc::new(Fixed(vec![
            GaugeReading::LimiterInFlight {
                host: "a",
                value: 2,
            },
            GaugeReading::LimiterInFlight {
                host: "b",
                value: 3,
            },
            GaugeReading::LimiterInFlight {
                host: "c",
                value: 4,
            },
            GaugeReading::LimiterWindow {
                host: None,
                value: 8,
            },
            GaugeReading::TenantInFlight {
                tenant: "t1",
                value: 2,
            },
            GaugeReading::TenantInFlight {
                tenant: "t2",
                value: 1,
            },
            GaugeReading::RetryBudgetTokens {
                host: "a",
                tenant: Some("t1"),
                value: 5,
            },
            GaugeReading::RetryBudgetTokens {
                host: "a",
                tenant: Some("t2"),
                value: 6,
            },
            GaugeReading::SloFactors {
                host: "a",
                backoff: 2.0,
                rate: 0.5,
            },
        ]));
        let b: Arc<dyn GaugeSource> = Arc::new(Fixed(vec![
            GaugeReading::LimiterInFlight {
                host: "a",
                value: 1,
            },
            GaugeReading::PoolOpen {
                host: "a",
                value: 4,
            },
            GaugeReading::PoolOpen {
                host: "a",
                value: 2,
            },
            GaugeReading::PoolIdle {
                host: "z",
                value: 1,
            },
            GaugeReading::LimiterWindow {
                host: None,
                value: 2,
            },
            GaugeReading::SloFactors {
                host: "a",
                backoff: 4.0,
                rate: 0.75,
            },
        ]));
        state.attach(&a);
        state.attach(&b);
        let t = state.read();
        let other = Label::new(crate::labels::OTHER);
        assert_eq!(t.in_flight.get(&Label::new("a")), Some(&3));
        // Two origins of one host (other ports) add up; a host past the cap is "_other".
        assert_eq!(t.pool_open.get(&Label::new("a")), Some(&6));
        assert_eq!(t.pool_idle.get(&other), Some(&1));
        assert_eq!(t.in_flight.get(&other), Some(&7), "b and c past the cap");
        assert_eq!(t.global_window, Some(10));
        assert_eq!(t.tenant_in_flight.get(&Label::new("t1")), Some(&2));
        assert_eq!(t.tenant_in_flight.get(&other), Some(&1), "t2 past the cap");
        assert_eq!(t.tokens.get(&(Label::new("t1"), Label::new("a"))), Some(&5));
        assert_eq!(t.tokens.get(&(other, Label::new("a"))), Some(&6));
        // Two clients slowing one host down: the strongest factors are shown.
        assert_eq!(t.slo_backoff.get(&Label::new("a")), Some(&4.0));
        assert_eq!(t.slo_rate.get(&Label::new("a")), Some(&0.5));
        drop(b);
        assert_eq!(state.read().in_flight.get(&Label::new("a")), Some(&2));
        drop(a);
        assert_eq!(
            state.read(),
            Totals::default(),
            "dropped clients report nothing"
        );
        assert!(state.sources.lock().is_empty());
    }

    #[test]
    fn the_slo_factors_are_written_as_float_gauges_per_host() {
        let state = Arc::new(GaugeState::new(
            Arc::new(LabelCap::new(10)),
            Arc::new(LabelCap::new(10)),
        ));
        let source: Arc<dyn GaugeSource> = Arc::new(Fixed(vec![GaugeReading::SloFactors {
            host: "api.example.com",
            backoff: 2.5,
            rate: 0.25,
        }]));
        state.attach(&source);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(GaugeCollector(state.clone())));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("net_slo_backoff_factor{host=\"api.example.com\"} 2.5"),
            "{text}"
        );
        assert!(
            text.contains("net_slo_rate_factor{host=\"api.example.com\"} 0.25"),
            "{text}"
        );
        drop(source);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            !text.contains("net_slo_"),
            "no family without a reading: {text}"
        );
    }
}
