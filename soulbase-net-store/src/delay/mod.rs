//! Delay stores: where the delay server's tasks wait — persisted before the server
//! acknowledges them, claimed under a lease when due for a route the server holds a connection
//! for, deleted on the client's acknowledgement, and due again after a retry delay when a
//! delivery failed. [`SqliteDelayStore`] is the embedded default (one file, WAL);
//! `PostgresDelayStore` (feature `postgres`) lets several servers share one table (each claims
//! only the routes it serves). [`open_delay_store`] opens either from a URL.
//!
//! The tasks follow the lease discipline of [`crate::lease`] and the outbox's durable-time
//! rules: every lease's end and every due-time comparison is on the store's clock, every change
//! a holder makes is fenced by its claim's token. A task's `fire_at` is the client's (epoch ms,
//! as the protocol gives it) and stays as given; `next_at`, when it is due next, starts there
//! and moves on by the retry delay after each failed delivery.

mod postgres;
mod sql;
mod sqlite;

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use soulbase_net_core::NetError;

#[cfg(feature = "postgres")]
pub use self::postgres::PostgresDelayStore;
pub use self::sqlite::SqliteDelayStore;

/// A task as the delay server keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelayTask {
    /// The task's id: the client's, or one the server made. Unique in the store.
    pub id: String,
    /// Where it is delivered: the connections registered for this route.
    pub route_key: String,
    /// When it fires, in ms since the epoch, as the client gave it.
    pub fire_at: i64,
    /// The payload's compression as the client named it (`none`, `lz4`, `zstd`).
    pub compression: String,
    /// The payload, as sent (compressed or not).
    pub payload: Bytes,
    /// Deliveries attempted so far.
    pub attempts: u32,
    /// The claim this copy was handed out under (0 when not claimed): it fences the holder.
    pub claim: i64,
    /// How long until it is due, as of the read, on the store's clock (zero when due or
    /// late): a server that claimed it ahead fires it then.
    pub due_in: Duration,
}

/// What [`DelayStore::schedule`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheduled {
    /// Stored.
    New,
    /// A task with this id was already stored; it is kept as it was.
    Duplicate,
}

/// Where the delay server's tasks live. Every method is one short transaction; an error is a
/// `NetError` saying what failed (kind `Io`, or `Timeout` past `op_timeout`).
#[async_trait::async_trait]
pub trait DelayStore: Send + Sync + std::fmt::Debug {
    /// Stores `tasks` and deletes the acknowledged `acks` (`(id, claim)` pairs, as
    /// [`ack`](Self::ack) does) in one transaction — one commit for what many connections
    /// sent meanwhile (group commit) — and returns after it: one result per task and per
    /// acknowledgement, in order.
    async fn write(
        &self,
        tasks: &[DelayTask],
        acks: &[(String, i64)],
    ) -> Result<(Vec<Scheduled>, Vec<bool>), NetError>;

    /// Stores `tasks` durably in one transaction (returns after the commit): one result per
    /// task, in order.
    async fn schedule(&self, tasks: &[DelayTask]) -> Result<Vec<Scheduled>, NetError> {
        Ok(self.write(tasks, &[]).await?.0)
    }

    /// Claims up to `limit` tasks due within `ahead` of now (the store's clock) whose route
    /// is one of `routes`, soonest due first, for `lease` (which should cover `ahead`); each
    /// says how long until it is due ([`DelayTask::due_in`]).
    async fn claim_due(
        &self,
        routes: &[String],
        limit: u32,
        lease: Duration,
        ahead: Duration,
    ) -> Result<Vec<DelayTask>, NetError>;

    /// Gives the task `id` back, due as it was and without counting an attempt, if `claim`
    /// still holds it (a server stopping with tasks it had claimed ahead).
    async fn release(&self, id: &str, claim: i64) -> Result<bool, NetError>;

    /// Extends the leases of `tasks` (`(id, claim)` pairs) to `lease` from now, each only while
    /// its claim holds it.
    async fn extend(&self, tasks: &[(String, i64)], lease: Duration) -> Result<(), NetError>;

    /// Deletes the task `id` if `claim` still holds it — or, with `claim` 0, whoever holds
    /// it (a client's acknowledgement of a delivery it received counts whatever the lease).
    /// Whether it was deleted.
    async fn ack(&self, id: &str, claim: i64) -> Result<bool, NetError> {
        let done = self.write(&[], &[(id.to_owned(), claim)]).await?.1;
        Ok(done.first().copied().unwrap_or(false))
    }

    /// A delivery of the task failed: it is due again `after` from now, its attempts counted,
    /// its lease released — if `claim` still holds it.
    async fn retry(&self, id: &str, claim: i64, after: Duration) -> Result<bool, NetError>;

    /// How long until the next task whose route is one of `routes` is due (zero when one is
    /// due now), if any.
    async fn next_due(&self, routes: &[String]) -> Result<Option<Duration>, NetError>;

    /// The task `id`, if stored.
    async fn get(&self, id: &str) -> Result<Option<DelayTask>, NetError>;

    /// Tasks waiting (claimed or not).
    async fn pending(&self) -> Result<u64, NetError>;

    /// Tasks whose `fire_at` has passed on the store's clock and that no client has
    /// acknowledged yet (an acknowledged task is deleted): delivered and waiting for the ack,
    /// waiting for a retry, or waiting for a connection of their route — on every server that
    /// shares the store.
    async fn due(&self) -> Result<u64, NetError>;
}

/// What a delay store is configured with.
#[derive(Clone, Debug)]
pub struct DelayStoreOptions {
    pub(crate) table: String,
    pub(crate) op_timeout: Duration,
}

impl Default for DelayStoreOptions {
    fn default() -> Self {
        Self {
            table: "delay_tasks".to_owned(),
            op_timeout: Duration::from_secs(30),
        }
    }
}

impl DelayStoreOptions {
    /// The table's name (default `delay_tasks`): letters, digits and `_`, not starting with a
    /// digit.
    ///
    /// # Errors
    /// `SCHEMA.VALIDATION_FAILED` for any other name.
    pub fn table(mut self, name: &str) -> Result<Self, NetError> {
        let valid = !name.is_empty()
            && name.len() <= 48
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(NetError::invalid_request(format!(
                "delay store: `{name}` is not a table name (letters, digits and _, at most 48)"
            )));
        }
        self.table = name.to_owned();
        Ok(self)
    }

    /// Longest a store operation may take (default 30 s; SQLite waits this long for its write
    /// lock).
    pub fn op_timeout(mut self, limit: Duration) -> Self {
        self.op_timeout = limit;
        self
    }
}

/// Opens the delay store `url` names: `postgres://…` (feature `postgres`), or a SQLite file
/// (`sqlite:PATH` or a path), created with its directory if missing.
///
/// # Errors
/// `Io` when it cannot be opened or migrated; `SCHEMA.VALIDATION_FAILED` for a PostgreSQL URL
/// without the `postgres` feature.
pub async fn open_delay_store(
    url: &str,
    options: DelayStoreOptions,
) -> Result<Arc<dyn DelayStore>, NetError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            let store = PostgresDelayStore::connect(url, options).await?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = options;
            return Err(NetError::invalid_request(
                "delay store: PostgreSQL needs the `postgres` feature",
            ));
        }
    }
    let path = url.strip_prefix("sqlite:").unwrap_or(url);
    if let Some(dir) = std::path::Path::new(path).parent() {
        if !dir.as_os_str().is_empty() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| crate::outbox::io(&format!("creating {}", dir.display()), e))?;
        }
    }
    Ok(Arc::new(SqliteDelayStore::open(path, options).await?))
}
