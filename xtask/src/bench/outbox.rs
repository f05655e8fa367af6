//! `cargo xtask bench --outbox [--items N]`: what the outbox sustains on this machine, for
//! SQLite (a temp file, WAL, `synchronous = FULL`) and PostgreSQL (a throwaway cluster with
//! `fsync` on, so commits are as durable as in production; skipped with a line when
//! PostgreSQL is not installed):
//!
//! - **enqueue, one caller**: items/s and p50/p99 of `enqueue` (each a commit);
//! - **enqueue, batched**: items/s with 100 items per `enqueue_batch` (one commit each);
//! - **deliveries/s**: N items stored, then one outbox with its defaults drains them to an
//!   upstream of ordinary speed: the bench server, in a process of its own, answering each
//!   after a delay drawn uniformly from 0–20 ms (`/jitter`);
//! - **enqueue → delivered**: with the outbox running, one caller enqueues 200 items/s; p50
//!   and p99 of the time from `enqueue` to the acknowledged delivery (the outbox's lateness).
//!
//! Targets (reported, not asserted): ≥ 2 000 deliveries/s on PostgreSQL and ≥ 1 000/s on
//! SQLite against that upstream, enqueue p99 ≤ 5 ms on SQLite. Numbers are representative in release: `cargo run --release -p xtask -- bench
//! --outbox`.
#![allow(
    clippy::print_stdout,
    reason = "a command a person runs: the table goes to stdout"
)]

use std::{sync::Arc, time::Duration};

use parking_lot::Mutex;
use soulbase_net_core::{NetEvent, Observer, OutboxStep};
use soulbase_net_outbox::{
    Outbox, OutboxItem, OutboxStore, PostgresStore, SqliteStore, StoreOptions,
};
use soulbase_net_testkit::PostgresServer;
use tokio::time::Instant;

use super::server::{Listener, ServerProcess};
use crate::outbox_kit::TempDir;

/// One store's figures.
#[derive(Debug, Default)]
struct Row {
    store: &'static str,
    enqueue_per_s: f64,
    enqueue_p50_ms: f64,
    enqueue_p99_ms: f64,
    batched_per_s: f64,
    deliveries_per_s: f64,
    latency_p50_ms: f64,
    latency_p99_ms: f64,
}

/// `cargo xtask bench --outbox [--items N]`.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let items = super::count_option(args, "bench --outbox", "--items", 5000)?;
    let rt = super::store_bench_runtime()?;
    rt.block_on(async move {
        println!(
            "outbox bench ({} build): {items} items per delivery run\n",
            if cfg!(debug_assertions) {
                "debug — figures are not representative; use --release"
            } else {
                "release"
            }
        );
        let mut rows = Vec::new();
        let upstream = ServerProcess::start(&super::this_program()?).await?;
        let sink = format!("http://127.0.0.1:{}/jitter", upstream.port(Listener::H1));
        println!(
            "upstream: the bench server in process {}, each answer after 0-20 ms (uniform); \
             the outbox with its defaults\n",
            upstream.pid().unwrap_or(0)
        );
        let dir = TempDir::new("outbox-bench")?;
        let sqlite = SqliteStore::open(dir.file("bench.db"))
            .await
            .map_err(|e| e.to_string())?;
        rows.push(measure("SQLite", Arc::new(sqlite), &sink, items).await?);
        match PostgresServer::builder().fsync(true).try_start() {
            Ok(Some(pg)) => {
                let url = pg.create_database("bench").map_err(|e| e.to_string())?;
                let store = PostgresStore::builder(&url)
                    .options(StoreOptions::default())
                    .max_connections(16)
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
                rows.push(measure("PostgreSQL", Arc::new(store), &sink, items).await?);
            }
            Ok(None) => println!("PostgreSQL: skipped (not installed; cargo xtask ci installs it)"),
            Err(e) => return Err(format!("PostgreSQL did not start: {e}")),
        }
        print_table(&rows);
        Ok(())
    })
}

/// The figures of one store.
async fn measure(
    name: &'static str,
    store: Arc<dyn OutboxStore>,
    url: &str,
    items: usize,
) -> Result<Row, String> {
    let lateness = Arc::new(Lateness::default());
    let outbox = Arc::new(
        Outbox::builder()
            .store(store.clone())
            .client(crate::outbox::delivery_client()?)
            .observer(lateness.clone())
            .build()
            .map_err(|e| e.to_string())?,
    );
    let mut row = Row {
        store: name,
        ..Row::default()
    };
    // Enqueue, one caller, one commit each (nothing delivers meanwhile).
    let single = 1000usize;
    let mut took = Vec::with_capacity(single);
    let started = Instant::now();
    for i in 0..single {
        let t = Instant::now();
        outbox
            .enqueue(OutboxItem::post(url, format!("single {i}")))
            .await
            .map_err(|e| e.to_string())?;
        took.push(t.elapsed());
    }
    row.enqueue_per_s = single as f64 / started.elapsed().as_secs_f64();
    (row.enqueue_p50_ms, row.enqueue_p99_ms) = (ms(pct(&mut took, 0.50)), ms(pct(&mut took, 0.99)));
    // Enqueue, batched: the rest of the delivery run's items, 100 a commit.
    let batched = items.saturating_sub(single).max(100);
    let started = Instant::now();
    let mut sent = 0;
    while sent < batched {
        let n = 100.min(batched - sent);
        outbox
            .enqueue_batch((sent..sent + n).map(|i| OutboxItem::post(url, format!("batch {i}"))))
            .await
            .map_err(|e| e.to_string())?;
        sent += n;
    }
    row.batched_per_s = batched as f64 / started.elapsed().as_secs_f64();
    // Deliveries: drain what is stored.
    let stored = store.pending().await.map_err(|e| e.to_string())?;
    let running = {
        let o = outbox.clone();
        tokio::spawn(async move { o.run().await })
    };
    let started = Instant::now();
    wait_drained(&*store, Duration::from_secs(120)).await?;
    row.deliveries_per_s = stored as f64 / started.elapsed().as_secs_f64();
    // Enqueue → delivered, at 200 items/s with the outbox running.
    lateness.0.lock().clear();
    let paced = 400usize;
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    for i in 0..paced {
        tick.tick().await;
        outbox
            .enqueue(OutboxItem::post(url, format!("paced {i}")))
            .await
            .map_err(|e| e.to_string())?;
    }
    wait_drained(&*store, Duration::from_secs(60)).await?;
    let mut seen = lateness.0.lock().clone();
    if seen.len() < paced {
        return Err(format!(
            "{name}: {} of {paced} deliveries reported",
            seen.len()
        ));
    }
    (row.latency_p50_ms, row.latency_p99_ms) = (ms(pct(&mut seen, 0.50)), ms(pct(&mut seen, 0.99)));
    outbox.shutdown();
    running
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    Ok(row)
}

/// Waits, bounded, until nothing is pending (the store has no event to await).
async fn wait_drained(store: &dyn OutboxStore, limit: Duration) -> Result<(), String> {
    let started = Instant::now();
    while store.pending().await.map_err(|e| e.to_string())? > 0 {
        if started.elapsed() > limit {
            return Err(format!("the outbox did not drain within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// Each delivery's lateness (acknowledged − due), as the outbox reports it.
#[derive(Debug, Default)]
struct Lateness(Mutex<Vec<Duration>>);

impl Observer for Lateness {
    fn on_event(&self, event: &NetEvent<'_>) {
        if let NetEvent::Outbox {
            step: OutboxStep::Delivered,
            lateness: Some(late),
        } = event
        {
            self.0.lock().push(*late);
        }
    }
}

fn pct(v: &mut [Duration], q: f64) -> Duration {
    v.sort_unstable();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len().max(1)) - 1;
    v.get(i).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn print_table(rows: &[Row]) {
    let head = [
        "store",
        "enqueue/s (1 caller)",
        "enqueue p50 / p99",
        "enqueue/s (100 per batch)",
        "deliveries/s",
        "enqueue→delivered p50 / p99",
    ];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.store.to_owned(),
                format!("{:.0}", r.enqueue_per_s),
                format!("{:.2} / {:.2} ms", r.enqueue_p50_ms, r.enqueue_p99_ms),
                format!("{:.0}", r.batched_per_s),
                format!("{:.0}", r.deliveries_per_s),
                format!("{:.1} / {:.1} ms", r.latency_p50_ms, r.latency_p99_ms),
            ]
        })
        .collect();
    let width = |i: usize| {
        cells
            .iter()
            .map(|c| c[i].chars().count())
            .chain([head[i].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let line = |c: [&str; 6]| {
        let parts: Vec<String> = c
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{s:<w$}", w = width(i)))
            .collect();
        format!("| {} |", parts.join(" | "))
    };
    println!("{}", line(head));
    let rule: Vec<String> = (0..head.len()).map(|i| "-".repeat(width(i))).collect();
    println!("| {} |", rule.join(" | "));
    for c in &cells {
        println!(
            "{}",
            line([&c[0], &c[1], &c[2], &c[3], &c[4], &c[5]].map(String::as_str))
        );
    }
    println!(
        "\ntargets (reported, not asserted): ≥ 2000 deliveries/s on PostgreSQL and ≥ 1000/s on SQLite against that upstream; SQLite enqueue p99 ≤ 5 ms"
    );
}
