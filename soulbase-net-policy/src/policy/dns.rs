//! DNS policy: timeouts, caching and serve-stale, happy eyeballs, persistence, refresh and
//! static overrides.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::host::{normalize_host, HostPattern};
use crate::validate::{fmt_duration, Checker};

/// Name resolution: a cache of at most 1h, optional persistence to a file, background refresh every 30m, 10 resolve retries with a randomised
/// delay, and shuffled answers so load spreads).
///
/// Cached answers live for the record's TTL clamped to `[min_ttl, cache_ttl]`; when the
/// resolver fails, an expired answer is served for up to `stale_for` (RFC 8767).
///
/// Default: 2s lookups, 1h cache, serve-stale for 1h, happy eyeballs with 300ms fallback, IPv4
/// first, shuffled answers, no persistence file, refresh every 30m, system name servers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DnsPolicy {
    /// Time limit of one lookup. Default is 2s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Longest time an answer is cached, whatever its TTL. Default is 1h.
    #[serde(with = "humantime_serde")]
    pub cache_ttl: Duration,
    /// Shortest time an answer is cached, whatever its TTL. Default is 0s.
    #[serde(with = "humantime_serde")]
    pub min_ttl: Duration,
    /// Happy eyeballs (RFC 8305): when an address has not connected within
    /// `happy_eyeballs_delay`, the next one is tried beside it, and the families are
    /// interleaved. Off: one address at a time, in order, the next only after the previous
    /// one failed (a silent address then costs the whole connect timeout). Default is `true`.
    pub happy_eyeballs: bool,
    /// How long the first family gets before the other one is tried. Default is 300ms.
    #[serde(with = "humantime_serde")]
    pub happy_eyeballs_delay: Duration,
    /// Try IPv6 addresses first. Default is `false`.
    pub prefer_ipv6: bool,
    /// Shuffle the addresses of an answer on every use, so load spreads over them.
    /// Default is `true`.
    pub shuffle: bool,
    /// Serve an expired answer when the resolver fails. Default is `true`.
    pub serve_stale: bool,
    /// How long past expiry an answer may be served stale. Default is 1h.
    #[serde(with = "humantime_serde")]
    pub stale_for: Duration,
    /// File the cache is persisted to and loaded from, so a restart starts warm and survives
    /// a resolver outage. Default is `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persist_file: Option<PathBuf>,
    /// How often the cache is written to `persist_file`; `"off"` writes only on shutdown.
    /// Default is 30m.
    #[serde(with = "crate::serde_opt")]
    pub persist_interval: Option<Duration>,
    /// How often expired entries are re-resolved in the background; `"off"` turns refresh
    /// off. Default is 30m.
    #[serde(with = "crate::serde_opt")]
    pub refresh_interval: Option<Duration>,
    /// Background re-resolution attempts per name, with a randomised delay between them.
    /// Default is 10.
    pub resolve_retries: u32,
    /// Wait between background resolve attempts; each wait is randomised to 50–100 % of it.
    /// Default is 1s.
    #[serde(with = "humantime_serde")]
    pub resolve_retry_delay: Duration,
    /// Names resolved at start-up. Default is empty.
    pub prefetch: Vec<String>,
    /// Fixed answers, like curl `--resolve`; they bypass DNS but not the address guard.
    /// Default is empty.
    pub static_hosts: BTreeMap<String, Vec<IpAddr>>,
    /// Name servers to query; empty means the system configuration. Default is empty.
    pub nameservers: Vec<SocketAddr>,
}

impl Default for DnsPolicy {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(2),
            cache_ttl: Duration::from_secs(3600),
            min_ttl: Duration::ZERO,
            happy_eyeballs: true,
            happy_eyeballs_delay: Duration::from_millis(300),
            prefer_ipv6: false,
            shuffle: true,
            serve_stale: true,
            stale_for: Duration::from_secs(3600),
            persist_file: None,
            persist_interval: Some(Duration::from_secs(1800)),
            refresh_interval: Some(Duration::from_secs(1800)),
            resolve_retries: 10,
            resolve_retry_delay: Duration::from_secs(1),
            prefetch: Vec::new(),
            static_hosts: BTreeMap::new(),
            nameservers: Vec::new(),
        }
    }
}

impl DnsPolicy {
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        c.nonzero(self.timeout, "timeout");
        c.when(self.min_ttl > self.cache_ttl, "min_ttl", || {
            format!(
                "must not exceed cache_ttl ({} > {})",
                fmt_duration(self.min_ttl),
                fmt_duration(self.cache_ttl)
            )
        });
        for (field, v) in [
            ("persist_interval", self.persist_interval),
            ("refresh_interval", self.refresh_interval),
        ] {
            c.when(v == Some(Duration::ZERO), field, || {
                "must be greater than 0s; write \"off\" to turn it off".to_owned()
            });
        }
        if let Some(p) = &self.persist_file {
            c.when(p.as_os_str().is_empty(), "persist_file", || {
                "is empty; leave it out to turn persistence off".to_owned()
            });
        }
        for (i, name) in self.prefetch.iter().enumerate() {
            if let Err(e) = normalize_host(name) {
                c.push(&format!("prefetch[{i}]"), e.to_string());
            }
        }
        for (name, ips) in &self.static_hosts {
            let field = format!("static_hosts.{}", crate::document::quote_key(name));
            match HostPattern::parse(name) {
                Ok(p) if p.is_wildcard() => {
                    c.push(&field, "a static entry names one host, not a wildcard")
                }
                Ok(_) => {}
                Err(e) => c.push(&field, e.to_string()),
            }
            c.when(ips.is_empty(), &field, || {
                "needs at least one address".to_owned()
            });
        }
    }
}
