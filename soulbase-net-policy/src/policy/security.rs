//! Security policy: host allow-list, private-address denial, size limits, header stripping and
//! sandbox grants.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::host::HostPattern;
use crate::policy::redirect::MAX_REDIRECTS;
use crate::size::ByteSize;
use crate::validate::Checker;

/// Egress security: where requests may go and how big answers may be (SSRF rules after
/// Stripe's Smokescreen).
///
/// With `deny_private`, the address guard refuses every special-purpose address (loopback,
/// private, link-local and cloud metadata, CGNAT, …) on the addresses actually dialled, so DNS
/// rebinding cannot pass it; `grants` let specific hosts or networks through.
///
/// Default: any host, private addresses denied, mixed answers filtered (not refused),
/// at most 5 redirects, 32MiB per request and response body, no headers stripped, no grants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SecurityPolicy {
    /// Host patterns that may be called (`api.example.com`, `*.example.com`); `None` allows
    /// every host. Default is `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_hosts: Option<Vec<String>>,
    /// Refuse private, loopback, link-local and other special-purpose addresses.
    /// Default is `true`.
    pub deny_private: bool,
    /// When a name resolves to both allowed and denied addresses, refuse the name instead of
    /// dialling only the allowed ones. Default is `false`.
    pub strict_mixed_answers: bool,
    /// Most redirects followed, whatever `redirect.max` says (the smaller wins).
    /// Default is 5.
    pub max_redirects: u8,
    /// Largest response body; a longer one is cut off with `TooLarge`. Default is 32MiB.
    pub max_resp_bytes: ByteSize,
    /// Largest request body. Default is 32MiB.
    pub max_req_bytes: ByteSize,
    /// Headers removed from every request before it is sent (seed 000 §3: "sensitive
    /// headers stripped before sending"), whoever set them — the caller, a `before`
    /// interceptor or an `on_attempt` one — on every attempt and redirect hop
    /// (case-insensitive names). Default is empty.
    pub strip_headers: Vec<String>,
    /// Headers dropped, like `Authorization` and `Cookie`, from the first redirect hop that
    /// leaves the request's origin and every hop after it (case-insensitive names); the
    /// request's own origin still receives them. Default is empty.
    pub cross_origin_strip_headers: Vec<String>,
    /// Exceptions to `deny_private`: hosts and CIDRs the guard lets through. Default is none.
    pub grants: SandboxGrants,
}

/// Hosts and networks that `deny_private` lets through (a sandbox grant).
/// Default is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SandboxGrants {
    /// Host patterns whose addresses are not checked. Default is empty.
    pub hosts: Vec<String>,
    /// Networks that may be dialled even though they are private, e.g. `10.1.0.0/16`.
    /// Default is empty.
    pub cidrs: Vec<IpNet>,
}

impl Default for SecurityPolicy {
    fn default() -> Self {
        Self {
            allow_hosts: None,
            deny_private: true,
            strict_mixed_answers: false,
            max_redirects: 5,
            max_resp_bytes: ByteSize::mib(32),
            max_req_bytes: ByteSize::mib(32),
            strip_headers: Vec::new(),
            cross_origin_strip_headers: Vec::new(),
            grants: SandboxGrants::default(),
        }
    }
}

impl SecurityPolicy {
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        for (i, p) in self.allow_hosts.iter().flatten().enumerate() {
            if let Err(e) = HostPattern::parse(p) {
                c.push(&format!("allow_hosts[{i}]"), e.to_string());
            }
        }
        c.when(self.max_redirects > MAX_REDIRECTS, "max_redirects", || {
            format!(
                "must be at most {MAX_REDIRECTS}, got {}",
                self.max_redirects
            )
        });
        c.at_least_one(self.max_resp_bytes.as_u64(), "max_resp_bytes");
        c.at_least_one(self.max_req_bytes.as_u64(), "max_req_bytes");
        for (field, names) in [
            ("strip_headers", &self.strip_headers),
            (
                "cross_origin_strip_headers",
                &self.cross_origin_strip_headers,
            ),
        ] {
            for (i, h) in names.iter().enumerate() {
                c.when(
                    http::HeaderName::from_bytes(h.as_bytes()).is_err(),
                    &format!("{field}[{i}]"),
                    || format!("`{h}` is not a valid header name"),
                );
            }
        }
        for (i, p) in self.grants.hosts.iter().enumerate() {
            if let Err(e) = HostPattern::parse(p) {
                c.push(&format!("grants.hosts[{i}]"), e.to_string());
            }
        }
    }
}
