//! Outbox stores: where the outbox's items wait, are claimed, acknowledged, rescheduled and
//! dead-lettered — the item ([`OutboxItem`], [`StoredItem`]), the seam ([`OutboxStore`]),
//! [`SqliteStore`] (the embedded default: one file, WAL) and, with the `postgres` feature,
//! `PostgresStore` (a fleet delivering from one table); [`StoreOptions`] is what both are
//! configured with (table name, retention, timeouts, the sealing key); [`open_store`] opens
//! either from a URL. The delivery itself (claims in batches, the window, the heartbeat that
//! extends leases, acknowledgements) is `soulbase-net-outbox`'s.

mod item;
mod open;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod row;
mod seal;
pub(crate) mod sql;
mod sqlite;

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use soulbase_net_core::{ErrorKind, NetError};
use tokio::sync::Notify;

pub use self::item::OutboxItem;
pub use self::open::open_store;
#[cfg(feature = "postgres")]
pub use self::postgres::{PostgresStore, PostgresStoreBuilder, POSTGRES_SCHEMA_VERSION};
pub(crate) use self::row::Columns;
pub use self::sqlite::{SqliteStore, SqliteStoreBuilder, SQLITE_SCHEMA_VERSION};

/// An item as stored.
#[derive(Clone, Debug)]
pub struct StoredItem {
    /// The store's id.
    pub id: i64,
    /// The caller's id, if any.
    pub dedup_id: Option<String>,
    /// The method.
    pub method: Method,
    /// The URL.
    pub url: String,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
    /// The tenant.
    pub tenant: Option<String>,
    /// The key sent as `Idempotency-Key` on every attempt.
    pub idempotency_key: String,
    /// When it is due.
    pub deliver_at: SystemTime,
    /// When it is given up, if ever.
    pub deadline: Option<SystemTime>,
    /// Attempts made.
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// The claim this copy was handed out under (a token drawn at the claim; 0 when not
    /// claimed). It fences a slow holder: once its lease ran out and another worker claimed the
    /// item, its `ack`, `reschedule`, `dead` and `extend` change nothing. Extending the lease
    /// keeps the token.
    pub claim: i64,
    /// The ordering key, if any: items of one key are delivered one at a time in enqueue
    /// (id) order; a retried item keeps the head of its key, a dead-lettered one is skipped
    /// (the next of its key becomes deliverable once it is dead). See
    /// [`OutboxItem::ordering_key`].
    pub ordering_key: Option<String>,
}

/// What `enqueue` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// Stored under this id.
    New(i64),
    /// An item with the same caller id was already stored (under this id); nothing was added.
    Duplicate(i64),
}

/// An item that will not be delivered, and why.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// The item.
    pub item: StoredItem,
    /// Why: the last error's stable code, or the HTTP status, and a message.
    pub reason: String,
    /// The last status, if the upstream answered.
    pub status: Option<u16>,
    /// When it died.
    pub died_at: SystemTime,
}

/// Where items live. Every method is one short transaction; an error is a `NetError` with kind
/// `Io` saying what failed (a half-written item never exists).
///
/// Leases and due times are on the store's clock where it has one: [`SqliteStore`] and
/// `PostgresStore` compute every lease's end and compare every due time in their statements
/// (PostgreSQL's `clock_timestamp()`, SQLite's machine time), so instances whose clocks
/// disagree neither claim early nor take over each other's live leases. A time an instance
/// gives (an item's `deliver_at`, a reschedule's `at`) is moved onto the store's clock as an
/// offset from the instance's own reading; the `now` arguments are for stores without a clock
/// of their own, and those two ignore them.
#[async_trait::async_trait]
pub trait OutboxStore: Send + Sync + std::fmt::Debug {
    /// Stores `item` durably (returns after the commit).
    async fn enqueue(&self, item: StoredItem) -> Result<Enqueued, NetError>;
    /// Stores `items` durably in one transaction: all or none (returns after the commit).
    async fn enqueue_batch(&self, items: Vec<StoredItem>) -> Result<Vec<Enqueued>, NetError>;
    /// Claims up to `limit` items due at `now` (the store's clock where it has one) for
    /// `lease` (claimed items are not claimed again until the lease ends: a crashed worker's
    /// claims come back). Each copy carries its
    /// [`claim`](StoredItem::claim).
    async fn claim_due(
        &self,
        now: SystemTime,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<StoredItem>, NetError>;
    /// Extends the leases of `items` (`(id, claim)` pairs) to `lease` from the moment the
    /// store writes them, each only while its claim still holds the item; per item, whether it
    /// did. The outbox extends what it holds every half lease, so a live worker keeps its items
    /// however long a delivery takes, and a dead one's come back within a lease.
    async fn extend(&self, items: &[(i64, i64)], lease: Duration) -> Result<Vec<bool>, NetError>;
    /// When the next unclaimed item is due, if any, as a time on this instance's clock.
    async fn next_due(&self) -> Result<Option<SystemTime>, NetError>;
    /// Delivered: forgotten, or kept as done for the store's retention (see
    /// [`StoreOptions::retain_acked`]) — unless the claim was taken over meanwhile (its lease
    /// ran out and another worker holds the item: nothing changes, `Ok(false)`, and that
    /// worker's outcome counts).
    async fn ack(&self, item: &StoredItem) -> Result<bool, NetError>;
    /// [`ack`](Self::ack) for each of `items`, in one transaction where the engine has them
    /// (one commit, one `fsync`, for the lot); per item, whether this claim still held it.
    async fn ack_batch(&self, items: &[StoredItem]) -> Result<Vec<bool>, NetError> {
        let mut done = Vec::with_capacity(items.len());
        for item in items {
            done.push(self.ack(item).await?);
        }
        Ok(done)
    }
    /// Failed, retried later: due at `at`, with `attempts` made and the lease released —
    /// unless the claim was taken over meanwhile (then nothing changes: `Ok(false)`).
    async fn reschedule(
        &self,
        item: &StoredItem,
        at: SystemTime,
        attempts: u32,
    ) -> Result<bool, NetError>;
    /// Given up: moved to the dead letters — unless the claim was taken over meanwhile
    /// (`Ok(false)`).
    async fn dead(
        &self,
        item: &StoredItem,
        attempts: u32,
        reason: &str,
        status: Option<u16>,
    ) -> Result<bool, NetError>;
    /// The dead letters, oldest first.
    async fn dead_letters(&self) -> Result<Vec<DeadLetter>, NetError>;
    /// Puts a dead letter back in the queue, due now, with its attempts reset.
    async fn requeue(&self, id: i64) -> Result<bool, NetError>;
    /// Forgets every dead letter; returns how many.
    async fn purge_dead(&self) -> Result<u64, NetError>;
    /// Items waiting (claimed or not; not the acknowledged ones kept for retention).
    async fn pending(&self) -> Result<u64, NetError>;
    /// The waiting item enqueued with the caller id `dedup_id` (claimed or not), if any.
    async fn find(&self, dedup_id: &str) -> Result<Option<StoredItem>, NetError>;
    /// Forgets the waiting item enqueued with the caller id `dedup_id`; whether there was one.
    /// A delivery of it already under way is not stopped: its worker's outcome then changes
    /// nothing (as for a claim taken over).
    async fn cancel(&self, dedup_id: &str) -> Result<bool, NetError>;
    /// Forgets acknowledged items kept longer than the retention (at `now`, or on the store's
    /// clock); returns how many. The
    /// outbox calls it now and then; a store that forgets at once has nothing to do.
    async fn sweep(&self, _now: SystemTime) -> Result<u64, NetError> {
        Ok(0)
    }
    /// Woken when another process (or this one) stored an item, where the engine can say so
    /// (PostgreSQL's `LISTEN`/`NOTIFY`); `None` when the outbox must poll.
    fn wakeups(&self) -> Option<Arc<Notify>> {
        None
    }
}

/// What both stores are configured with.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use soulbase_net_store::outbox::StoreOptions;
///
/// let options = StoreOptions::default()
///     .table("billing_outbox")
///     .unwrap()
///     .retain_acked(Duration::from_secs(24 * 3600));
/// assert_eq!(options.table_name(), "billing_outbox");
/// assert!(StoreOptions::default().table("drop table;").is_err());
/// ```
#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub(crate) table: String,
    pub(crate) retain_acked: Option<Duration>,
    pub(crate) op_timeout: Duration,
    pub(crate) seal: Option<Arc<crate::outbox::seal::Seal>>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            table: "outbox".to_owned(),
            retain_acked: None,
            op_timeout: Duration::from_secs(30),
            seal: None,
        }
    }
}

impl StoreOptions {
    /// The table's name (default `outbox`); the dead letters live in `<table>_dead`, the
    /// applied migrations in `<table>_migrations`. Several outboxes can share one database
    /// under different names.
    ///
    /// # Errors
    /// `SCHEMA.VALIDATION_FAILED` unless the name is a plain SQL identifier: a lowercase ASCII
    /// letter or `_` first, then letters, digits or `_`, at most 40 characters.
    pub fn table(mut self, name: &str) -> Result<Self, NetError> {
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !first_ok || !rest_ok || name.len() > 40 {
            return Err(NetError::invalid_request(format!(
                "outbox table name `{name}`: a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 40 characters) is needed"
            )));
        }
        self.table = name.to_owned();
        Ok(self)
    }

    /// Keeps acknowledged items (marked done) for `keep` before forgetting them, for audit
    /// and so that enqueueing a delivered item's caller id again within `keep` stores nothing.
    /// Default: forgotten at the ack.
    pub fn retain_acked(mut self, keep: Duration) -> Self {
        self.retain_acked = Some(keep);
        self
    }

    /// The longest one store operation may take before it fails with `Timeout` (a stalled
    /// database must not stall the outbox). On SQLite it is also how long a write waits for
    /// the file's one writer (a caller's open transaction, say). Default 30s.
    pub fn op_timeout(mut self, limit: Duration) -> Self {
        self.op_timeout = limit;
        self
    }

    /// Seals what must not rest in clear with `key` (32 bytes; ChaCha20-Poly1305): the
    /// values of credential headers (`Authorization`, `Proxy-Authorization`, `Cookie`,
    /// `X-Api-Key`, `X-Auth-Token`, `X-Amz-Security-Token`, and any value marked sensitive)
    /// and the URL's query are encrypted before an item is written and opened when it is
    /// claimed; dead letters keep them sealed. Without a key, an item carrying such a header,
    /// or a query parameter named like a credential (`token`, `access_token`, `api_key`,
    /// `key`, `secret`, `password`, `signature`, …), is refused at enqueue. An item sealed
    /// with another key cannot be opened: it goes to the dead letters with the reason. Keep
    /// the key out of the database (an environment variable, a secret manager).
    ///
    /// # Errors
    /// `InvalidRequest` when `key` is not 32 bytes.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_store::outbox::StoreOptions;
    ///
    /// let options = StoreOptions::default().seal_key(&[7u8; 32]).unwrap();
    /// assert!(StoreOptions::default().seal_key(b"too short").is_err());
    /// # let _ = options;
    /// ```
    pub fn seal_key(mut self, key: &[u8]) -> Result<Self, NetError> {
        self.seal = Some(Arc::new(crate::outbox::seal::Seal::new(key)?));
        Ok(self)
    }

    /// The table's name.
    pub fn table_name(&self) -> &str {
        &self.table
    }
}

/// A store failure: kind `Io`, saying what failed.
pub(crate) fn io(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> NetError {
    NetError::new(ErrorKind::Io)
        .with_message(format!("outbox store: {what}"))
        .with_source(e)
}

/// Runs one store operation within `limit`; past it, a `Timeout` naming the operation.
pub(crate) async fn timed<T>(
    limit: Duration,
    what: &str,
    op: impl std::future::Future<Output = Result<T, NetError>>,
) -> Result<T, NetError> {
    match tokio::time::timeout(limit, op).await {
        Ok(done) => done,
        Err(_) => Err(
            NetError::new(ErrorKind::Timeout(soulbase_net_core::Phase::Total)).with_message(
                format!(
                    "outbox store: {what} took longer than {}ms",
                    limit.as_millis()
                ),
            ),
        ),
    }
}

/// Runs one sqlx `statement` as [`timed`] does, its failure an `Io` error saying `what`
/// failed: most operations of the outbox and delay stores are one statement, and this keeps
/// the bound and the error's wording the same for all of them.
pub(crate) async fn run_statement<T>(
    limit: Duration,
    what: &str,
    statement: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, NetError> {
    timed(limit, what, async {
        statement.await.map_err(|e| io(what, e))
    })
    .await
}

/// Milliseconds since the epoch (0 before it, saturating far after).
pub(crate) fn ms(t: SystemTime) -> i64 {
    let d = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `d` in whole milliseconds (saturating).
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The time `ms` milliseconds after the epoch.
pub(crate) fn at(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Headers as stored: a JSON list of `[name, value]` pairs (order and repeats kept).
pub(crate) fn encode_headers(h: &HeaderMap) -> String {
    let pairs: Vec<(&str, String)> = h
        .iter()
        .map(|(n, v)| {
            (
                n.as_str(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".to_owned())
}

/// The headers [`encode_headers`] stored.
pub(crate) fn decode_headers(text: &str) -> HeaderMap {
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

/// Reads a [`StoredItem`] from a row of either engine (the same column names).
pub(crate) fn item_from(row: &impl Columns) -> Result<StoredItem, NetError> {
    use std::str::FromStr as _;
    let get = |e: sqlx::Error| io("reading an item", e);
    let method = row.text("method").map_err(get)?;
    let int = |name: &str| -> Result<i64, NetError> { row.int(name).map_err(get) };
    Ok(StoredItem {
        id: int("id")?,
        dedup_id: row.opt_text("dedup_id").map_err(get)?,
        method: Method::from_str(&method).map_err(|e| io("reading a method", e))?,
        url: row.text("url").map_err(get)?,
        headers: decode_headers(&row.text("headers").map_err(get)?),
        body: Bytes::from(row.bytes("body").map_err(get)?),
        tenant: row.opt_text("tenant").map_err(get)?,
        idempotency_key: row.text("idem_key").map_err(get)?,
        deliver_at: at(int("deliver_at")?),
        deadline: row.opt_int("deadline").map_err(get)?.map(at),
        attempts: u32::try_from(int("attempts")?).unwrap_or(0),
        max_attempts: u32::try_from(int("max_attempts")?).unwrap_or(1),
        // Dead letters have no lease: no claim.
        claim: row.opt_int("claim_id").ok().flatten().unwrap_or(0),
        // A table migrated only to an older version has no such column: no key.
        ordering_key: row.opt_text("ordering_key").ok().flatten(),
    })
}

/// Reads a [`DeadLetter`] from a row of either engine.
pub(crate) fn dead_from(row: &impl Columns) -> Result<DeadLetter, NetError> {
    let get = |e: sqlx::Error| io("reading a dead letter", e);
    Ok(DeadLetter {
        item: item_from(row)?,
        reason: row.text("reason").map_err(get)?,
        status: row
            .opt_int("status")
            .map_err(get)?
            .and_then(|s| u16::try_from(s).ok()),
        died_at: at(row.int("died_at").map_err(get)?),
    })
}
