//! `SandboxGuard`: the host allow-list and literal-IP checks, before anything is sent.

use soulbase_net_core::{url::Host, Hooks, Interceptor, NetError, NetRequest};
use soulbase_net_policy::{AddressGuard, HostPatternError, SecurityPolicy};

/// Refuses, before anything is sent, a request whose host is not in `allow_hosts` or whose
/// host is an IP literal the [`AddressGuard`] refuses (private, loopback, link-local, cloud
/// metadata, … unless granted), with the same rules as the runtime — one implementation, in
/// `soulbase-net-policy`.
///
/// A refusal is an [`ErrorKind::Blocked`](soulbase_net_core::ErrorKind::Blocked) error
/// (`AUTH.FORBIDDEN`) whose source is the policy's `Denied`. Names are checked against the
/// allow-list only: their addresses are known after DNS, where the runtime checks them.
///
/// # Examples
/// ```
/// use soulbase_net_core::{ErrorKind, Interceptor, NetRequest};
/// use soulbase_net_interceptors::SandboxGuard;
/// use soulbase_net_policy::SecurityPolicy;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let sandbox = SandboxGuard::new(&SecurityPolicy::default()).unwrap();
/// let mut req = NetRequest::get("http://169.254.169.254/latest/meta-data/");
/// assert_eq!(sandbox.before(&mut req).await.unwrap_err().kind(), ErrorKind::Blocked);
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct SandboxGuard {
    guard: AddressGuard,
}

// === impl SandboxGuard ===

impl SandboxGuard {
    /// The guard of `policy` (its `allow_hosts`, `deny_private` and `grants`).
    ///
    /// # Errors
    /// A host pattern of `allow_hosts` or `grants.hosts` that does not parse.
    pub fn new(policy: &SecurityPolicy) -> Result<Self, HostPatternError> {
        Ok(Self::from_guard(AddressGuard::new(policy)?))
    }

    /// Uses an existing guard.
    pub fn from_guard(guard: AddressGuard) -> Self {
        SandboxGuard { guard }
    }
}

#[async_trait::async_trait]
impl Interceptor for SandboxGuard {
    async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
        self.before_now(req)
    }

    /// What `before` does: the checks wait for nothing, so the client calls it in place (see
    /// [`Hooks::BEFORE_NOW`]).
    fn before_now(&self, req: &mut NetRequest) -> Result<(), NetError> {
        // The runtime's URL rules: numeric host forms that slip past filters are refused here.
        let url = req.validate(u64::MAX)?;
        match url.host() {
            Some(Host::Domain(name)) => self.guard.check_host(name)?,
            Some(Host::Ipv4(ip)) => {
                let host = ip.to_string();
                self.guard.check_host(&host)?;
                self.guard.check_addr(&host, ip.into())?;
            }
            Some(Host::Ipv6(ip)) => {
                let host = ip.to_string();
                self.guard.check_host(&host)?;
                self.guard.check_addr(&host, ip.into())?;
            }
            None => return Err(NetError::invalid_request("the URL has no host")),
        }
        Ok(())
    }

    fn hooks(&self) -> Hooks {
        Hooks::BEFORE_NOW
    }

    fn name(&self) -> &'static str {
        "sandbox_guard"
    }
}

#[cfg(test)]
mod tests {
    use soulbase_net_core::ErrorKind;

    use super::*;

    async fn check(policy: &SecurityPolicy, url: &str) -> Result<(), NetError> {
        SandboxGuard::new(policy)
            .unwrap()
            .before(&mut NetRequest::get(url))
            .await
    }

    #[tokio::test]
    async fn literal_addresses_and_the_allow_list() {
        let default = SecurityPolicy::default();
        for url in [
            "http://169.254.169.254/",
            "http://127.0.0.1:8080/",
            "http://10.0.0.1/",
            "http://[::1]/",
            "http://[::ffff:169.254.169.254]/",
        ] {
            let err = check(&default, url).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Blocked, "{url}");
            assert_eq!(err.code().as_str(), "AUTH.FORBIDDEN");
        }
        assert!(check(&default, "https://93.184.215.14/").await.is_ok());
        assert!(check(&default, "https://api.example.com/").await.is_ok());
        // Numeric forms are refused as the runtime refuses them.
        let err = check(&default, "http://0x7f.1/").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);

        let mut listed = SecurityPolicy::default();
        listed.allow_hosts = Some(vec!["*.example.com".to_owned()]);
        assert!(check(&listed, "https://api.example.com/").await.is_ok());
        let err = check(&listed, "https://api.example.org/")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Blocked);
    }
}
