//! What the SQLite and the PostgreSQL delay stores share: the schema and the statements (one
//! text, two dialects) and the [`DelayStore`](super::DelayStore) implementation, written once as a macro
//! over the engine's concrete sqlx types, as the outbox's stores are.

use soulbase_net_core::NetError;

use super::DelayTask;
use crate::outbox::{
    io,
    sql::{Dialect, Versions},
    Columns,
};

/// The delay table's schema versions, oldest first (`{t}` is the table), for an engine whose
/// 64-bit integer type is `$int` and whose byte-string type is `$bytes`: one schema text for
/// both stores, so the two cannot drift apart. A macro because a [`Migration`] holds
/// `'static` text, which only `concat!` of literals assembles at compile time.
///
/// [`Migration`]: crate::outbox::sql::Migration
macro_rules! delay_migrations {
    ($int:literal, $bytes:literal) => {
        &[(
            1,
            "delay tasks, due by next_at",
            &[
                concat!(
                    "CREATE TABLE IF NOT EXISTS {t} (
            id TEXT PRIMARY KEY,
            route_key TEXT NOT NULL,
            fire_at ",
                    $int,
                    " NOT NULL,
            next_at ",
                    $int,
                    " NOT NULL,
            compression TEXT NOT NULL,
            payload ",
                    $bytes,
                    " NOT NULL,
            attempts ",
                    $int,
                    " NOT NULL DEFAULT 0,
            lease_until ",
                    $int,
                    ",
            claim_id ",
                    $int,
                    ",
            created_at ",
                    $int,
                    " NOT NULL
        )"
                ),
                "CREATE INDEX IF NOT EXISTS {t}_due ON {t} (route_key, next_at)",
                "CREATE INDEX IF NOT EXISTS {t}_next ON {t} (next_at)",
            ],
        )]
    };
}

pub(crate) use delay_migrations;

/// The statements, with the table's name in them (built once when the store opens).
#[derive(Debug, Clone)]
pub(crate) struct DelaySql {
    /// How a write transaction begins (see [`Dialect::begin`]).
    pub(crate) begin: &'static str,
    pub(crate) insert: String,
    pub(crate) claim: String,
    pub(crate) extend: String,
    pub(crate) ack_claimed: String,
    pub(crate) ack_any: String,
    pub(crate) retry: String,
    pub(crate) release: String,
    pub(crate) next_due: String,
    pub(crate) get: String,
    pub(crate) pending: String,
    pub(crate) due: String,
    pub(crate) versions: Versions,
}

impl DelaySql {
    pub(crate) fn new(t: &str, dialect: Dialect) -> Self {
        let now = dialect.now();
        let (routes, lock, greatest) = match dialect {
            // A JSON array of the routes, bound as one text.
            Dialect::Sqlite => ("route_key IN (SELECT value FROM json_each(?))", "", "MAX"),
            // A text[] of the routes; rows another server is claiming are skipped.
            Dialect::Postgres => ("route_key = ANY(?)", "FOR UPDATE SKIP LOCKED", "GREATEST"),
        };
        let int = dialect.int();
        let place = |sql: String| dialect.place(sql);
        Self {
            begin: dialect.begin(),
            insert: place(format!(
                "INSERT INTO {t} (id, route_key, fire_at, next_at, compression, payload, attempts,
                    created_at)
                 VALUES (?, ?, ?, ?, ?, ?, 0, {now}) ON CONFLICT (id) DO NOTHING"
            )),
            claim: place(format!(
                "UPDATE {t} SET lease_until = {now} + ?, claim_id = ?
                 WHERE id IN (SELECT id FROM {t}
                              WHERE next_at <= {now} + ?
                                AND (lease_until IS NULL OR lease_until <= {now})
                                AND {routes}
                              ORDER BY next_at LIMIT ? {lock})
                 RETURNING *, next_at - {now} AS due_in_ms"
            )),
            extend: place(format!(
                "UPDATE {t} SET lease_until = {now} + ? WHERE id = ? AND claim_id = ?"
            )),
            ack_claimed: place(format!("DELETE FROM {t} WHERE id = ? AND claim_id = ?")),
            ack_any: place(format!("DELETE FROM {t} WHERE id = ?")),
            retry: place(format!(
                "UPDATE {t} SET next_at = {now} + ?, attempts = attempts + 1, lease_until = NULL,
                    claim_id = NULL
                 WHERE id = ? AND claim_id = ?"
            )),
            next_due: place(format!(
                "SELECT CAST(MIN({greatest}(next_at, COALESCE(lease_until, 0))) - {now} AS {int})
                 FROM {t} WHERE {routes}"
            )),
            release: place(format!(
                "UPDATE {t} SET lease_until = NULL, claim_id = NULL WHERE id = ? AND claim_id = ?"
            )),
            get: place(format!(
                "SELECT *, next_at - {now} AS due_in_ms FROM {t} WHERE id = ?"
            )),
            pending: format!("SELECT COUNT(*) FROM {t}"),
            due: format!("SELECT COUNT(*) FROM {t} WHERE fire_at <= {now}"),
            versions: Versions::new(t, dialect),
        }
    }
}

/// Reads a [`DelayTask`] from a row of either engine (the same column names).
pub(crate) fn task_from(row: &impl Columns) -> Result<DelayTask, NetError> {
    let get = |e: sqlx::Error| io("reading a delay task", e);
    let attempts = row.int("attempts").map_err(get)?;
    let due_in = row.int("due_in_ms").map_err(get)?;
    Ok(DelayTask {
        id: row.text("id").map_err(get)?,
        route_key: row.text("route_key").map_err(get)?,
        fire_at: row.int("fire_at").map_err(get)?,
        compression: row.text("compression").map_err(get)?,
        payload: bytes::Bytes::from(row.bytes("payload").map_err(get)?),
        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        claim: row.opt_int("claim_id").map_err(get)?.unwrap_or(0),
        due_in: std::time::Duration::from_millis(u64::try_from(due_in).unwrap_or(0)),
    })
}

/// Implements [`DelayStore`](super::DelayStore) for `$store`, a type with fields `pool`,
/// `options` and `sql` (a [`DelaySql`], whose `begin` opens its write transactions), an associated `fn routes(&[String]) -> impl
/// Encode` that binds a list of routes the way its engine's statements read it, and a
/// `write_rows` that stores a batch inside a transaction (a statement a row where a
/// statement is cheap, one statement for the batch where each costs a round trip).
macro_rules! delay_store {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl $crate::delay::DelayStore for $store {
            async fn write(
                &self,
                tasks: &[$crate::delay::DelayTask],
                acks: &[(String, i64)],
            ) -> Result<(Vec<$crate::delay::Scheduled>, Vec<bool>), soulbase_net_core::NetError>
            {
                let what = "storing delay tasks and acknowledgements";
                let fail = |e| $crate::outbox::io(what, e);
                $crate::outbox::timed(self.options.op_timeout, what, async {
                    let mut tx = self.pool.begin_with(self.sql.begin).await.map_err(fail)?;
                    let (stored, deleted) =
                        self.write_rows(&mut tx, tasks, acks).await.map_err(fail)?;
                    tx.commit().await.map_err(fail)?;
                    Ok((stored, deleted))
                })
                .await
            }

            async fn claim_due(
                &self,
                routes: &[String],
                limit: u32,
                lease: std::time::Duration,
                ahead: std::time::Duration,
            ) -> Result<Vec<$crate::delay::DelayTask>, soulbase_net_core::NetError> {
                if routes.is_empty() || limit == 0 {
                    return Ok(Vec::new());
                }
                // A token of this claim: what fences its holder (a positive i64).
                let token = fastrand::i64(1..i64::MAX);
                let rows = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "claiming due delay tasks",
                    sqlx::query(&self.sql.claim)
                        .bind($crate::outbox::millis(lease))
                        .bind(token)
                        .bind($crate::outbox::millis(ahead))
                        .bind(Self::routes(routes))
                        .bind(i64::from(limit))
                        .fetch_all(&self.pool),
                )
                .await?;
                rows.iter().map($crate::delay::sql::task_from).collect()
            }

            async fn extend(
                &self,
                tasks: &[(String, i64)],
                lease: std::time::Duration,
            ) -> Result<(), soulbase_net_core::NetError> {
                if tasks.is_empty() {
                    return Ok(());
                }
                let what = "extending delay task leases";
                let fail = |e| $crate::outbox::io(what, e);
                $crate::outbox::timed(self.options.op_timeout, what, async {
                    let mut tx = self.pool.begin_with(self.sql.begin).await.map_err(fail)?;
                    // In id order: two transactions locking the same rows never wait for each
                    // other in a cycle.
                    let mut order: Vec<&(String, i64)> = tasks.iter().collect();
                    order.sort_unstable();
                    for (id, claim) in order {
                        sqlx::query(&self.sql.extend)
                            .bind($crate::outbox::millis(lease))
                            .bind(id)
                            .bind(claim)
                            .execute(&mut *tx)
                            .await
                            .map_err(fail)?;
                    }
                    tx.commit().await.map_err(fail)
                })
                .await
            }

            async fn retry(
                &self,
                id: &str,
                claim: i64,
                after: std::time::Duration,
            ) -> Result<bool, soulbase_net_core::NetError> {
                let done = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "rescheduling a delay task",
                    sqlx::query(&self.sql.retry)
                        .bind($crate::outbox::millis(after))
                        .bind(id)
                        .bind(claim)
                        .execute(&self.pool),
                )
                .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn release(
                &self,
                id: &str,
                claim: i64,
            ) -> Result<bool, soulbase_net_core::NetError> {
                let done = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "releasing a delay task",
                    sqlx::query(&self.sql.release)
                        .bind(id)
                        .bind(claim)
                        .execute(&self.pool),
                )
                .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn next_due(
                &self,
                routes: &[String],
            ) -> Result<Option<std::time::Duration>, soulbase_net_core::NetError> {
                if routes.is_empty() {
                    return Ok(None);
                }
                let (wait,): (Option<i64>,) = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "finding the next due delay task",
                    sqlx::query_as(&self.sql.next_due)
                        .bind(Self::routes(routes))
                        .fetch_one(&self.pool),
                )
                .await?;
                Ok(wait.map(|ms| std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
            }

            async fn get(
                &self,
                id: &str,
            ) -> Result<Option<$crate::delay::DelayTask>, soulbase_net_core::NetError> {
                let row = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "reading a delay task",
                    sqlx::query(&self.sql.get)
                        .bind(id)
                        .fetch_optional(&self.pool),
                )
                .await?;
                row.as_ref().map($crate::delay::sql::task_from).transpose()
            }

            async fn pending(&self) -> Result<u64, soulbase_net_core::NetError> {
                let (n,): (i64,) = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "counting delay tasks",
                    sqlx::query_as(&self.sql.pending).fetch_one(&self.pool),
                )
                .await?;
                Ok(u64::try_from(n).unwrap_or(0))
            }

            async fn due(&self) -> Result<u64, soulbase_net_core::NetError> {
                let (n,): (i64,) = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "counting due delay tasks",
                    sqlx::query_as(&self.sql.due).fetch_one(&self.pool),
                )
                .await?;
                Ok(u64::try_from(n).unwrap_or(0))
            }
        }
    };
}

pub(crate) use delay_store;
