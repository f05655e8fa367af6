//! `TestNet`: a MockDns and a CertKit started together, and the policy patch that points a
//! service's own policy document at them.
//!
//! Why a TOML string and not a typed patch: the testkit depends on core only (it is the other
//! side of the wire and shares no code with the client it tests), so it cannot name the
//! policy crate's types. The string has the document's shape, which
//! `PolicyDocument::merged_with_toml` takes as is.

use std::io;

use crate::certkit::CertKit;
use crate::dns::MockDns;

/// The networks a loopback test dials: the testkit's servers listen on `127.0.0.1` or `[::1]`.
const LOOPBACK_CIDRS: [&str; 2] = ["127.0.0.0/8", "::1/128"];

/// A test's network: a [`MockDns`] for the names the service calls, a [`CertKit`] for their
/// certificates, and [`policy_patch`](Self::policy_patch), what the service's production
/// policy document needs on top to reach them. Stops when dropped.
///
/// With it a service tests on its own policy file plus one line, so the host overrides,
/// tenants and limits under test are production's:
///
/// ```text
/// let doc = PolicyDocument::from_path("policy.toml")?.merged_with_toml(&net.policy_patch())?;
/// ```
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// use soulbase_net_testkit::{FaultServer, TestNet};
///
/// let net = TestNet::new().await?;
/// net.dns().set_ips("inventory.example.com", &["127.0.0.1".parse().unwrap()], 60);
/// let leaf = net.certs().leaf(&["inventory.example.com"])?;
/// let upstream = FaultServer::builder().tls(leaf.server_config()?).start().await?;
///
/// let patch = net.policy_patch();
/// assert!(patch.contains(&format!("\"{}\"", net.dns().addr())));
/// assert!(patch.contains("127.0.0.0/8"));
/// # drop(upstream);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TestNet {
    dns: MockDns,
    certs: CertKit,
}

// === impl TestNet ===

impl TestNet {
    /// Starts a [`MockDns`] on `127.0.0.1` with an empty table and makes a fresh [`CertKit`].
    ///
    /// # Errors
    /// The MockDns found no free loopback port, or the CertKit could not be made.
    pub async fn new() -> io::Result<Self> {
        let dns = MockDns::start().await?;
        let certs = CertKit::new()?;
        Ok(Self { dns, certs })
    }

    /// The name server: give it the service's production names, e.g.
    /// `net.dns().set_ips("inventory.example.com", &[127.0.0.1], 60)`.
    pub fn dns(&self) -> &MockDns {
        &self.dns
    }

    /// The test PKI: issue the upstreams' server certificates with
    /// [`CertKit::leaf`]`(&["inventory.example.com"])`, or the broken ones.
    pub fn certs(&self) -> &CertKit {
        &self.certs
    }

    /// A policy document fragment (TOML) for `PolicyDocument::merged_with_toml`. In the
    /// `[default]` layer it sets:
    ///
    /// - `security.grants.cidrs = ["127.0.0.0/8", "::1/128"]`: loopback is let through the
    ///   address guard, which refuses it by default;
    /// - `dns.nameservers`: this MockDns only, so no name leaves the machine;
    /// - `tls.extra_roots_pem`: the CertKit's root.
    ///
    /// Lists replace: these three lists of the production default give way. Everything else
    /// the document says stays; a layer that states one of these fields itself (a host
    /// override with its own `dns.nameservers`, say) still wins for its hosts, so patch that
    /// layer too.
    pub fn policy_patch(&self) -> String {
        let mut out = String::from(
            "# soulbase-net-testkit TestNet: what a loopback test needs on top of the policy.\n",
        );
        out.push_str("[default.security.grants]\ncidrs = [");
        out.push_str(&quoted_list(LOOPBACK_CIDRS.map(String::from)));
        out.push_str("]\n\n[default.dns]\nnameservers = [");
        out.push_str(&quoted_list([self.dns.addr().to_string()]));
        out.push_str("]\n\n[default.tls]\nextra_roots_pem = [");
        out.push_str(&quoted_list([self.certs.root_pem()]));
        out.push_str("]\n");
        out
    }
}

/// `"a", "b"`: each item a TOML basic string.
fn quoted_list(items: impl IntoIterator<Item = String>) -> String {
    let mut out = String::new();
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        // JSON string escapes (\n, \", \\, \uXXXX) are also TOML basic-string escapes.
        let quoted = serde_json::to_string(&item).unwrap_or_else(|_| format!("\"{item}\""));
        out.push_str(&quoted);
    }
    out
}
