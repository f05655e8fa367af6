//! `PostgresDelayStore` (feature `postgres`): the delay tasks of several servers in one
//! PostgreSQL table; each claims only the routes it serves, `FOR UPDATE SKIP LOCKED`.
#![cfg(feature = "postgres")]

use soulbase_net_core::NetError;
use sqlx::PgPool;

use super::{
    sql::{delay_store, DelaySql},
    DelayStoreOptions,
};
use crate::outbox::sql::{migrate_postgres, Dialect, Migration};

/// The schema's versions, oldest first (`{t}` is the table), recorded in `{t}_migrations`
/// under an advisory lock (servers starting together apply each once).
const MIGRATIONS: &[Migration] = &[(
    1,
    "delay tasks, due by next_at",
    &[
        "CREATE TABLE IF NOT EXISTS {t} (
            id TEXT PRIMARY KEY,
            route_key TEXT NOT NULL,
            fire_at BIGINT NOT NULL,
            next_at BIGINT NOT NULL,
            compression TEXT NOT NULL,
            payload BYTEA NOT NULL,
            attempts BIGINT NOT NULL DEFAULT 0,
            lease_until BIGINT,
            claim_id BIGINT,
            created_at BIGINT NOT NULL
        )",
        "CREATE INDEX IF NOT EXISTS {t}_due ON {t} (route_key, next_at)",
        "CREATE INDEX IF NOT EXISTS {t}_next ON {t} (next_at)",
    ],
)];

/// The delay tasks in a PostgreSQL table, shared by every server that connects to it.
#[derive(Clone)]
pub struct PostgresDelayStore {
    pool: PgPool,
    options: DelayStoreOptions,
    sql: DelaySql,
}

impl std::fmt::Debug for PostgresDelayStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL (and its credentials) is never shown.
        f.debug_struct("PostgresDelayStore")
            .field("table", &self.options.table)
            .finish_non_exhaustive()
    }
}

impl PostgresDelayStore {
    /// Connects to `url` and migrates the schema.
    ///
    /// # Errors
    /// `Io` when the URL is not valid, the server cannot be reached or the schema cannot be
    /// migrated — never with the URL's credentials in the message.
    pub async fn connect(url: &str, options: DelayStoreOptions) -> Result<Self, NetError> {
        let pool = crate::outbox::postgres::pool(url, 10, options.op_timeout, "delay").await?;
        let sql = DelaySql::new(&options.table, Dialect::Postgres);
        crate::outbox::timed(
            options.op_timeout,
            "migrating the delay schema",
            migrate_postgres(&pool, &sql.versions, &options.table, MIGRATIONS, i64::MAX),
        )
        .await?;
        Ok(Self { pool, options, sql })
    }

    /// How a write transaction begins.
    fn begin(&self) -> &'static str {
        "BEGIN"
    }

    /// Routes as the statements read them: a `text[]`.
    fn routes(routes: &[String]) -> Vec<String> {
        routes.to_vec()
    }
}

delay_store!(PostgresDelayStore);
