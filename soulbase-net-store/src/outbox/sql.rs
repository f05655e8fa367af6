//! What the SQLite and the PostgreSQL store share: the statements (one text, two dialects),
//! the migration runner, and the [`OutboxStore`](crate::outbox::OutboxStore) implementation, written
//! once as a macro over the engine's concrete sqlx types (a generic one over
//! `sqlx::Database` would need a bound per bound type and column).

/// The engine's dialect, where the statements differ. Public (as
/// [`soulbase_net_store::sql::Dialect`](crate::sql::Dialect)) for the stores of other crates
/// that keep their tables on the same engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite: the embedded engine, one file.
    Sqlite,
    /// PostgreSQL: several instances on one database.
    Postgres,
}

impl Dialect {
    /// The store's clock, in ms since the epoch: every lease and due time is on it, so the
    /// instances' clocks never matter (an instance an hour ahead neither claims early nor
    /// takes over a live lease). PostgreSQL's `clock_timestamp()` is the server's time at that
    /// moment (`now()` would be the transaction's start, stale after a wait for a lock);
    /// SQLite's is the machine's, the one every instance sharing the file runs on.
    pub fn now(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
            Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        }
    }

    /// How a write transaction begins: on SQLite `BEGIN IMMEDIATE`, which takes the file's
    /// one write lock at once (waiting for it as `busy_timeout` allows) rather than at the
    /// first write, so that what the transaction computes meanwhile (a lease's end) is not
    /// stale when it writes.
    pub fn begin(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            Dialect::Postgres => "BEGIN",
        }
    }

    /// `sql`, written with `?` placeholders, as this engine reads it: PostgreSQL numbers
    /// them (`$1`, `$2`, …), SQLite takes them as they are.
    pub fn place(self, sql: String) -> String {
        match self {
            Dialect::Sqlite => sql,
            Dialect::Postgres => numbered(&sql),
        }
    }

    /// The 64-bit integer type's name.
    pub fn int(self) -> &'static str {
        match self {
            Dialect::Sqlite => "INTEGER",
            Dialect::Postgres => "BIGINT",
        }
    }
}

/// The statements of a table's schema versions, kept in `{t}_migrations`.
#[derive(Debug, Clone)]
pub(crate) struct Versions {
    pub(crate) table: String,
    pub(crate) current: String,
    pub(crate) record: String,
}

impl Versions {
    pub(crate) fn new(t: &str, dialect: Dialect) -> Self {
        let int = dialect.int();
        let record =
            format!("INSERT INTO {t}_migrations (version, name, applied_at) VALUES (?, ?, ?)");
        Self {
            table: format!(
                "CREATE TABLE IF NOT EXISTS {t}_migrations (
                    version {int} PRIMARY KEY, name TEXT NOT NULL, applied_at {int} NOT NULL)"
            ),
            current: format!("SELECT CAST(COALESCE(MAX(version), 0) AS {int}) FROM {t}_migrations"),
            record: dialect.place(record),
        }
    }
}

/// One schema version: its number, what it adds, and its statements (`{t}` is the table).
pub type Migration = (i64, &'static str, &'static [&'static str]);

/// The statements, with the table's name in them (built once when the store opens).
#[derive(Debug, Clone)]
pub(crate) struct Sql {
    /// How a write transaction begins (see [`Dialect::begin`]).
    pub(crate) begin: &'static str,
    pub(crate) insert: String,
    pub(crate) find_dedup: String,
    pub(crate) claim: String,
    pub(crate) extend: String,
    pub(crate) next_due: String,
    pub(crate) done: String,
    pub(crate) reschedule: String,
    pub(crate) to_dead: String,
    pub(crate) delete_claimed: String,
    pub(crate) dead_letters: String,
    pub(crate) requeue: String,
    /// Taken first by a requeue, where the engine needs it (see `Sql::new`).
    pub(crate) requeue_lock: Option<String>,
    pub(crate) delete_dead: String,
    pub(crate) purge: String,
    pub(crate) pending: String,
    pub(crate) find: String,
    pub(crate) cancel: String,
    pub(crate) sweep: String,
    pub(crate) versions: Versions,
}

impl Sql {
    pub(crate) fn new(t: &str, dialect: Dialect) -> Self {
        let cols =
            "id, dedup_id, method, url, headers, body, tenant, idem_key, deliver_at, deadline,
            ordering_key";
        let (lock, greatest, int) = match dialect {
            Dialect::Sqlite => ("", "MAX", "INTEGER"),
            // Rows another instance is claiming right now are skipped, not waited for.
            Dialect::Postgres => ("FOR UPDATE SKIP LOCKED", "GREATEST", "BIGINT"),
        };
        let now = dialect.now();
        let place = |sql: String| dialect.place(sql);
        // Whether the row `c` may be claimed as far as its ordering key goes: it has none, or
        // it is the first of its key still waiting (acknowledged items are gone or
        // `done_at`-marked, dead ones moved to `{t}_dead`: a dead head is skipped) and no other
        // item of its key is held under a live lease (a requeued dead letter, first again,
        // waits for the later item in flight). It reads every remaining item of the key,
        // locked or leased by another instance included (no `SKIP LOCKED` here), and at most
        // one item per key passes: the head. On PostgreSQL the head itself is then taken
        // `FOR UPDATE SKIP LOCKED`, so two instances never claim two items of one key at once.
        // The heads are found once per statement (one pass over the partial index
        // `{t}_ordering`); the lease check runs for heads only (`AND` inside the `OR` is
        // evaluated in order) and reads the few leased items of the key (`{t}_ordering_leased`).
        let head = format!(
            "(c.ordering_key IS NULL OR (c.id IN (SELECT MIN(h.id) FROM {t} h
                WHERE h.ordering_key IS NOT NULL AND h.done_at IS NULL GROUP BY h.ordering_key)
              AND NOT EXISTS (SELECT 1 FROM {t} o
                WHERE o.ordering_key = c.ordering_key AND o.ordering_key IS NOT NULL
                  AND o.done_at IS NULL AND o.lease_until IS NOT NULL AND o.id <> c.id
                  AND o.lease_until > {now})))"
        );
        Self {
            begin: dialect.begin(),
            insert: place(format!(
                "INSERT INTO {t} (dedup_id, method, url, headers, body, tenant, idem_key,
                    deliver_at, deadline, attempts, max_attempts, ordering_key)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ? + ({now} - ?), ? + ({now} - ?), 0, ?, ?)
                 ON CONFLICT (dedup_id) DO NOTHING RETURNING id"
            )),
            find_dedup: place(format!("SELECT id FROM {t} WHERE dedup_id = ?")),
            // One statement: the select and the lease. An item with an ordering key is
            // claimable only as the head of its key (see `head`).
            claim: place(format!(
                "UPDATE {t} SET lease_until = {now} + ?, claim_id = ?
                 WHERE id IN (SELECT c.id FROM {t} c
                              WHERE c.done_at IS NULL AND c.deliver_at <= {now}
                                AND (c.lease_until IS NULL OR c.lease_until <= {now})
                                AND {head}
                              ORDER BY c.deliver_at LIMIT ? {lock})
                 RETURNING *"
            )),
            // Only while this claim holds the item: the token, not the lease's end, fences.
            extend: place(format!(
                "UPDATE {t} SET lease_until = {now} + ?
                 WHERE id = ? AND claim_id = ? AND done_at IS NULL"
            )),
            // Over what a claim could take once due and unleased: items without a key, and
            // the first of each key, not before the leases held on its key end (one held by
            // the head itself, or — after a requeue — by a later item of the key).
            next_due: format!(
                "SELECT CAST(MIN({greatest}(c.deliver_at, COALESCE(c.lease_until, 0),
                    CASE WHEN c.ordering_key IS NULL THEN 0
                    ELSE COALESCE((SELECT MAX(o.lease_until) FROM {t} o
                                   WHERE o.ordering_key = c.ordering_key
                                     AND o.ordering_key IS NOT NULL AND o.done_at IS NULL
                                     AND o.lease_until IS NOT NULL), 0) END))
                    - {now} AS {int})
                 FROM {t} c WHERE c.done_at IS NULL
                   AND (c.ordering_key IS NULL OR c.id IN (SELECT MIN(h.id) FROM {t} h
                        WHERE h.ordering_key IS NOT NULL AND h.done_at IS NULL
                        GROUP BY h.ordering_key))"
            ),
            done: place(format!(
                "UPDATE {t} SET done_at = {now}, lease_until = NULL
                 WHERE id = ? AND claim_id = ? AND done_at IS NULL"
            )),
            reschedule: place(format!(
                "UPDATE {t} SET deliver_at = ? + ({now} - ?), attempts = ?, lease_until = NULL,
                    claim_id = NULL
                 WHERE id = ? AND claim_id = ? AND done_at IS NULL"
            )),
            to_dead: place(format!(
                "INSERT INTO {t}_dead ({cols}, attempts, max_attempts, reason, status, died_at)
                 SELECT {cols}, ?, max_attempts, ?, ?, {now} FROM {t}
                 WHERE id = ? AND claim_id = ? AND done_at IS NULL"
            )),
            delete_claimed: place(format!("DELETE FROM {t} WHERE id = ? AND claim_id = ?")),
            dead_letters: format!("SELECT * FROM {t}_dead ORDER BY died_at, id"),
            requeue: place(format!(
                "INSERT INTO {t} ({cols}, attempts, max_attempts)
                 SELECT id, dedup_id, method, url, headers, body, tenant, idem_key, {now}, NULL,
                    ordering_key, 0, max_attempts FROM {t}_dead WHERE id = ?"
            )),
            // A requeued dead letter is the first of its key again: a claim whose snapshot
            // predates the requeue could take a later item of the key while another, started
            // after it, takes the requeued one — two of one key in flight. On PostgreSQL the
            // requeue therefore waits for the claims under way and holds off new ones (this
            // mode conflicts with every writer's, not with readers) for its short transaction:
            // a claim's snapshot is taken after its table lock, so every claim either finished
            // before the requeue (its lease is then seen) or sees the requeued item. SQLite's
            // `BEGIN IMMEDIATE` serialises writers already.
            requeue_lock: match dialect {
                Dialect::Sqlite => None,
                Dialect::Postgres => Some(format!("LOCK TABLE {t} IN SHARE ROW EXCLUSIVE MODE")),
            },
            delete_dead: place(format!("DELETE FROM {t}_dead WHERE id = ?")),
            purge: format!("DELETE FROM {t}_dead"),
            pending: format!("SELECT COUNT(*) FROM {t} WHERE done_at IS NULL"),
            find: place(format!(
                "SELECT * FROM {t} WHERE dedup_id = ? AND done_at IS NULL"
            )),
            cancel: place(format!(
                "DELETE FROM {t} WHERE dedup_id = ? AND done_at IS NULL"
            )),
            sweep: place(format!(
                "DELETE FROM {t} WHERE done_at IS NOT NULL AND done_at <= {now} - ?"
            )),
            versions: Versions::new(t, dialect),
        }
    }
}

/// `?` placeholders as PostgreSQL's `$1`, `$2`, … (the statements above hold no `?` in
/// literals).
pub(crate) fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// Defines `$name(pool, versions, t, migrations, up_to)` for a pool type: applies the versions
/// of `migrations` not yet recorded in `{t}_migrations`, up to `up_to`, in one transaction
/// opened by `$begin`, after the serialising statement `$lock(t)` makes (if any) — shared by
/// every table of the store crate (outbox items, delay tasks).
macro_rules! migrate_fn {
    ($name:ident, $pool:ty, $begin:expr, $lock:expr) => {
        pub(crate) async fn $name(
            pool: &$pool,
            versions: &$crate::outbox::sql::Versions,
            t: &str,
            migrations: &[$crate::outbox::sql::Migration],
            up_to: i64,
        ) -> Result<(), soulbase_net_core::NetError> {
            use $crate::outbox::io;
            let fail = |e| io("migrating the schema", e);
            let mut tx = pool.begin_with($begin).await.map_err(fail)?;
            let lock: Option<String> = $lock(t);
            if let Some(lock) = lock {
                sqlx::raw_sql(&lock).execute(&mut *tx).await.map_err(fail)?;
            }
            sqlx::raw_sql(&versions.table)
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
            let (current,): (i64,) = sqlx::query_as(&versions.current)
                .fetch_one(&mut *tx)
                .await
                .map_err(fail)?;
            for (version, name, statements) in migrations {
                if *version <= current || *version > up_to {
                    continue;
                }
                for statement in *statements {
                    sqlx::raw_sql(&statement.replace("{t}", t))
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| {
                            io(&format!("migrating the schema to version {version}"), e)
                        })?;
                }
                sqlx::query(&versions.record)
                    .bind(version)
                    .bind(*name)
                    .bind($crate::outbox::ms(std::time::SystemTime::now()))
                    .execute(&mut *tx)
                    .await
                    .map_err(fail)?;
            }
            tx.commit().await.map_err(fail)
        }
    };
}

// SQLite serialises with `BEGIN IMMEDIATE` (the file's one write lock).
migrate_fn!(
    migrate_sqlite,
    sqlx::SqlitePool,
    "BEGIN IMMEDIATE",
    |_: &str| None
);
// PostgreSQL: instances starting together take turns on an advisory lock keyed by the table.
#[cfg(feature = "postgres")]
migrate_fn!(migrate_postgres, sqlx::PgPool, "BEGIN", |t: &str| Some(
    format!("SELECT pg_advisory_xact_lock(hashtext('{t}_migrations'))")
));

/// Implements the shared parts for a store type `$store` with fields `pool`, `options` and
/// `sql` on engine connection type `$conn`:
/// - `insert(conn, item)`, used by `enqueue` and by the store's `enqueue_in`;
/// - `OutboxStore`, every operation bounded by the store's `op_timeout`, plus `$extra` items.
macro_rules! sql_store {
    ($store:ty, $pool:ty, $conn:ty, { $($extra:item)* }) => {
        impl $store {
            /// The schema version the database is at.
            ///
            /// # Errors
            /// `Io` when the database cannot be read.
            pub async fn schema_version(&self) -> Result<i64, soulbase_net_core::NetError> {
                let (v,): (i64,) = sqlx::query_as(&self.sql.versions.current)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| $crate::outbox::io("reading the schema version", e))?;
                Ok(v)
            }

            /// The connection pool, for the caller's own transactions (see `enqueue_in`).
            pub fn pool(&self) -> &$pool {
                &self.pool
            }

            /// Stores `item` inside the caller's transaction: it exists if and only if the
            /// transaction commits.
            ///
            /// # Errors
            /// `SCHEMA.VALIDATION_FAILED` for an invalid item; `Io` when the insert fails
            /// (the caller's transaction should then be rolled back).
            pub async fn enqueue_in(
                &self,
                tx: &mut sqlx::Transaction<'_, <$conn as sqlx::Connection>::Database>,
                item: $crate::outbox::OutboxItem,
            ) -> Result<$crate::outbox::Enqueued, soulbase_net_core::NetError> {
                let stored = item.into_stored(std::time::SystemTime::now())?;
                self.insert(&mut **tx, &stored).await
            }

            async fn insert(
                &self,
                conn: &mut $conn,
                item: &$crate::outbox::StoredItem,
            ) -> Result<$crate::outbox::Enqueued, soulbase_net_core::NetError> {
                use $crate::outbox::{encode_headers, io, ms};
                // Credentials sealed (or refused without a key) before anything is written.
                let (headers, url) = $crate::outbox::seal::for_storage(
                    self.options.seal.as_deref(),
                    &item.headers,
                    &item.url,
                )?;
                // Twice at most: a duplicate acknowledged (and forgotten) between the insert
                // and the lookup is stored anew.
                for _ in 0..2 {
                    let inserted: Option<(i64,)> = sqlx::query_as(&self.sql.insert)
                        .bind(&item.dedup_id)
                        .bind(item.method.as_str())
                        .bind(&url)
                        .bind(encode_headers(&headers))
                        .bind(item.body.as_ref())
                        .bind(&item.tenant)
                        .bind(&item.idempotency_key)
                        .bind(ms(item.deliver_at))
                        .bind(ms(std::time::SystemTime::now()))
                        .bind(item.deadline.map(ms))
                        .bind(ms(std::time::SystemTime::now()))
                        .bind(i64::from(item.max_attempts))
                        .bind(&item.ordering_key)
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(|e| io("storing an item", e))?;
                    if let Some((id,)) = inserted {
                        return Ok($crate::outbox::Enqueued::New(id));
                    }
                    let found: Option<(i64,)> = sqlx::query_as(&self.sql.find_dedup)
                        .bind(&item.dedup_id)
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(|e| io("looking up an id", e))?;
                    if let Some((id,)) = found {
                        return Ok($crate::outbox::Enqueued::Duplicate(id));
                    }
                }
                Err(soulbase_net_core::NetError::new(soulbase_net_core::ErrorKind::Io)
                    .with_message("outbox store: an item with this id kept appearing and vanishing"))
            }
        }

        #[async_trait::async_trait]
        impl $crate::outbox::OutboxStore for $store {
            async fn enqueue(
                &self,
                item: $crate::outbox::StoredItem,
            ) -> Result<$crate::outbox::Enqueued, soulbase_net_core::NetError> {
                $crate::outbox::timed(self.options.op_timeout, "storing an item", async {
                    let mut conn = self
                        .pool
                        .acquire()
                        .await
                        .map_err(|e| $crate::outbox::io("storing an item", e))?;
                    self.insert(&mut conn, &item).await
                })
                .await
            }

            async fn enqueue_batch(
                &self,
                items: Vec<$crate::outbox::StoredItem>,
            ) -> Result<Vec<$crate::outbox::Enqueued>, soulbase_net_core::NetError> {
                let what = "storing a batch of items";
                let fail = |e| $crate::outbox::io(what, e);
                $crate::outbox::timed(self.options.op_timeout, what, async {
                    let mut tx = self.pool.begin_with(self.sql.begin).await.map_err(fail)?;
                    let mut done = Vec::with_capacity(items.len());
                    for item in &items {
                        done.push(self.insert(&mut *tx, item).await?);
                    }
                    tx.commit().await.map_err(fail)?;
                    Ok(done)
                })
                .await
            }

            async fn claim_due(
                &self,
                // The store's own clock decides (see `Sql::new`).
                _now: std::time::SystemTime,
                limit: u32,
                lease: std::time::Duration,
            ) -> Result<Vec<$crate::outbox::StoredItem>, soulbase_net_core::NetError> {
                use $crate::outbox::millis;
                // A token of this claim: what fences its holder (a positive i64).
                let token = fastrand::i64(1..i64::MAX);
                let rows = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "claiming due items",
                    sqlx::query(&self.sql.claim)
                        .bind(millis(lease))
                        .bind(token)
                        .bind(i64::from(limit))
                        .fetch_all(&self.pool),
                )
                .await?
                .iter()
                .map($crate::outbox::item_from)
                .collect::<Result<Vec<_>, _>>()?;
                // Sealed parts opened for delivery; an item this store cannot open (sealed with
                // another key) goes to the dead letters with the reason, still sealed.
                let mut ready = Vec::with_capacity(rows.len());
                for mut item in rows {
                    let seal = self.options.seal.as_deref();
                    match $crate::outbox::seal::opened(seal, &mut item.headers, &mut item.url) {
                        Ok(()) => ready.push(item),
                        Err(why) => {
                            self.dead(&item, item.attempts, &why, None).await?;
                        }
                    }
                }
                Ok(ready)
            }

            async fn extend(
                &self,
                items: &[(i64, i64)],
                lease: std::time::Duration,
            ) -> Result<Vec<bool>, soulbase_net_core::NetError> {
                let what = "extending leases";
                let fail = |e| $crate::outbox::io(what, e);
                $crate::outbox::timed(self.options.op_timeout, what, async {
                    let mut tx = self.pool.begin_with(self.sql.begin).await.map_err(fail)?;
                    // The end is computed by the statement, on the store's clock, once the
                    // transaction holds the write lock: a lease extended after a long wait
                    // for the lock still runs `lease` from then.
                    let lease = $crate::outbox::millis(lease);
                    // In the order of their ids, as `ack_batch` takes them: two transactions
                    // of one outbox locking the same rows never wait for each other in a cycle
                    // (PostgreSQL would abort one as a deadlock).
                    let mut order: Vec<usize> = (0..items.len()).collect();
                    order.sort_unstable_by_key(|&i| items[i].0);
                    let mut held = vec![false; items.len()];
                    for i in order {
                        let (id, claim) = &items[i];
                        let hit = sqlx::query(&self.sql.extend)
                            .bind(lease)
                            .bind(id)
                            .bind(claim)
                            .execute(&mut *tx)
                            .await
                            .map_err(fail)?;
                        held[i] = hit.rows_affected() > 0;
                    }
                    tx.commit().await.map_err(fail)?;
                    Ok(held)
                })
                .await
            }

            async fn next_due(
                &self,
            ) -> Result<Option<std::time::SystemTime>, soulbase_net_core::NetError> {
                // How long until then on the store's clock, as a time on this instance's.
                let (wait,): (Option<i64>,) = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "finding the next due item",
                    sqlx::query_as(&self.sql.next_due).fetch_one(&self.pool),
                )
                .await?;
                Ok(wait.map(|ms| {
                    let now = std::time::SystemTime::now();
                    match u64::try_from(ms) {
                        Ok(ahead) => now + std::time::Duration::from_millis(ahead),
                        Err(_) => now
                            .checked_sub(std::time::Duration::from_millis(ms.unsigned_abs()))
                            .unwrap_or(now),
                    }
                }))
            }

            async fn ack(
                &self,
                item: &$crate::outbox::StoredItem,
            ) -> Result<bool, soulbase_net_core::NetError> {
                let done = self.ack_batch(std::slice::from_ref(item)).await?;
                Ok(done.first().copied().unwrap_or(false))
            }

            async fn ack_batch(
                &self,
                items: &[$crate::outbox::StoredItem],
            ) -> Result<Vec<bool>, soulbase_net_core::NetError> {
                let what = "acknowledging items";
                let fail = |e| $crate::outbox::io(what, e);
                $crate::outbox::timed(self.options.op_timeout, what, async {
                    let mut tx = self.pool.begin_with(self.sql.begin).await.map_err(fail)?;
                    // In the order of their ids (see `extend`).
                    let mut order: Vec<usize> = (0..items.len()).collect();
                    order.sort_unstable_by_key(|&i| items[i].id);
                    let mut done = vec![false; items.len()];
                    for i in order {
                        let item = &items[i];
                        // Fenced by the claim: a holder whose lease was taken over acks nothing.
                        let q = match self.options.retain_acked {
                            None => sqlx::query(&self.sql.delete_claimed),
                            Some(_) => sqlx::query(&self.sql.done),
                        };
                        let hit = q
                            .bind(item.id)
                            .bind(item.claim)
                            .execute(&mut *tx)
                            .await
                            .map_err(fail)?;
                        done[i] = hit.rows_affected() > 0;
                    }
                    tx.commit().await.map_err(fail)?;
                    Ok(done)
                })
                .await
            }

            async fn reschedule(
                &self,
                item: &$crate::outbox::StoredItem,
                at: std::time::SystemTime,
                attempts: u32,
            ) -> Result<bool, soulbase_net_core::NetError> {
                let done = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "rescheduling an item",
                    sqlx::query(&self.sql.reschedule)
                        .bind($crate::outbox::ms(at))
                        .bind($crate::outbox::ms(std::time::SystemTime::now()))
                        .bind(i64::from(attempts))
                        .bind(item.id)
                        .bind(item.claim)
                        .execute(&self.pool),
                )
                .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn dead(
                &self,
                item: &$crate::outbox::StoredItem,
                attempts: u32,
                reason: &str,
                status: Option<u16>,
            ) -> Result<bool, soulbase_net_core::NetError> {
                let what = "moving an item to the dead letters";
                let fail = |e| $crate::outbox::io(what, e);
                $crate::outbox::timed(self.options.op_timeout, what, async {
                    let mut tx = self.pool.begin_with(self.sql.begin).await.map_err(fail)?;
                    let moved = sqlx::query(&self.sql.to_dead)
                        .bind(i64::from(attempts))
                        .bind(reason)
                        .bind(status.map(i64::from))
                        .bind(item.id)
                        .bind(item.claim)
                        .execute(&mut *tx)
                        .await
                        .map_err(fail)?;
                    sqlx::query(&self.sql.delete_claimed)
                        .bind(item.id)
                        .bind(item.claim)
                        .execute(&mut *tx)
                        .await
                        .map_err(fail)?;
                    tx.commit().await.map_err(fail)?;
                    Ok(moved.rows_affected() > 0)
                })
                .await
            }

            async fn dead_letters(
                &self,
            ) -> Result<Vec<$crate::outbox::DeadLetter>, soulbase_net_core::NetError> {
                let rows = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "listing dead letters",
                    sqlx::query(&self.sql.dead_letters).fetch_all(&self.pool),
                )
                .await?;
                rows.iter().map($crate::outbox::dead_from).collect()
            }

            async fn requeue(&self, id: i64) -> Result<bool, soulbase_net_core::NetError> {
                let what = "requeueing a dead letter";
                let fail = |e| $crate::outbox::io(what, e);
                $crate::outbox::timed(self.options.op_timeout, what, async {
                    let mut tx = self.pool.begin_with(self.sql.begin).await.map_err(fail)?;
                    if let Some(lock) = &self.sql.requeue_lock {
                        sqlx::query(lock).execute(&mut *tx).await.map_err(fail)?;
                    }
                    let moved = sqlx::query(&self.sql.requeue)
                        .bind(id)
                        .execute(&mut *tx)
                        .await
                        .map_err(fail)?;
                    sqlx::query(&self.sql.delete_dead)
                        .bind(id)
                        .execute(&mut *tx)
                        .await
                        .map_err(fail)?;
                    tx.commit().await.map_err(fail)?;
                    Ok(moved.rows_affected() > 0)
                })
                .await
            }

            async fn purge_dead(&self) -> Result<u64, soulbase_net_core::NetError> {
                let done = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "purging dead letters",
                    sqlx::query(&self.sql.purge).execute(&self.pool),
                )
                .await?;
                Ok(done.rows_affected())
            }

            async fn pending(&self) -> Result<u64, soulbase_net_core::NetError> {
                let (n,): (i64,) = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "counting items",
                    sqlx::query_as(&self.sql.pending).fetch_one(&self.pool),
                )
                .await?;
                Ok(u64::try_from(n).unwrap_or(0))
            }

            async fn find(
                &self,
                dedup_id: &str,
            ) -> Result<Option<$crate::outbox::StoredItem>, soulbase_net_core::NetError> {
                let row = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "looking an item up",
                    sqlx::query(&self.sql.find)
                        .bind(dedup_id)
                        .fetch_optional(&self.pool),
                )
                .await?;
                row.as_ref().map($crate::outbox::item_from).transpose()
            }

            async fn cancel(&self, dedup_id: &str) -> Result<bool, soulbase_net_core::NetError> {
                let done = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "cancelling an item",
                    sqlx::query(&self.sql.cancel).bind(dedup_id).execute(&self.pool),
                )
                .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn sweep(
                &self,
                // The store's own clock decides (see `Sql::new`).
                _now: std::time::SystemTime,
            ) -> Result<u64, soulbase_net_core::NetError> {
                let Some(keep) = self.options.retain_acked else {
                    return Ok(0);
                };
                let done = $crate::outbox::run_statement(
                    self.options.op_timeout,
                    "forgetting acknowledged items",
                    sqlx::query(&self.sql.sweep)
                        .bind($crate::outbox::millis(keep))
                        .execute(&self.pool),
                )
                .await?;
                Ok(done.rows_affected())
            }

            $($extra)*
        }
    };
}

pub(crate) use sql_store;
