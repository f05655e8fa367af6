//! The upstream of the cache: one A + AAAA lookup through hickory-resolver, bounded by the
//! policy's DNS timeout.
//!
//! The resolver is built by [`hickory_resolver()`] (shared with callers outside the runtime):
//! hickory's own cache is turned off (size 0) so that ours, with its clamps, singleflight,
//! serve-stale and persistence, is the only one; hickory's hosts file is skipped when name
//! servers are given, so that tests and `--resolve`-style setups see only what they configured.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use soulbase_net_core::{ErrorKind, NetError, Phase};
use soulbase_net_policy::DnsPolicy;

use super::cache::Answer;
use super::hickory::{hickory_resolver, HickoryOptions};

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
    /// Builds the resolver as [`hickory_resolver()`] does with the default options: the
    /// policy's name servers (UDP, then TCP on the same address), or the system configuration
    /// when none are given.
    pub(crate) fn new(policy: &DnsPolicy) -> Result<Self, NetError> {
        let resolver = hickory_resolver(policy, HickoryOptions::default())?;
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
