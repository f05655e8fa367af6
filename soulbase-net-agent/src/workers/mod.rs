//! The probes an agent runs (seed 002's `workers`): HTTP through the soulbase-net client,
//! TCP connect, DNS through hickory, ping (ICMP echo) and trace (TTL-limited ICMP echo) over
//! raw ICMP sockets (IPv4 and IPv6), which need root or `CAP_NET_RAW`.
//!
//! A probe never fails as a call: whatever happened to its target is its result — a
//! [`ProbeResult`] with observations (each with its unit where it has one), and
//! [`ReportStatus::Error`] with the reason when the target did not answer as expected.

mod dns;
mod http;
mod icmp;
mod ping;
mod tcp;
mod trace;

use std::net::SocketAddr;
use std::time::Duration;

use soulbase_net_core::NetError;
use soulbase_net_policy::{DnsPolicy, NetPolicy};
use soulbase_net_runtime::{Client, DnsResolver};

use crate::protocol::{Observation, ReportStatus, TaskSpec};

/// What a probe found.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeResult {
    /// Whether the target answered as expected.
    pub status: ReportStatus,
    /// What was observed.
    pub observations: Vec<Observation>,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

impl ProbeResult {
    fn ok(observations: Vec<Observation>) -> Self {
        Self {
            status: ReportStatus::Ok,
            observations,
            error: None,
        }
    }

    fn error(observations: Vec<Observation>, error: impl Into<String>) -> Self {
        Self {
            status: ReportStatus::Error,
            observations,
            error: Some(error.into()),
        }
    }
}

/// Milliseconds, as an observation's value (to the microsecond).
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

/// The probes, with what they share: the HTTP client, the address resolver (TCP probes'
/// names), the DNS probe's resolver.
#[derive(Clone, Debug)]
pub struct Probes {
    http: Client,
    addresses: DnsResolver,
    dns: dns::DnsProbe,
}

impl Probes {
    /// Probes under `policy` (HTTP), with names looked up on `dns_servers` (the system's
    /// configuration when empty).
    ///
    /// # Errors
    /// `InvalidRequest` when the policy does not validate; `Dns` when the system's DNS
    /// configuration is needed and does not read.
    pub fn new(policy: &NetPolicy, dns_servers: &[SocketAddr]) -> Result<Self, NetError> {
        let mut policy = policy.clone();
        if !dns_servers.is_empty() {
            policy.dns.nameservers = dns_servers.to_vec();
        }
        let http = Client::builder().policy(policy.clone()).build()?;
        let mut dns_policy: DnsPolicy = policy.dns.clone();
        dns_policy.prefetch.clear();
        dns_policy.persist_file = None;
        let addresses = DnsResolver::new(&dns_policy)?;
        let dns = dns::DnsProbe::new(dns_servers)?;
        Ok(Self {
            http,
            addresses,
            dns,
        })
    }

    /// Runs the probe `spec` describes.
    pub async fn run(&self, spec: &TaskSpec) -> ProbeResult {
        match spec {
            TaskSpec::Http {
                url,
                method,
                timeout_ms,
                connect_timeout_ms,
                expect_status,
            } => {
                http::probe(
                    &self.http,
                    http::HttpTask {
                        url,
                        method: method.as_deref(),
                        timeout: timeout_ms.map(Duration::from_millis),
                        connect_timeout: connect_timeout_ms.map(Duration::from_millis),
                        expect_status: *expect_status,
                    },
                )
                .await
            }
            TaskSpec::Tcp {
                host,
                port,
                timeout_ms,
            } => {
                let timeout = Duration::from_millis(timeout_ms.unwrap_or(5000));
                tcp::probe(&self.addresses, host, *port, timeout).await
            }
            TaskSpec::Dns {
                name,
                record_types,
                timeout_ms,
            } => {
                let timeout = Duration::from_millis(timeout_ms.unwrap_or(5000));
                self.dns.probe(name, record_types, timeout).await
            }
            TaskSpec::Ping {
                host,
                count,
                timeout_ms,
                interval_ms,
            } => {
                let task = ping::PingTask {
                    count: count.unwrap_or(3),
                    interval: Duration::from_millis(interval_ms.unwrap_or(1000)),
                    timeout: Duration::from_millis(timeout_ms.unwrap_or(1000)),
                };
                ping::probe(&self.addresses, host, task).await
            }
            TaskSpec::Trace {
                host,
                max_hops,
                timeout_ms,
            } => {
                let task = trace::TraceTask {
                    max_hops: max_hops.unwrap_or(30),
                    timeout: Duration::from_millis(timeout_ms.unwrap_or(1000)),
                };
                trace::probe(&self.addresses, host, task).await
            }
        }
    }
}
