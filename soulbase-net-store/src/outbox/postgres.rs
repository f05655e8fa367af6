//! [`PostgresStore`]: the outbox of a fleet — several instances deliver from one table.

use std::{
    str::FromStr,
    sync::{Arc, OnceLock},
    time::Duration,
};

use soulbase_net_core::NetError;
use sqlx::{
    postgres::{PgConnectOptions, PgListener, PgPoolOptions},
    PgPool,
};
use tokio::sync::Notify;

use super::{
    sql::{migrate_postgres, sql_store, Dialect, Migration, Sql},
    timed, StoreOptions,
};

/// The schema's versions, oldest first: `(version, name, statements)`; `{t}` is the table.
/// Applied in order under an advisory lock (instances starting together apply
/// each version once), recorded in `{t}_migrations`.
const MIGRATIONS: &[Migration] = &[
    (
        1,
        "items, dead letters, and a notification on every insert",
        &[
            "CREATE TABLE IF NOT EXISTS {t} (
                id BIGSERIAL PRIMARY KEY,
                dedup_id TEXT UNIQUE,
                method TEXT NOT NULL,
                url TEXT NOT NULL,
                headers TEXT NOT NULL,
                body BYTEA NOT NULL,
                tenant TEXT,
                idem_key TEXT NOT NULL,
                deliver_at BIGINT NOT NULL,
                deadline BIGINT,
                attempts BIGINT NOT NULL DEFAULT 0,
                max_attempts BIGINT NOT NULL,
                lease_until BIGINT
            )",
            "CREATE INDEX IF NOT EXISTS {t}_due ON {t} (deliver_at)",
            "CREATE TABLE IF NOT EXISTS {t}_dead (
                id BIGINT PRIMARY KEY,
                dedup_id TEXT,
                method TEXT NOT NULL,
                url TEXT NOT NULL,
                headers TEXT NOT NULL,
                body BYTEA NOT NULL,
                tenant TEXT,
                idem_key TEXT NOT NULL,
                deliver_at BIGINT NOT NULL,
                deadline BIGINT,
                attempts BIGINT NOT NULL,
                max_attempts BIGINT NOT NULL,
                reason TEXT NOT NULL,
                status BIGINT,
                died_at BIGINT NOT NULL
            )",
            // Every insert — `enqueue`, `enqueue_in` inside a caller's transaction (sent at its
            // commit, never for a rollback), a requeue — wakes the listening instances.
            "CREATE OR REPLACE FUNCTION {t}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_notify('{t}', ''); RETURN NULL; END $$",
            "CREATE OR REPLACE TRIGGER {t}_notify AFTER INSERT ON {t}
             FOR EACH STATEMENT EXECUTE FUNCTION {t}_notify()",
        ],
    ),
    (
        2,
        "acknowledged items kept for a retention",
        &[
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS done_at BIGINT",
            "CREATE INDEX IF NOT EXISTS {t}_done ON {t} (done_at)",
        ],
    ),
    (
        3,
        "claim tokens, so that a lease can be extended without changing its fence",
        &["ALTER TABLE {t} ADD COLUMN IF NOT EXISTS claim_id BIGINT"],
    ),
    (
        4,
        "ordering keys: items of one key delivered one at a time, in enqueue order",
        &[
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS ordering_key TEXT",
            "ALTER TABLE {t}_dead ADD COLUMN IF NOT EXISTS ordering_key TEXT",
            // The first waiting item of each key, and the leased items of a key: partial
            // indexes that items without a key (and acknowledged ones) never enter.
            "CREATE INDEX IF NOT EXISTS {t}_ordering ON {t} (ordering_key, id)
             WHERE ordering_key IS NOT NULL AND done_at IS NULL",
            "CREATE INDEX IF NOT EXISTS {t}_ordering_leased ON {t} (ordering_key)
             WHERE ordering_key IS NOT NULL AND done_at IS NULL AND lease_until IS NOT NULL",
        ],
    ),
];

/// The schema version this build migrates to.
pub const POSTGRES_SCHEMA_VERSION: i64 = 4;

/// The outbox of a fleet: one PostgreSQL table that any number of instances enqueue to and
/// deliver from.
///
/// - **No double claims**: due items are claimed with `FOR UPDATE SKIP LOCKED` under a lease,
///   so two instances never hold one item at once; a crashed instance's claims come back when
///   its lease ends. A slow holder whose lease ran out is fenced: its `reschedule`/`dead`
///   change nothing once another instance claimed the item.
/// - **Woken at once**: an insert trigger `NOTIFY`s the table's channel and every instance
///   `LISTEN`s on it (reconnecting by itself); polling stays as the fallback.
/// - **Transactional enqueue**: [`enqueue_in`](Self::enqueue_in) stores the item in the
///   caller's own transaction, so the call is recorded if and only if the business change
///   commits.
/// - **Migrations**: versioned, applied at connect under an advisory lock, recorded in
///   `<table>_migrations`; the table's name is configurable ([`StoreOptions::table`]).
/// - Every operation is bounded by [`StoreOptions::op_timeout`]; credentials never appear in
///   errors or `Debug`.
///
/// # Examples
/// ```no_run
/// # async fn f() -> Result<(), soulbase_net_core::NetError> {
/// use soulbase_net_store::outbox::{OutboxItem, PostgresStore};
///
/// let store = PostgresStore::connect("postgres://app@db.internal/app").await?;
/// let mut tx = store.pool().begin().await.expect("a transaction");
/// // ... the business change, in `tx` ...
/// store.enqueue_in(&mut tx, OutboxItem::post("https://partner.example/hook", "{}")).await?;
/// tx.commit().await.expect("committed"); // the call exists from here on, and only if this commits
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    options: StoreOptions,
    sql: Sql,
    wake: Arc<Notify>,
    listener: Arc<Listener>,
}

/// The task listening for notifications: started by the first `wakeups`, stopped with the
/// last clone of the store.
#[derive(Default)]
struct Listener(OnceLock<Option<tokio::task::JoinHandle<()>>>);

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(Some(task)) = self.0.get() {
            task.abort();
        }
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL (and its credentials) is never shown.
        f.debug_struct("PostgresStore")
            .field("table", &self.options.table)
            .field("connections", &self.pool.size())
            .finish_non_exhaustive()
    }
}

/// Builds a [`PostgresStore`]; from [`PostgresStore::builder`].
pub struct PostgresStoreBuilder {
    url: String,
    options: StoreOptions,
    max_connections: u32,
}

impl std::fmt::Debug for PostgresStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStoreBuilder")
            .field("options", &self.options)
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

impl PostgresStoreBuilder {
    /// Table name, retention and operation timeout.
    pub fn options(mut self, options: StoreOptions) -> Self {
        self.options = options;
        self
    }

    /// Connections at most (one more is held by the listener). Default 10.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Connects and migrates the schema.
    ///
    /// # Errors
    /// `Io` when the URL is not a PostgreSQL URL, the server cannot be reached (within the
    /// operation timeout) or the schema cannot be migrated — never with the URL's credentials
    /// in the message.
    pub async fn connect(self) -> Result<PostgresStore, NetError> {
        let pool = pool(
            &self.url,
            self.max_connections,
            self.options.op_timeout,
            "outbox",
        )
        .await?;
        let sql = Sql::new(&self.options.table, Dialect::Postgres);
        timed(
            self.options.op_timeout,
            "migrating the schema",
            migrate_postgres(
                &pool,
                &sql.versions,
                &self.options.table,
                MIGRATIONS,
                POSTGRES_SCHEMA_VERSION,
            ),
        )
        .await?;
        Ok(PostgresStore {
            pool,
            sql,
            options: self.options,
            wake: Arc::new(Notify::new()),
            listener: Arc::new(Listener::default()),
        })
    }
}

/// Listens on the table's channel for as long as the store lives, waking the outbox on each
/// notification — and once after each (re)connect, for what was sent while it was away.
async fn listen(pool: PgPool, channel: String, wake: Arc<Notify>) {
    loop {
        if let Ok(mut listener) = PgListener::connect_with(&pool).await {
            if listener.listen(&channel).await.is_ok() {
                wake.notify_one();
                loop {
                    match listener.try_recv().await {
                        Ok(Some(_)) => wake.notify_one(),
                        // The connection dropped; the next call reconnects and listens again.
                        Ok(None) => wake.notify_one(),
                        Err(e) => {
                            tracing::debug!(error = %e, "outbox: listening stopped");
                            break;
                        }
                    }
                }
            }
        }
        // Polling covers the gap.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user[:password]@host[:port]/database`), table `outbox`,
    /// and migrates the schema.
    ///
    /// # Errors
    /// As [`PostgresStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, NetError> {
        Self::builder(url).connect().await
    }

    /// A builder, for a table name, a retention, a timeout or a pool size of its own.
    pub fn builder(url: &str) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: url.to_owned(),
            options: StoreOptions::default(),
            max_connections: 10,
        }
    }
}

sql_store!(PostgresStore, PgPool, sqlx::PgConnection, {
    fn wakeups(&self) -> Option<Arc<Notify>> {
        let started = self.listener.0.get_or_init(|| {
            let handle = tokio::runtime::Handle::try_current().ok()?;
            Some(handle.spawn(listen(
                self.pool.clone(),
                self.options.table.clone(),
                self.wake.clone(),
            )))
        });
        started.as_ref().map(|_| self.wake.clone())
    }
});

/// A pool of at most `max` connections to the PostgreSQL at `url`, each acquired within
/// `op_timeout`; `what` names the store in errors, which never show the URL's credentials.
pub(crate) async fn pool(
    url: &str,
    max: u32,
    op_timeout: Duration,
    what: &str,
) -> Result<PgPool, NetError> {
    let connect = PgConnectOptions::from_str(url).map_err(|_| {
        NetError::new(soulbase_net_core::ErrorKind::Io).with_message(format!(
            "{what} store: the PostgreSQL URL is not valid (postgres://user[:password]@host[:port]/database)"
        ))
    })?;
    let target = format!(
        "PostgreSQL at {}:{}",
        connect.get_host(),
        connect.get_port()
    );
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(op_timeout)
        .connect_with(connect)
        .await
        .map_err(|e| {
            NetError::new(soulbase_net_core::ErrorKind::Io)
                .with_message(format!("{what} store: connecting to {target}"))
                .with_source(e)
        })
}
