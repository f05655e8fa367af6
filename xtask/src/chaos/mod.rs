//! `cargo xtask chaos [--secs S] [--seed N] [--json PATH]`: the chaos list of seed 000 §10
//! against the testkit, on loopback.
//!
//! Concurrent callers send a seeded mix of GET, HEAD, POST (plain and idempotent) and PUT to
//! targets that fail in every way the testkit can: resets, closes, hangs, slow starts, stalls,
//! cut and dripping bodies, 5xx and 429 bursts, poisoned / failing / slow / rebinding DNS
//! names and one that flips while the run goes on, broken certificates, a black hole, a closed
//! port, proxies that refuse, hang, answer 502 or demand credentials, and a `no_proxy` host.
//! Then it checks what must hold whatever the faults: no call lost (no answer and no error),
//! none past its deadline + 100 ms, no non-idempotent request arriving twice, one
//! `Idempotency-Key` across the copies of an idempotent one, no dial to a denied address, no
//! success where a protection must refuse, and no `no_proxy` call through the proxy.
//!
//! Then the outbox crash loop (`crash`): a worker process delivering a SQLite outbox is
//! killed with SIGKILL three times at seeded moments and started again until nothing is
//! pending; no item may be lost, applied twice at the receiver (which dedups by
//! `Idempotency-Key`) or dead-lettered, and the loop fails rather than hangs past 60 s. Any
//! breach fails the command.
//!
//! The same seed gives every caller the same sequence of targets, methods and deadlines and
//! every route the same sequence of faults; which call meets which fault still depends on
//! timing. Nothing leaves the machine: servers, DNS and proxies are on loopback, the client
//! asks only the mock DNS, and its dialer refuses (and records) every address that is not
//! loopback.
#![allow(clippy::print_stdout, reason = "a command-line report")]
#![allow(
    clippy::disallowed_types,
    reason = "std Instant only to time the whole run for the report"
)]

mod crash;
pub(crate) mod tally;
mod traffic;
mod world;

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use crate::table::{self, print_table};
pub(crate) use tally::Summary;
use tally::{Arrival, Seen};
use traffic::MARKER;
use world::{World, PATHS};

/// Default duration of the traffic.
const DEFAULT_SECS: f64 = 10.0;
/// Default seed: runs are reproducible unless asked otherwise.
const DEFAULT_SEED: u64 = 0x5EED_0010;
/// Concurrent callers.
const CALLERS: u64 = 16;

/// Options from the command line.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Options {
    pub(crate) secs: f64,
    pub(crate) seed: u64,
    pub(crate) json: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            secs: DEFAULT_SECS,
            seed: DEFAULT_SEED,
            json: None,
        }
    }
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("chaos: `{flag}` needs a value"))?;
        match flag.as_str() {
            "--secs" => o.secs = value.parse().map_err(|e| format!("chaos: --secs: {e}"))?,
            "--seed" => o.seed = value.parse().map_err(|e| format!("chaos: --seed: {e}"))?,
            "--json" => o.json = Some(value.clone()),
            other => return Err(format!("chaos: unknown option `{other}`")),
        }
    }
    if !(o.secs.is_finite() && o.secs > 0.0 && o.secs <= 3600.0) {
        return Err("chaos: --secs must be a number of seconds in (0, 3600]".to_owned());
    }
    Ok(o)
}

/// `cargo xtask chaos`: runs, prints the tables, writes JSON when asked; `Err` on a breach.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let opts = parse_args(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    println!(
        "soulbase-net chaos: {CALLERS} callers for {}s, seed {}, all on loopback\n",
        opts.secs, opts.seed
    );
    let started = std::time::Instant::now();
    let summary = rt.block_on(chaos(Duration::from_secs_f64(opts.secs), opts.seed))?;
    println!("{}", summary.breakdown());
    let plan = crash::Plan::new(opts.seed);
    println!(
        "outbox crash loop: {} items in a SQLite outbox, a worker process killed {} times …",
        plan.items, plan.kills
    );
    // A copy of the running program: `cargo test` may rebuild the file it was started from.
    let exe = std::env::current_exe().map_err(|e| format!("chaos: current exe: {e}"))?;
    let exe = crate::interop::stable_copy(&exe, &crate::interop::target_dir(&exe))?;
    let crashes = rt.block_on(crash::crash_loop(plan, &crash::xtask_worker(exe)))?;
    println!("{}\n", crashes.line());
    let mut rows = summary.rows();
    rows.extend(crashes.rows());
    print_table("invariant", &rows);
    let failed = table::failed(&rows);
    println!(
        "\n{} invariants, {failed} broken, in {:.1}s (seed {})",
        rows.len(),
        started.elapsed().as_secs_f64(),
        opts.seed
    );
    if let Some(path) = &opts.json {
        let mut json = table::rows_json(&rows);
        json["seed"] = opts.seed.into();
        json["secs"] = opts.secs.into();
        json["summary"] = summary.json();
        json["outbox_crash"] = crashes.json();
        table::write_json(path, &json)?;
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(format!(
            "chaos: {failed} invariant(s) broken (seed {})",
            opts.seed
        ))
    }
}

/// Sets up the world, runs the callers for `secs`, and counts what happened.
///
/// # Errors
/// Only when the world cannot be set up; a breach is a failed row of the summary.
pub(crate) async fn chaos(secs: Duration, seed: u64) -> Result<Summary, String> {
    let until = Instant::now() + secs;
    let world = World::start(seed, until).await?;
    let targets = Arc::new(world.targets.clone());
    // The runtime's own lateness, measured while the callers run.
    let canary = tally::Lateness::start();
    let mut callers = tokio::task::JoinSet::new();
    for index in 0..CALLERS {
        callers.spawn(traffic::caller(
            world.client.clone(),
            targets.clone(),
            seed,
            index,
            until,
        ));
    }
    let mut calls = Vec::new();
    while let Some(done) = callers.join_next().await {
        calls.extend(done.map_err(|e| format!("chaos: a caller failed: {e}"))?);
    }
    let seen = Seen {
        arrivals: arrivals(&world),
        denied_dials: world
            .dialer
            .off_loopback()
            .iter()
            .map(ToString::to_string)
            .collect(),
        proxy_leaks: world.bypassed_proxy().map_or(0, |proxy| {
            proxy
                .requests()
                .iter()
                .filter(|r| r.target.contains("bypass.chaos.test"))
                .count()
        }),
    };
    let lateness = canary.stop();
    Ok(tally::analyse(&targets, &calls, seen, &lateness))
}

/// Every marked request the servers received.
fn arrivals(world: &World) -> Vec<Arrival> {
    let mut out = Vec::new();
    for srv in &world.servers {
        for path in PATHS {
            for req in srv.requests(path) {
                if let Some(id) = req.header(MARKER) {
                    out.push(Arrival {
                        id: id.to_owned(),
                        key: req.header("idempotency-key").map(str::to_owned),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let args = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(parse_args(&[]).unwrap(), Options::default());
        let o = parse_args(&args("--secs 2.5 --seed 7 --json c.json")).unwrap();
        assert_eq!(
            (o.secs, o.seed, o.json.as_deref()),
            (2.5, 7, Some("c.json"))
        );
        for bad in ["--secs", "--secs 0", "--secs x", "--seed -1", "--fast 1"] {
            assert!(parse_args(&args(bad)).is_err(), "{bad}");
        }
    }

    /// A short run in-process: every invariant holds and every kind of fault was met.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_run_keeps_every_invariant() {
        let _turn = crate::HEAVY.lock().await;
        let summary = tokio::time::timeout(
            Duration::from_secs(60),
            chaos(Duration::from_secs(3), DEFAULT_SEED),
        )
        .await
        .expect("the run ends")
        .expect("the world starts");
        let rows = summary.rows();
        let broken: Vec<_> = rows.iter().filter(|r| !r.passed).collect();
        assert!(broken.is_empty(), "{broken:?}\n{}", summary.breakdown());
        let seen = |needle: &str| summary.failed.keys().any(|k| k.contains(needle));
        for kind in ["blocked", "tls_verify", "proxy", "dns", "timeout_"] {
            assert!(seen(kind), "no `{kind}` failure\n{}", summary.breakdown());
        }
        assert!(summary.non_idempotent_arrived > 0);
    }
}
