//! `PostgresDelayStore` (feature `postgres`): the delay tasks of several servers in one
//! PostgreSQL table; each claims only the routes it serves, `FOR UPDATE SKIP LOCKED`.
#![cfg(feature = "postgres")]

use soulbase_net_core::NetError;
use sqlx::PgPool;

use super::{
    sql::{delay_migrations, delay_store, DelaySql},
    DelayStoreOptions, DelayTask, Scheduled,
};
use crate::outbox::sql::{migrate_postgres, Dialect, Migration};

/// The schema's versions, oldest first (`{t}` is the table), recorded in `{t}_migrations`
/// under an advisory lock (servers starting together apply each once).
const MIGRATIONS: &[Migration] = delay_migrations!("BIGINT", "BYTEA");

/// The delay tasks in a PostgreSQL table, shared by every server that connects to it.
#[derive(Clone)]
pub struct PostgresDelayStore {
    pool: PgPool,
    options: DelayStoreOptions,
    sql: DelaySql,
    batch: Batch,
}

/// A batch's writes as one statement each: a round trip to the server per batch, not per row.
#[derive(Debug, Clone)]
struct Batch {
    /// Inserts the rows of five arrays; returns the ids that were new.
    insert: String,
    /// Deletes the rows of (id, claim) pairs (claim 0: whoever holds it); returns their ids.
    ack: String,
}

impl Batch {
    fn new(t: &str) -> Self {
        let now = Dialect::Postgres.now();
        Self {
            insert: format!(
                "INSERT INTO {t} (id, route_key, fire_at, next_at, compression, payload, attempts,
                    created_at)
                 SELECT id, route_key, fire_at, fire_at, compression, payload, 0, {now}
                 FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::text[], $5::bytea[])
                    AS n(id, route_key, fire_at, compression, payload)
                 ON CONFLICT (id) DO NOTHING
                 RETURNING id"
            ),
            ack: format!(
                "DELETE FROM {t} AS d USING UNNEST($1::text[], $2::int8[]) AS a(id, claim)
                 WHERE d.id = a.id AND (a.claim = 0 OR d.claim_id = a.claim)
                 RETURNING d.id"
            ),
        }
    }
}

/// For each of `ids` in order, whether it is among `hits` (each hit counted once: the same id
/// twice in a batch is new, or deleted, the first time only).
fn matched<'a>(ids: impl Iterator<Item = &'a str>, hits: Vec<String>) -> Vec<bool> {
    let mut hits: std::collections::HashSet<String> = hits.into_iter().collect();
    ids.map(|id| hits.remove(id)).collect()
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
        let batch = Batch::new(&options.table);
        Ok(Self {
            pool,
            options,
            sql,
            batch,
        })
    }

    /// Stores `tasks` and deletes the acknowledged `acks` inside `tx`: a statement for each
    /// kind, whatever the batch's size.
    async fn write_rows(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        tasks: &[DelayTask],
        acks: &[(String, i64)],
    ) -> Result<(Vec<Scheduled>, Vec<bool>), sqlx::Error> {
        let mut stored = Vec::new();
        if !tasks.is_empty() {
            let new: Vec<String> = sqlx::query_scalar(&self.batch.insert)
                .bind(tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>())
                .bind(
                    tasks
                        .iter()
                        .map(|t| t.route_key.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(tasks.iter().map(|t| t.fire_at).collect::<Vec<_>>())
                .bind(
                    tasks
                        .iter()
                        .map(|t| t.compression.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    tasks
                        .iter()
                        .map(|t| t.payload.as_ref())
                        .collect::<Vec<&[u8]>>(),
                )
                .fetch_all(&mut **tx)
                .await?;
            stored = matched(tasks.iter().map(|t| t.id.as_str()), new)
                .into_iter()
                .map(|new| {
                    if new {
                        Scheduled::New
                    } else {
                        Scheduled::Duplicate
                    }
                })
                .collect();
        }
        let mut deleted = Vec::new();
        if !acks.is_empty() {
            // In id order: two transactions deleting the same rows never wait for each other
            // in a cycle.
            let mut order: Vec<&(String, i64)> = acks.iter().collect();
            order.sort_unstable();
            let gone: Vec<String> = sqlx::query_scalar(&self.batch.ack)
                .bind(order.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>())
                .bind(order.iter().map(|(_, claim)| *claim).collect::<Vec<_>>())
                .fetch_all(&mut **tx)
                .await?;
            deleted = matched(acks.iter().map(|(id, _)| id.as_str()), gone);
        }
        Ok((stored, deleted))
    }

    /// Routes as the statements read them: a `text[]`.
    fn routes(routes: &[String]) -> Vec<String> {
        routes.to_vec()
    }
}

delay_store!(PostgresDelayStore);
