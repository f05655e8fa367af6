//! Proxy policy: forward proxies for http and https targets and the no-proxy list.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::redact;
use crate::validate::Checker;

/// Outbound proxies.
///
/// `https` targets go through `https_proxy` with HTTP CONNECT; `http` targets through
/// `http_proxy`. A proxy URL is `http://` (plain to the proxy) or `https://` (TLS to the
/// proxy, verified against the policy's trust roots; a CONNECT tunnel then carries the
/// target's own TLS inside it). Hosts matching `no_proxy` (curl's `NO_PROXY` rules: host names, `.domain`
/// suffixes, IPs, CIDRs, `*`) connect directly. Through a proxy, literal IP targets and the
/// host allow-list are always checked locally; who resolves names, and so who checks the
/// addresses they resolve to, is [`resolve`](Self::resolve).
///
/// A proxy URL may hold credentials (`http://user:password@proxy.internal:3128`): the fields
/// keep them for the client, while `Debug`, `Snapshot::explain` and validation problems show
/// the URL with its password masked (`http://user:***@proxy.internal:3128/`).
///
/// Default: no proxy, environment ignored (`NetPolicy::proxy` is `None` by default).
///
/// # Examples
/// ```
/// use soulbase_net_policy::ProxyPolicy;
///
/// let mut p = ProxyPolicy::default();
/// p.https_proxy = Some("http://app:s3cret@proxy.internal:3128".to_owned());
/// let shown = format!("{p:?}");
/// assert!(shown.contains("app:***@proxy.internal:3128") && !shown.contains("s3cret"));
/// assert_eq!(p.https_proxy.as_deref(), Some("http://app:s3cret@proxy.internal:3128"));
/// ```
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ProxyPolicy {
    /// Proxy URL for `http://` targets, e.g. `http://proxy.internal:3128` or
    /// `https://proxy.internal:3129` (TLS to the proxy). Default is `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_proxy: Option<String>,
    /// Proxy URL for `https://` targets (tunnelled with CONNECT, so TLS stays end to end),
    /// `http://` or `https://`. Default is `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub https_proxy: Option<String>,
    /// Targets that bypass the proxy (hosts, `.domain` suffixes, IPs, CIDRs). Default is empty.
    pub no_proxy: Vec<String>,
    /// Also read `HTTP_PROXY`, `HTTPS_PROXY` and `NO_PROXY` from the environment; explicit
    /// fields win. Default is `false`.
    pub from_env: bool,
    /// Who resolves target names. Default is [`ProxyResolve::Proxy`].
    pub resolve: ProxyResolve,
}

/// Who resolves a target's name when a call goes through a proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProxyResolve {
    /// The proxy: the name goes to it as written (CONNECT `name:port`, or an absolute-form
    /// URL), and the address guard cannot see what it resolves to — a name that resolves to
    /// 10.0.0.1 reaches 10.0.0.1 unless the proxy itself refuses private addresses. Use it
    /// when the proxy is the egress control (Smokescreen, a filtering squid) or when only the
    /// proxy can resolve the names. The default, as every HTTP client does it.
    #[default]
    Proxy,
    /// The client: it resolves the name itself, runs the address guard on the answer and has
    /// the proxy connect to the checked address (`CONNECT ip:port`, for `http` targets too,
    /// with the request inside the tunnel); the TLS server name and `Host` stay the name. A
    /// name that resolves to a denied address is `Blocked` and the proxy never hears of it.
    Local,
}

impl ProxyPolicy {
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        for (field, v) in [
            ("http_proxy", &self.http_proxy),
            ("https_proxy", &self.https_proxy),
        ] {
            if let Some(u) = v {
                if let Err(reason) = check_proxy_url(u) {
                    c.push(field, reason);
                }
            }
        }
        for (i, entry) in self.no_proxy.iter().enumerate() {
            c.when(
                entry.trim().is_empty() || entry.contains(char::is_whitespace),
                &format!("no_proxy[{i}]"),
                || format!("`{entry}` is not a host, domain, IP or CIDR"),
            );
        }
    }
}

/// Whether `u` is a proxy URL the client can use; the reason never holds its password.
fn check_proxy_url(u: &str) -> Result<(), String> {
    let shown = redact::url(u);
    let url = url::Url::parse(u).map_err(|e| format!("`{shown}` is not an absolute URL: {e}"))?;
    match url.scheme() {
        "http" | "https" => {}
        other => {
            return Err(format!(
                "`{shown}` must be an http:// or https:// URL, not {other}://"
            ))
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{shown}` has no host"));
    }
    Ok(())
}

impl fmt::Debug for ProxyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyPolicy")
            .field("http_proxy", &self.http_proxy.as_deref().map(redact::url))
            .field("https_proxy", &self.https_proxy.as_deref().map(redact::url))
            .field("no_proxy", &self.no_proxy)
            .field("from_env", &self.from_env)
            .field("resolve", &self.resolve)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls_must_be_absolute_http_or_https() {
        assert!(check_proxy_url("http://proxy:3128").is_ok());
        assert!(check_proxy_url("http://user:pw@proxy.example").is_ok());
        assert!(check_proxy_url("https://proxy.example:3129").is_ok());
        for bad in [
            "proxy:3128",
            "socks5://proxy:1080",
            "/relative",
            "http://",
            "https://",
        ] {
            assert!(check_proxy_url(bad).is_err(), "{bad}");
        }
        let err = check_proxy_url("socks5://proxy:1080").unwrap_err();
        assert!(err.contains("http:// or https://"), "{err}");
    }

    #[test]
    fn reasons_and_debug_never_hold_the_password() {
        for bad in [
            "socks5://u:pw-x@proxy:1080",
            "u:pw-x@proxy:3128",
            "http://u:pw-x@",
            "http://u:pw-x@pro xy",
        ] {
            let err = check_proxy_url(bad).unwrap_err();
            assert!(!err.contains("pw-x") && err.contains("u:***@"), "{err}");
        }
        let p = ProxyPolicy {
            http_proxy: Some("http://u:pw-x@proxy:3128".into()),
            https_proxy: Some("https://u:pw-x@proxy:3129".into()),
            ..ProxyPolicy::default()
        };
        let shown = format!("{p:?}");
        assert!(!shown.contains("pw-x"), "{shown}");
        assert!(shown.contains("u:***@proxy:3128") && shown.contains("u:***@proxy:3129"));
    }
}
