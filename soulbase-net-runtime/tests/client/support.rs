//! Shared helpers: a dialer that records every address and refuses anything off loopback,
//! an observer that keeps events, and a policy that lets loopback through the guard.

use std::{net::SocketAddr, sync::Arc};

use parking_lot::Mutex;
use soulbase_net_core::{NetEvent, Observer};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::{Client, DialFuture, Dialer, TcpDialer};

/// Records each address it is asked to dial; refuses (without dialling) any that is not
/// loopback, so a broken guard fails the test instead of reaching the network.
#[derive(Debug, Default)]
pub(crate) struct RecordingDialer {
    pub(crate) dialled: Mutex<Vec<SocketAddr>>,
}

impl Dialer for RecordingDialer {
    fn dial(&self, addr: SocketAddr) -> DialFuture {
        self.dialled.lock().push(addr);
        if !addr.ip().is_loopback() {
            return Box::pin(async move {
                Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("test dialer refuses non-loopback {addr}"),
                ))
            });
        }
        TcpDialer.dial(addr)
    }
}

impl RecordingDialer {
    pub(crate) fn non_loopback(&self) -> Vec<SocketAddr> {
        self.dialled
            .lock()
            .iter()
            .copied()
            .filter(|a| !a.ip().is_loopback())
            .collect()
    }
}

/// Keeps a short description of every event.
#[derive(Debug, Default)]
pub(crate) struct Events {
    pub(crate) seen: Mutex<Vec<String>>,
}

impl Observer for Events {
    fn on_event(&self, ev: &NetEvent<'_>) {
        let line = match ev {
            NetEvent::RequestStarted { req } => format!("start {} {}", req.method, req.host),
            NetEvent::AttemptStarted { attempt, .. } => format!("attempt {attempt}"),
            NetEvent::AttemptFinished {
                attempt, outcome, ..
            } => {
                format!("attempt {attempt} {}", outcome.label())
            }
            NetEvent::Blocked { addr, rule, .. } => format!("blocked {addr:?} {rule}"),
            NetEvent::TimedOut { phase, .. } => format!("timeout {phase}"),
            NetEvent::DnsResolved { host, source, .. } => format!("dns {host} {source:?}"),
            NetEvent::Bytes { dir, bytes, .. } => format!("bytes {} {bytes}", dir.as_str()),
            NetEvent::RequestFinished {
                outcome, attempts, ..
            } => {
                format!("finish {} {attempts}", outcome.label())
            }
            NetEvent::BreakerTransition { key, from, to } => {
                format!("BreakerTransition {key} {from:?} -> {to:?}")
            }
            other => format!("{other:?}"),
        };
        self.seen.lock().push(line);
    }
}

/// The default policy with loopback granted, so tests can reach the testkit.
pub(crate) fn loopback_policy() -> NetPolicy {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
    p
}

pub(crate) struct Harness {
    pub(crate) client: Client,
    pub(crate) dialer: Arc<RecordingDialer>,
    pub(crate) events: Arc<Events>,
}

pub(crate) fn harness(policy: NetPolicy) -> Harness {
    harness_with(policy, |b| b)
}

pub(crate) fn harness_with(
    mut policy: NetPolicy,
    edit: impl FnOnce(soulbase_net_runtime::ClientBuilder) -> soulbase_net_runtime::ClientBuilder,
) -> Harness {
    // Never the system resolver (its name server is not on loopback): a test that needs
    // names gives MockDns; any other name lookup goes to a closed loopback port and fails.
    if policy.dns.nameservers.is_empty() {
        policy.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
        policy.dns.timeout = std::time::Duration::from_millis(500);
    }
    let dialer = Arc::new(RecordingDialer::default());
    let events = Arc::new(Events::default());
    let builder = Client::builder()
        .policy(policy)
        .dialer(dialer.clone())
        .observer(events.clone());
    let client = edit(builder).build().unwrap();
    Harness {
        client,
        dialer,
        events,
    }
}

/// Every test that uses it finishes within this bound, or fails.
const LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Runs `f` within [`LIMIT`]; fails the test when it takes longer.
pub(crate) async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test exceeded its time bound")
}
