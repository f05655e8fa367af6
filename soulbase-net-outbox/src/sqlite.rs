//! [`SqliteStore`]: the embedded outbox — one SQLite file in WAL mode, one writer.

use std::{
    path::Path,
    str::FromStr,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use soulbase_net_core::{ErrorKind, NetError};
use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
    Row, SqlitePool,
};

use crate::store::{DeadLetter, Enqueued, OutboxStore, StoredItem};

/// The schema, versioned by `PRAGMA user_version`: version 1.
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS outbox (
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
    "CREATE INDEX IF NOT EXISTS outbox_due ON outbox (deliver_at)",
    "CREATE TABLE IF NOT EXISTS outbox_dead (
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
    "PRAGMA user_version = 1",
];

/// The embedded outbox: a SQLite file (created with its schema when missing), WAL mode,
/// `synchronous = FULL` (an acknowledged enqueue survives a power cut), one connection (SQLite
/// has one writer; a single connection serialises without `SQLITE_BUSY`).
///
/// # Examples
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let dir = std::env::temp_dir().join(format!("outbox-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let store = soulbase_net_outbox::SqliteStore::open(dir.join("outbox.db")).await.unwrap();
/// use soulbase_net_outbox::OutboxStore;
/// assert_eq!(store.pending().await.unwrap(), 0);
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

fn io(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> NetError {
    NetError::new(ErrorKind::Io)
        .with_message(format!("outbox store: {what}"))
        .with_source(e)
}

fn ms(t: SystemTime) -> i64 {
    let d = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn at(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn encode_headers(h: &HeaderMap) -> String {
    let pairs: Vec<(String, String)> = h
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".to_owned())
}

fn decode_headers(text: &str) -> HeaderMap {
    let pairs: Vec<(String, String)> = serde_json::from_str(text).unwrap_or_default();
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(n.as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            h.append(n, v);
        }
    }
    h
}

fn item(row: &sqlx::sqlite::SqliteRow) -> Result<StoredItem, NetError> {
    let get = |e: sqlx::Error| io("reading an item", e);
    let method: String = row.try_get("method").map_err(get)?;
    Ok(StoredItem {
        id: row.try_get("id").map_err(get)?,
        dedup_id: row.try_get("dedup_id").map_err(get)?,
        method: Method::from_str(&method).map_err(|e| io("reading a method", e))?,
        url: row.try_get("url").map_err(get)?,
        headers: decode_headers(&row.try_get::<String, _>("headers").map_err(get)?),
        body: Bytes::from(row.try_get::<Vec<u8>, _>("body").map_err(get)?),
        tenant: row.try_get("tenant").map_err(get)?,
        idempotency_key: row.try_get("idem_key").map_err(get)?,
        deliver_at: at(row.try_get("deliver_at").map_err(get)?),
        deadline: row
            .try_get::<Option<i64>, _>("deadline")
            .map_err(get)?
            .map(at),
        attempts: u32::try_from(row.try_get::<i64, _>("attempts").map_err(get)?).unwrap_or(0),
        max_attempts: u32::try_from(row.try_get::<i64, _>("max_attempts").map_err(get)?)
            .unwrap_or(1),
    })
}

impl SqliteStore {
    /// Opens (or creates) the outbox at `path`.
    ///
    /// # Errors
    /// `Io` when the file cannot be opened or its schema created.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, NetError> {
        let options = SqliteConnectOptions::new()
            .filename(path.as_ref())
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(|e| io(&format!("opening {}", path.as_ref().display()), e))?;
        for statement in SCHEMA {
            sqlx::query(statement)
                .execute(&pool)
                .await
                .map_err(|e| io("creating the schema", e))?;
        }
        Ok(Self { pool })
    }
}

#[async_trait::async_trait]
impl OutboxStore for SqliteStore {
    async fn enqueue(&self, item: StoredItem) -> Result<Enqueued, NetError> {
        if let Some(dedup) = &item.dedup_id {
            let found: Option<(i64,)> = sqlx::query_as("SELECT id FROM outbox WHERE dedup_id = ?")
                .bind(dedup)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| io("looking up an id", e))?;
            if let Some((id,)) = found {
                return Ok(Enqueued::Duplicate(id));
            }
        }
        let done = sqlx::query(
            "INSERT INTO outbox (dedup_id, method, url, headers, body, tenant, idem_key,
                deliver_at, deadline, attempts, max_attempts)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)",
        )
        .bind(&item.dedup_id)
        .bind(item.method.as_str())
        .bind(&item.url)
        .bind(encode_headers(&item.headers))
        .bind(item.body.to_vec())
        .bind(&item.tenant)
        .bind(&item.idempotency_key)
        .bind(ms(item.deliver_at))
        .bind(item.deadline.map(ms))
        .bind(i64::from(item.max_attempts))
        .execute(&self.pool)
        .await
        .map_err(|e| io("storing an item", e))?;
        Ok(Enqueued::New(done.last_insert_rowid()))
    }

    async fn claim_due(
        &self,
        now: SystemTime,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<StoredItem>, NetError> {
        let now_ms = ms(now);
        let until = ms(now + lease);
        // One writer: the select and the lease are one statement.
        let rows = sqlx::query(
            "UPDATE outbox SET lease_until = ?
             WHERE id IN (SELECT id FROM outbox
                          WHERE deliver_at <= ? AND (lease_until IS NULL OR lease_until <= ?)
                          ORDER BY deliver_at LIMIT ?)
             RETURNING *",
        )
        .bind(until)
        .bind(now_ms)
        .bind(now_ms)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| io("claiming due items", e))?;
        rows.iter().map(item).collect()
    }

    async fn next_due(&self) -> Result<Option<SystemTime>, NetError> {
        let row: Option<(Option<i64>,)> =
            sqlx::query_as("SELECT MIN(MAX(deliver_at, COALESCE(lease_until, 0))) FROM outbox")
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| io("finding the next due item", e))?;
        Ok(row.and_then(|(t,)| t).map(at))
    }

    async fn ack(&self, id: i64) -> Result<(), NetError> {
        sqlx::query("DELETE FROM outbox WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(|e| io("acknowledging an item", e))?;
        Ok(())
    }

    async fn reschedule(&self, id: i64, at: SystemTime, attempts: u32) -> Result<(), NetError> {
        sqlx::query(
            "UPDATE outbox SET deliver_at = ?, attempts = ?, lease_until = NULL WHERE id = ?",
        )
        .bind(ms(at))
        .bind(i64::from(attempts))
        .bind(id)
        .execute(&self.pool)
        .await
        .map_err(|e| io("rescheduling an item", e))?;
        Ok(())
    }

    async fn dead(
        &self,
        id: i64,
        attempts: u32,
        reason: &str,
        status: Option<u16>,
    ) -> Result<(), NetError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| io("starting a transaction", e))?;
        sqlx::query(
            "INSERT INTO outbox_dead (id, dedup_id, method, url, headers, body, tenant, idem_key,
                deliver_at, deadline, attempts, max_attempts, reason, status, died_at)
             SELECT id, dedup_id, method, url, headers, body, tenant, idem_key, deliver_at,
                deadline, ?, max_attempts, ?, ?, ? FROM outbox WHERE id = ?",
        )
        .bind(i64::from(attempts))
        .bind(reason)
        .bind(status.map(i64::from))
        .bind(ms(SystemTime::now()))
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(|e| io("moving an item to the dead letters", e))?;
        sqlx::query("DELETE FROM outbox WHERE id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(|e| io("moving an item to the dead letters", e))?;
        tx.commit()
            .await
            .map_err(|e| io("moving an item to the dead letters", e))?;
        Ok(())
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetter>, NetError> {
        let rows = sqlx::query("SELECT * FROM outbox_dead ORDER BY died_at, id")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| io("listing dead letters", e))?;
        rows.iter()
            .map(|row| {
                let get = |e: sqlx::Error| io("reading a dead letter", e);
                Ok(DeadLetter {
                    item: item(row)?,
                    reason: row.try_get("reason").map_err(get)?,
                    status: row
                        .try_get::<Option<i64>, _>("status")
                        .map_err(get)?
                        .and_then(|s| u16::try_from(s).ok()),
                    died_at: at(row.try_get("died_at").map_err(get)?),
                })
            })
            .collect()
    }

    async fn requeue(&self, id: i64) -> Result<bool, NetError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| io("starting a transaction", e))?;
        let moved = sqlx::query(
            "INSERT INTO outbox (id, dedup_id, method, url, headers, body, tenant, idem_key,
                deliver_at, deadline, attempts, max_attempts)
             SELECT id, dedup_id, method, url, headers, body, tenant, idem_key, ?, NULL, 0,
                max_attempts FROM outbox_dead WHERE id = ?",
        )
        .bind(ms(SystemTime::now()))
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(|e| io("requeueing a dead letter", e))?;
        sqlx::query("DELETE FROM outbox_dead WHERE id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(|e| io("requeueing a dead letter", e))?;
        tx.commit()
            .await
            .map_err(|e| io("requeueing a dead letter", e))?;
        Ok(moved.rows_affected() > 0)
    }

    async fn purge_dead(&self) -> Result<u64, NetError> {
        let done = sqlx::query("DELETE FROM outbox_dead")
            .execute(&self.pool)
            .await
            .map_err(|e| io("purging dead letters", e))?;
        Ok(done.rows_affected())
    }

    async fn pending(&self) -> Result<u64, NetError> {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM outbox")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| io("counting items", e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}
