//! The upstream of the cache: one A + AAAA lookup through hickory-resolver, bounded by the
//! policy's DNS timeout.
//!
//! Hickory's own cache is turned off (size 0) so that ours, with its clamps, singleflight,
//! serve-stale and persistence, is the only one; hickory's hosts file is skipped when name
//! servers are given, so that tests and `--resolve`-style setups see only what they configured.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
    ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use soulbase_net_core::{ErrorKind, NetError, Phase};
use soulbase_net_policy::DnsPolicy;

use super::cache::Answer;

/// Why a lookup failed; cheap to clone, since every singleflight waiter gets a copy.
#[derive(Clone, Debug)]
pub(crate) enum LookupError {
    /// The lookup did not finish within the DNS timeout.
    Timeout,
    /// The name server answered with an error, or with no addresses.
    Failed(Arc<hickory_resolver::net::NetError>),
    /// The answer held no A or AAAA record.
    NoAddresses,
}

impl LookupError {
    /// The error a caller sees, naming `host`.
    pub(crate) fn to_net_error(&self, host: &str) -> NetError {
        match self {
            LookupError::Timeout => NetError::timeout(Phase::Dns)
                .with_message(format!("no answer for {host} within the dns timeout")),
            LookupError::Failed(e) => {
                let what = if e.is_nx_domain() {
                    "no such host"
                } else if e.is_no_records_found() {
                    "no addresses for host"
                } else {
                    "lookup failed for host"
                };
                NetError::new(ErrorKind::Dns)
                    .with_message(format!("{what} {host}"))
                    .with_source(SharedError(e.clone()))
            }
            LookupError::NoAddresses => {
                NetError::new(ErrorKind::Dns).with_message(format!("no addresses for host {host}"))
            }
        }
    }
}

/// A hickory error shared between singleflight waiters, usable as an error source.
#[derive(Debug)]
struct SharedError(Arc<hickory_resolver::net::NetError>);

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// A configured hickory resolver.
#[derive(Clone)]
pub(crate) struct Upstream {
    resolver: TokioResolver,
    timeout: Duration,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// Builds the resolver: the policy's name servers (UDP, then TCP on the same address),
    /// or the system configuration when none are given.
    pub(crate) fn new(policy: &DnsPolicy) -> Result<Self, NetError> {
        let provider = TokioRuntimeProvider::default();
        let mut builder = if policy.nameservers.is_empty() {
            TokioResolver::builder(provider).map_err(|e| {
                NetError::new(ErrorKind::Dns)
                    .with_message("cannot read the system dns configuration")
                    .with_source(e)
            })?
        } else {
            let servers = policy
                .nameservers
                .iter()
                .map(|addr| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = addr.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = addr.port();
                    NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
                })
                .collect();
            let config = ResolverConfig::from_parts(None, Vec::new(), servers);
            let mut b = TokioResolver::builder_with_config(config, provider);
            b.options_mut().use_hosts_file = ResolveHosts::Never;
            b
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        opts.timeout = policy.timeout;
        // Hickory re-sends a failed exchange `attempts` more times within one lookup (a lost
        // datagram, a SERVFAIL); one is enough here, inside the DNS timeout. Retrying beyond
        // that is for the background refresh and the request retry layer.
        opts.attempts = 1;
        opts.cache_size = 0;
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        let resolver = builder.build().map_err(|e| {
            NetError::new(ErrorKind::Dns)
                .with_message("cannot build the dns resolver")
                .with_source(e)
        })?;
        Ok(Upstream {
            resolver,
            timeout: policy.timeout,
        })
    }

    /// Looks `name` up (A and AAAA), within the DNS timeout. The TTL of the answer is the
    /// smallest TTL of its records (CNAMEs included), as hickory's `valid_until` computes it.
    pub(crate) async fn lookup(&self, name: &str) -> Result<Answer, LookupError> {
        let res = tokio::time::timeout(self.timeout, self.resolver.lookup_ip(name)).await;
        let lookup = match res {
            Err(_elapsed) => return Err(LookupError::Timeout),
            Ok(Err(hickory_resolver::net::NetError::Timeout)) => return Err(LookupError::Timeout),
            Ok(Err(e)) => return Err(LookupError::Failed(Arc::new(e))),
            Ok(Ok(lookup)) => lookup,
        };
        let addrs: Arc<[_]> = lookup.iter().collect();
        if addrs.is_empty() {
            return Err(LookupError::NoAddresses);
        }
        let ttl = lookup
            .as_lookup()
            .answers()
            .iter()
            .map(|r| r.ttl)
            .min()
            .unwrap_or(0);
        Ok(Answer {
            addrs,
            ttl: Duration::from_secs(u64::from(ttl)),
        })
    }
}
