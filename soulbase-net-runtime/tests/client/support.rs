//! Shared helpers: the runtime's test dialer (every address recorded, nothing off loopback),
//! an observer that keeps events, and a policy that lets loopback through the guard.

use std::sync::Arc;

use parking_lot::Mutex;
use soulbase_net_core::{NetEvent, Observer};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;

pub(crate) use soulbase_net_runtime::testing::LoopbackDialer as RecordingDialer;

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

/// A route a hedge wins: the first request is answered `slow` after 3 s, every later one
/// `fast` at once.
pub(crate) fn slow_then_fast() -> soulbase_net_testkit::Script {
    soulbase_net_testkit::Script::reply(
        soulbase_net_testkit::Reply::ok("slow").delay(std::time::Duration::from_secs(3)),
    )
    .times(1)
    .then(soulbase_net_testkit::Reply::ok("fast"))
}
