//! Host names and host patterns (`api.example.com`, `*.example.com`) and their matching.
//!
//! Hosts and patterns are normalised the same way before they are compared: ASCII lowercase,
//! one trailing dot removed, internationalised names converted to A-labels (IDNA, via the
//! `url` crate), IPv4 written canonically and IPv6 written in brackets (`[::1]`).

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

mod set;

pub use self::set::HostPatternSet;

/// A host pattern: an exact host (`api.example.com`, `10.0.0.7`, `[::1]`) or a wildcard over
/// the sub-domains of a domain (`*.example.com`).
///
/// `*.example.com` matches `a.example.com` and `a.b.example.com`, but neither `example.com`
/// nor `evilexample.com`. The `*` may only be the whole first label: `*foo.com`, `a.*.com`
/// and a bare `*` are rejected, and so is an empty pattern.
///
/// # Examples
/// ```
/// use soulbase_net_policy::HostPattern;
/// let p = HostPattern::parse("*.Example.COM.").unwrap();
/// assert_eq!(p.to_string(), "*.example.com");
/// assert!(p.matches("a.b.example.com"));
/// assert!(!p.matches("example.com"));
/// assert!(!p.matches("evilexample.com"));
/// assert!(HostPattern::parse("a.*.com").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPattern {
    kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Kind {
    /// A normalised host.
    Exact(String),
    /// The normalised domain after `*.`.
    Wildcard(String),
}

/// Why a host or host pattern is invalid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid host `{input}`: {reason}")]
pub struct HostPatternError {
    input: String,
    reason: String,
}

/// Normalises a host name for comparison: ASCII lowercase, trailing dot removed, IDN to
/// A-labels, IPv4 canonical, IPv6 in brackets.
///
/// # Errors
/// When `host` is empty or not a valid host name or IP address.
///
/// # Examples
/// ```
/// use soulbase_net_policy::normalize_host;
/// assert_eq!(normalize_host("API.Example.com.").unwrap(), "api.example.com");
/// assert_eq!(normalize_host("bücher.example").unwrap(), "xn--bcher-kva.example");
/// assert_eq!(normalize_host("::1").unwrap(), "[::1]");
/// ```
pub fn normalize_host(host: &str) -> Result<String, HostPatternError> {
    let err = |reason: &str| HostPatternError {
        input: host.to_owned(),
        reason: reason.to_owned(),
    };
    let h = host.strip_suffix('.').unwrap_or(host);
    if h.is_empty() {
        return Err(err("the host is empty"));
    }
    if h.contains(':') && !h.starts_with('[') {
        return h
            .parse::<Ipv6Addr>()
            .map(|ip| format!("[{ip}]"))
            .map_err(|_| err("not a valid IPv6 address (or a host name with a `:`)"));
    }
    // The common case (a host taken from a parsed URL) is already what the parser returns:
    // no IDNA pass for it.
    if already_normal(h) {
        check_labels(h).map_err(err)?;
        return Ok(h.to_owned());
    }
    let parsed = url::Host::parse(h).map_err(|e| err(&e.to_string()))?;
    let out = match parsed {
        url::Host::Domain(d) => d,
        url::Host::Ipv4(ip) => return Ok(ip.to_string()),
        url::Host::Ipv6(ip) => return Ok(format!("[{ip}]")),
    };
    check_labels(&out).map_err(err)?;
    Ok(out)
}

/// A cheap normalisation for lookups: hosts already in normal form are borrowed.
pub(crate) fn lookup_key(host: &str) -> Cow<'_, str> {
    let h = host.strip_suffix('.').unwrap_or(host);
    let plain = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-';
    if h.bytes().all(plain) {
        return Cow::Borrowed(h);
    }
    if h.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
    {
        return Cow::Owned(h.to_ascii_lowercase());
    }
    match normalize_host(host) {
        Ok(n) => Cow::Owned(n),
        Err(_) => Cow::Owned(h.to_lowercase()),
    }
}

/// Whether `url`'s host parser returns `h` as it is (a domain, unchanged): ASCII lower-case
/// letters, digits, `-`, `_` and `.` only (IDNA maps each to itself), no label in punycode
/// (`xn--…`, which IDNA decodes to check), and a last label that is neither empty nor a
/// number — the WHATWG parser reads a host ending in a number (`127.1`, `1.0x7f`, `0x`) as an
/// IPv4 address.
fn already_normal(h: &str) -> bool {
    // One pass over the bytes (this runs for every new host): where the last label starts,
    // and whether any label starts `xn--`.
    let bytes = h.as_bytes();
    let mut last = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let plain = b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_');
        if b == b'.' {
            last = i + 1;
        } else if !plain || (i == last && bytes[i..].starts_with(b"xn--")) {
            return false;
        }
    }
    let last = &h[last..];
    let decimal = last.bytes().all(|b| b.is_ascii_digit());
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|rest| rest.bytes().all(|b| b.is_ascii_hexdigit()));
    !last.is_empty() && !decimal && !hex
}

fn check_labels(domain: &str) -> Result<(), &'static str> {
    if domain.len() > 253 {
        return Err("a host name is at most 253 characters");
    }
    // One pass for the common, valid name; a name that fails it is read again label by
    // label, so the error names the first label's first fault.
    let mut len = 0usize;
    let mut valid = true;
    for &b in domain.as_bytes() {
        if b == b'.' {
            valid &= len > 0;
            len = 0;
        } else {
            valid &= b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
            len += 1;
        }
        valid &= len <= 63;
    }
    if valid && len > 0 {
        return Ok(());
    }
    for label in domain.split('.') {
        if label.is_empty() {
            return Err("a host name has no empty labels");
        }
        if label.len() > 63 {
            return Err("a label of a host name is at most 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("a host name has only letters, digits, `-` and `_`");
        }
    }
    Ok(())
}

// === impl HostPattern ===

impl HostPattern {
    /// Parses and normalises a pattern.
    ///
    /// # Errors
    /// When the pattern is empty, is a bare `*`, has a `*` other than as the whole first label,
    /// or names an invalid host.
    pub fn parse(pattern: &str) -> Result<Self, HostPatternError> {
        let err = |reason: &str| HostPatternError {
            input: pattern.to_owned(),
            reason: reason.to_owned(),
        };
        if pattern.is_empty() {
            return Err(err("the pattern is empty"));
        }
        if pattern == "*" || pattern == "*." {
            return Err(err(
                "a bare `*` is not a pattern: the default policy (or leaving the list out) covers every host",
            ));
        }
        let (wild, rest) = match pattern.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, pattern),
        };
        if rest.contains('*') {
            return Err(err(
                "`*` may only be the whole first label, as in `*.example.com`",
            ));
        }
        let host = normalize_host(rest).map_err(|e| err(&e.reason))?;
        if !wild {
            return Ok(Self {
                kind: Kind::Exact(host),
            });
        }
        if host.starts_with('[') || host.parse::<IpAddr>().is_ok() {
            return Err(err("a wildcard needs a domain name, not an IP address"));
        }
        Ok(Self {
            kind: Kind::Wildcard(host),
        })
    }

    /// `true` for `*.domain` patterns.
    pub fn is_wildcard(&self) -> bool {
        matches!(self.kind, Kind::Wildcard(_))
    }

    /// Whether `host` matches this pattern (the host is normalised first).
    pub fn matches(&self, host: &str) -> bool {
        let key = lookup_key(host);
        match &self.kind {
            Kind::Exact(h) => *h == key,
            Kind::Wildcard(suffix) => is_strict_subdomain(&key, suffix),
        }
    }

    /// Whether some host matches both patterns.
    pub fn overlaps(&self, other: &HostPattern) -> bool {
        match (&self.kind, &other.kind) {
            (Kind::Exact(a), Kind::Exact(b)) => a == b,
            (Kind::Exact(h), Kind::Wildcard(s)) | (Kind::Wildcard(s), Kind::Exact(h)) => {
                is_strict_subdomain(h, s)
            }
            (Kind::Wildcard(a), Kind::Wildcard(b)) => {
                a == b || is_strict_subdomain(a, b) || is_strict_subdomain(b, a)
            }
        }
    }
}

/// `host` is `<one or more labels>.suffix`.
fn is_strict_subdomain(host: &str, suffix: &str) -> bool {
    host.len() > suffix.len() + 1
        && host.ends_with(suffix)
        && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
        && !host.starts_with('.')
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Exact(h) => f.write_str(h),
            Kind::Wildcard(s) => write!(f, "*.{s}"),
        }
    }
}

impl FromStr for HostPattern {
    type Err = HostPatternError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_case_dot_idn_and_ips() {
        assert_eq!(
            normalize_host("API.Example.COM.").unwrap(),
            "api.example.com"
        );
        assert_eq!(
            normalize_host("Bücher.example").unwrap(),
            "xn--bcher-kva.example"
        );
        assert_eq!(normalize_host("10.0.0.7").unwrap(), "10.0.0.7");
        assert_eq!(normalize_host("[::1]").unwrap(), "[::1]");
        assert_eq!(normalize_host("::1").unwrap(), "[::1]");
        for bad in ["", ".", "a b.com", "a..b", "exa/mple.com", &"a".repeat(64)] {
            assert!(normalize_host(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hosts_the_parser_would_change_are_not_taken_as_normal() {
        for normal in [
            "api.example.com",
            "h1.bench.test",
            "a-b_c.d9",
            "x1",
            "0xg.com",
        ] {
            assert!(already_normal(normal), "{normal}");
        }
        for other in [
            "127.1",
            "a.0x7f",
            "0x",
            "1.2.3.4",
            "xn--bcher-kva.example",
            "a.xn--",
            "API.example.com",
            "a.",
            "b\u{fc}cher.example",
        ] {
            assert!(!already_normal(other), "{other}");
        }
        // Through the slow path, as before.
        assert_eq!(normalize_host("127.1").unwrap(), "127.0.0.1");
        assert!(normalize_host("a.b..").is_err());
    }

    proptest::proptest! {
        /// Whatever the fast path takes as it is, the URL parser returns unchanged.
        #[test]
        fn the_fast_path_agrees_with_the_parser(
            h in "[a-z0-9x.\\-_]{1,24}",
            labels in proptest::collection::vec(
                proptest::sample::select(vec!["xn--a", "xn--bcher-kva", "0x1f", "0x", "12", "0", "ab", "-", "_", "a-b", "ab--c", ""]),
                1..5,
            ),
        ) {
            for h in [h, labels.join(".")] {
                if already_normal(&h) {
                    let parsed = url::Host::parse(&h);
                    proptest::prop_assert_eq!(parsed, Ok(url::Host::Domain(h.clone())));
                }
            }
        }
    }

    #[test]
    fn wildcards_match_subdomains_only() {
        let p = HostPattern::parse("*.example.com").unwrap();
        assert!(p.is_wildcard());
        for h in ["a.example.com", "a.b.example.com", "A.Example.com."] {
            assert!(p.matches(h), "{h}");
        }
        for h in [
            "example.com",
            "evilexample.com",
            ".example.com",
            "example.com.evil",
        ] {
            assert!(!p.matches(h), "{h}");
        }
    }

    #[test]
    fn rejects_bad_patterns() {
        for bad in [
            "",
            "*",
            "*foo.com",
            "a.*.com",
            "*.*.com",
            "foo*",
            "*.10.0.0.1",
            "*.",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn idn_patterns_match_a_labels() {
        let p = HostPattern::parse("*.bücher.example").unwrap();
        assert_eq!(p.to_string(), "*.xn--bcher-kva.example");
        assert!(p.matches("shop.BÜCHER.example"));
        assert!(p.matches("shop.xn--bcher-kva.example"));
    }

    #[test]
    fn overlaps() {
        let p = |s| HostPattern::parse(s).unwrap();
        assert!(p("*.example.com").overlaps(&p("a.example.com")));
        assert!(p("*.example.com").overlaps(&p("*.a.example.com")));
        assert!(!p("*.example.com").overlaps(&p("example.com")));
        assert!(!p("*.example.com").overlaps(&p("*.example.org")));
        assert!(p("a.example.com").overlaps(&p("a.example.com")));
    }
}
