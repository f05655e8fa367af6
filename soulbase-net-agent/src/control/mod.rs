//! The control plane: an HTTP service (hyper) over SQLite or PostgreSQL (sqlx) that agents
//! register with, claim leased tasks from, extend their leases at, and report to; and that
//! operators create, revoke, cancel and read tasks through.
//!
//! It owns the tasks, their leases and their results; it never runs a probe. Several
//! instances can share one PostgreSQL database (cargo feature `postgres`): claims take their
//! rows `FOR UPDATE SKIP LOCKED`, leases are fenced by a token and timed on the database's
//! clock, and every report and reschedule is conditional, so a task is held by one lease at a
//! time and reported once whichever instances the agents talk to.
//!
//! An agent whose heartbeats stop ([`ControlConfig::missed_heartbeats`] intervals without one)
//! is found stale by a sweep each instance runs: its leases are returned to the queue at once
//! (their tokens gone, so its late extensions and reports are refused) and it is given no more
//! until it beats again.
//!
//! Agent endpoints (headers `X-Agent-Id` and `X-Agent-Token`, JSON bodies of
//! [`protocol`](crate::protocol)):
//!
//! - `POST /v1/agents/register` ([`RegisterRequest`]) → [`RegisterResponse`]: the first
//!   registration of an id binds its token (stored as a SHA-256 hash); a later one with the
//!   same token resumes the session, with another token is refused (403);
//! - `POST /v1/agents/heartbeat` ([`HeartbeatRequest`]) → [`HeartbeatResponse`];
//! - `POST /v1/leases/claim` ([`ClaimRequest`]) → [`ClaimResponse`];
//! - `POST /v1/leases/extend` ([`ExtendRequest`]) → [`ExtendResponse`];
//! - `POST /v1/leases/report` ([`ReportRequest`]) → [`ReportResponse`].
//!
//! Operator endpoints (`Authorization: Bearer <admin token>` when one is configured):
//!
//! - `POST /v1/tasks` ([`CreateTask`]) → [`CreateTaskResponse`] (400 for an id taken);
//! - `GET /v1/tasks/{id}` → [`TaskView`]; `GET /v1/tasks/{id}/results?limit=N` →
//!   [`TaskResults`]; `DELETE /v1/tasks/{id}` cancels the task;
//! - `POST /v1/leases/{lease_id}/revoke`: the task is unleased and due again; its holder
//!   learns it at its next extension and stops;
//! - `GET /v1/agents` → [`AgentList`]: every agent, live or stale, with the leases it holds.
//!
//! And `GET /health`, `GET /metrics` (Prometheus text).
//!
//! [`RegisterRequest`]: crate::protocol::RegisterRequest
//! [`RegisterResponse`]: crate::protocol::RegisterResponse
//! [`HeartbeatRequest`]: crate::protocol::HeartbeatRequest
//! [`HeartbeatResponse`]: crate::protocol::HeartbeatResponse
//! [`ClaimRequest`]: crate::protocol::ClaimRequest
//! [`ClaimResponse`]: crate::protocol::ClaimResponse
//! [`ExtendRequest`]: crate::protocol::ExtendRequest
//! [`ExtendResponse`]: crate::protocol::ExtendResponse
//! [`ReportRequest`]: crate::protocol::ReportRequest
//! [`ReportResponse`]: crate::protocol::ReportResponse
//! [`CreateTask`]: crate::protocol::CreateTask
//! [`CreateTaskResponse`]: crate::protocol::CreateTaskResponse
//! [`TaskView`]: crate::protocol::TaskView
//! [`TaskResults`]: crate::protocol::TaskResults

mod agents;
mod http;
mod location;
mod metrics;
mod sql;
mod store;
mod sweep;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use soulbase_net_core::{ErrorKind, NetError};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use self::agents::{AgentList, AgentState, AgentView};
use self::location::Location;
use self::metrics::Metrics;
use self::store::TaskStore;
use crate::protocol::{CreateTask, TaskResult, TaskView};

/// How a control plane runs. Its `Debug` leaves the admin token out.
#[derive(Clone)]
#[non_exhaustive]
pub struct ControlConfig {
    /// Where it listens. Default is `127.0.0.1:0` (a free loopback port).
    pub listen: SocketAddr,
    /// The database: a SQLite file's path (or `sqlite:PATH`), or a PostgreSQL URL
    /// (`postgres://user[:password]@host[:port]/database`, cargo feature `postgres`) that
    /// several instances can share. Default is none: SQLite in memory, gone when the control
    /// plane stops.
    pub database: Option<PathBuf>,
    /// How long a lease holds without extension. Default is 10 seconds.
    pub lease: Duration,
    /// How often agents are told to beat. Default is 5 seconds (the seed's).
    pub heartbeat_every: Duration,
    /// How many heartbeat intervals without a heartbeat make an agent stale: its leases are
    /// returned to the queue and it is given none until it beats again. Default is 3 (at
    /// least 1); see [`stale_after`](Self::stale_after).
    pub missed_heartbeats: u32,
    /// The token the operator endpoints need (`Authorization: Bearer …`). Default is none:
    /// they are open, for a control plane on loopback.
    pub admin_token: Option<String>,
}

impl std::fmt::Debug for ControlConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlConfig")
            .field("listen", &self.listen)
            .field(
                "database",
                &self.database.as_deref().map(|p| match p.to_str() {
                    Some(text) => location::redacted(text),
                    None => p.display().to_string(),
                }),
            )
            .field("lease", &self.lease)
            .field("heartbeat_every", &self.heartbeat_every)
            .field("missed_heartbeats", &self.missed_heartbeats)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            database: None,
            lease: Duration::from_secs(10),
            heartbeat_every: Duration::from_secs(5),
            missed_heartbeats: 3,
            admin_token: None,
        }
    }
}

impl ControlConfig {
    /// Sets [`listen`](Self::listen).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Sets [`database`](Self::database): a SQLite file's path, `sqlite:PATH`, or a
    /// PostgreSQL URL (`postgres://…`).
    pub fn database(mut self, location: impl Into<PathBuf>) -> Self {
        self.database = Some(location.into());
        self
    }

    /// Sets [`lease`](Self::lease).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets [`heartbeat_every`](Self::heartbeat_every).
    pub fn heartbeat_every(mut self, every: Duration) -> Self {
        self.heartbeat_every = every;
        self
    }

    /// Sets [`missed_heartbeats`](Self::missed_heartbeats) (at least 1).
    pub fn missed_heartbeats(mut self, n: u32) -> Self {
        self.missed_heartbeats = n.max(1);
        self
    }

    /// How long after its last heartbeat (or registration) an agent is stale:
    /// [`missed_heartbeats`](Self::missed_heartbeats) × [`heartbeat_every`](Self::heartbeat_every).
    /// Its leases are back in the queue within this plus a quarter of it (the sweep's
    /// period).
    pub fn stale_after(&self) -> Duration {
        self.heartbeat_every
            .saturating_mul(self.missed_heartbeats.max(1))
    }

    /// How often each instance sweeps for stale agents: a quarter of
    /// [`stale_after`](Self::stale_after), at least 10 ms.
    fn sweep_every(&self) -> Duration {
        (self.stale_after() / 4).max(Duration::from_millis(10))
    }

    /// Sets [`admin_token`](Self::admin_token).
    pub fn admin_token(mut self, token: impl Into<String>) -> Self {
        self.admin_token = Some(token.into());
        self
    }
}

/// What the HTTP handlers share.
#[derive(Debug)]
struct Inner {
    store: TaskStore,
    config: ControlConfig,
    metrics: Metrics,
}

/// A running control plane. Stops when [`shutdown`](Self::shutdown) or dropped.
///
/// Besides HTTP, it offers the operator's calls in process ([`create_task`](Self::create_task),
/// [`task`](Self::task), [`results`](Self::results), [`revoke`](Self::revoke),
/// [`cancel`](Self::cancel)) — the same code the endpoints run.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), soulbase_net_core::NetError> {
/// use soulbase_net_agent::control::{ControlConfig, ControlPlane};
/// use soulbase_net_agent::protocol::{CreateTask, TaskSpec, TaskState};
///
/// let control = ControlPlane::start(ControlConfig::default()).await?;
/// let id = control
///     .create_task(CreateTask {
///         spec: TaskSpec::Tcp { host: "127.0.0.1".into(), port: 9, timeout_ms: None },
///         every_secs: None,
///         id: Some("t1".into()),
///     })
///     .await?;
/// let task = control.task(&id).await?.expect("stored");
/// assert_eq!(task.state, TaskState::Pending);
/// assert!(control.url().starts_with("http://127.0.0.1:"));
/// control.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ControlPlane {
    addr: SocketAddr,
    inner: Arc<Inner>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    sweeper: Option<JoinHandle<()>>,
}

impl ControlPlane {
    /// Opens the store (creating or migrating its schema) and starts serving, and sweeping
    /// for stale agents.
    ///
    /// # Errors
    /// `Io` when the database cannot be opened or migrated or the address bound;
    /// `InvalidRequest` for a database URL this build does not know (PostgreSQL without the
    /// `postgres` feature, another scheme).
    pub async fn start(config: ControlConfig) -> Result<Self, NetError> {
        let location = Location::of(config.database.as_deref())?;
        let store = TaskStore::open(&location, config.lease).await?;
        let listener = TcpListener::bind(config.listen).await.map_err(|e| {
            NetError::new(ErrorKind::Io)
                .with_message(format!("control plane: cannot listen on {}", config.listen))
                .with_source(e)
        })?;
        let addr = listener.local_addr().map_err(|e| {
            NetError::new(ErrorKind::Io)
                .with_message("control plane: no local address")
                .with_source(e)
        })?;
        let inner = Arc::new(Inner {
            store,
            config,
            metrics: Metrics::default(),
        });
        let (stop, stopped) = watch::channel(false);
        let sweeper = tokio::spawn(sweep::run(inner.clone(), stopped.clone()));
        let task = tokio::spawn(http::serve(inner.clone(), listener, stopped));
        tracing::info!(%addr, database = ?location, "control plane listening");
        Ok(Self {
            addr,
            inner,
            stop,
            task: Some(task),
            sweeper: Some(sweeper),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, the base URL agents are given.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stores a task; its id.
    ///
    /// # Errors
    /// `InvalidRequest` when the id is taken or `every_secs` is 0; `Io` when the store
    /// fails.
    pub async fn create_task(&self, task: CreateTask) -> Result<String, NetError> {
        create_task(&self.inner, task).await
    }

    /// The task `id` with its last result, if there is such a task.
    ///
    /// # Errors
    /// `Io` when the store fails.
    pub async fn task(&self, id: &str) -> Result<Option<TaskView>, NetError> {
        self.inner.store.task(id).await
    }

    /// The results of task `id`, newest first, at most `limit`.
    ///
    /// # Errors
    /// `Io` when the store fails.
    pub async fn results(&self, id: &str, limit: u32) -> Result<Vec<TaskResult>, NetError> {
        self.inner.store.results(id, limit).await
    }

    /// Revokes a lease: its task is due again, its holder stops at its next extension.
    /// Whether there was such a lease.
    ///
    /// # Errors
    /// `Io` when the store fails.
    pub async fn revoke(&self, lease_id: &str) -> Result<bool, NetError> {
        let revoked = self.inner.store.revoke(lease_id).await?;
        if revoked {
            Metrics::add(&self.inner.metrics.revoked);
        }
        Ok(revoked)
    }

    /// Every agent, by id: live, or stale when not heard from within
    /// [`ControlConfig::stale_after`], with the leases it holds.
    ///
    /// # Errors
    /// `Io` when the store fails.
    pub async fn agents(&self) -> Result<Vec<AgentView>, NetError> {
        self.inner
            .store
            .agents(self.inner.config.stale_after())
            .await
    }

    /// Cancels a task (and its lease); whether there was such a task not yet cancelled.
    ///
    /// # Errors
    /// `Io` when the store fails.
    pub async fn cancel(&self, task_id: &str) -> Result<bool, NetError> {
        self.inner.store.cancel(task_id).await
    }

    /// Stops serving and sweeping, and waits for their tasks to end.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for task in [self.task.take(), self.sweeper.take()]
            .into_iter()
            .flatten()
        {
            let _ = task.await;
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for task in [&self.task, &self.sweeper].into_iter().flatten() {
            task.abort();
        }
    }
}

/// A random id: 128 bits from the system's generator, in hex.
pub(crate) fn random_id() -> String {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 16];
    // The system generator does not fail on the platforms this builds for; if it did, the
    // fallback is still unique within the process.
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        bytes[..8].copy_from_slice(&fastrand::u64(..).to_le_bytes());
        bytes[8..].copy_from_slice(&fastrand::u64(..).to_le_bytes());
    }
    hex(&bytes)
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The stored form of an agent's token: its SHA-256, in hex.
fn token_hash(token: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref())
}

async fn create_task(inner: &Inner, task: CreateTask) -> Result<String, NetError> {
    if task.every_secs == Some(0) {
        return Err(NetError::invalid_request("every_secs must be at least 1"));
    }
    let id = task.id.unwrap_or_else(random_id);
    if id.is_empty() || id.len() > 200 {
        return Err(NetError::invalid_request("a task id is 1 to 200 bytes"));
    }
    let every = task.every_secs.map(Duration::from_secs);
    if !inner.store.create(&id, &task.spec, every).await? {
        return Err(NetError::invalid_request(format!(
            "task `{id}` exists already"
        )));
    }
    Metrics::add(&inner.metrics.created);
    Ok(id)
}
