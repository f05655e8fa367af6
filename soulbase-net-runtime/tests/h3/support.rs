//! Shared helpers: a CertKit-trusting HTTP/3 policy, FaultServers on QUIC, a bound on time.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use soulbase_net_policy::{HttpVersionPolicy, NetPolicy};
use soulbase_net_runtime::{testing::LoopbackDialer, Client};
use soulbase_net_testkit::{CertKit, FaultServer, FaultServerBuilder, Script};

/// Every test finishes within this bound, or fails.
const LIMIT: Duration = Duration::from_secs(20);

/// Runs `f` within [`LIMIT`]; fails the test when it takes longer.
pub(crate) async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test exceeded its time bound")
}

/// A policy for `version`: loopback granted, the kit's root trusted, no system resolver,
/// short backoff.
pub(crate) fn policy(kit: &CertKit, version: HttpVersionPolicy) -> NetPolicy {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
    p.tls.extra_roots_pem = vec![kit.root_pem()];
    p.http.version = version;
    // Never the system resolver: any name lookup goes to a closed loopback port.
    p.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    p.dns.timeout = Duration::from_millis(500);
    p.dns.prefetch.clear();
    p.retry.backoff.base = Duration::from_millis(1);
    p.retry.backoff.cap = Duration::from_millis(10);
    p
}

/// A client under `policy`, reaching loopback only (over TCP and QUIC alike).
pub(crate) fn client(policy: NetPolicy) -> Client {
    client_with(policy, Arc::new(LoopbackDialer::default()))
}

/// A client under `policy` whose sockets go through `dialer`.
pub(crate) fn client_with(policy: NetPolicy, dialer: Arc<LoopbackDialer>) -> Client {
    Client::builder()
        .policy(policy)
        .dialer(dialer)
        .build()
        .unwrap()
}

/// A TLS FaultServer builder with the kit's `localhost` certificate, serving HTTP/3 too.
pub(crate) fn h3_server(kit: &CertKit) -> FaultServerBuilder {
    let leaf = kit.localhost().unwrap();
    FaultServer::builder()
        .tls(leaf.server_config().unwrap())
        .http3()
}

/// An HTTP/3 (and TCP) FaultServer answering `path` by `script`, started.
pub(crate) async fn serving(kit: &CertKit, path: &str, script: impl Into<Script>) -> FaultServer {
    h3_server(kit).route(path, script).start().await.unwrap()
}
