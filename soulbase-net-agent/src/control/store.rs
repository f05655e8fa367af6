//! The control plane's tables on SQLite (sqlx): agents, tasks and their leases, results.
//!
//! The lease discipline is the store crate's (`soulbase_net_store::lease`): a lease is a
//! random token drawn by the claim statement itself, and every extension, report and
//! revocation is conditional on it (and on the agent holding it); lease ends are computed in
//! the statements on SQLite's clock, never on an agent's; leases are short and extended by
//! their holder.
//!
//! One connection: SQLite has one writer at a time anyway, and every statement here is short,
//! so the pool serialises them rather than letting them meet `SQLITE_BUSY`.

use std::path::Path;
use std::time::Duration;

use soulbase_net_core::{ErrorKind, NetError};
use soulbase_net_store::lease::Lease as LeaseTime;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use crate::protocol::{
    Lease, LeaseReport, ReportStatus, TaskKind, TaskResult, TaskSpec, TaskState, TaskView,
};

/// SQLite's clock, in milliseconds since the Unix epoch (as the outbox's statements read it).
const NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// The schema: agents, tasks (with their current lease) and results.
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS agents (
        id TEXT PRIMARY KEY,
        token_hash TEXT NOT NULL,
        session INTEGER NOT NULL,
        info TEXT NOT NULL,
        registered_at INTEGER NOT NULL,
        last_seen INTEGER NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS tasks (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        spec TEXT NOT NULL,
        every_ms INTEGER,
        next_at INTEGER NOT NULL,
        state TEXT NOT NULL,
        lease_id TEXT,
        agent_id TEXT,
        lease_until INTEGER,
        claims INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS tasks_due ON tasks (state, kind, next_at)",
    "CREATE UNIQUE INDEX IF NOT EXISTS tasks_lease ON tasks (lease_id)",
    "CREATE TABLE IF NOT EXISTS results (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        task_id TEXT NOT NULL,
        lease_id TEXT NOT NULL UNIQUE,
        agent_id TEXT NOT NULL,
        status TEXT NOT NULL,
        observations TEXT NOT NULL,
        error TEXT,
        reported_at INTEGER NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS results_task ON results (task_id, seq)",
];

/// The control plane's store.
#[derive(Clone, Debug)]
pub(crate) struct TaskStore {
    pool: SqlitePool,
    lease_ms: i64,
}

/// What a registration found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Registered {
    /// Registered (`resumed`: the agent was known) in session `session`.
    Yes { session: u64, resumed: bool },
    /// The agent is known under another token.
    WrongToken,
}

/// What a report did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reported {
    /// Recorded now.
    Recorded,
    /// Recorded by an earlier copy of the same report.
    Duplicate,
    /// Changed nothing: the lease is not (or no longer) this agent's.
    Refused,
}

/// Counts for the metrics.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    pub(crate) pending: i64,
    pub(crate) leased: i64,
    pub(crate) done: i64,
    pub(crate) cancelled: i64,
    pub(crate) agents: i64,
    pub(crate) agents_live: i64,
}

fn io(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> NetError {
    NetError::new(ErrorKind::Io)
        .with_message(format!("control plane store: {what}"))
        .with_source(e)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn status_str(s: ReportStatus) -> &'static str {
    match s {
        ReportStatus::Ok => "ok",
        ReportStatus::Error => "error",
    }
}

impl TaskStore {
    /// Opens (creating) the file at `path`, or an in-memory database without one, with leases
    /// of `lease`.
    pub(crate) async fn open(path: Option<&Path>, lease: Duration) -> Result<Self, NetError> {
        let connect = match path {
            Some(p) => SqliteConnectOptions::new()
                .filename(p)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal),
            None => SqliteConnectOptions::new().in_memory(true),
        }
        .busy_timeout(Duration::from_secs(5));
        // One connection, kept for good: an in-memory database lives as long as it does.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(connect)
            .await
            .map_err(|e| io("opening the database", e))?;
        for statement in SCHEMA {
            sqlx::query(statement)
                .execute(&pool)
                .await
                .map_err(|e| io("creating the schema", e))?;
        }
        Ok(Self {
            pool,
            lease_ms: ms(LeaseTime::new(lease).ttl()),
        })
    }

    /// The lease time, in milliseconds.
    pub(crate) fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease_ms).unwrap_or(0)
    }

    /// Registers `agent` with `token_hash`, or resumes it when the hash is the one it
    /// registered with.
    pub(crate) async fn register(
        &self,
        agent: &str,
        token_hash: &str,
        info: &str,
    ) -> Result<Registered, NetError> {
        let inserted = sqlx::query(&format!(
            "INSERT INTO agents (id, token_hash, session, info, registered_at, last_seen)
             VALUES (?, ?, 1, ?, {NOW}, {NOW}) ON CONFLICT (id) DO NOTHING"
        ))
        .bind(agent)
        .bind(token_hash)
        .bind(info)
        .execute(&self.pool)
        .await
        .map_err(|e| io("registering an agent", e))?;
        if inserted.rows_affected() == 1 {
            return Ok(Registered::Yes {
                session: 1,
                resumed: false,
            });
        }
        let row = sqlx::query(&format!(
            "UPDATE agents SET session = session + 1, info = ?, last_seen = {NOW}
             WHERE id = ? AND token_hash = ? RETURNING session"
        ))
        .bind(info)
        .bind(agent)
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| io("resuming an agent", e))?;
        Ok(match row {
            Some(row) => Registered::Yes {
                session: u64::try_from(row.get::<i64, _>(0)).unwrap_or(0),
                resumed: true,
            },
            None => Registered::WrongToken,
        })
    }

    /// Whether `agent` is registered with `token_hash`.
    pub(crate) async fn authenticate(
        &self,
        agent: &str,
        token_hash: &str,
    ) -> Result<bool, NetError> {
        let row = sqlx::query("SELECT 1 FROM agents WHERE id = ? AND token_hash = ?")
            .bind(agent)
            .bind(token_hash)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| io("authenticating an agent", e))?;
        Ok(row.is_some())
    }

    /// Records a heartbeat of `agent`; its session.
    pub(crate) async fn heartbeat(&self, agent: &str) -> Result<u64, NetError> {
        let row = sqlx::query(&format!(
            "UPDATE agents SET last_seen = {NOW} WHERE id = ? RETURNING session"
        ))
        .bind(agent)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| io("recording a heartbeat", e))?;
        Ok(row.map_or(0, |r| u64::try_from(r.get::<i64, _>(0)).unwrap_or(0)))
    }

    /// Stores a new task; `false` when a task with that id exists already.
    pub(crate) async fn create(
        &self,
        id: &str,
        spec: &TaskSpec,
        every: Option<Duration>,
    ) -> Result<bool, NetError> {
        let spec_text = serde_json::to_string(spec).map_err(|e| io("encoding a task", e))?;
        let done = sqlx::query(&format!(
            "INSERT INTO tasks (id, kind, spec, every_ms, next_at, state, created_at)
             VALUES (?, ?, ?, ?, {NOW}, 'pending', {NOW}) ON CONFLICT (id) DO NOTHING"
        ))
        .bind(id)
        .bind(spec.kind().as_str())
        .bind(spec_text)
        .bind(every.map(ms))
        .execute(&self.pool)
        .await
        .map_err(|e| io("storing a task", e))?;
        Ok(done.rows_affected() == 1)
    }

    /// Leases up to `n` due tasks of `kind` to `agent`, each under a fresh random token, for
    /// the lease time from now (the store's now). Tasks whose lease ran out are due again.
    pub(crate) async fn claim(
        &self,
        agent: &str,
        kind: TaskKind,
        n: u32,
    ) -> Result<Vec<Lease>, NetError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(&format!(
            "UPDATE tasks SET lease_id = lower(hex(randomblob(16))), agent_id = ?,
                lease_until = {NOW} + ?, claims = claims + 1
             WHERE id IN (SELECT id FROM tasks
                          WHERE state = 'pending' AND kind = ? AND next_at <= {NOW}
                            AND (lease_until IS NULL OR lease_until <= {NOW})
                          ORDER BY next_at LIMIT ?)
             RETURNING id, spec, lease_id, claims"
        ))
        .bind(agent)
        .bind(self.lease_ms)
        .bind(kind.as_str())
        .bind(i64::from(n))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| io("claiming tasks", e))?;
        let mut leases = Vec::with_capacity(rows.len());
        for row in rows {
            let spec: String = row.get("spec");
            let spec = serde_json::from_str(&spec).map_err(|e| io("decoding a task", e))?;
            leases.push(Lease {
                lease_id: row.get("lease_id"),
                task_id: row.get("id"),
                spec,
                lease_ms: self.lease_ms(),
                attempt: u32::try_from(row.get::<i64, _>("claims")).unwrap_or(u32::MAX),
            });
        }
        Ok(leases)
    }

    /// Extends those of `lease_ids` that `agent` holds; the ids extended.
    pub(crate) async fn extend(
        &self,
        agent: &str,
        lease_ids: &[String],
    ) -> Result<Vec<String>, NetError> {
        let ids = serde_json::to_string(lease_ids).map_err(|e| io("encoding lease ids", e))?;
        let rows = sqlx::query(&format!(
            "UPDATE tasks SET lease_until = {NOW} + ?
             WHERE agent_id = ? AND state = 'pending'
               AND lease_id IN (SELECT value FROM json_each(?))
             RETURNING lease_id"
        ))
        .bind(self.lease_ms)
        .bind(agent)
        .bind(ids)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| io("extending leases", e))?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Records `report` by `agent`, if the lease is still its own; the task is then done (a
    /// one-off) or due again a period from now (a periodic one), and unleased.
    pub(crate) async fn report(
        &self,
        agent: &str,
        report: &LeaseReport,
    ) -> Result<Reported, NetError> {
        let observations =
            serde_json::to_string(&report.observations).map_err(|e| io("encoding a report", e))?;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| io("beginning a report", e))?;
        let fenced = sqlx::query(&format!(
            "UPDATE tasks SET lease_id = NULL, agent_id = NULL, lease_until = NULL,
                state = CASE WHEN every_ms IS NULL THEN 'done' ELSE state END,
                next_at = CASE WHEN every_ms IS NULL THEN next_at ELSE {NOW} + every_ms END
             WHERE id = ? AND lease_id = ? AND agent_id = ? AND state = 'pending'"
        ))
        .bind(&report.task_id)
        .bind(&report.lease_id)
        .bind(agent)
        .execute(&mut *tx)
        .await
        .map_err(|e| io("fencing a report", e))?;
        if fenced.rows_affected() == 1 {
            sqlx::query(&format!(
                "INSERT INTO results (task_id, lease_id, agent_id, status, observations, error,
                    reported_at)
                 VALUES (?, ?, ?, ?, ?, ?, {NOW})"
            ))
            .bind(&report.task_id)
            .bind(&report.lease_id)
            .bind(agent)
            .bind(status_str(report.status))
            .bind(observations)
            .bind(report.error.as_deref())
            .execute(&mut *tx)
            .await
            .map_err(|e| io("recording a result", e))?;
            tx.commit()
                .await
                .map_err(|e| io("committing a report", e))?;
            return Ok(Reported::Recorded);
        }
        let earlier = sqlx::query(
            "SELECT 1 FROM results WHERE lease_id = ? AND agent_id = ? AND task_id = ?",
        )
        .bind(&report.lease_id)
        .bind(agent)
        .bind(&report.task_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| io("looking a report up", e))?;
        tx.commit().await.map_err(|e| io("ending a report", e))?;
        Ok(if earlier.is_some() {
            Reported::Duplicate
        } else {
            Reported::Refused
        })
    }

    /// Revokes the lease `lease_id`: the task is unleased and due again; its holder learns at
    /// its next extension. Whether there was such a lease.
    pub(crate) async fn revoke(&self, lease_id: &str) -> Result<bool, NetError> {
        let done = sqlx::query(
            "UPDATE tasks SET lease_id = NULL, agent_id = NULL, lease_until = NULL
             WHERE lease_id = ?",
        )
        .bind(lease_id)
        .execute(&self.pool)
        .await
        .map_err(|e| io("revoking a lease", e))?;
        Ok(done.rows_affected() == 1)
    }

    /// Cancels the task `id` (and its lease); whether there was such a task not cancelled.
    pub(crate) async fn cancel(&self, id: &str) -> Result<bool, NetError> {
        let done = sqlx::query(
            "UPDATE tasks SET state = 'cancelled', lease_id = NULL, agent_id = NULL,
                lease_until = NULL
             WHERE id = ? AND state != 'cancelled'",
        )
        .bind(id)
        .execute(&self.pool)
        .await
        .map_err(|e| io("cancelling a task", e))?;
        Ok(done.rows_affected() == 1)
    }

    /// The task `id`, with its last result.
    pub(crate) async fn task(&self, id: &str) -> Result<Option<TaskView>, NetError> {
        let row = sqlx::query(&format!(
            "SELECT spec, every_ms, state, claims, agent_id, lease_id,
                (lease_id IS NOT NULL AND lease_until > {NOW}) AS leased,
                (SELECT COUNT(*) FROM results WHERE task_id = tasks.id) AS results
             FROM tasks WHERE id = ?"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| io("reading a task", e))?;
        let Some(row) = row else { return Ok(None) };
        let spec: String = row.get("spec");
        let spec = serde_json::from_str(&spec).map_err(|e| io("decoding a task", e))?;
        let leased: bool = row.get("leased");
        let state = match row.get::<String, _>("state").as_str() {
            "done" => TaskState::Done,
            "cancelled" => TaskState::Cancelled,
            _ if leased => TaskState::Leased,
            _ => TaskState::Pending,
        };
        let last = self.results(id, 1).await?.into_iter().next();
        Ok(Some(TaskView {
            task_id: id.to_owned(),
            spec,
            every_secs: row
                .get::<Option<i64>, _>("every_ms")
                .map(|m| u64::try_from(m / 1000).unwrap_or(0)),
            state,
            claims: u32::try_from(row.get::<i64, _>("claims")).unwrap_or(u32::MAX),
            results: u32::try_from(row.get::<i64, _>("results")).unwrap_or(u32::MAX),
            agent_id: if leased { row.get("agent_id") } else { None },
            lease_id: if leased { row.get("lease_id") } else { None },
            last,
        }))
    }

    /// The results of task `id`, newest first, at most `limit`.
    pub(crate) async fn results(&self, id: &str, limit: u32) -> Result<Vec<TaskResult>, NetError> {
        let rows = sqlx::query(
            "SELECT lease_id, agent_id, status, observations, error, reported_at
             FROM results WHERE task_id = ? ORDER BY seq DESC LIMIT ?",
        )
        .bind(id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| io("reading results", e))?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let observations: String = row.get("observations");
            out.push(TaskResult {
                lease_id: row.get("lease_id"),
                agent_id: row.get("agent_id"),
                status: if row.get::<String, _>("status") == "ok" {
                    ReportStatus::Ok
                } else {
                    ReportStatus::Error
                },
                observations: serde_json::from_str(&observations)
                    .map_err(|e| io("decoding a result", e))?,
                error: row.get("error"),
                reported_at_ms: row.get("reported_at"),
            });
        }
        Ok(out)
    }

    /// Tasks by state and agents (live: seen within `live_within`).
    pub(crate) async fn counts(&self, live_within: Duration) -> Result<Counts, NetError> {
        let row = sqlx::query(&format!(
            "SELECT
                (SELECT COUNT(*) FROM tasks WHERE state = 'pending'
                    AND (lease_id IS NULL OR lease_until <= {NOW})) AS pending,
                (SELECT COUNT(*) FROM tasks WHERE state = 'pending'
                    AND lease_id IS NOT NULL AND lease_until > {NOW}) AS leased,
                (SELECT COUNT(*) FROM tasks WHERE state = 'done') AS done,
                (SELECT COUNT(*) FROM tasks WHERE state = 'cancelled') AS cancelled,
                (SELECT COUNT(*) FROM agents) AS agents,
                (SELECT COUNT(*) FROM agents WHERE last_seen > {NOW} - ?) AS agents_live"
        ))
        .bind(ms(live_within))
        .fetch_one(&self.pool)
        .await
        .map_err(|e| io("counting", e))?;
        Ok(Counts {
            pending: row.get("pending"),
            leased: row.get("leased"),
            done: row.get("done"),
            cancelled: row.get("cancelled"),
            agents: row.get("agents"),
            agents_live: row.get("agents_live"),
        })
    }
}
