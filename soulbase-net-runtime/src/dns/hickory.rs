//! The one set-up of a hickory-resolver from a [`DnsPolicy`]: the runtime's own address
//! lookups (`upstream`) and callers that need other record types (the probe agent's DNS
//! probe: MX, NS, TXT) build their resolver here, so that name servers, transports, timeouts
//! and caching are configured in one place.

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use soulbase_net_core::{ErrorKind, NetError};
use soulbase_net_policy::DnsPolicy;

/// What a resolver from [`hickory_resolver()`] may do beyond what its [`DnsPolicy`] says.
///
/// The default is the runtime's own resolver (the one under [`DnsResolver`](crate::DnsResolver)).
///
/// # Examples
/// ```
/// use soulbase_net_runtime::HickoryOptions;
///
/// // Every query with an EDNS(0) OPT record, as a probe of TXT or MX records wants.
/// let options = HickoryOptions::default().edns0(true);
/// # let _ = options;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HickoryOptions {
    edns0: Option<bool>,
}

impl HickoryOptions {
    /// Whether queries carry an EDNS(0) OPT record, which lets a name server answer past 512
    /// bytes over UDP (large TXT or MX answers) before the TCP fallback is needed.
    ///
    /// Default is as configured: on with the policy's `nameservers` (hickory's default), as
    /// the system's configuration says (`options edns0`) without them.
    pub fn edns0(mut self, on: bool) -> Self {
        self.edns0 = Some(on);
        self
    }
}

/// Builds a hickory-resolver [`TokioResolver`] from `policy`, as the runtime's own
/// [`DnsResolver`](crate::DnsResolver) asks its name servers:
///
/// - the policy's `nameservers`, each over UDP and then TCP on the same address (TCP is used
///   when an answer comes back truncated), with hickory's hosts file skipped so that only the
///   configured servers answer; without `nameservers`, the system's configuration
///   (`/etc/resolv.conf` and the hosts file);
/// - one exchange per lookup (no resend of a lost datagram), waiting at most the policy's
///   `timeout` for it;
/// - hickory's cache off: every lookup asks the name servers;
/// - `lookup_ip` asks for A and AAAA records both.
///
/// The policy's other fields (`static_hosts`, the TTL clamps, serve-stale, persistence,
/// prefetch) belong to [`DnsResolver`](crate::DnsResolver)'s cache and are not used here.
/// Use it for lookups [`DnsResolver`](crate::DnsResolver) does not make — other record types,
/// or uncached answers — with the same name servers; `lookup(name, RecordType::MX)` and the
/// like answer every record type.
///
/// # Errors
/// `Dns` when `nameservers` is empty and the system's DNS configuration cannot be read, or
/// when hickory refuses to build the resolver.
///
/// # Examples
/// ```
/// use soulbase_net_policy::DnsPolicy;
/// use soulbase_net_runtime::{hickory_resolver, HickoryOptions};
///
/// let mut policy = DnsPolicy::default();
/// policy.nameservers = vec!["127.0.0.1:53".parse()?];
/// let resolver = hickory_resolver(&policy, HickoryOptions::default().edns0(true))?;
/// // resolver.lookup("example.com", RecordType::TXT).await? within a Tokio runtime
/// # let _ = resolver;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn hickory_resolver(
    policy: &DnsPolicy,
    options: HickoryOptions,
) -> Result<TokioResolver, NetError> {
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
    let opts = builder.options_mut();
    opts.timeout = policy.timeout;
    // Hickory re-sends a failed exchange `attempts` more times within one lookup (a lost
    // datagram, a SERVFAIL); one is enough: the runtime retries in its background refresh
    // and its request retry layer, and a probe reports a lost answer rather than hiding it.
    opts.attempts = 1;
    opts.cache_size = 0;
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    if let Some(on) = options.edns0 {
        opts.edns0 = on;
    }
    builder.build().map_err(|e| {
        NetError::new(ErrorKind::Dns)
            .with_message("cannot build the dns resolver")
            .with_source(e)
    })
}
