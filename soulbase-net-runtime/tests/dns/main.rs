//! The DNS resolver against the testkit's MockDns on loopback: TTLs, singleflight,
//! serve-stale, persistence, TCP fallback, errors, static hosts, ordering and background work.
//! Every resolver is given MockDns as its only name server, so no test reaches the system
//! resolver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod background;
mod lookup;
mod order;
mod persist;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use soulbase_net_policy::DnsPolicy;
use soulbase_net_runtime::DnsResolver;
use soulbase_net_testkit::MockDns;

/// A policy whose only name server is `dns`, with background work off and no shuffling, so
/// tests see exactly the queries they cause.
fn policy(dns: &MockDns) -> DnsPolicy {
    let mut p = DnsPolicy::default();
    p.nameservers = vec![dns.addr()];
    p.timeout = Duration::from_secs(2);
    p.shuffle = false;
    p.refresh_interval = None;
    p.persist_interval = None;
    p
}

/// Builds a resolver, refusing any policy that would fall back to the system configuration.
fn resolver(p: &DnsPolicy) -> DnsResolver {
    assert!(
        !p.nameservers.is_empty() && p.nameservers.iter().all(|a| a.ip().is_loopback()),
        "tests must use a loopback name server"
    );
    DnsResolver::new(p).unwrap()
}

/// The A queries MockDns received for `name`: one per lookup (each lookup also asks AAAA).
fn a_queries(dns: &MockDns, name: &str) -> usize {
    let fq = format!("{name}.");
    dns.queries()
        .iter()
        .filter(|q| q.name == fq && q.qtype == "A")
        .count()
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

fn sorted(addrs: &[IpAddr]) -> Vec<IpAddr> {
    let mut v = addrs.to_vec();
    v.sort();
    v
}

/// A fresh directory under the system temp dir.
fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "soulbase-dns-{tag}-{}-{:x}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Polls `cond` every 20ms for up to `within`.
async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}
