//! The control plane and agents end to end over loopback: the control plane's API and lease
//! fencing (`control`), agents running probes against the testkit's servers
//! (`pipeline`), and the UDP DNS forwarder (`forwarder`). DNS goes to the testkit's MockDns
//! or a dnsmasq started on loopback only, never to the system resolver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod binary;
mod control;
mod fleet;
mod forwarder;
mod load;
mod netns;
mod ns;
mod pipeline;
mod postgres;
mod process;
mod records;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use soulbase_net_agent::agent::{self, AgentConfig, AgentHandle};
use soulbase_net_agent::control::{ControlConfig, ControlPlane};
use soulbase_net_agent::protocol::{
    CreateTask, Observation, ReportStatus, TaskResult, TaskSpec, TaskState, TaskView,
};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use tokio::time::Instant;

/// A control plane on loopback with leases of `lease`, in memory.
async fn control_plane(lease: Duration) -> ControlPlane {
    ControlPlane::start(
        ControlConfig::default()
            .lease(lease)
            .heartbeat_every(Duration::from_millis(200)),
    )
    .await
    .unwrap()
}

/// An agent's configuration for tests: quick heartbeats and back-offs, DNS on `dns` only,
/// and HTTP probes granted `127.0.0.1` (and nothing else private).
fn agent_config(control: &ControlPlane, id: &str, dns: SocketAddr) -> AgentConfig {
    let mut config = AgentConfig::new(control.url(), id, format!("token-of-{id}"));
    config.heartbeat_every = Duration::from_millis(200);
    config.claim_backoff_min = Duration::from_millis(10);
    config.claim_backoff_max = Duration::from_millis(100);
    config.call_timeout = Duration::from_secs(3);
    config.dns_servers = vec![dns];
    let mut policy = AgentConfig::default_probe_policy();
    policy.security.grants.cidrs = vec!["127.0.0.1/32".parse().unwrap()];
    policy.dns.timeout = Duration::from_secs(2);
    config.probe_policy = policy;
    config
}

/// Starts an agent with [`agent_config`].
async fn start_agent(control: &ControlPlane, id: &str, dns: SocketAddr) -> AgentHandle {
    agent::start(agent_config(control, id, dns)).await.unwrap()
}

/// An HTTP client that may reach `127.0.0.1` (and nothing else private): an operator's or a
/// metrics scraper's.
fn loopback_client() -> Client {
    let mut policy = NetPolicy::default();
    policy.security.grants.cidrs = vec!["127.0.0.1/32".parse().unwrap()];
    Client::builder().policy(policy).build().unwrap()
}

/// Creates a one-off task `id` running `spec`.
async fn task(control: &ControlPlane, id: &str, spec: TaskSpec) -> String {
    control
        .create_task(CreateTask {
            spec,
            every_secs: None,
            id: Some(id.to_owned()),
        })
        .await
        .unwrap()
}

/// Task `id` as the control plane sees it now (it exists).
async fn view(control: &ControlPlane, id: &str) -> TaskView {
    control.task(id).await.unwrap().unwrap()
}

/// Polls `check` every 10 ms until it gives a value, for at most `within`; panics naming
/// `what` past it. For state that only the control plane's database holds (no event to
/// await).
async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until task `id` is done; its only result.
async fn done(control: &ControlPlane, id: &str) -> TaskResult {
    eventually(
        &format!("task {id} done"),
        Duration::from_secs(20),
        || async {
            let view = control.task(id).await.unwrap()?;
            (view.state == TaskState::Done).then_some(())
        },
    )
    .await;
    let results = control.results(id, 10).await.unwrap();
    assert_eq!(
        results.len(),
        1,
        "task {id} is reported done once: {results:?}"
    );
    results.into_iter().next().unwrap()
}

/// Waits until task `id` is done (as [`done`]) and checks that `agent` reported it `Ok`; its
/// result.
async fn done_ok_by(control: &ControlPlane, id: &str, agent: &str) -> TaskResult {
    let r = done(control, id).await;
    assert_eq!(r.agent_id, agent, "{r:?}");
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    r
}

/// Checks that task `id` is done already, claimed once and reported once, by `agent`, `Ok`.
async fn done_once_by(control: &ControlPlane, id: &str, agent: &str) {
    let v = view(control, id).await;
    assert_eq!(
        (v.state, v.claims, v.results),
        (TaskState::Done, 1, 1),
        "{v:?}"
    );
    done_ok_by(control, id, agent).await;
}

/// The observation `name` of `result`.
fn obs<'a>(result: &'a TaskResult, name: &str) -> &'a Observation {
    result
        .observations
        .iter()
        .find(|o| o.name == name)
        .unwrap_or_else(|| panic!("no observation `{name}` in {result:?}"))
}
