//! `cargo xtask bench --delay [--pending N]`: what the delay server sustains on this machine —
//! the release binary `soulbase-net-delay`, in a process of its own — on SQLite (a temp file,
//! WAL, `synchronous = FULL`) and PostgreSQL (a throwaway cluster, `fsync` on; skipped with a
//! line when it is not installed):
//!
//! - **schedules/s**: 8 connections each pipelining 2 500 `schedule` lines (due in a day);
//!   acknowledged schedules per second (each acknowledged only once committed: group commit);
//! - **fire lateness at 5 000/s**: 25 000 tasks due over 5 s for one route, received by one
//!   connection that acknowledges each; p50 / p99 of receipt − `fire_at`;
//! - **RSS with N pending**: the server's resident memory once N tasks (default 1 000 000) are
//!   pending over the next day;
//! - **restart → first delivery**: the server SIGKILLed and started again with those N
//!   pending; from its start to the delivery of a task that was due.
//!
//! Targets (issue 32; reported, not asserted): ≥ 10 000 schedules/s, lateness ≤ `tick_ms` +
//! 10 ms at 5 000 fires/s, ≤ 200 MB RSS with 1 000 000 pending, first delivery ≤ 5 s after a
//! restart. Representative in release: `cargo run --release -p xtask -- bench --delay`.
#![allow(
    clippy::print_stdout,
    reason = "a command a person runs: the table goes to stdout"
)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, SystemTime},
};

use soulbase_net_testkit::PostgresServer;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
    time::Instant,
};

use crate::outbox_kit::TempDir;

/// Connections scheduling at once.
const CONNECTIONS: usize = 8;
/// Schedules per connection in the throughput run.
const EACH: usize = 2500;
/// Fires per second, and for how long, in the lateness run.
const FIRES_PER_S: usize = 5000;
const FIRE_SECS: usize = 5;

/// One store's figures.
#[derive(Debug, Default)]
struct Row {
    store: &'static str,
    schedules_per_s: f64,
    late_p50_ms: i64,
    late_p99_ms: i64,
    pending: usize,
    rss_mb: f64,
    restart_ms: f64,
}

/// `cargo xtask bench --delay [--pending N]`.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let pending = super::count_option(args, "bench --delay", "--pending", 1_000_000)?;
    let exe = build_server()?;
    let rt = super::store_bench_runtime()?;
    let mut rows = Vec::new();
    rows.push(rt.block_on(one_store("SQLite", &exe, None, pending))?);
    // `fsync` on, as in production (the testkit's default is off, for tests' speed): every
    // acknowledged schedule is on disk.
    match PostgresServer::builder().fsync(true).try_start() {
        Ok(Some(pg)) => {
            let url = pg.create_database("delay").map_err(|e| e.to_string())?;
            rows.push(rt.block_on(one_store("PostgreSQL", &exe, Some(url), pending))?);
        }
        Ok(None) => println!("PostgreSQL: skipped (not installed)"),
        Err(e) => return Err(format!("PostgreSQL did not start: {e}")),
    }
    println!(
        "delay bench (release server in its own process, {CONNECTIONS} connections pipelining; \
         {FIRES_PER_S} fires/s for {FIRE_SECS} s; tick_ms 10)\n"
    );
    println!("| store | schedules/s | fire lateness p50 / p99 | RSS with pending | restart → first delivery |");
    println!("| --- | --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {:.0} | {} / {} ms | {:.1} MB with {} | {:.0} ms |",
            r.store,
            r.schedules_per_s,
            r.late_p50_ms,
            r.late_p99_ms,
            r.rss_mb,
            r.pending,
            r.restart_ms
        );
    }
    println!(
        "\ntargets (reported, not asserted): ≥ 10000 schedules/s; lateness ≤ tick + 10 ms at 5000 fires/s; \
         ≤ 200 MB RSS with 1000000 pending; first delivery ≤ 5 s after a restart"
    );
    Ok(())
}

/// Builds the server binary (release, with PostgreSQL) and returns its path.
fn build_server() -> Result<PathBuf, String> {
    let root = crate::project_root();
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args([
            "build",
            "--release",
            "-p",
            "soulbase-net-delay",
            "--features",
            "postgres",
        ])
        .current_dir(&root)
        .status()
        .map_err(|e| format!("cargo build: {e}"))?;
    if !status.success() {
        return Err("building soulbase-net-delay failed".to_owned());
    }
    Ok(root.join("target/release/soulbase-net-delay"))
}

/// The server in its own process, listening on `addr` with `store` (a SQLite path or a
/// PostgreSQL URL); returns once it says it listens.
fn start(exe: &Path, dir: &Path, addr: &str, store: &str) -> Result<Child, String> {
    let config = dir.join("config.json");
    let text = serde_json::json!({
        "bind_addr": addr,
        "data_dir": dir.join("data"),
        "store": store,
    });
    std::fs::write(&config, text.to_string()).map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .env("HYPER_DELAY_CONFIG", &config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the server: {e}"))?;
    let mut line = String::new();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
        .map_err(|e| e.to_string())?;
    if !line.contains("listening on") {
        return Err(format!("the server did not start: {line:?}"));
    }
    Ok(child)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Sends `lines` on a new connection and waits for as many `ack` lines.
async fn pipeline(addr: &str, lines: Vec<String>) -> Result<usize, String> {
    let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (read, mut write) = stream.into_split();
    let want = lines.len();
    let writer = tokio::spawn(async move {
        let mut chunk = String::with_capacity(64 * 1024);
        for line in lines {
            chunk.push_str(&line);
            if chunk.len() > 60 * 1024 {
                write.write_all(chunk.as_bytes()).await?;
                chunk.clear();
            }
        }
        write.write_all(chunk.as_bytes()).await?;
        Ok::<_, std::io::Error>(write)
    });
    let mut lines_in = BufReader::new(read).lines();
    let mut acks = 0;
    while acks < want {
        match tokio::time::timeout(Duration::from_secs(60), lines_in.next_line()).await {
            Ok(Ok(Some(line))) if line.contains("\"kind\":\"ack\"") => acks += 1,
            Ok(Ok(Some(line))) => return Err(format!("not an ack: {line}")),
            _ => return Err(format!("{acks} of {want} acks, then nothing for 60 s")),
        }
    }
    let _write = writer
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    Ok(acks)
}

fn schedule_line(id: &str, route: &str, fire_at: i64) -> String {
    format!(
        "{{\"kind\":\"schedule\",\"id\":\"{id}\",\"route_key\":\"{route}\",\"fire_at\":{fire_at},\"compression\":\"none\",\"payload_base64\":\"aGVsbG8=\"}}\n"
    )
}

/// Schedules `n` tasks named `prefix-i` on `CONNECTIONS` connections at once, due at
/// `fire_at(i)`; returns the schedules acknowledged per second.
async fn schedule_many(
    addr: &str,
    prefix: &str,
    n: usize,
    fire_at: impl Fn(usize) -> i64,
) -> Result<f64, String> {
    let started = Instant::now();
    let mut runs = tokio::task::JoinSet::new();
    for c in 0..CONNECTIONS {
        let lines: Vec<String> = (c..n)
            .step_by(CONNECTIONS)
            .map(|i| schedule_line(&format!("{prefix}-{i}"), "far", fire_at(i)))
            .collect();
        let addr = addr.to_owned();
        runs.spawn(async move { pipeline(&addr, lines).await });
    }
    let mut acked = 0;
    while let Some(done) = runs.join_next().await {
        acked += done.map_err(|e| e.to_string())??;
    }
    Ok(acked as f64 / started.elapsed().as_secs_f64())
}

/// The server's resident memory, in MB.
fn rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn one_store(
    name: &'static str,
    exe: &Path,
    pg: Option<String>,
    pending: usize,
) -> Result<Row, String> {
    let dir = TempDir::new("bench-delay")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let store = pg.unwrap_or_else(|| dir.file("delay.db"));
    let mut server = start(exe, Path::new(&dir.file("")), &addr, &store)?;
    let mut row = Row {
        store: name,
        pending,
        ..Row::default()
    };
    let day = now_ms() + 86_400_000;
    row.schedules_per_s = schedule_many(&addr, "t", CONNECTIONS * EACH, |i| day + i as i64).await?;

    // Lateness: one receiver for route "fire", acknowledging each delivery.
    let stream = TcpStream::connect(&addr).await.map_err(|e| e.to_string())?;
    let (read, mut write) = stream.into_split();
    write
        .write_all(b"{\"kind\":\"register\",\"route_key\":\"fire\"}\n")
        .await
        .map_err(|e| e.to_string())?;
    let total = FIRES_PER_S * FIRE_SECS;
    let start_at = now_ms() + 4000;
    let lines: Vec<String> = (0..total)
        .map(|i| {
            let at = start_at + (i * 1000 / FIRES_PER_S) as i64;
            schedule_line(&format!("f-{i}"), "fire", at)
        })
        .collect();
    pipeline(&addr, lines).await?;
    let mut late = Vec::with_capacity(total);
    let mut lines_in = BufReader::new(read).lines();
    while late.len() < total {
        let line = match tokio::time::timeout(Duration::from_secs(30), lines_in.next_line()).await {
            Ok(Ok(Some(line))) => line,
            _ => {
                return Err(format!(
                    "{} of {total} fired, then nothing for 30 s",
                    late.len()
                ))
            }
        };
        let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| e.to_string())?;
        if v["kind"] != "delivery" {
            continue;
        }
        late.push(now_ms() - v["fire_at"].as_i64().unwrap_or(0));
        let ack = format!(
            "{{\"kind\":\"ack\",\"id\":\"{}\"}}\n",
            v["id"].as_str().unwrap_or("")
        );
        write
            .write_all(ack.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
    }
    late.sort_unstable();
    row.late_p50_ms = late[late.len() / 2];
    row.late_p99_ms = late[late.len() * 99 / 100];
    drop(write);

    // Memory with `pending` tasks due over the next day.
    let more = pending.saturating_sub(CONNECTIONS * EACH);
    let spread = 86_400_000 / pending.max(1) as i64;
    schedule_many(&addr, "p", more, |i| now_ms() + 60_000 + i as i64 * spread).await?;
    row.rss_mb = rss_mb(server.id());

    // Restart: a task due now, the server killed and started again.
    pipeline(
        &addr,
        vec![schedule_line("restart-probe", "probe", now_ms())],
    )
    .await?;
    let _ = server.kill();
    let _ = server.wait();
    let restarted = Instant::now();
    let mut server = start(exe, Path::new(&dir.file("")), &addr, &store)?;
    let stream = TcpStream::connect(&addr).await.map_err(|e| e.to_string())?;
    let (read, mut write) = stream.into_split();
    write
        .write_all(b"{\"kind\":\"register\",\"route_key\":\"probe\"}\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut lines_in = BufReader::new(read).lines();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), lines_in.next_line()).await {
            Ok(Ok(Some(line))) if line.contains("restart-probe") => break,
            Ok(Ok(Some(_))) => {}
            _ => return Err("no delivery within 30 s of the restart".to_owned()),
        }
    }
    row.restart_ms = restarted.elapsed().as_secs_f64() * 1e3;
    let _ = server.kill();
    let _ = server.wait();
    Ok(row)
}
