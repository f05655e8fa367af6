//! What a host is (an IP literal or a name) and the order its addresses are tried in:
//! shuffled so load spreads (seed 004), then sorted for happy eyeballs (RFC 8305 §4).

use std::net::IpAddr;

use soulbase_net_core::NetError;
use soulbase_net_policy::normalize_host;

/// A host as given to the resolver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Host {
    /// An IP literal (IPv6 possibly in brackets).
    Ip(IpAddr),
    /// A name: lowercase, A-labels, no trailing dot.
    Name(String),
}

/// Parses `host`: a canonical IP literal, or a host name normalised for the cache.
///
/// # Errors
/// `InvalidRequest` when `host` is not a valid host name, or looks numeric without being a
/// canonical IP address (`127.1`, `0x7f.0.0.1`, `2130706433`): those are refused rather than
/// resolved, as the address guard refuses them in URLs.
pub(crate) fn parse_host(host: &str) -> Result<Host, NetError> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    // An IP literal has a `:` (IPv6) or ends in a digit (IPv4): a name ending in anything
    // else (most names, `example.com`, `example.com.`) is not tried as one.
    if might_be_ip(bare) {
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Host::Ip(ip));
        }
    }
    let name = normalize_host(host)
        .map_err(|e| NetError::invalid_request("not a valid host name").with_source(e))?;
    if name.starts_with('[') || (might_be_ip(&name) && name.parse::<IpAddr>().is_ok()) {
        return Err(NetError::invalid_request(
            "a numeric host that is not a canonical ip address",
        ));
    }
    Ok(Host::Name(name))
}

/// Whether `host` could parse as an IP address: it has a `:`, or its last character is a
/// digit (an IPv4 address ends in one; an IPv6 address has colons).
fn might_be_ip(host: &str) -> bool {
    host.contains(':') || host.bytes().last().is_some_and(|b| b.is_ascii_digit())
}

/// Orders `addrs` for connecting: shuffled first when `shuffle`, then the preferred family
/// (IPv6 when `prefer_ipv6`, else IPv4) first. With `interleave` (happy eyeballs) the two
/// families alternate after that, as RFC 8305 §4 sorts them; without it, all addresses of the
/// preferred family come before the others.
pub(crate) fn order(
    addrs: &[IpAddr],
    shuffle: bool,
    prefer_ipv6: bool,
    interleave: bool,
) -> Vec<IpAddr> {
    // One address (a static name, a name with one record): nothing to order.
    if addrs.len() <= 1 {
        return addrs.to_vec();
    }
    let mut all = addrs.to_vec();
    if shuffle {
        fastrand::shuffle(&mut all);
    }
    let (preferred, other): (Vec<IpAddr>, Vec<IpAddr>) =
        all.into_iter().partition(|ip| ip.is_ipv6() == prefer_ipv6);
    if !interleave {
        return preferred.into_iter().chain(other).collect();
    }
    let mut out = Vec::with_capacity(preferred.len() + other.len());
    let (mut p, mut o) = (preferred.into_iter(), other.into_iter());
    loop {
        match (p.next(), o.next()) {
            (None, None) => break,
            (a, b) => out.extend(a.into_iter().chain(b)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn literals_and_names() {
        assert_eq!(
            parse_host("10.0.0.1").unwrap(),
            Host::Ip("10.0.0.1".parse().unwrap())
        );
        assert_eq!(
            parse_host("[::1]").unwrap(),
            Host::Ip("::1".parse().unwrap())
        );
        assert_eq!(parse_host("::1").unwrap(), Host::Ip("::1".parse().unwrap()));
        assert_eq!(
            parse_host("API.Example.Test.").unwrap(),
            Host::Name("api.example.test".into())
        );
        assert_eq!(
            parse_host("h12.bench.test").unwrap(),
            Host::Name("h12.bench.test".into())
        );
        for bad in ["", "127.1", "0x7f.0.0.1", "2130706433", "a b.test", "[::1"] {
            let err = parse_host(bad).unwrap_err();
            assert_eq!(
                err.kind(),
                soulbase_net_core::ErrorKind::InvalidRequest,
                "{bad}"
            );
        }
    }

    #[test]
    fn preferred_family_first_then_alternating() {
        let mixed = ips(&["1.1.1.1", "2.2.2.2", "3.3.3.3", "::1", "::2"]);
        assert_eq!(
            order(&mixed, false, false, true),
            ips(&["1.1.1.1", "::1", "2.2.2.2", "::2", "3.3.3.3"])
        );
        assert_eq!(
            order(&mixed, false, true, true),
            ips(&["::1", "1.1.1.1", "::2", "2.2.2.2", "3.3.3.3"])
        );
        assert_eq!(
            order(&mixed, false, true, false),
            ips(&["::1", "::2", "1.1.1.1", "2.2.2.2", "3.3.3.3"])
        );
        assert!(order(&[], true, false, true).is_empty());
    }

    #[test]
    fn shuffling_keeps_every_address_and_the_family_order() {
        let mixed = ips(&["1.1.1.1", "2.2.2.2", "3.3.3.3", "::1", "::2", "::3"]);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            let out = order(&mixed, true, false, true);
            let mut sorted = out.clone();
            sorted.sort();
            assert_eq!(sorted, mixed);
            let families: Vec<bool> = out.iter().map(IpAddr::is_ipv6).collect();
            assert_eq!(families, [false, true, false, true, false, true]);
            seen.insert(out);
        }
        assert!(seen.len() > 1);
    }
}
