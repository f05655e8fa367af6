//! [`SqliteDelayStore`]: the delay server's embedded store — one SQLite file in WAL mode.

use std::path::Path;

use soulbase_net_core::NetError;
use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
    SqlitePool,
};

use super::{
    sql::{delay_migrations, delay_store, DelaySql},
    DelayStoreOptions, DelayTask, Scheduled,
};
use crate::outbox::{
    io,
    sql::{migrate_sqlite, Dialect, Migration},
};

/// The schema's versions, oldest first (`{t}` is the table), recorded in `{t}_migrations`.
const MIGRATIONS: &[Migration] = delay_migrations!("INTEGER", "BLOB");

/// The delay tasks in one SQLite file (WAL, `synchronous = FULL`: a task is on disk before
/// the server acknowledges it), four connections, one writer at a time.
#[derive(Debug, Clone)]
pub struct SqliteDelayStore {
    pool: SqlitePool,
    options: DelayStoreOptions,
    sql: DelaySql,
}

impl SqliteDelayStore {
    /// Opens (creating if missing) the file at `path` and migrates its schema.
    ///
    /// # Errors
    /// `Io` when the file cannot be opened or migrated.
    pub async fn open(
        path: impl AsRef<Path>,
        options: DelayStoreOptions,
    ) -> Result<Self, NetError> {
        let path = path.as_ref();
        let connect = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(options.op_timeout);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(options.op_timeout)
            .connect_with(connect)
            .await
            .map_err(|e| io(&format!("opening {}", path.display()), e))?;
        let sql = DelaySql::new(&options.table, Dialect::Sqlite);
        migrate_sqlite(&pool, &sql.versions, &options.table, MIGRATIONS, i64::MAX).await?;
        Ok(Self { pool, options, sql })
    }

    /// Stores `tasks` and deletes the acknowledged `acks` inside `tx`, a statement each (in
    /// the process, a statement costs no round trip).
    async fn write_rows(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        tasks: &[DelayTask],
        acks: &[(String, i64)],
    ) -> Result<(Vec<Scheduled>, Vec<bool>), sqlx::Error> {
        let mut stored = Vec::with_capacity(tasks.len());
        for task in tasks {
            let hit = sqlx::query(&self.sql.insert)
                .bind(&task.id)
                .bind(&task.route_key)
                .bind(task.fire_at)
                .bind(task.fire_at)
                .bind(&task.compression)
                .bind(task.payload.as_ref())
                .execute(&mut **tx)
                .await?;
            stored.push(if hit.rows_affected() > 0 {
                Scheduled::New
            } else {
                Scheduled::Duplicate
            });
        }
        let mut deleted = Vec::with_capacity(acks.len());
        for (id, claim) in acks {
            let q = if *claim == 0 {
                sqlx::query(&self.sql.ack_any).bind(id)
            } else {
                sqlx::query(&self.sql.ack_claimed).bind(id).bind(claim)
            };
            deleted.push(q.execute(&mut **tx).await?.rows_affected() > 0);
        }
        Ok((stored, deleted))
    }

    /// Routes as the statements read them: a JSON array.
    fn routes(routes: &[String]) -> String {
        serde_json::to_string(routes).unwrap_or_else(|_| "[]".to_owned())
    }
}

delay_store!(SqliteDelayStore);
