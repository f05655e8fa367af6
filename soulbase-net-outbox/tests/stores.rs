//! Both stores against one contract (claims, fencing, dedup, retention, migrations), and what
//! only PostgreSQL does: transactional enqueue, `LISTEN`/`NOTIFY` wake-ups, several outboxes
//! on one table without double claims, an outage at enqueue. PostgreSQL runs as a throwaway
//! cluster on a free loopback port (testkit `PostgresServer`); without it installed those
//! tests say `SKIPPED` (CI installs it and never skips).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime};

use soulbase_net_outbox::{Enqueued, OutboxStore, SqliteStore, StoreOptions, StoredItem};

mod support;

use support::db;

fn stored(url: &str, dedup: Option<&str>) -> StoredItem {
    StoredItem {
        id: 0,
        dedup_id: dedup.map(str::to_owned),
        method: http::Method::POST,
        url: url.to_owned(),
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::from_static(b"x"),
        tenant: None,
        idempotency_key: "k".repeat(32),
        deliver_at: SystemTime::now(),
        deadline: None,
        attempts: 0,
        max_attempts: 5,
        claim: 0,
        ordering_key: None,
    }
}

/// An hour: how far ahead the clock of a skewed instance runs in the contracts.
const HOUR: Duration = Duration::from_secs(3600);

/// Claims what is due, polling every 20 ms until something is (at most `within`).
async fn claim_within(
    store: &dyn OutboxStore,
    within: Duration,
    lease: Duration,
) -> Vec<StoredItem> {
    let until = tokio::time::Instant::now() + within;
    loop {
        let got = store.claim_due(SystemTime::now(), 10, lease).await.unwrap();
        if !got.is_empty() || tokio::time::Instant::now() >= until {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What every store promises, driven through the trait. Leases and due times are on the
/// store's clock: an instance whose clock runs an hour ahead (the `now` it passes) neither
/// claims early nor takes over a live lease.
async fn store_contract(store: &dyn OutboxStore) {
    // Dedup at enqueue by the caller's id.
    let Enqueued::New(a) = store
        .enqueue(stored("http://127.0.0.1:1/a", Some("order-1")))
        .await
        .unwrap()
    else {
        panic!("a new id is stored")
    };
    assert_eq!(
        store
            .enqueue(stored("http://127.0.0.1:1/a", Some("order-1")))
            .await
            .unwrap(),
        Enqueued::Duplicate(a)
    );
    assert_eq!(store.pending().await.unwrap(), 1);
    // Read after the enqueue, which made the item due at its own clock reading: a reading
    // taken before it could be earlier than the item's due time on a loaded machine.
    let now = SystemTime::now();
    // A claim holds the item for its lease; nobody else gets it meanwhile, whatever their
    // clock says.
    let lease = Duration::from_millis(300);
    let first = store.claim_due(now, 10, lease).await.unwrap();
    let claimed = tokio::time::Instant::now();
    assert_eq!(first.len(), 1);
    assert!(first[0].claim > 0);
    assert!(store
        .claim_due(now + HOUR, 10, lease)
        .await
        .unwrap()
        .is_empty());
    // The lease ran out: another worker claims it, and the slow first holder is fenced.
    let second = claim_within(store, Duration::from_secs(5), lease).await;
    assert_eq!(second.len(), 1);
    assert!(
        claimed.elapsed() >= lease - Duration::from_millis(50),
        "taken over after {:?}, within its lease",
        claimed.elapsed()
    );
    assert_ne!(second[0].claim, first[0].claim);
    assert!(!store.reschedule(&first[0], now, 1).await.unwrap());
    assert!(!store.dead(&first[0], 1, "late", None).await.unwrap());
    // Its ack changes nothing either, alone or in a batch: the item is the second holder's.
    assert!(!store.ack(&first[0]).await.unwrap());
    assert_eq!(store.ack_batch(&first).await.unwrap(), vec![false]);
    assert_eq!(store.pending().await.unwrap(), 1);
    assert!(store.dead_letters().await.unwrap().is_empty());
    // Nor does its extension: the holder's own extends, the stale one (for an hour) does not,
    // and the item comes back when the holder's lease runs out, not an hour later.
    let both = [
        (second[0].id, second[0].claim),
        (first[0].id, first[0].claim),
    ];
    assert_eq!(store.extend(&both, lease).await.unwrap(), vec![true, false]);
    let extended = tokio::time::Instant::now();
    assert_eq!(
        store
            .extend(&[(first[0].id, first[0].claim)], HOUR)
            .await
            .unwrap(),
        vec![false],
        "a stale claim extends nothing"
    );
    let second = claim_within(store, Duration::from_secs(5), lease).await;
    assert_eq!(
        second.len(),
        1,
        "the stale extension kept the item from its next holder"
    );
    assert!(
        extended.elapsed() >= lease - Duration::from_millis(50),
        "taken over after {:?}, within the extended lease",
        extended.elapsed()
    );
    assert!(
        !store
            .extend(&[(first[0].id, first[0].claim)], lease)
            .await
            .unwrap()[0]
    );
    // The holder reschedules it: due later, its attempts kept, the lease released.
    let later = SystemTime::now() + Duration::from_millis(300);
    assert!(store.reschedule(&second[0], later, 1).await.unwrap());
    let due = store.next_due().await.unwrap().expect("an item is due");
    let off = due.duration_since(later).unwrap_or_else(|e| e.duration());
    assert!(
        off < Duration::from_secs(1),
        "due {off:?} off what was asked"
    );
    assert!(store
        .claim_due(now + HOUR, 10, lease)
        .await
        .unwrap()
        .is_empty());
    let third = claim_within(store, Duration::from_secs(5), lease).await;
    assert_eq!(third[0].attempts, 1);
    // Dead letters: moved with the reason, requeued, purged.
    assert!(store
        .dead(&third[0], 2, "HTTP 400", Some(400))
        .await
        .unwrap());
    assert_eq!(store.pending().await.unwrap(), 0);
    let dead = store.dead_letters().await.unwrap();
    assert_eq!(
        (dead.len(), dead[0].status, dead[0].item.attempts),
        (1, Some(400), 2)
    );
    assert!(store.requeue(a).await.unwrap());
    assert_eq!(store.pending().await.unwrap(), 1);
    let back = claim_within(store, Duration::from_secs(5), lease).await;
    assert_eq!((back.len(), back[0].attempts), (1, 0));
    assert!(store.ack(&back[0]).await.unwrap());
    assert_eq!(store.pending().await.unwrap(), 0);
    // Forgotten at the ack (no retention): the id can be enqueued again.
    assert!(matches!(
        store
            .enqueue(stored("http://127.0.0.1:1/a", Some("order-1")))
            .await
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_eq!(store.purge_dead().await.unwrap(), 0);
    // A batch: one commit, the duplicate among them stored once.
    let before = store.pending().await.unwrap();
    let done = store
        .enqueue_batch(vec![
            stored("http://127.0.0.1:1/b", Some("batch-1")),
            stored("http://127.0.0.1:1/b", None),
            stored("http://127.0.0.1:1/b", Some("order-1")),
            stored("http://127.0.0.1:1/b", Some("batch-1")),
        ])
        .await
        .unwrap();
    assert!(matches!(
        done.as_slice(),
        [Enqueued::New(x), Enqueued::New(_), Enqueued::Duplicate(_), Enqueued::Duplicate(y)] if x == y
    ));
    assert_eq!(store.pending().await.unwrap(), before + 2);
    // Acks in one batch, each fenced by its own claim.
    let claimed = store
        .claim_due(SystemTime::now(), 10, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(claimed.len(), before as usize + 2);
    let mut stale = claimed[0].clone();
    stale.claim -= 1;
    let mut acks = claimed[1..].to_vec();
    acks.push(stale);
    let done = store.ack_batch(&acks).await.unwrap();
    assert_eq!(done.len(), claimed.len());
    assert!(done[..done.len() - 1].iter().all(|d| *d), "{done:?}");
    assert!(
        !done[done.len() - 1],
        "a claim that is not the item's acks nothing"
    );
    assert_eq!(store.pending().await.unwrap(), 1);
}

/// With a retention, an acknowledged item is kept (its id still dedups) until swept.
async fn retention_contract(store: &dyn OutboxStore, keep: Duration) {
    store
        .enqueue(stored("http://127.0.0.1:1/r", Some("kept")))
        .await
        .unwrap();
    let claimed = store
        .claim_due(SystemTime::now(), 10, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(store.ack(&claimed[0]).await.unwrap());
    let acked = tokio::time::Instant::now();
    assert_eq!(store.pending().await.unwrap(), 0, "done is not pending");
    assert!(store.next_due().await.unwrap().is_none());
    assert!(matches!(
        store
            .enqueue(stored("http://127.0.0.1:1/r", Some("kept")))
            .await
            .unwrap(),
        Enqueued::Duplicate(_)
    ));
    // Kept for `keep` on the store's clock, even by an instance whose clock runs ahead.
    let swept = store.sweep(SystemTime::now() + keep + HOUR).await.unwrap();
    if acked.elapsed() < keep {
        assert_eq!(swept, 0, "still kept");
    }
    let until = acked + keep + Duration::from_secs(5);
    let mut swept = swept;
    while swept == 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        swept = store.sweep(SystemTime::now()).await.unwrap();
    }
    assert_eq!(swept, 1, "forgotten once kept for {keep:?}");
    assert!(matches!(
        store
            .enqueue(stored("http://127.0.0.1:1/r", Some("kept")))
            .await
            .unwrap(),
        Enqueued::New(_)
    ));
}

/// Credentials at rest: refused without a key; with one, sealed in the table, the file and
/// its WAL, and the dead letters, and opened only when claimed; another key cannot open them.
async fn sealing_contract(
    plain: &dyn OutboxStore,
    sealed: &dyn OutboxStore,
    other: &dyn OutboxStore,
) {
    const TOKEN: &str = "Bearer TOPSECRET-1";
    const URL: &str = "http://127.0.0.1:1/pay?access_token=TOPSECRET-2&x=1";
    let mut item = stored(URL, None);
    item.headers
        .insert("authorization", http::HeaderValue::from_static(TOKEN));
    item.headers
        .insert("x-team", http::HeaderValue::from_static("pay"));
    let refused = plain.enqueue(item.clone()).await.unwrap_err();
    assert_eq!(
        refused.kind(),
        soulbase_net_core::ErrorKind::InvalidRequest,
        "{refused}"
    );
    assert!(refused.to_string().contains("`authorization`"), "{refused}");
    assert_eq!(plain.pending().await.unwrap(), 0, "nothing written");
    // Sealed: claimed in clear.
    sealed.enqueue(item.clone()).await.unwrap();
    let claimed = sealed
        .claim_due(SystemTime::now(), 10, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].headers["authorization"], TOKEN);
    assert_eq!(claimed[0].headers["x-team"], "pay");
    assert_eq!(claimed[0].url, URL);
    // Dead letters keep them sealed.
    assert!(sealed
        .dead(&claimed[0], 1, "HTTP 400", Some(400))
        .await
        .unwrap());
    let dead = sealed.dead_letters().await.unwrap();
    let shown = format!("{:?} {}", dead[0].item.headers, dead[0].item.url);
    assert!(!shown.contains("TOPSECRET"), "{shown}");
    assert_eq!(dead[0].item.headers["x-team"], "pay");
    // Another key: the requeued item cannot be opened, and goes back to the dead letters
    // with the reason.
    assert!(other.requeue(dead[0].item.id).await.unwrap());
    let none = other
        .claim_due(SystemTime::now(), 10, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(none.is_empty());
    let dead = other.dead_letters().await.unwrap();
    assert!(
        dead[0].reason.contains("could not be opened"),
        "{}",
        dead[0].reason
    );
}

#[tokio::test]
async fn sqlite_keeps_no_credential_in_clear() {
    let path = db("sealed");
    let key = [9u8; 32];
    let plain = SqliteStore::open(&path).await.unwrap();
    let options = || StoreOptions::default().seal_key(&key).unwrap();
    let sealed = SqliteStore::builder(&path)
        .options(options())
        .open()
        .await
        .unwrap();
    let other = SqliteStore::builder(&path)
        .options(StoreOptions::default().seal_key(&[1u8; 32]).unwrap())
        .open()
        .await
        .unwrap();
    sealing_contract(&plain, &sealed, &other).await;
    // Neither the file nor its WAL holds a secret.
    assert!(
        !support::file_holds(&path, b"TOPSECRET"),
        "a secret at rest"
    );
}

#[tokio::test]
async fn sqlite_keeps_the_store_contract() {
    let store = SqliteStore::open(db("contract")).await.unwrap();
    store_contract(&store).await;
    let keep = Duration::from_secs(1);
    let kept = SqliteStore::builder(db("retention"))
        .options(StoreOptions::default().retain_acked(keep))
        .open()
        .await
        .unwrap();
    retention_contract(&kept, keep).await;
}

#[tokio::test]
async fn sqlite_migrates_a_version_1_file_and_names_tables() {
    let path = db("migrate");
    let old = SqliteStore::builder(&path)
        .schema_version(1)
        .open()
        .await
        .unwrap();
    assert_eq!(old.schema_version().await.unwrap(), 1);
    // Written as a version-1 build wrote it (this build's statements need the later columns).
    sqlx::query(
        "INSERT INTO outbox (dedup_id, method, url, headers, body, idem_key, deliver_at,
            max_attempts) VALUES ('from-v1', 'POST', 'http://127.0.0.1:1/m', '[]', x'78',
            'kkkk', 0, 5)",
    )
    .execute(old.pool())
    .await
    .unwrap();
    drop(old);
    let new = SqliteStore::open(&path).await.unwrap();
    assert_eq!(
        new.schema_version().await.unwrap(),
        soulbase_net_outbox::SQLITE_SCHEMA_VERSION
    );
    assert_eq!(new.pending().await.unwrap(), 1, "the item survives");
    // Opening again applies nothing twice.
    assert_eq!(
        SqliteStore::open(&path)
            .await
            .unwrap()
            .schema_version()
            .await
            .unwrap(),
        soulbase_net_outbox::SQLITE_SCHEMA_VERSION
    );
    // Another outbox in the same file under its own table.
    let billing = SqliteStore::builder(&path)
        .options(StoreOptions::default().table("billing_outbox").unwrap())
        .open()
        .await
        .unwrap();
    assert_eq!(billing.pending().await.unwrap(), 0);
    store_contract(&billing).await;
    assert_eq!(new.pending().await.unwrap(), 1, "tables are apart");
}

/// What only PostgreSQL does (cargo feature `postgres`).
#[cfg(feature = "postgres")]
mod postgres {
    use std::{collections::HashMap, sync::Arc};

    use soulbase_net_core::NetError;
    use soulbase_net_outbox::{OutboxItem, PostgresStore};
    use soulbase_net_testkit::{FaultServer, PostgresServer, Reply, Script};

    use crate::support::{outbox, run, until};
    use tokio::time::Instant;

    use super::*;

    async fn postgres(test: &str) -> Option<(PostgresServer, String)> {
        let pg = PostgresServer::start_or_skip(test)?;
        let url = pg.create_database("outbox").unwrap();
        Some((pg, url))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_keeps_no_credential_in_clear() {
        let Some(pg) = PostgresServer::start_or_skip("postgres_keeps_no_credential_in_clear")
        else {
            return;
        };
        let url = pg.create_database("sealed").unwrap();
        let open = |options: StoreOptions| {
            let url = url.clone();
            async move {
                PostgresStore::builder(&url)
                    .options(options)
                    .connect()
                    .await
                    .unwrap()
            }
        };
        let plain = open(StoreOptions::default()).await;
        let sealed = open(StoreOptions::default().seal_key(&[9u8; 32]).unwrap()).await;
        let other = open(StoreOptions::default().seal_key(&[1u8; 32]).unwrap()).await;
        super::sealing_contract(&plain, &sealed, &other).await;
    }

    #[tokio::test]
    async fn postgres_keeps_the_store_contract_and_migrates_once() {
        let Some((_pg, url)) =
            postgres("postgres_keeps_the_store_contract_and_migrates_once").await
        else {
            return;
        };
        // Instances starting together migrate once (advisory lock), to the current version.
        let (a, b) = tokio::join!(PostgresStore::connect(&url), PostgresStore::connect(&url));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(
            a.schema_version().await.unwrap(),
            soulbase_net_outbox::POSTGRES_SCHEMA_VERSION
        );
        let (versions,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM outbox_migrations")
            .fetch_one(b.pool())
            .await
            .unwrap();
        assert_eq!(
            versions,
            soulbase_net_outbox::POSTGRES_SCHEMA_VERSION,
            "each version applied once"
        );
        store_contract(&a).await;
        let left = a.pending().await.unwrap();
        let keep = Duration::from_secs(1);
        let kept = PostgresStore::builder(&url)
            .options(
                StoreOptions::default()
                    .table("kept_outbox")
                    .unwrap()
                    .retain_acked(keep),
            )
            .connect()
            .await
            .unwrap();
        retention_contract(&kept, keep).await;
        assert_eq!(a.pending().await.unwrap(), left, "tables are apart");
        // Credentials never show.
        let secret = url.replace("soulbase@", "soulbase:hunter2@");
        let debug = format!(
            "{:?}",
            PostgresStore::connect(&secret)
                .await
                .map(|s| format!("{s:?}"))
        );
        assert!(!debug.contains("hunter2"), "{debug}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_delivers_with_one_key_across_retries() {
        let Some((_pg, url)) = postgres("postgres_delivers_with_one_key_across_retries").await
        else {
            return;
        };
        let srv = FaultServer::http1()
            .route("/hook", Script::status(503).times(2).then(Reply::ok("ok")))
            .start()
            .await
            .unwrap();
        let store = Arc::new(PostgresStore::connect(&url).await.unwrap());
        let o = outbox(store.clone(), Duration::from_millis(50));
        let _run = run(&o);
        o.enqueue(OutboxItem::post(srv.url("/hook"), "event=1"))
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), srv.wait_for_hits("/hook", 3))
            .await
            .unwrap();
        until("the ack", async || store.pending().await.unwrap() == 0).await;
        let seen = srv.requests("/hook");
        assert_eq!(seen.len(), 3);
        let key = seen[0].header("idempotency-key").unwrap();
        assert!(seen
            .iter()
            .all(|r| r.header("idempotency-key") == Some(key)));
        assert!(store.dead_letters().await.unwrap().is_empty());
        srv.join().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_enqueue_in_a_transaction_exists_only_if_it_commits() {
        let Some((_pg, url)) =
            postgres("postgres_enqueue_in_a_transaction_exists_only_if_it_commits").await
        else {
            return;
        };
        let srv = FaultServer::http1()
            .route("/rolled-back", Reply::ok("no"))
            .route("/committed", Reply::ok("yes"))
            .start()
            .await
            .unwrap();
        let store = Arc::new(PostgresStore::connect(&url).await.unwrap());
        sqlx::query("CREATE TABLE orders (id BIGINT PRIMARY KEY)")
            .execute(store.pool())
            .await
            .unwrap();
        // The business change and the call, rolled back together.
        let mut tx = store.pool().begin().await.unwrap();
        sqlx::query("INSERT INTO orders VALUES (1)")
            .execute(&mut *tx)
            .await
            .unwrap();
        store
            .enqueue_in(
                &mut tx,
                OutboxItem::post(srv.url("/rolled-back"), "order 1"),
            )
            .await
            .unwrap();
        assert_eq!(
            store.pending().await.unwrap(),
            0,
            "not visible before commit"
        );
        tx.rollback().await.unwrap();
        // ... and committed together.
        let mut tx = store.pool().begin().await.unwrap();
        sqlx::query("INSERT INTO orders VALUES (2)")
            .execute(&mut *tx)
            .await
            .unwrap();
        store
            .enqueue_in(&mut tx, OutboxItem::post(srv.url("/committed"), "order 2"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(store.pending().await.unwrap(), 1);
        let o = outbox(store.clone(), Duration::from_millis(50));
        let _run = run(&o);
        tokio::time::timeout(Duration::from_secs(10), srv.wait_for_hits("/committed", 1))
            .await
            .unwrap();
        until("the ack", async || store.pending().await.unwrap() == 0).await;
        assert_eq!(
            srv.hits("/rolled-back"),
            0,
            "a rolled-back call is never made"
        );
        let (orders,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(orders, 1);
        srv.join().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_wakes_a_sleeping_outbox_when_another_instance_enqueues() {
        let Some((_pg, url)) =
            postgres("postgres_wakes_a_sleeping_outbox_when_another_instance_enqueues").await
        else {
            return;
        };
        let srv = FaultServer::http1()
            .route("/hook", Reply::ok("ok"))
            .start()
            .await
            .unwrap();
        // The delivering instance polls only every 60 s: only a notification can wake it.
        let worker_store: Arc<dyn OutboxStore> =
            Arc::new(PostgresStore::connect(&url).await.unwrap());
        let worker = outbox(worker_store, Duration::from_secs(60));
        let _run = run(&worker);
        // Another instance (its own pool) enqueues; nothing wakes the worker in-process.
        let other = outbox(
            Arc::new(PostgresStore::connect(&url).await.unwrap()),
            Duration::from_secs(60),
        );
        // An item sent before the worker's LISTEN is up is claimed by the wake-up that
        // follows every (re)connect of the listener.
        let mut waits = Vec::new();
        for i in 0..5 {
            let sent = Instant::now();
            other
                .enqueue(OutboxItem::post(srv.url("/hook"), format!("{i}")))
                .await
                .unwrap();
            tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/hook", i + 1))
                .await
                .expect("woken by NOTIFY, not by the 60 s poll");
            waits.push(sent.elapsed());
        }
        eprintln!("enqueue in one instance -> delivery by another: {waits:?}");
        srv.join().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_outboxes_sharing_a_table_never_deliver_one_item_twice() {
        let Some((_pg, url)) =
            postgres("postgres_outboxes_sharing_a_table_never_deliver_one_item_twice").await
        else {
            return;
        };
        let srv = FaultServer::http1()
            .route("/effect", Reply::ok("ok"))
            .start()
            .await
            .unwrap();
        let stores: Vec<Arc<dyn OutboxStore>> = vec![
            Arc::new(PostgresStore::connect(&url).await.unwrap()),
            Arc::new(PostgresStore::connect(&url).await.unwrap()),
            Arc::new(PostgresStore::connect(&url).await.unwrap()),
        ];
        let filler = outbox(stores[0].clone(), Duration::from_millis(50));
        const ITEMS: usize = 600;
        for i in 0..ITEMS {
            filler
                .enqueue(OutboxItem::post(srv.url("/effect"), format!("{i}")))
                .await
                .unwrap();
        }
        let outboxes: Vec<_> = stores
            .iter()
            .map(|s| outbox(s.clone(), Duration::from_millis(50)))
            .collect();
        let _running: Vec<_> = outboxes.iter().map(run).collect();
        tokio::time::timeout(
            Duration::from_secs(30),
            srv.wait_for_hits("/effect", ITEMS as u64),
        )
        .await
        .unwrap();
        until("every ack", async || {
            stores[0].pending().await.unwrap() == 0
        })
        .await;
        let mut by_key: HashMap<String, usize> = HashMap::new();
        for r in srv.requests("/effect") {
            *by_key
                .entry(r.header("idempotency-key").unwrap().to_owned())
                .or_default() += 1;
        }
        assert_eq!(by_key.len(), ITEMS, "none lost");
        assert!(by_key.values().all(|&n| n == 1), "none delivered twice");
        srv.join().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_callers_long_transaction_delays_no_write_and_fails_none() {
        let Some((_pg, url)) =
            postgres("postgres_a_callers_long_transaction_delays_no_write_and_fails_none").await
        else {
            return;
        };
        // Each delivery takes 300 ms: some are claimed and in flight when the caller's
        // transaction begins.
        let srv = FaultServer::http1()
            .route("/slow", Reply::ok("ok").delay(Duration::from_millis(300)))
            .route("/later", Reply::ok("ok"))
            .start()
            .await
            .unwrap();
        let store = Arc::new(PostgresStore::connect(&url).await.unwrap());
        let outbox = Arc::new(
            soulbase_net_outbox::Outbox::builder()
                .store(store.clone())
                .client(crate::support::client())
                .workers(8)
                .build()
                .unwrap(),
        );
        for i in 0..40 {
            outbox
                .enqueue(OutboxItem::post(srv.url("/slow"), format!("{i}")))
                .await
                .unwrap();
        }
        let _running = run(&outbox);
        srv.wait_for_hits("/slow", 1).await;
        // The caller's transaction enqueues and stays open for 5 s.
        const HOLD: Duration = Duration::from_secs(5);
        let mut tx = store.pool().begin().await.unwrap();
        store
            .enqueue_in(
                &mut tx,
                OutboxItem::post(srv.url("/later"), "in the transaction"),
            )
            .await
            .unwrap();
        let held = Instant::now();
        let at_hold = srv.hits("/slow");
        // Meanwhile the service enqueues as usual: no wait for the caller's transaction.
        let enqueue = {
            let (outbox, url) = (outbox.clone(), srv.url("/later"));
            tokio::spawn(async move {
                let started = Instant::now();
                let done = outbox.enqueue(OutboxItem::post(url, "beside it")).await;
                (done.map(|_| ()), started.elapsed())
            })
        };
        let (done, took) = enqueue.await.unwrap();
        assert!(done.is_ok(), "{done:?}");
        assert!(
            took < Duration::from_secs(1),
            "the enqueue waited for the caller's transaction: {took:?}"
        );
        // What is the scenario, not a synchronisation: the caller keeps its transaction open.
        tokio::time::sleep(HOLD.saturating_sub(held.elapsed())).await;
        let during = srv.hits("/slow") - at_hold;
        let later_during = srv.hits("/later");
        tx.commit().await.unwrap();
        // Deliveries went on meanwhile, the concurrent enqueue's item among them; the
        // caller's item only after its commit.
        assert!(during > 0, "no delivery while the transaction was open");
        assert_eq!(
            later_during, 1,
            "the item enqueued beside it, not the one inside"
        );
        until("every ack", async || store.pending().await.unwrap() == 0).await;
        let distinct = |path: &str| {
            let bodies: std::collections::HashSet<_> =
                srv.requests(path).into_iter().map(|r| r.body).collect();
            bodies.len()
        };
        assert_eq!((distinct("/slow"), distinct("/later")), (40, 2));
        // The heartbeat wrote throughout: no claim lapsed, nothing went twice.
        assert_eq!(srv.hits("/slow"), 40, "none delivered again");
        eprintln!(
            "postgres, a caller's transaction held for {:?}: a concurrent enqueue took {took:?}; {during} deliveries went on meanwhile; none delivered again",
            held.elapsed()
        );
        srv.join().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_delivery_slower_than_its_lease_is_never_sent_twice_at_once() {
        let Some((_pg, url)) =
            postgres("postgres_a_delivery_slower_than_its_lease_is_never_sent_twice_at_once").await
        else {
            return;
        };
        // The upstream takes 1.5 s; the lease is 300 ms (extended every 150 ms); two outboxes,
        // each with a pool of its own, poll the table every 20 ms.
        let srv = FaultServer::http1()
            .route("/slow", Reply::ok("ok").delay(Duration::from_millis(1500)))
            .start()
            .await
            .unwrap();
        let one = || async {
            let store = PostgresStore::connect(&url).await.unwrap();
            Arc::new(
                soulbase_net_outbox::Outbox::builder()
                    .store(Arc::new(store))
                    .client(crate::support::client())
                    .lease(Duration::from_millis(300))
                    .poll(Duration::from_millis(20))
                    .build()
                    .unwrap(),
            )
        };
        let (a, b) = (one().await, one().await);
        a.enqueue(OutboxItem::post(srv.url("/slow"), "once"))
            .await
            .unwrap();
        let (_ra, _rb) = (run(&a), run(&b));
        until("the delivery", async || {
            a.store().pending().await.unwrap() == 0
        })
        .await;
        assert_eq!(
            srv.hits("/slow"),
            1,
            "sent once while its lease was extended"
        );
        srv.join().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_down_at_enqueue_is_a_clear_error_and_nothing_is_half_written() {
        let Some((mut pg, url)) =
            postgres("postgres_down_at_enqueue_is_a_clear_error_and_nothing_is_half_written").await
        else {
            return;
        };
        let store = Arc::new(
            PostgresStore::builder(&url)
                .options(StoreOptions::default().op_timeout(Duration::from_secs(2)))
                .connect()
                .await
                .unwrap(),
        );
        let o = outbox(store.clone(), Duration::from_millis(50));
        o.enqueue(OutboxItem::post("http://127.0.0.1:1/before", "1").id("before"))
            .await
            .unwrap();
        pg.stop();
        let started = Instant::now();
        let err: NetError = o
            .enqueue(OutboxItem::post("http://127.0.0.1:1/during", "2").id("during"))
            .await
            .unwrap_err();
        let waited = started.elapsed();
        assert!(
            matches!(
                err.kind(),
                soulbase_net_core::ErrorKind::Io | soulbase_net_core::ErrorKind::Timeout(_)
            ),
            "{err}"
        );
        assert!(err.to_string().contains("outbox store"), "{err}");
        assert!(waited < Duration::from_secs(5), "bounded: {waited:?}");
        pg.restart().unwrap();
        // The pool reconnects by itself; the failed item is not there, half or whole.
        until("the store back", async || store.pending().await.is_ok()).await;
        assert_eq!(store.pending().await.unwrap(), 1);
        assert!(matches!(
            o.enqueue(OutboxItem::post("http://127.0.0.1:1/during", "2").id("during"))
                .await
                .unwrap(),
            Enqueued::New(_)
        ));
        assert_eq!(store.pending().await.unwrap(), 2);
        eprintln!("enqueue with the database down failed after {waited:?}: {err}");
    }
}
