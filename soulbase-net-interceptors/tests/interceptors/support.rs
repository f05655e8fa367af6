//! A client that can reach only loopback, with the interceptors under test.

use std::sync::Arc;

use soulbase_net_core::Interceptor;
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;

pub(crate) use soulbase_net_runtime::testing::LoopbackDialer as RecordingDialer;

/// The default policy with loopback granted and the system resolver out of reach.
pub(crate) fn loopback_policy() -> NetPolicy {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
    p.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    p.dns.timeout = std::time::Duration::from_millis(500);
    p
}

/// A client with `interceptors`, the loopback policy edited by `edit`, and its dialer.
pub(crate) fn client_with(
    interceptors: Vec<Arc<dyn Interceptor>>,
    edit: impl FnOnce(&mut NetPolicy),
) -> (Client, Arc<RecordingDialer>) {
    let mut policy = loopback_policy();
    edit(&mut policy);
    let dialer = Arc::new(RecordingDialer::default());
    let client = Client::builder()
        .policy(policy)
        .dialer(dialer.clone())
        .interceptors(interceptors)
        .build()
        .unwrap();
    (client, dialer)
}

/// A client with `interceptors` and the loopback policy.
pub(crate) fn client(interceptors: Vec<Arc<dyn Interceptor>>) -> Client {
    client_with(interceptors, |_| {}).0
}
