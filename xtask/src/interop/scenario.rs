//! What every scenario shares (the groups themselves are run by `super::all`): the client as a user builds it (a `NetPolicy` that grants only
//! loopback and names dnsmasq as the name server, the run's CA as an extra root), an observer
//! that counts attempts and retry delays, and short descriptions of outcomes.

use std::{sync::Arc, time::Duration};

use parking_lot::Mutex;
use soulbase_net_core::{NetError, NetEvent, NetResponse, Observer};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::{Client, ClientBuilder};

use super::{peers::Layout, Setup};

/// The policy normal scenarios use: private addresses denied except the granted loopback
/// network, names resolved only by dnsmasq, the run's CA trusted, short backoff.
pub(crate) fn policy(layout: &Layout, setup: &Setup) -> NetPolicy {
    let mut p = NetPolicy::default();
    p.security.deny_private = true;
    if let Ok(net) = "127.0.0.0/8".parse() {
        p.security.grants.cidrs = vec![net];
    }
    p.dns.nameservers = vec![layout.dns];
    p.dns.timeout = Duration::from_secs(2);
    p.tls.extra_roots_pem = vec![setup.pki.ca_pem.clone()];
    p.retry.backoff.base = Duration::from_millis(20);
    p.retry.backoff.cap = Duration::from_millis(200);
    p.timeout.connect = Duration::from_secs(2);
    p.timeout.ttfb = Duration::from_secs(5);
    p.timeout.read = Duration::from_secs(5);
    p.timeout.attempt = Duration::from_secs(8);
    p.timeout.total = Duration::from_secs(30);
    p
}

/// Attempts started and retry delays seen by one client.
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    started: Mutex<u32>,
    delays: Mutex<Vec<Duration>>,
}

impl Observer for Attempts {
    fn on_event(&self, ev: &NetEvent<'_>) {
        match ev {
            NetEvent::AttemptStarted { .. } => *self.started.lock() += 1,
            NetEvent::RetryScheduled { delay, .. } => self.delays.lock().push(*delay),
            _ => {}
        }
    }
}

impl Attempts {
    /// Attempts started so far.
    pub(crate) fn count(&self) -> u32 {
        *self.started.lock()
    }

    /// Retry delays so far.
    pub(crate) fn delays(&self) -> Vec<Duration> {
        self.delays.lock().clone()
    }
}

/// A client for `policy` with an attempt counter; `edit` adds interceptors and options.
pub(crate) fn client_with(
    policy: NetPolicy,
    edit: impl FnOnce(ClientBuilder) -> ClientBuilder,
) -> Result<(Client, Arc<Attempts>), String> {
    let attempts = Arc::new(Attempts::default());
    let builder = Client::builder().policy(policy).observer(attempts.clone());
    let client = edit(builder)
        .build()
        .map_err(|e| format!("building the client: {e}"))?;
    Ok((client, attempts))
}

/// A client for `policy`.
pub(crate) fn client(policy: NetPolicy) -> Result<(Client, Arc<Attempts>), String> {
    client_with(policy, |b| b)
}

/// `status N` for a response (after `error_for_status`: `kind CODE`), `kind CODE` for an error.
pub(crate) fn outcome(r: &Result<NetResponse, NetError>) -> String {
    match r {
        Ok(res) => match res.error_for_status_ref() {
            Ok(_) => format!("status {}", res.status.as_u16()),
            Err(e) => format!("status {} ({})", res.status.as_u16(), e.code()),
        },
        Err(e) => error(e),
    }
}

/// `kind CODE`.
pub(crate) fn error(e: &NetError) -> String {
    format!("{} {}", e.kind().label(), e.code())
}

/// Lines of a log file (empty when it cannot be read).
pub(crate) fn log_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Waits until `f` holds, polling every 50ms for at most `limit` (log files are written a
/// moment after the response).
pub(crate) async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
