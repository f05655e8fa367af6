//! `net_circuit_open_ratio`: per host, the share of its circuit breakers that are open, kept
//! from the client's `BreakerTransition` events and written at scrape time.
//!
//! Why from events: the observer sees the breakers only through their transitions, so the
//! breakers it counts are those that changed state at least once (a breaker that never left
//! closed is invisible, and would only add a 0). With `cbreaker.key_by = "host"` a host has
//! one breaker per origin (per port), so the ratio is 0 or 1 for a host called on one port;
//! with `"host_tenant"` it is the share of the host's tenants whose breaker is open.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{gauge::ConstGauge, MetricType},
};
use soulbase_net_core::BreakerState;

use crate::labels::{HostLabels, Label, LabelCap};

/// What is known of one breaker: its host's label and whether it is open now.
#[derive(Debug)]
struct Known {
    host: Label,
    open: bool,
}

/// The last state of every breaker key seen changing state, at most `max` of them.
#[derive(Debug)]
pub(crate) struct BreakerShare {
    max: usize,
    keys: Mutex<HashMap<Box<str>, Known>>,
}

// === impl BreakerShare ===

impl BreakerShare {
    pub(crate) fn new(max: usize) -> Self {
        BreakerShare {
            max,
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// Records that the breaker `key` entered `to`; its host label comes from `hosts`.
    ///
    /// Once `max` keys are known, a new key takes the place of a closed one (which only
    /// counted in its host's denominator); when every known key is open, the new key is not
    /// kept, so an open circuit is never forgotten for a new one.
    pub(crate) fn on_transition(&self, key: &str, to: BreakerState, hosts: &LabelCap) {
        let open = to == BreakerState::Open;
        let mut keys = self.keys.lock();
        if let Some(known) = keys.get_mut(key) {
            known.open = open;
            return;
        }
        if keys.len() >= self.max {
            let Some(closed) = keys.iter().find(|(_, k)| !k.open).map(|(k, _)| k.clone()) else {
                return;
            };
            keys.remove(&closed);
        }
        let host = hosts.admit(key_host(key));
        keys.insert(Box::from(key), Known { host, open });
    }

    /// Per host label: (open breakers, known breakers).
    pub(crate) fn counts(&self) -> BTreeMap<Label, (u64, u64)> {
        let mut counts = BTreeMap::<Label, (u64, u64)>::new();
        for known in self.keys.lock().values() {
            let (open, all) = counts.entry(known.host.clone()).or_default();
            *open += u64::from(known.open);
            *all += 1;
        }
        counts
    }
}

/// The host of a breaker key as the other families' `host` label names it: the key is an
/// origin (`https://h`, `http://h:8081`, `https://[::1]:8443`), then `/tenant` when keyed by
/// tenant; the scheme, the port, the brackets of an IPv6 literal and the tenant are dropped.
pub(crate) fn key_host(key: &str) -> &str {
    let rest = key.split_once("://").map_or(key, |(_, rest)| rest);
    let authority = rest
        .split_once('/')
        .map_or(rest, |(authority, _)| authority);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split_once(']').map_or(v6, |(host, _)| host);
    }
    authority
        .split_once(':')
        .map_or(authority, |(host, _)| host)
}

/// Writes [`BreakerShare::counts`] as the gauge `net_circuit_open_ratio{host}`.
#[derive(Debug)]
pub(crate) struct BreakerCollector(pub(crate) std::sync::Arc<BreakerShare>);

impl Collector for BreakerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let counts = self.0.counts();
        if counts.is_empty() {
            return Ok(());
        }
        let mut metric = encoder.encode_descriptor(
            "net_circuit_open_ratio",
            "Share of a host's circuit breakers (those seen changing state) that are open",
            None,
            MetricType::Gauge,
        )?;
        for (host, (open, all)) in counts {
            // `all` is at least 1: a host is counted only with a key.
            let ratio = open as f64 / all.max(1) as f64;
            ConstGauge::new(ratio).encode(metric.encode_family(&HostLabels { host })?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_a_key_is_the_request_host() {
        assert_eq!(key_host("https://a.example"), "a.example");
        assert_eq!(key_host("http://a.example:8081"), "a.example");
        assert_eq!(key_host("https://a.example/tenant/x"), "a.example");
        assert_eq!(key_host("https://[::1]:8443/t"), "::1");
        assert_eq!(key_host("a.example"), "a.example");
    }

    #[test]
    fn a_full_map_gives_up_a_closed_key_never_an_open_one() {
        let hosts = LabelCap::new(10);
        let share = BreakerShare::new(2);
        share.on_transition("https://a/t1", BreakerState::Open, &hosts);
        share.on_transition("https://a/t2", BreakerState::Open, &hosts);
        share.on_transition("https://a/t3", BreakerState::Open, &hosts);
        assert_eq!(share.counts().get(&Label::new("a")), Some(&(2, 2)));
        share.on_transition("https://a/t1", BreakerState::HalfOpen, &hosts);
        share.on_transition("https://b", BreakerState::Open, &hosts);
        assert_eq!(share.counts().get(&Label::new("a")), Some(&(1, 1)));
        assert_eq!(share.counts().get(&Label::new("b")), Some(&(1, 1)));
    }
}
