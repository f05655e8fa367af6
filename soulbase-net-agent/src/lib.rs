//! The probe agent of seed 002 and the control plane it talks to: tasks created by an
//! operator, leased to agents, probed, and their observations reported and kept.
//!
//! - [`protocol`]: the wire types with the seed's names (`TaskKind`, `TaskSpec`, `Lease`,
//!   `ClaimRequest`/`ClaimResponse`, `ExtendRequest`, `ReportRequest`/`ReportResponse`,
//!   `HeartbeatRequest`, `RegisterRequest`, observations as any JSON value with an optional
//!   unit), `snake_case` JSON; the schema is in `docs/agent.md`.
//! - [`control`]: the control plane — [`ControlPlane`](control::ControlPlane), an HTTP service
//!   (hyper) over SQLite (embedded, the default) or PostgreSQL (the `postgres` feature, for
//!   several control-plane instances on one database; claims take `FOR UPDATE SKIP LOCKED`):
//!   agents register with a per-agent token, claim batches of due tasks sized by their free
//!   capacity, extend and report under leases fenced by a random token and timed on the
//!   database's clock (the lease discipline of `soulbase_net_store::lease`), so a report of a
//!   stale or foreign lease changes nothing and a task is recorded done once; an agent whose
//!   heartbeats stop is marked stale and its leases return to the queue; operators create
//!   tasks (one-off or every N seconds), revoke leases, cancel tasks and read results and
//!   agents; `/metrics` and `/health`.
//! - [`agent`]: the agent — [`agent::start`] with an [`AgentConfig`](agent::AgentConfig) (a
//!   struct, the seed's environment variables, or a TOML file): register or resume,
//!   heartbeat, a claim loop with back-off and backpressure, per-kind bounded queues, AIMD
//!   windows at three levels (global, per kind, per target) on the runtime's limiter
//!   (`soulbase_net_runtime::layer::AimdLimit`), one timer service for back-offs, heartbeats
//!   and extensions (warning on its depth and lag), a lease extender that cancels the probe of
//!   a lease lost or run out (never reported done), and a reporter that retries until
//!   acknowledged. Its calls go through the soulbase-net client
//!   ([`ControlClient`](agent::ControlClient)); its metrics are served on request
//!   ([`serve_metrics`](agent::AgentHandle::serve_metrics)).
//! - [`workers`]: the probes — HTTP (the soulbase-net client under the agent's probe policy:
//!   its address guard, limits and the task's own timeouts), TCP connect (time to connect),
//!   DNS (A, AAAA, MX, NS, TXT through hickory, EDNS, TCP fallback on truncation), ping (ICMP
//!   echo: RTTs, loss) and trace (TTL-limited echo probes: hops with their RTTs) over raw ICMP
//!   sockets (root or `CAP_NET_RAW`; without it, a `permission` error observation).
//! - [`forwarder`]: the UDP DNS forwarder — each query sent upstream unchanged on a socket
//!   of its own, its answer returned with the original id, `AGENT_MAX_INFLIGHT` at most at
//!   once, a query left unanswered past the upstream timeout logged; latency measured.
//!
//! The binary `soulbase-net-agent` runs either side: `soulbase-net-agent control` (the
//! control plane) or `soulbase-net-agent agent` (an agent, configured from the environment),
//! and `soulbase-net-agent probe '<task spec JSON>'` runs one probe and prints its result.
//!
//! # Examples
//! ```no_run
//! # async fn run() -> Result<(), soulbase_net_core::NetError> {
//! use soulbase_net_agent::agent::{self, AgentConfig};
//! use soulbase_net_agent::control::{ControlConfig, ControlPlane};
//! use soulbase_net_agent::protocol::{CreateTask, TaskSpec};
//!
//! let control = ControlPlane::start(ControlConfig::default()).await?;
//! let task = control
//!     .create_task(CreateTask {
//!         spec: TaskSpec::Tcp { host: "127.0.0.1".into(), port: 22, timeout_ms: Some(500) },
//!         every_secs: Some(30),
//!         id: None,
//!     })
//!     .await?;
//! let agent = agent::start(AgentConfig::new(control.url(), "probe-1", "a-long-secret")).await?;
//! // … later: the task's last observations.
//! let view = control.task(&task).await?;
//! # let _ = view;
//! agent.shutdown(std::time::Duration::from_secs(5)).await;
//! # Ok(()) }
//! ```

pub mod agent;
pub mod control;
pub mod forwarder;
pub mod protocol;
pub mod workers;
