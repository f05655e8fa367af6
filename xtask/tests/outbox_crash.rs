//! The outbox survives a crash: a worker *process* delivering 1 000 items is killed with
//! SIGKILL at a seeded moment, then started again — on SQLite and on PostgreSQL (a throwaway
//! cluster; skipped loudly without it, never in CI). Every item's effect is applied exactly
//! once at the receiver (which dedups by `Idempotency-Key`), none is lost, and the duplicates
//! on the wire (items delivered but not yet acknowledged when the process died) are counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The pieces `cargo xtask chaos`'s crash loop uses too (a binary crate's modules cannot be
// imported, so the file is included).
#[path = "../src/outbox_kit.rs"]
mod outbox_kit;

use std::{process::Command, sync::Arc, time::Duration};

use outbox_kit::{Applied, TempDir};
use soulbase_net_outbox::{Outbox, OutboxItem, SqliteStore};
use soulbase_net_testkit::{FaultServer, Reply};

const ITEMS: usize = 1000;

fn worker(db: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["outbox-worker", "--db", db, "--secs", "60"])
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_loses_nothing_and_applies_each_effect_once() {
    let dir = TempDir::new("outbox-crash").unwrap();
    crash_and_restart("SQLite", &dir.file("outbox.db")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_on_postgres_loses_nothing_and_applies_each_effect_once() {
    let Some(pg) = soulbase_net_testkit::PostgresServer::start_or_skip(
        "a_killed_worker_on_postgres_loses_nothing_and_applies_each_effect_once",
    ) else {
        return;
    };
    crash_and_restart("PostgreSQL", &pg.create_database("crash").unwrap()).await;
}

/// Fills the outbox at `db`, kills its worker process once mid-run, restarts it, and checks
/// the receiver.
async fn crash_and_restart(engine: &str, db: &str) {
    let srv = FaultServer::http1()
        .route("/effect", Reply::ok("applied"))
        .start()
        .await
        .unwrap();
    let db = db.to_owned();
    // Fill the outbox (enqueue only: this process delivers nothing).
    let store = outbox_kit::fill(&db, &srv.url("/effect"), ITEMS)
        .await
        .unwrap();
    // Killed at a seeded point between 5 % and 85 % of the deliveries.
    let kill_at = 50 + (std::process::id() as u64 * 7919) % 800;
    let mut first = worker(&db);
    tokio::time::timeout(
        Duration::from_secs(60),
        srv.wait_for_hits("/effect", kill_at),
    )
    .await
    .expect("the first worker delivers");
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    let at_kill = srv.hits("/effect");
    // Started again: claims made by the dead process come back after their lease.
    let mut second = worker(&db);
    outbox_kit::drained(&*store, Duration::from_secs(60))
        .await
        .expect("the second worker finishes");
    assert!(second.wait().unwrap().success());
    // At the receiver: every item's key, each effect applied once (dedup by key).
    let applied = Applied::of(&srv.requests("/effect"));
    let duplicates = applied.duplicates_on_wire();
    eprintln!(
        "{engine}: killed after {at_kill} deliveries; {} distinct items applied once each, {} on the wire, {duplicates} duplicates (delivered, not yet acknowledged at the kill)",
        applied.items, applied.on_wire
    );
    assert_eq!(applied.items, ITEMS, "none lost");
    assert_eq!(applied.duplicated_effects(), 0, "{applied:?}");
    assert_eq!(applied.shared_keys, 0, "one key, one item");
    assert!(store.dead_letters().await.unwrap().is_empty());
    // A duplicate can only be a delivery in flight at the kill, or one whose acknowledgement
    // waited for or was in its batch's commit: at most three times the workers' 16.
    assert!(duplicates <= 3 * 16, "{duplicates} duplicates");
    srv.join().await;
}

/// The lease of the outbox-worker process (`xtask/src/outbox.rs`); its heartbeat beats every
/// half of it.
const WORKER_LEASE: Duration = Duration::from_secs(2);

/// Items a worker held when it was SIGKILLed mid-delivery are delivered again by a worker
/// that ran alongside all along, within two heartbeats (one lease) — and not while the
/// first lived, however long its deliveries took: its heartbeat kept them its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_items_come_back_within_two_heartbeats() {
    // Fewer than the worker's 16 deliveries at once: all of them in flight together.
    const HELD: u64 = 12;
    let dir = TempDir::new("outbox-heartbeat").unwrap();
    let db = dir.file("outbox.db");
    let gate = soulbase_net_testkit::Gate::new();
    let srv = FaultServer::http1()
        .route("/effect", Reply::ok("applied").after(&gate))
        .start()
        .await
        .unwrap();
    let store = outbox_kit::fill(&db, &srv.url("/effect"), HELD as usize)
        .await
        .unwrap();
    let mut first = worker(&db);
    tokio::time::timeout(Duration::from_secs(30), srv.wait_for_hits("/effect", HELD))
        .await
        .expect("the first worker's deliveries reach the upstream, which holds them");
    let mut second = worker(&db);
    // The deliveries last longer than a lease: the second worker takes none of them over.
    tokio::time::sleep(WORKER_LEASE * 3 / 2).await;
    assert_eq!(
        srv.hits("/effect"),
        HELD,
        "a live worker's items were taken over"
    );
    first.kill().unwrap(); // SIGKILL, mid-delivery
    first.wait().unwrap();
    let killed = tokio::time::Instant::now();
    gate.open();
    tokio::time::timeout(WORKER_LEASE * 5, srv.wait_for_hits("/effect", 2 * HELD))
        .await
        .expect("the killed worker's items are delivered again");
    let back = killed.elapsed();
    eprintln!("a killed worker's {HELD} items delivered again {back:?} after the kill (lease {WORKER_LEASE:?})");
    // Its last extension was at most half a lease before the kill: back within a lease, plus
    // the second worker's poll (50 ms) and a delivery, with room for a loaded machine.
    assert!(
        back <= WORKER_LEASE + Duration::from_secs(1),
        "delivered again {back:?} after the kill"
    );
    outbox_kit::drained(&*store, Duration::from_secs(30))
        .await
        .expect("the second worker finishes");
    assert!(second.wait().unwrap().success());
    let applied = Applied::of(&srv.requests("/effect"));
    assert_eq!(applied.items as u64, HELD, "none lost");
    assert_eq!(applied.duplicated_effects(), 0, "{applied:?}");
    srv.join().await;
}

fn admin(db: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["outbox", "--db", db])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_requeued_and_purged_from_the_command_line() {
    let srv = FaultServer::http1()
        .route("/refuses", Reply::status(400))
        .start()
        .await
        .unwrap();
    let dir = TempDir::new("outbox-admin").unwrap();
    let db = dir.file("outbox.db");
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let outbox = Outbox::builder()
        .store(store.clone())
        .client(Arc::new(
            soulbase_net_runtime::Client::builder().build().unwrap(),
        ))
        .build()
        .unwrap();
    outbox
        .enqueue(OutboxItem::post(srv.url("/refuses"), "x"))
        .await
        .unwrap();
    // Delivered by a worker process: a 400 is a dead letter at once.
    assert!(worker(&db).wait().unwrap().success());
    let listed = admin(&db, &["list"]);
    assert!(
        listed.contains("0 pending, 1 dead") && listed.contains("HTTP 400"),
        "{listed}"
    );
    let id = listed
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert!(admin(&db, &["requeue", &id]).contains("requeued"));
    assert!(admin(&db, &["list"]).contains("1 pending, 0 dead"));
    assert!(admin(&db, &["purge"]).contains("0 dead letters purged"));
    srv.join().await;
}
