//! The outbox as a fleet: three worker *processes* (`cargo xtask outbox-worker`) deliver from
//! one PostgreSQL table. Claims are `FOR UPDATE SKIP LOCKED` under a lease, so no item is
//! delivered twice while nobody crashes, none is lost, and the work is spread over all three.
//! PostgreSQL is a throwaway cluster on a free loopback port (skipped loudly without it; CI
//! installs it and never skips).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::HashMap, process::Command, sync::Arc};

use soulbase_net_outbox::{Outbox, OutboxItem, OutboxStore, PostgresStore};
use soulbase_net_testkit::{FaultServer, PostgresServer, Reply};
use tokio::time::Instant;

const ITEMS: usize = 3000;
const WORKERS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_table_with_no_double_delivery_and_none_lost() {
    let Some(pg) = PostgresServer::start_or_skip(
        "three_processes_share_one_table_with_no_double_delivery_and_none_lost",
    ) else {
        return;
    };
    let url = pg.create_database("fleet").unwrap();
    let srv = FaultServer::http1()
        .route("/effect", Reply::ok("applied"))
        .start()
        .await
        .unwrap();
    // Filled by this process, which delivers nothing.
    let store = Arc::new(PostgresStore::connect(&url).await.unwrap());
    let filler = Outbox::builder()
        .store(store.clone())
        .client(Arc::new(
            soulbase_net_runtime::Client::builder().build().unwrap(),
        ))
        .build()
        .unwrap();
    for i in 0..ITEMS {
        filler
            .enqueue(OutboxItem::post(srv.url("/effect"), format!("item {i}")))
            .await
            .unwrap();
    }
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_xtask"))
                .args(["outbox-worker", "--db", &url, "--secs", "60"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut delivered = Vec::new();
    for w in workers {
        let out = tokio::task::spawn_blocking(move || w.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let n: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("delivered "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("a worker reports its count: {text}"));
        delivered.push(n);
    }
    let took = started.elapsed();
    assert_eq!(store.pending().await.unwrap(), 0);
    let mut by_key: HashMap<String, usize> = HashMap::new();
    for r in srv.requests("/effect") {
        *by_key
            .entry(r.header("idempotency-key").unwrap().to_owned())
            .or_default() += 1;
    }
    let twice = by_key.values().filter(|&&n| n > 1).count();
    eprintln!(
        "{ITEMS} items, {WORKERS} processes on one PostgreSQL table: delivered {delivered:?} \
         (sum {}), {} distinct at the receiver, {twice} delivered twice, in {took:.2?} \
         ({:.0} deliveries/s)",
        delivered.iter().sum::<usize>(),
        by_key.len(),
        ITEMS as f64 / took.as_secs_f64()
    );
    assert_eq!(by_key.len(), ITEMS, "none lost");
    assert_eq!(twice, 0, "no double delivery without a crash");
    assert_eq!(delivered.iter().sum::<usize>(), ITEMS);
    // Spread: every process delivered a real share (not one doing it all).
    assert!(
        delivered.iter().all(|&n| n >= ITEMS / 10),
        "work spread over all three: {delivered:?}"
    );
    assert!(store.dead_letters().await.unwrap().is_empty());
    srv.join().await;
}
