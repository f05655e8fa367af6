//! The address guard (SSRF protection): which hosts may be called and which addresses dialled.
//!
//! Why here and not in the runtime: the runtime's connector and the `SandboxGuard`
//! interceptor must apply exactly the same rules, so there is one implementation, next to the
//! policy it reads.
//!
//! The runtime calls [`AddressGuard::check_host`] before resolving, and
//! [`AddressGuard::filter_addrs`] on the addresses it is about to dial — IP literals included,
//! since those never pass through a resolver — so DNS rebinding cannot slip past it.

mod ranges;

use std::{fmt, net::IpAddr};

use ipnet::IpNet;
use soulbase_net_core::{ErrorKind, NetError};

pub use self::ranges::{canonical, classify, SpecialRange};
use crate::{
    host::{HostPatternError, HostPatternSet},
    policy::security::SecurityPolicy,
};

/// Decides which hosts may be called and which addresses dialled, from a
/// [`SecurityPolicy`].
///
/// Rules, in order, for an address (after [`canonical`]):
/// 1. inside a `grants.cidrs` network → allowed; a cloud metadata address only by a grant
///    of exactly that address (`169.254.169.254/32`), never by a wider network;
/// 2. an ordinary public unicast address → allowed;
/// 3. a cloud metadata address → denied;
/// 4. `deny_private = false` → allowed;
/// 5. the host matches `grants.hosts` → allowed;
/// 6. otherwise denied, naming the [`SpecialRange`].
///
/// For a host, `allow_hosts` (when set) must match it.
///
/// # Examples
/// ```
/// use soulbase_net_policy::{AddressGuard, SecurityPolicy};
///
/// let guard = AddressGuard::new(&SecurityPolicy::default())?;
/// let public = "93.184.215.14".parse()?;
/// let metadata = "169.254.169.254".parse()?;
/// assert!(guard.check_addr("example.com", public).is_ok());
/// let denied = guard.check_addr("example.com", metadata).unwrap_err();
/// assert_eq!(denied.to_string(), "169.254.169.254 (for example.com) is a cloud_metadata address");
/// // Mixed answers: only the allowed addresses are dialled.
/// assert_eq!(guard.filter_addrs("example.com", &[metadata, public])?, vec![public]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct AddressGuard {
    deny_private: bool,
    strict_mixed: bool,
    allow_hosts: Option<HostPatternSet>,
    grant_hosts: HostPatternSet,
    grant_cidrs: Vec<IpNet>,
}

/// Why a destination was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DenyRule {
    /// The host is not in `security.allow_hosts`.
    NotAllowed,
    /// The address is in a special range.
    Range(SpecialRange),
    /// `strict_mixed_answers` is on and the name resolved to at least one denied address.
    StrictMixed(SpecialRange),
}

impl DenyRule {
    /// A stable label, used as the `rule` of a `Blocked` event.
    pub fn as_str(&self) -> &'static str {
        match self {
            DenyRule::NotAllowed => "allow_hosts",
            DenyRule::Range(r) | DenyRule::StrictMixed(r) => r.as_str(),
        }
    }
}

/// A refused destination: the host, the address (when the refusal is about one) and the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied {
    /// The host as called.
    pub host: String,
    /// The refused address, if the refusal is about an address.
    pub addr: Option<IpAddr>,
    /// The rule.
    pub rule: DenyRule,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.rule, self.addr) {
            (DenyRule::NotAllowed, _) => write!(f, "host {} is not in security.allow_hosts", self.host),
            (DenyRule::Range(r), Some(ip)) => write!(f, "{ip} (for {}) is a {r} address", self.host),
            (DenyRule::StrictMixed(r), Some(ip)) => write!(
                f,
                "{} resolved to {ip}, a {r} address, and strict_mixed_answers refuses the whole name",
                self.host
            ),
            (DenyRule::Range(r) | DenyRule::StrictMixed(r), None) => {
                write!(f, "{} is a {r} address", self.host)
            }
        }
    }
}

impl std::error::Error for Denied {}

impl From<Denied> for NetError {
    /// A [`ErrorKind::Blocked`] error (`AUTH.FORBIDDEN`) saying what was refused and why; the
    /// `Denied` stays reachable as its source.
    fn from(d: Denied) -> Self {
        NetError::new(ErrorKind::Blocked)
            .with_message(d.to_string())
            .with_source(d)
    }
}

// === impl AddressGuard ===

impl AddressGuard {
    /// The guard of `policy`.
    ///
    /// # Errors
    /// A host pattern of `allow_hosts` or `grants.hosts` that does not parse (a validated
    /// policy has none).
    pub fn new(policy: &SecurityPolicy) -> Result<Self, HostPatternError> {
        Ok(AddressGuard {
            deny_private: policy.deny_private,
            strict_mixed: policy.strict_mixed_answers,
            allow_hosts: policy
                .allow_hosts
                .as_ref()
                .map(HostPatternSet::parse)
                .transpose()?,
            grant_hosts: HostPatternSet::parse(&policy.grants.hosts)?,
            grant_cidrs: policy.grants.cidrs.clone(),
        })
    }

    /// Checks `host` against `allow_hosts`, before anything is resolved or dialled.
    ///
    /// # Errors
    /// [`DenyRule::NotAllowed`] when an allow-list is set and `host` is not in it.
    pub fn check_host(&self, host: &str) -> Result<(), Denied> {
        match &self.allow_hosts {
            Some(allowed) if !allowed.matches(host) => Err(Denied {
                host: host.to_owned(),
                addr: None,
                rule: DenyRule::NotAllowed,
            }),
            _ => Ok(()),
        }
    }

    /// Checks one address that `host` resolved to (or that `host` is, for an IP literal).
    ///
    /// # Errors
    /// [`DenyRule::Range`] with the range the address is in.
    pub fn check_addr(&self, host: &str, ip: IpAddr) -> Result<(), Denied> {
        match self.refusal(host, ip) {
            None => Ok(()),
            Some(range) => Err(Denied {
                host: host.to_owned(),
                addr: Some(canonical(ip)),
                rule: DenyRule::Range(range),
            }),
        }
    }

    /// The addresses of `host` that may be dialled, in their order, canonicalised.
    ///
    /// With mixed answers only the allowed addresses are kept, unless
    /// `strict_mixed_answers` is on, which refuses the whole name.
    ///
    /// # Errors
    /// The first refusal when no address is left (or any refusal in strict mode).
    pub fn filter_addrs(&self, host: &str, addrs: &[IpAddr]) -> Result<Vec<IpAddr>, Denied> {
        let mut kept = Vec::with_capacity(addrs.len());
        let mut first_refusal = None;
        for &ip in addrs {
            match self.check_addr(host, ip) {
                Ok(()) => kept.push(canonical(ip)),
                Err(denied) => {
                    if self.strict_mixed {
                        let DenyRule::Range(range) = denied.rule else {
                            return Err(denied);
                        };
                        return Err(Denied {
                            rule: DenyRule::StrictMixed(range),
                            ..denied
                        });
                    }
                    first_refusal.get_or_insert(denied);
                }
            }
        }
        match (kept.is_empty(), first_refusal) {
            (true, Some(denied)) => Err(denied),
            _ => Ok(kept),
        }
    }

    /// The range that makes `ip` refused for `host`, or `None` when it may be dialled.
    fn refusal(&self, host: &str, ip: IpAddr) -> Option<SpecialRange> {
        let ip = canonical(ip);
        let class = classify(ip);
        let metadata = class == Some(SpecialRange::CloudMetadata);
        // A metadata address opens only to a grant of exactly that address: a wide grant
        // (`169.254.0.0/16`, `0.0.0.0/0`) must not hand out cloud credentials by accident.
        let granted = self.grant_cidrs.iter().any(|net| {
            net.contains(&ip) && (!metadata || net.prefix_len() == net.max_prefix_len())
        });
        if granted {
            return None;
        }
        let range = class?;
        if range == SpecialRange::CloudMetadata {
            return Some(range);
        }
        if !self.deny_private || self.grant_hosts.matches(host) {
            return None;
        }
        Some(range)
    }
}

#[cfg(test)]
mod tests;
