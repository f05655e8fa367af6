//! Ordering keys (seed 001 §VII, `ordered_ack`): items of one key are delivered one at a time
//! in enqueue order while other keys go in parallel; a retried head holds its key, a dead one
//! is skipped; two PostgreSQL instances on one table keep the order; and a worker process
//! killed with SIGKILL mid-delivery and started again keeps it too. The upstream is the
//! testkit's `FaultServer`, recording when each item arrives; PostgreSQL runs as the testkit's
//! throwaway cluster (skipped with a printed line when not installed, never under
//! `SOULBASE_REQUIRE_POSTGRES`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use parking_lot::Mutex;
use soulbase_net_outbox::{Outbox, OutboxItem, OutboxStore, SqliteStore};
use soulbase_net_testkit::{FaultServer, Reply, Script};
use tokio::time::Instant;

mod support;

use support::{client, db, outbox, run, until};

/// How long the upstream holds each answer: an item of a key arriving within this of the one
/// before it would have been sent while that one was still in flight.
const HOLD: Duration = Duration::from_millis(40);

/// One arrival at the upstream: the item's key and its place in the key, and when.
#[derive(Clone, Debug)]
struct Arrival {
    key: String,
    seq: usize,
    at: Instant,
}

/// Every arrival, in order, as the upstream saw them.
#[derive(Clone, Default)]
struct Arrivals(Arc<Mutex<Vec<Arrival>>>);

impl Arrivals {
    /// Notes the item whose body is `key:seq`.
    fn note(&self, body: &str) {
        let (key, seq) = body.split_once(':').unwrap();
        self.0.lock().push(Arrival {
            key: key.to_owned(),
            seq: seq.parse().unwrap(),
            at: Instant::now(),
        });
    }

    fn all(&self) -> Vec<Arrival> {
        self.0.lock().clone()
    }

    /// The places of `key`'s items, in the order they arrived.
    fn seqs(&self, key: &str) -> Vec<usize> {
        self.all()
            .iter()
            .filter(|a| a.key == key)
            .map(|a| a.seq)
            .collect()
    }

    /// The most items of `key` the upstream held at once, each held [`HOLD`] from its
    /// arrival: an overlap is certain (the earlier one's answer was not even sent yet), so a
    /// count over 1 is a violation, never a timing artefact.
    fn most_at_once(&self, key: &str) -> usize {
        self.most_at_once_of(|k| k == key)
    }

    /// [`most_at_once`](Self::most_at_once) over the items of every key `which` takes.
    fn most_at_once_of(&self, which: impl Fn(&str) -> bool) -> usize {
        let at: Vec<Instant> = self
            .all()
            .iter()
            .filter(|a| which(&a.key))
            .map(|a| a.at)
            .collect();
        at.iter()
            .map(|&t| at.iter().filter(|&&u| u <= t && t < u + HOLD).count())
            .max()
            .unwrap_or(0)
    }
}

/// An upstream at `/hook` that notes every arrival and answers each after [`HOLD`] with what
/// `answer` says for the body and the how-many-th time it arrives (1 for the first).
async fn upstream(
    answer: impl Fn(&str, u32) -> Reply + Send + Sync + 'static,
) -> (FaultServer, Arrivals) {
    let arrivals = Arrivals::default();
    let seen = arrivals.clone();
    let times: Mutex<HashMap<String, u32>> = Mutex::default();
    let srv = FaultServer::http1()
        .route(
            "/hook",
            Script::respond_with(move |req| {
                let body = req.text();
                seen.note(&body);
                let n = {
                    let mut times = times.lock();
                    let n = times.entry(body.clone()).or_default();
                    *n += 1;
                    *n
                };
                answer(&body, n).delay(HOLD)
            }),
        )
        .start()
        .await
        .unwrap();
    (srv, arrivals)
}

/// The item `key:seq` to `/hook`, with ordering key `key` (none for the key `none`).
fn item(srv: &FaultServer, key: &str, seq: usize) -> OutboxItem {
    let item = OutboxItem::post(srv.url("/hook"), format!("{key}:{seq}"));
    if key == "none" {
        item
    } else {
        item.ordering_key(key)
    }
}

/// `keys` × `per_key` items, enqueued round-robin across the keys (one transaction).
fn items(srv: &FaultServer, keys: &[&str], per_key: usize) -> Vec<OutboxItem> {
    (0..per_key)
        .flat_map(|seq| keys.iter().map(move |key| (*key, seq)))
        .map(|(key, seq)| item(srv, key, seq))
        .collect()
}

/// Asserts that each of `keys` arrived exactly once per item, in enqueue order, one at a time.
fn assert_in_order_one_at_a_time(arrivals: &Arrivals, keys: &[&str], per_key: usize) {
    for key in keys {
        assert_eq!(
            arrivals.seqs(key),
            (0..per_key).collect::<Vec<_>>(),
            "key {key} arrived in enqueue order, each once"
        );
        assert_eq!(
            arrivals.most_at_once(key),
            1,
            "key {key}: never two in flight"
        );
    }
}

// === the store's claims ===

/// What a store promises about ordering keys, driven through the trait.
async fn ordering_contract(store: &dyn OutboxStore) {
    let now = SystemTime::now;
    let lease = Duration::from_secs(30);
    let stored = |key: Option<&str>, name: &str| {
        let item = OutboxItem::post(format!("http://127.0.0.1:1/{name}"), name.to_owned());
        match key {
            Some(k) => item.ordering_key(k),
            None => item,
        }
        .into_stored(now())
        .unwrap()
    };
    for (key, name) in [
        (Some("a"), "a0"),
        (Some("a"), "a1"),
        (None, "n0"),
        (Some("b"), "b0"),
        (Some("a"), "a2"),
    ] {
        store.enqueue(stored(key, name)).await.unwrap();
    }
    let names = |items: &[soulbase_net_outbox::StoredItem]| {
        let mut n: Vec<String> = items.iter().map(|i| i.body_text()).collect();
        n.sort();
        n
    };
    // The head of each key, and what has no key; never a follower.
    let first = store.claim_due(now(), 10, lease).await.unwrap();
    assert_eq!(names(&first), ["a0", "b0", "n0"]);
    let a0 = first.iter().find(|i| i.body_text() == "a0").unwrap();
    assert_eq!(a0.ordering_key.as_deref(), Some("a"));
    assert!(store.claim_due(now(), 10, lease).await.unwrap().is_empty());
    // Nothing is due until a lease ends: an outbox does not spin on blocked followers.
    let next = store.next_due().await.unwrap().unwrap();
    assert!(
        next > now() + lease / 2,
        "next due {:?} from now",
        next.duration_since(now())
    );
    // A retried head keeps its place.
    assert!(store.reschedule(a0, now(), 1).await.unwrap());
    let again = store.claim_due(now(), 10, lease).await.unwrap();
    assert_eq!(names(&again), ["a0"]);
    let a0 = &again[0];
    // A dead head is skipped: the next of its key goes.
    assert!(store.dead(a0, 2, "HTTP 400", Some(400)).await.unwrap());
    let next = store.claim_due(now(), 10, lease).await.unwrap();
    assert_eq!(names(&next), ["a1"]);
    // Requeued, the dead head keeps its id (first of its key again) but waits for the item
    // of its key in flight.
    let dead = store.dead_letters().await.unwrap();
    assert_eq!(dead[0].item.ordering_key.as_deref(), Some("a"));
    assert!(store.requeue(dead[0].item.id).await.unwrap());
    assert!(store.claim_due(now(), 10, lease).await.unwrap().is_empty());
    assert!(store.ack(&next[0]).await.unwrap());
    let back = store.claim_due(now(), 10, lease).await.unwrap();
    assert_eq!(names(&back), ["a0"]);
    assert!(store.ack(&back[0]).await.unwrap());
    let last = store.claim_due(now(), 10, lease).await.unwrap();
    assert_eq!(names(&last), ["a2"]);
    for item in first.iter().filter(|i| i.body_text() != "a0").chain(&last) {
        assert!(store.ack(item).await.unwrap());
    }
    assert_eq!(store.pending().await.unwrap(), 0);
}

trait BodyText {
    fn body_text(&self) -> String;
}

impl BodyText for soulbase_net_outbox::StoredItem {
    fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_claims_only_the_head_of_each_ordering_key() {
    let store = SqliteStore::open(db("ordered-contract")).await.unwrap();
    ordering_contract(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_migrates_a_version_3_file_to_ordering_keys() {
    let path = db("ordered-migrate");
    let old = SqliteStore::builder(&path)
        .schema_version(3)
        .open()
        .await
        .unwrap();
    assert_eq!(old.schema_version().await.unwrap(), 3);
    // Written as a version-3 build wrote it (this build's insert names `ordering_key`).
    sqlx::query(
        "INSERT INTO outbox (method, url, headers, body, idem_key, deliver_at, max_attempts)
         VALUES ('POST', 'http://127.0.0.1:1/old', '[]', x'6f6c64', 'kkkk', 0, 5)",
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
    let claimed = new
        .claim_due(SystemTime::now(), 10, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "the item stored before the migration");
    assert_eq!(claimed[0].ordering_key, None);
    assert!(new.ack(&claimed[0]).await.unwrap());
}

// === delivery ===

/// Four keys of five items and five items without a key: each key in order, one at a time,
/// the keys in parallel.
async fn keys_in_order_and_in_parallel(store: Arc<dyn OutboxStore>, poll: Duration) {
    let (srv, arrivals) = upstream(|_, _| Reply::ok("ok")).await;
    let o = outbox(store, poll);
    let keys = ["a", "b", "c", "d"];
    let mut all = items(&srv, &keys, 5);
    all.extend((0..5).map(|seq| item(&srv, "none", seq)));
    o.enqueue_batch(all).await.unwrap();
    let _run = run(&o);
    tokio::time::timeout(Duration::from_secs(20), srv.wait_for_hits("/hook", 25))
        .await
        .unwrap();
    until("every ack", async || {
        o.store().pending().await.unwrap() == 0
    })
    .await;
    assert_in_order_one_at_a_time(&arrivals, &keys, 5);
    // Items of different keys were at the upstream at the same time.
    let parallel = arrivals.most_at_once_of(|k| k != "none");
    assert!(
        parallel >= 2,
        "the keys went in parallel: {parallel} at most at once"
    );
    assert_eq!(srv.hits("/hook"), 25, "each item once");
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_of_one_key_go_in_order_one_at_a_time_and_keys_in_parallel() {
    let store = SqliteStore::open(db("ordered-parallel")).await.unwrap();
    keys_in_order_and_in_parallel(Arc::new(store), Duration::from_millis(50)).await;
}

/// Key `a`'s head fails once (503) then succeeds; key `b`'s head is refused (400: a dead
/// letter at once); key `c`'s head fails until its two attempts are spent (a dead letter).
async fn a_retried_head_holds_its_key_and_a_dead_one_is_skipped(
    store: Arc<dyn OutboxStore>,
    poll: Duration,
) {
    let (srv, arrivals) = upstream(|body, n| match (body, n) {
        ("a:0", 1) | ("c:0", _) => Reply::status(503),
        ("b:0", _) => Reply::status(400),
        _ => Reply::ok("ok"),
    })
    .await;
    let o = outbox(store, poll);
    let mut all = items(&srv, &["a", "b"], 3);
    all.push(item(&srv, "c", 0).max_attempts(2));
    all.extend((1..3).map(|seq| item(&srv, "c", seq)));
    o.enqueue_batch(all).await.unwrap();
    let _run = run(&o);
    // a:0 twice, c:0 twice, the rest once.
    tokio::time::timeout(Duration::from_secs(20), srv.wait_for_hits("/hook", 11))
        .await
        .unwrap();
    until("every outcome", async || {
        o.store().pending().await.unwrap() == 0
    })
    .await;
    assert_eq!(
        arrivals.seqs("a"),
        [0, 0, 1, 2],
        "the followers waited for the retried head"
    );
    assert_eq!(arrivals.seqs("b"), [0, 1, 2], "the dead head was skipped");
    assert_eq!(
        arrivals.seqs("c"),
        [0, 0, 1, 2],
        "skipped once its attempts were spent"
    );
    for key in ["a", "b", "c"] {
        assert_eq!(arrivals.most_at_once(key), 1, "key {key}");
    }
    let mut dead: Vec<String> = o
        .store()
        .dead_letters()
        .await
        .unwrap()
        .iter()
        .map(|d| String::from_utf8_lossy(&d.item.body).into_owned())
        .collect();
    dead.sort();
    assert_eq!(dead, ["b:0", "c:0"]);
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_head_holds_its_followers_and_a_dead_head_lets_them_go() {
    let store = SqliteStore::open(db("ordered-retry")).await.unwrap();
    a_retried_head_holds_its_key_and_a_dead_one_is_skipped(
        Arc::new(store),
        Duration::from_millis(50),
    )
    .await;
}

// === a worker process killed mid-delivery ===

/// Set (to the outbox's file) in the child process this test binary starts as its worker.
const CHILD_DB: &str = "SOULBASE_ORDERED_CRASH_DB";

/// The worker process of [`a_worker_killed_mid_delivery_keeps_each_keys_order`]: with
/// [`CHILD_DB`] set, it runs an outbox on that file until it is killed; as an ordinary test
/// (the variable unset) it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_crash_worker() {
    let Some(path) = std::env::var_os(CHILD_DB) else {
        return;
    };
    let store = SqliteStore::open(Path::new(&path)).await.unwrap();
    let o = Arc::new(
        Outbox::builder()
            .store(Arc::new(store))
            .client(client())
            .workers(16)
            .lease(Duration::from_millis(500))
            .poll(Duration::from_millis(20))
            .build()
            .unwrap(),
    );
    o.run().await.unwrap();
}

/// Starts this test binary as a worker process on the outbox at `path`.
fn worker(path: &Path) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "ordered_crash_worker", "--nocapture"])
        .env(CHILD_DB, path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_delivery_keeps_each_keys_order() {
    let (srv, arrivals) = upstream(|_, _| Reply::ok("ok")).await;
    let path = db("ordered-crash");
    let keys = ["a", "b", "c"];
    const PER_KEY: usize = 15;
    {
        let store = SqliteStore::open(&path).await.unwrap();
        outbox(Arc::new(store), Duration::from_secs(60))
            .enqueue_batch(items(&srv, &keys, PER_KEY))
            .await
            .unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    // Killed (SIGKILL) right after the upstream sees a delivery, while its answer is held:
    // the item is in flight, unacknowledged, its claim held by a process that is gone.
    for kill_at in [6, 17, 29] {
        let mut child = worker(&path);
        tokio::time::timeout(Duration::from_secs(20), srv.wait_for_hits("/hook", kill_at))
            .await
            .expect("the worker delivers");
        child.start_kill().unwrap();
        child.wait().await.unwrap();
    }
    let mut last = worker(&path);
    until("every item acknowledged", async || {
        store.pending().await.unwrap() == 0
    })
    .await;
    last.start_kill().unwrap();
    last.wait().await.unwrap();
    for key in keys {
        let seqs = arrivals.seqs(key);
        // At least once: a redelivery after a kill is allowed; out of order never — no item
        // arrives before every earlier item of its key has (and, since the head holds its
        // key, a redelivered one arrives before the next).
        assert!(
            seqs.windows(2).all(|w| w[0] <= w[1]),
            "key {key} arrived in order: {seqs:?}"
        );
        let mut firsts = seqs.clone();
        firsts.dedup();
        assert_eq!(
            firsts,
            (0..PER_KEY).collect::<Vec<_>>(),
            "key {key}: none lost"
        );
        assert_eq!(arrivals.most_at_once(key), 1, "key {key}");
    }
    eprintln!(
        "{} arrivals for {} items across 3 kills",
        arrivals.all().len(),
        keys.len() * PER_KEY
    );
    srv.join().await;
}

// === PostgreSQL ===

#[cfg(feature = "postgres")]
mod postgres {
    use soulbase_net_outbox::PostgresStore;
    use soulbase_net_testkit::PostgresServer;

    use super::*;

    async fn postgres(test: &str) -> Option<(PostgresServer, String)> {
        let pg = PostgresServer::start_or_skip(test)?;
        let url = pg.create_database("outbox").unwrap();
        Some((pg, url))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_claims_only_the_head_of_each_ordering_key() {
        let Some((_pg, url)) = postgres("postgres_claims_only_the_head_of_each_ordering_key").await
        else {
            return;
        };
        let store = PostgresStore::connect(&url).await.unwrap();
        ordering_contract(&store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_items_of_one_key_go_in_order_and_keys_in_parallel() {
        let Some((_pg, url)) =
            postgres("postgres_items_of_one_key_go_in_order_and_keys_in_parallel").await
        else {
            return;
        };
        let store = PostgresStore::connect(&url).await.unwrap();
        keys_in_order_and_in_parallel(Arc::new(store), Duration::from_millis(50)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_retried_head_holds_its_followers_and_a_dead_head_lets_them_go() {
        let Some((_pg, url)) =
            postgres("postgres_a_retried_head_holds_its_followers_and_a_dead_head_lets_them_go")
                .await
        else {
            return;
        };
        let store = PostgresStore::connect(&url).await.unwrap();
        a_retried_head_holds_its_key_and_a_dead_one_is_skipped(
            Arc::new(store),
            Duration::from_millis(50),
        )
        .await;
    }

    /// Two outboxes, each on a store connection of its own, deliver from one table: each key
    /// keeps its order and never has two items in flight, whichever instance claims them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres_two_outboxes_on_one_table_keep_each_keys_order() {
        let Some((_pg, url)) =
            postgres("postgres_two_outboxes_on_one_table_keep_each_keys_order").await
        else {
            return;
        };
        let (srv, arrivals) = upstream(|_, _| Reply::ok("ok")).await;
        let stores: Vec<Arc<dyn OutboxStore>> = vec![
            Arc::new(PostgresStore::connect(&url).await.unwrap()),
            Arc::new(PostgresStore::connect(&url).await.unwrap()),
        ];
        let keys = ["a", "b", "c", "d", "e", "f"];
        const PER_KEY: usize = 12;
        let outboxes: Vec<_> = stores
            .iter()
            .map(|s| outbox(s.clone(), Duration::from_millis(20)))
            .collect();
        outboxes[0]
            .enqueue_batch(items(&srv, &keys, PER_KEY))
            .await
            .unwrap();
        let _running: Vec<_> = outboxes.iter().map(run).collect();
        let total = (keys.len() * PER_KEY) as u64;
        tokio::time::timeout(Duration::from_secs(30), srv.wait_for_hits("/hook", total))
            .await
            .unwrap();
        until("every ack", async || {
            stores[1].pending().await.unwrap() == 0
        })
        .await;
        assert_in_order_one_at_a_time(&arrivals, &keys, PER_KEY);
        assert_eq!(srv.hits("/hook"), total, "each item once");
        srv.join().await;
    }

    /// A dead head requeued while two instances claim: the requeued item is the first of its
    /// key again, and a claim that took a later item of the key under a snapshot older than
    /// the requeue must not run alongside one that takes the requeued item. Per round, at most
    /// one item of the key is held.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres_a_requeue_racing_claims_never_puts_two_of_a_key_in_flight() {
        let Some((_pg, url)) =
            postgres("postgres_a_requeue_racing_claims_never_puts_two_of_a_key_in_flight").await
        else {
            return;
        };
        let stores: Vec<Arc<dyn OutboxStore>> = vec![
            Arc::new(PostgresStore::connect(&url).await.unwrap()),
            Arc::new(PostgresStore::connect(&url).await.unwrap()),
            Arc::new(PostgresStore::connect(&url).await.unwrap()),
        ];
        let lease = Duration::from_secs(60);
        let mut most = 0;
        const ROUNDS: usize = 80;
        for round in 0..ROUNDS {
            let key = format!("k{round}");
            let batch: Vec<_> = (0..3)
                .map(|seq| {
                    OutboxItem::post("http://127.0.0.1:1/x", format!("{key}:{seq}"))
                        .ordering_key(key.as_str())
                        .into_stored(SystemTime::now())
                        .unwrap()
                })
                .collect();
            for item in batch {
                stores[0].enqueue(item).await.unwrap();
            }
            let head = stores[0]
                .claim_due(SystemTime::now(), 10, lease)
                .await
                .unwrap();
            assert_eq!(head.len(), 1, "round {round}: the head alone");
            assert!(stores[0]
                .dead(&head[0], 1, "HTTP 400", Some(400))
                .await
                .unwrap());
            // The requeue and two claimers, released together.
            let go = Arc::new(tokio::sync::Barrier::new(3));
            let requeue = {
                let (store, go, id) = (stores[0].clone(), go.clone(), head[0].id);
                tokio::spawn(async move {
                    go.wait().await;
                    store.requeue(id).await.unwrap()
                })
            };
            let claimers: Vec<_> = stores[1..]
                .iter()
                .map(|store| {
                    let (store, go) = (store.clone(), go.clone());
                    tokio::spawn(async move {
                        go.wait().await;
                        let mut held = Vec::new();
                        for _ in 0..4 {
                            held.extend(
                                store.claim_due(SystemTime::now(), 10, lease).await.unwrap(),
                            );
                        }
                        held
                    })
                })
                .collect();
            assert!(requeue.await.unwrap());
            let mut held = Vec::new();
            for claimer in claimers {
                held.extend(claimer.await.unwrap());
            }
            most = most.max(held.len());
            assert!(
                held.len() <= 1,
                "round {round}: {} items of one key held at once: {:?}",
                held.len(),
                held.iter().map(|i| i.body_text()).collect::<Vec<_>>()
            );
            // Leave nothing of the key behind for the next round's claims.
            for item in &held {
                assert!(stores[0].ack(item).await.unwrap());
            }
            until("the round's key drained", async || {
                let left = stores[0]
                    .claim_due(SystemTime::now(), 10, lease)
                    .await
                    .unwrap();
                for item in &left {
                    assert!(stores[0].ack(item).await.unwrap());
                }
                stores[0].pending().await.unwrap() == 0
            })
            .await;
        }
        eprintln!("{ROUNDS} rounds, at most {most} item(s) of a key held at once");
    }
}
