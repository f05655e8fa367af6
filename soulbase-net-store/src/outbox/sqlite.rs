//! [`SqliteStore`]: the embedded outbox — one SQLite file in WAL mode, one writer.

use std::path::{Path, PathBuf};

use soulbase_net_core::NetError;
use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
    SqlitePool,
};

use super::{
    io,
    sql::{migrate_sqlite, sql_store, Dialect, Migration, Sql},
    StoreOptions,
};

/// The schema's versions, oldest first: `(version, name, statements)`; `{t}` is the table.
/// Applied in order, each version once, recorded in `{t}_migrations`.
/// Version 1's statements are idempotent, so a file made before versions were recorded
/// migrates too.
const MIGRATIONS: &[Migration] = &[
    (
        1,
        "items and dead letters",
        &[
            "CREATE TABLE IF NOT EXISTS {t} (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                dedup_id TEXT UNIQUE,
                method TEXT NOT NULL,
                url TEXT NOT NULL,
                headers TEXT NOT NULL,
                body BLOB NOT NULL,
                tenant TEXT,
                idem_key TEXT NOT NULL,
                deliver_at INTEGER NOT NULL,
                deadline INTEGER,
                attempts INTEGER NOT NULL DEFAULT 0,
                max_attempts INTEGER NOT NULL,
                lease_until INTEGER
            )",
            "CREATE INDEX IF NOT EXISTS {t}_due ON {t} (deliver_at)",
            "CREATE TABLE IF NOT EXISTS {t}_dead (
                id INTEGER PRIMARY KEY,
                dedup_id TEXT,
                method TEXT NOT NULL,
                url TEXT NOT NULL,
                headers TEXT NOT NULL,
                body BLOB NOT NULL,
                tenant TEXT,
                idem_key TEXT NOT NULL,
                deliver_at INTEGER NOT NULL,
                deadline INTEGER,
                attempts INTEGER NOT NULL,
                max_attempts INTEGER NOT NULL,
                reason TEXT NOT NULL,
                status INTEGER,
                died_at INTEGER NOT NULL
            )",
        ],
    ),
    (
        2,
        "acknowledged items kept for a retention",
        &[
            "ALTER TABLE {t} ADD COLUMN done_at INTEGER",
            "CREATE INDEX IF NOT EXISTS {t}_done ON {t} (done_at)",
        ],
    ),
    (
        3,
        "claim tokens, so that a lease can be extended without changing its fence",
        &["ALTER TABLE {t} ADD COLUMN claim_id INTEGER"],
    ),
    (
        4,
        "ordering keys: items of one key delivered one at a time, in enqueue order",
        &[
            "ALTER TABLE {t} ADD COLUMN ordering_key TEXT",
            "ALTER TABLE {t}_dead ADD COLUMN ordering_key TEXT",
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
pub const SQLITE_SCHEMA_VERSION: i64 = 4;

/// The embedded outbox: a SQLite file (created with its schema when missing), WAL mode,
/// `synchronous = FULL` (an acknowledged enqueue survives a power cut), four connections by
/// default ([`SqliteStoreBuilder::max_connections`]). SQLite has one writer: a write waits for
/// the one under way for up to the options' `op_timeout` (30 s by default) instead of failing
/// with `SQLITE_BUSY`. So a caller's open write transaction ([`pool`](Self::pool),
/// [`enqueue_in`](Self::enqueue_in)) delays every write of the outbox — enqueues, claims,
/// acknowledgements — for as long as it stays open (measured: a transaction held 12 s delayed
/// a concurrent enqueue by 12.3 s, which then succeeded), while deliveries already claimed go
/// on. Keep such transactions short. Several processes may open the same file (one enqueues,
/// another delivers); claims are leases, so they never deliver an item at once.
///
/// # Examples
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let dir = std::env::temp_dir().join(format!("outbox-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let store = soulbase_net_store::outbox::SqliteStore::open(dir.join("outbox.db")).await.unwrap();
/// use soulbase_net_store::outbox::OutboxStore;
/// assert_eq!(store.pending().await.unwrap(), 0);
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    options: StoreOptions,
    sql: Sql,
}

/// Builds a [`SqliteStore`]; from [`SqliteStore::builder`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    path: PathBuf,
    options: StoreOptions,
    up_to: i64,
    max_connections: u32,
}

impl SqliteStoreBuilder {
    /// Table name, retention and operation timeout.
    pub fn options(mut self, options: StoreOptions) -> Self {
        self.options = options;
        self
    }

    /// Connections to the file. WAL lets them read at once while one writes; a writer waits
    /// for the one before it (up to the options' `op_timeout`). A caller's transaction
    /// ([`SqliteStore::pool`]) takes one of them, so the outbox keeps the others. Default 4.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(2);
        self
    }

    /// Migrates only up to `version` (for testing a migration from an older schema).
    #[doc(hidden)]
    pub fn schema_version(mut self, version: i64) -> Self {
        self.up_to = version;
        self
    }

    /// Opens (or creates) the file and migrates its schema.
    ///
    /// # Errors
    /// `Io` when the file cannot be opened or its schema created.
    pub async fn open(self) -> Result<SqliteStore, NetError> {
        let options = SqliteConnectOptions::new()
            .filename(&self.path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            // SQLite has one writer: a write waits for the one under way (a caller's open
            // transaction, another process) as long as an operation may take.
            .busy_timeout(self.options.op_timeout);
        let pool = SqlitePoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.options.op_timeout)
            .connect_with(options)
            .await
            .map_err(|e| io(&format!("opening {}", self.path.display()), e))?;
        let sql = Sql::new(&self.options.table, Dialect::Sqlite);
        // `BEGIN IMMEDIATE`: another process opening the file waits for the migration.
        migrate_sqlite(
            &pool,
            &sql.versions,
            &self.options.table,
            MIGRATIONS,
            self.up_to,
        )
        .await?;
        Ok(SqliteStore {
            pool,
            sql,
            options: self.options,
        })
    }
}

impl SqliteStore {
    /// Opens (or creates) the outbox at `path`, table `outbox`.
    ///
    /// # Errors
    /// `Io` when the file cannot be opened or its schema created.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, NetError> {
        Self::builder(path).open().await
    }

    /// A builder, for a table name, a retention or a timeout of its own.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.as_ref().to_path_buf(),
            options: StoreOptions::default(),
            up_to: SQLITE_SCHEMA_VERSION,
            max_connections: 4,
        }
    }
}

sql_store!(SqliteStore, SqlitePool, sqlx::SqliteConnection, {});
