//! The control plane's store: agents, tasks and their leases, results — on SQLite (the
//! embedded default: a file, or memory) or PostgreSQL (several control-plane instances on one
//! database), with one text of statements for both ([`sql`](super::sql)).
//!
//! The lease discipline is the store crate's (`soulbase_net_store::lease`): a lease is a
//! random token drawn by the claim statement itself, and every extension, report and
//! revocation is conditional on it (and on the agent holding it); lease ends are computed in
//! the statements on the database's clock, never on an agent's or an instance's; leases are
//! short and extended by their holder. On PostgreSQL a claim takes its rows
//! `FOR UPDATE SKIP LOCKED`, so instances claiming together never hand out one task twice,
//! and the conditional statements make every report, return and reschedule happen once
//! whichever instance runs it.
//!
//! SQLite gets one connection: it has one writer at a time anyway, and every statement here is
//! short, so the pool serialises them rather than letting them meet `SQLITE_BUSY`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use soulbase_net_core::{ErrorKind, NetError};
use soulbase_net_store::lease::Lease as LeaseTime;
use soulbase_net_store::sql::Dialect;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use super::agents::{AgentState, AgentView};
use super::location::Location;
use super::sql::{Statements, MIGRATIONS_TABLE, SCHEMA_VERSION, SQLITE_MIGRATIONS};
use crate::protocol::{
    Lease, LeaseReport, ReportStatus, TaskKind, TaskResult, TaskSpec, TaskState, TaskView,
};

/// How long a connection may be waited for, and a PostgreSQL server for its first one.
const ACQUIRE: Duration = Duration::from_secs(10);

/// Connections to PostgreSQL, per instance.
#[cfg(feature = "postgres")]
const PG_CONNECTIONS: u32 = 10;

/// The engine's pool.
#[derive(Clone, Debug)]
enum Pool {
    Sqlite(SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
}

/// Runs `$body` with `$pool` bound to the engine's pool: the body is written once and
/// type-checked for each engine's concrete sqlx types (as the outbox's `sql_store!` is).
macro_rules! on_pool {
    ($store:expr, |$pool:ident| $body:expr) => {
        match &$store.pool {
            Pool::Sqlite($pool) => $body,
            #[cfg(feature = "postgres")]
            Pool::Postgres($pool) => $body,
        }
    };
}

/// The control plane's store.
#[derive(Clone, Debug)]
pub(crate) struct TaskStore {
    pool: Pool,
    sql: Statements,
    lease_ms: i64,
    /// For a store in memory: a connection of its own to the database, never used, so the
    /// database outlives the pool's connection (sqlx closes a connection whose query was cut
    /// off — a request dropped mid-call — and a private in-memory database went with it).
    _keeper: Option<Arc<Keeper>>,
}

/// The connection that keeps an in-memory database alive.
struct Keeper {
    _conn: tokio::sync::Mutex<sqlx::SqliteConnection>,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keeper")
    }
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

/// What a sweep for stale agents did.
#[derive(Clone, Debug, Default)]
pub(crate) struct Swept {
    /// The agents it found stale (each is found once, by one instance).
    pub(crate) stale: Vec<String>,
    /// The tasks whose leases it returned.
    pub(crate) returned: Vec<String>,
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

fn count(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(if n < 0 { 0 } else { u32::MAX })
}

fn status_str(s: ReportStatus) -> &'static str {
    match s {
        ReportStatus::Ok => "ok",
        ReportStatus::Error => "error",
    }
}

impl TaskStore {
    /// Opens the store at `location` (creating and migrating its schema), with leases of
    /// `lease`.
    ///
    /// # Errors
    /// `Io` when the database cannot be opened or migrated; `InvalidRequest` for PostgreSQL in
    /// a build without the `postgres` feature.
    pub(crate) async fn open(location: &Location, lease: Duration) -> Result<Self, NetError> {
        let mut keeper = None;
        let (pool, dialect) = match location {
            Location::Memory => {
                let (pool, kept) = sqlite(None).await?;
                keeper = kept;
                (Pool::Sqlite(pool), Dialect::Sqlite)
            }
            Location::Sqlite(path) => (Pool::Sqlite(sqlite(Some(path)).await?.0), Dialect::Sqlite),
            #[cfg(feature = "postgres")]
            Location::Postgres(url) => {
                let pool = soulbase_net_store::sql::connect_postgres(
                    url,
                    PG_CONNECTIONS,
                    ACQUIRE,
                    "control plane",
                )
                .await?;
                soulbase_net_store::sql::migrate_postgres(
                    &pool,
                    "control plane",
                    MIGRATIONS_TABLE,
                    super::sql::POSTGRES_MIGRATIONS,
                    SCHEMA_VERSION,
                )
                .await?;
                (Pool::Postgres(pool), Dialect::Postgres)
            }
            #[cfg(not(feature = "postgres"))]
            Location::Postgres(_) => {
                return Err(NetError::invalid_request(
                    "control plane: PostgreSQL needs the cargo feature `postgres` of \
                     soulbase-net-agent",
                ))
            }
        };
        Ok(Self {
            pool,
            sql: Statements::new(dialect),
            lease_ms: ms(LeaseTime::new(lease).ttl()),
            _keeper: keeper,
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
        let inserted = on_pool!(self, |pool| sqlx::query(&self.sql.register)
            .bind(agent)
            .bind(token_hash)
            .bind(info)
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))
        .map_err(|e| io("registering an agent", e))?;
        if inserted == 1 {
            return Ok(Registered::Yes {
                session: 1,
                resumed: false,
            });
        }
        let session: Option<i64> = on_pool!(self, |pool| sqlx::query_scalar(&self.sql.resume)
            .bind(info)
            .bind(agent)
            .bind(token_hash)
            .fetch_optional(pool)
            .await)
        .map_err(|e| io("resuming an agent", e))?;
        Ok(match session {
            Some(session) => Registered::Yes {
                session: u64::try_from(session).unwrap_or(0),
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
        on_pool!(self, |pool| sqlx::query(&self.sql.authenticate)
            .bind(agent)
            .bind(token_hash)
            .fetch_optional(pool)
            .await
            .map(|row| row.is_some()))
        .map_err(|e| io("authenticating an agent", e))
    }

    /// Records a heartbeat of `agent` (live again if it was stale); its session.
    pub(crate) async fn heartbeat(&self, agent: &str) -> Result<u64, NetError> {
        let session: Option<i64> = on_pool!(self, |pool| sqlx::query_scalar(&self.sql.heartbeat)
            .bind(agent)
            .fetch_optional(pool)
            .await)
        .map_err(|e| io("recording a heartbeat", e))?;
        Ok(session.map_or(0, |s| u64::try_from(s).unwrap_or(0)))
    }

    /// Stores a new task; `false` when a task with that id exists already.
    pub(crate) async fn create(
        &self,
        id: &str,
        spec: &TaskSpec,
        every: Option<Duration>,
    ) -> Result<bool, NetError> {
        let spec_text = serde_json::to_string(spec).map_err(|e| io("encoding a task", e))?;
        let inserted = on_pool!(self, |pool| sqlx::query(&self.sql.create)
            .bind(id)
            .bind(spec.kind().as_str())
            .bind(&spec_text)
            .bind(every.map(ms))
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))
        .map_err(|e| io("storing a task", e))?;
        Ok(inserted == 1)
    }

    /// Leases up to `n` due tasks of `kind` to `agent`, each under a fresh random token, for
    /// the lease time from now (the store's now) — none to an agent not heard from within
    /// `stale_after`. Tasks whose lease ran out are due again.
    pub(crate) async fn claim(
        &self,
        agent: &str,
        kind: TaskKind,
        n: u32,
        stale_after: Duration,
    ) -> Result<Vec<Lease>, NetError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let claimed: Vec<(String, String, String, i64)> = on_pool!(self, |pool| {
            sqlx::query(&self.sql.claim)
                .bind(agent)
                .bind(self.lease_ms)
                .bind(kind.as_str())
                .bind(agent)
                .bind(ms(stale_after))
                .bind(i64::from(n))
                .fetch_all(pool)
                .await
                .map(|rows| {
                    rows.iter()
                        .map(|r| {
                            (
                                r.get("id"),
                                r.get("spec"),
                                r.get("lease_id"),
                                r.get("claims"),
                            )
                        })
                        .collect()
                })
        })
        .map_err(|e| io("claiming tasks", e))?;
        let mut leases = Vec::with_capacity(claimed.len());
        for (task_id, spec, lease_id, claims) in claimed {
            // A spec that does not read (stored by another build?) is left leased: it comes
            // back when the lease runs out, and the error says which task it is.
            let spec = serde_json::from_str(&spec)
                .map_err(|e| io(&format!("decoding task `{task_id}`"), e))?;
            leases.push(Lease {
                lease_id,
                task_id,
                spec,
                lease_ms: self.lease_ms(),
                attempt: u32::try_from(claims).unwrap_or(u32::MAX),
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
        on_pool!(self, |pool| sqlx::query_scalar(&self.sql.extend)
            .bind(self.lease_ms)
            .bind(agent)
            .bind(&ids)
            .fetch_all(pool)
            .await)
        .map_err(|e| io("extending leases", e))
    }

    /// Records `report` by `agent`, if the lease is still its own; the task is then done (a
    /// one-off) or due again a period from now (a periodic one), and unleased. One
    /// transaction: the fence and the result together, once whichever instance takes it.
    pub(crate) async fn report(
        &self,
        agent: &str,
        report: &LeaseReport,
    ) -> Result<Reported, NetError> {
        let observations =
            serde_json::to_string(&report.observations).map_err(|e| io("encoding a report", e))?;
        let sql = &self.sql;
        on_pool!(self, |pool| {
            let mut tx = pool
                .begin_with(sql.begin)
                .await
                .map_err(|e| io("beginning a report", e))?;
            let fenced = sqlx::query(&sql.fence_report)
                .bind(&report.task_id)
                .bind(&report.lease_id)
                .bind(agent)
                .execute(&mut *tx)
                .await
                .map_err(|e| io("fencing a report", e))?;
            if fenced.rows_affected() == 1 {
                sqlx::query(&sql.record_result)
                    .bind(&report.task_id)
                    .bind(&report.lease_id)
                    .bind(agent)
                    .bind(status_str(report.status))
                    .bind(&observations)
                    .bind(report.error.as_deref())
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| io("recording a result", e))?;
                tx.commit()
                    .await
                    .map_err(|e| io("committing a report", e))?;
                return Ok(Reported::Recorded);
            }
            let earlier = sqlx::query(&sql.earlier_result)
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
        })
    }

    /// Revokes the lease `lease_id`: the task is unleased and due again; its holder learns at
    /// its next extension. Whether there was such a lease.
    pub(crate) async fn revoke(&self, lease_id: &str) -> Result<bool, NetError> {
        on_pool!(self, |pool| sqlx::query(&self.sql.revoke)
            .bind(lease_id)
            .execute(pool)
            .await
            .map(|done| done.rows_affected() == 1))
        .map_err(|e| io("revoking a lease", e))
    }

    /// Cancels the task `id` (and its lease); whether there was such a task not cancelled.
    pub(crate) async fn cancel(&self, id: &str) -> Result<bool, NetError> {
        on_pool!(self, |pool| sqlx::query(&self.sql.cancel)
            .bind(id)
            .execute(pool)
            .await
            .map(|done| done.rows_affected() == 1))
        .map_err(|e| io("cancelling a task", e))
    }

    /// Finds the agents not heard from within `stale_after` (marking each once) and returns
    /// every lease the agents marked stale hold: the tasks are due at once, and the old
    /// tokens refused.
    pub(crate) async fn sweep(&self, stale_after: Duration) -> Result<Swept, NetError> {
        let stale: Vec<String> = on_pool!(self, |pool| sqlx::query_scalar(&self.sql.mark_stale)
            .bind(ms(stale_after))
            .fetch_all(pool)
            .await)
        .map_err(|e| io("finding stale agents", e))?;
        let returned: Vec<String> =
            on_pool!(self, |pool| sqlx::query_scalar(&self.sql.return_leases)
                .fetch_all(pool)
                .await)
            .map_err(|e| io("returning the leases of stale agents", e))?;
        Ok(Swept { stale, returned })
    }

    /// The task `id`, with its last result.
    pub(crate) async fn task(&self, id: &str) -> Result<Option<TaskView>, NetError> {
        type Fields = (
            String,
            Option<i64>,
            String,
            i64,
            Option<String>,
            Option<String>,
            bool,
            i64,
        );
        let row: Option<Fields> = on_pool!(self, |pool| sqlx::query(&self.sql.task)
            .bind(id)
            .fetch_optional(pool)
            .await
            .map(|row| row.map(|r| (
                r.get("spec"),
                r.get("every_ms"),
                r.get("state"),
                r.get("claims"),
                r.get("agent_id"),
                r.get("lease_id"),
                r.get("leased"),
                r.get("results"),
            ))))
        .map_err(|e| io("reading a task", e))?;
        let Some((spec, every_ms, state, claims, agent_id, lease_id, leased, results)) = row else {
            return Ok(None);
        };
        let spec =
            serde_json::from_str(&spec).map_err(|e| io(&format!("decoding task `{id}`"), e))?;
        let state = match state.as_str() {
            "done" => TaskState::Done,
            "cancelled" => TaskState::Cancelled,
            _ if leased => TaskState::Leased,
            _ => TaskState::Pending,
        };
        let last = self.results(id, 1).await?.into_iter().next();
        Ok(Some(TaskView {
            task_id: id.to_owned(),
            spec,
            every_secs: every_ms.map(|m| u64::try_from(m / 1000).unwrap_or(0)),
            state,
            claims: count(claims),
            results: count(results),
            agent_id: agent_id.filter(|_| leased),
            lease_id: lease_id.filter(|_| leased),
            last,
        }))
    }

    /// The results of task `id`, newest first, at most `limit`.
    pub(crate) async fn results(&self, id: &str, limit: u32) -> Result<Vec<TaskResult>, NetError> {
        type Fields = (String, String, String, String, Option<String>, i64);
        let rows: Vec<Fields> = on_pool!(self, |pool| sqlx::query(&self.sql.results)
            .bind(id)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await
            .map(|rows| rows
                .iter()
                .map(|r| (
                    r.get("lease_id"),
                    r.get("agent_id"),
                    r.get("status"),
                    r.get("observations"),
                    r.get("error"),
                    r.get("reported_at"),
                ))
                .collect()))
        .map_err(|e| io("reading results", e))?;
        let mut out = Vec::with_capacity(rows.len());
        for (lease_id, agent_id, status, observations, error, reported_at_ms) in rows {
            out.push(TaskResult {
                lease_id,
                agent_id,
                status: if status == "ok" {
                    ReportStatus::Ok
                } else {
                    ReportStatus::Error
                },
                observations: serde_json::from_str(&observations)
                    .map_err(|e| io(&format!("decoding a result of task `{id}`"), e))?,
                error,
                reported_at_ms,
            });
        }
        Ok(out)
    }

    /// Every agent, by id, stale when not heard from within `stale_after`.
    pub(crate) async fn agents(&self, stale_after: Duration) -> Result<Vec<AgentView>, NetError> {
        type Fields = (String, i64, String, i64, i64, Option<i64>, bool, i64);
        let rows: Vec<Fields> = on_pool!(self, |pool| sqlx::query(&self.sql.agents)
            .bind(ms(stale_after))
            .fetch_all(pool)
            .await
            .map(|rows| rows
                .iter()
                .map(|r| (
                    r.get("id"),
                    r.get("session"),
                    r.get("info"),
                    r.get("registered_at"),
                    r.get("last_seen"),
                    r.get("stale_at"),
                    r.get("stale"),
                    r.get("leases"),
                ))
                .collect()))
        .map_err(|e| io("reading agents", e))?;
        Ok(rows
            .into_iter()
            .map(
                |(
                    agent_id,
                    session,
                    info,
                    registered_at_ms,
                    last_seen_ms,
                    stale_at,
                    stale,
                    leases,
                )| {
                    AgentView {
                        agent_id,
                        state: if stale {
                            AgentState::Stale
                        } else {
                            AgentState::Live
                        },
                        session: u64::try_from(session).unwrap_or(0),
                        registered_at_ms,
                        last_seen_ms,
                        stale_since_ms: stale_at,
                        leases: count(leases),
                        // What the agent sent, stored as it was read: it reads back (a row of
                        // another build's that does not is shown without it).
                        registration: serde_json::from_str(&info).ok(),
                    }
                },
            )
            .collect())
    }

    /// Tasks by state and agents (live: heard from within `stale_after`).
    pub(crate) async fn counts(&self, stale_after: Duration) -> Result<Counts, NetError> {
        on_pool!(self, |pool| sqlx::query(&self.sql.counts)
            .bind(ms(stale_after))
            .fetch_one(pool)
            .await
            .map(|row| Counts {
                pending: row.get("pending"),
                leased: row.get("leased"),
                done: row.get("done"),
                cancelled: row.get("cancelled"),
                agents: row.get("agents"),
                agents_live: row.get("agents_live"),
            }))
        .map_err(|e| io("counting", e))
    }
}

/// A SQLite pool of one connection on the file at `path` (WAL) or in memory, its schema
/// migrated; in memory, with the [`Keeper`] connection that keeps the database alive (a
/// named, shared-cache database of this process, which lives while one connection to it is
/// open).
async fn sqlite(path: Option<&Path>) -> Result<(SqlitePool, Option<Arc<Keeper>>), NetError> {
    let at = || path.map_or_else(|| "in memory".to_owned(), |p| p.display().to_string());
    let connect = match path {
        Some(p) => SqliteConnectOptions::new()
            .filename(p)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal),
        // sqlx names it `file:sqlx-in-memory-<n>`, `n` unique in the process, shared cache.
        None => "sqlite::memory:"
            .parse::<SqliteConnectOptions>()
            .map_err(|e| io("opening the SQLite database (in memory)", e))?,
    }
    .busy_timeout(Duration::from_secs(5));
    let keeper = match path {
        Some(_) => None,
        None => {
            let conn = sqlx::ConnectOptions::connect(&connect)
                .await
                .map_err(|e| io(&format!("opening the SQLite database ({})", at()), e))?;
            Some(Arc::new(Keeper {
                _conn: tokio::sync::Mutex::new(conn),
            }))
        }
    };
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(ACQUIRE)
        .connect_with(connect)
        .await
        .map_err(|e| io(&format!("opening the SQLite database ({})", at()), e))?;
    soulbase_net_store::sql::migrate_sqlite(
        &pool,
        "control plane",
        MIGRATIONS_TABLE,
        SQLITE_MIGRATIONS,
        SCHEMA_VERSION,
    )
    .await?;
    Ok((pool, keeper))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The pool's connection can be closed under the store (sqlx closes one whose query was
    /// cut off): an in-memory store keeps its tables and rows through it.
    #[tokio::test]
    async fn an_in_memory_store_outlives_its_pools_connection() {
        let store = TaskStore::open(&Location::Memory, Duration::from_secs(10))
            .await
            .unwrap();
        let spec = TaskSpec::Tcp {
            host: "127.0.0.1".into(),
            port: 9,
            timeout_ms: None,
        };
        assert!(store.create("kept", &spec, None).await.unwrap());
        // Taken out of the pool and closed: the pool opens a new connection next time.
        match &store.pool {
            Pool::Sqlite(pool) => sqlx::Connection::close(pool.acquire().await.unwrap().detach())
                .await
                .unwrap(),
            #[cfg(feature = "postgres")]
            Pool::Postgres(_) => unreachable!("a store in memory is SQLite"),
        }
        let view = store.task("kept").await.unwrap();
        assert!(view.is_some(), "the task survived the pool's connection");
    }
}
