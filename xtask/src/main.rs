//! Developer commands for the soulbase-net workspace (`cargo xtask <command>`).
//!
//! Why an xtask: the checks CI runs are plain Rust, run the same way on a laptop and on a
//! fresh CI machine that has only the Rust toolchain (rust-analyzer's pattern).

mod bench;
mod chaos;
mod ci;
mod contract;
mod demo;
mod fleet;
mod guides;
mod interop;
mod outbox;
mod outbox_kit;
mod table;
mod tidy;

/// The in-process runs that load the machine (chaos, demo, bench) take turns in `cargo test`:
/// run side by side on two cores, each would measure the others' load as its own lateness.
#[cfg(test)]
pub(crate) static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  demo    the main job on loopback in seconds: retries, the breaker opening and recovering,
          a rate limit, SSRF refused, a timeout, a cached GET, a fleet quota, an outbox
          delivering on its third try; exits non-zero if any phase misbehaves
  bench   [--scenario NAME[,NAME]] [--clients hyper,reqwest,soulbase_min,soulbase_full]
          [--secs S] [--rounds R] [--concurrency C] [--json PATH]
          hyper vs reqwest vs soulbase-net (minimal and full policy) over loopback, the
          server in a process of its own, ratios paired by round; scenarios h1-256, h1-16,
          h1-1, h2c-256, h2-tls-256, body-1m, hosts-10k, breaker, fleet (default: all);
          `cargo run --release -p xtask -- bench` for real numbers
  bench --instructions [--h2c] [--update-budget] [--requests N] [--clients ...]
          instructions per request of each client under callgrind (the server in its own
          process), checked against docs/bench-budget.json's section for the build
          profile running (fails more than 3 % above it)
  bench --outbox [--items N]
          the outbox on SQLite and PostgreSQL: enqueue/s (one caller, batched), deliveries/s,
          enqueue-to-delivered latency
  bench --delay [--pending N]
          the delay server in its own process on SQLite and PostgreSQL: schedules/s, fire
          lateness at 5000/s, RSS with N pending (default 1000000), restart to first delivery
  ci      repository rules, fmt check, clippy -D warnings, features alone, tests, docs (all
          and default features), guides,
          contracts, chaos, interop (what CI runs)
  features
          each library crate linted alone without default features, and with each of its
          features alone (clippy -D warnings): what a dependent that needs only that gets
  guides  each guide's snippets built as a crate of its own with only the dependencies the
          guide's manifest block lists (the crates in target/guides/)
  tidy    the repository rules alone (layering, module docs, one crypto provider, codes)
  contract [--json PATH]
          the contract matrix (seed 000 §10, seed 001 §XI) against the testkit on loopback
  chaos   [--secs S] [--seed N] [--json PATH]
          seeded random faults (DNS, resets, stalls, 5xx/429, bad certificates, proxies) for
          S seconds (default 10); fails if a call is lost, hangs past its deadline, or a
          non-idempotent request arrives twice, or a denied address is dialled; then an
          outbox worker process killed 3 times must lose nothing and apply each item once
  fleet-client --redis URL --url TARGET [--rps N] [--burst N] [--lease N] [--secs S]
               [--post-key K]
          one instance of a fleet sharing a quota (limits.global) on Redis; prints
          admitted=… refused=… errors=… store_calls=…; with --post-key K, one idempotent
          POST through the dedup window shared in Redis instead
  outbox --db PATH [--table NAME] list | requeue ID | purge
          an outbox's pending count and dead letters; put one back in the queue; forget them
  outbox-worker --db PATH [--secs S]
          delivers the outbox in PATH (SQLite) to loopback until nothing is pending (or S
          seconds): the process the outbox crash test kills and restarts
  policy  explain --policy FILE [--tenant T] [--key NAME] [--dns ADDR] URL | check FILE... | schema
          the effective policy of a request with the layer of each field, the guard's verdict
          on the addresses its host resolves to, whether its deadline closes; validation with
          every problem's path; the document's JSON Schema (`cargo xtask policy help`)
  interop [--json PATH]
          the client against real nginx, httpbin, tinyproxy, squid and dnsmasq, installed
          if missing, run in a network namespace with only loopback
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo::run(),
        Some("bench") => bench::run(&args[1..]),
        Some("bench-server") => bench::server_main(),
        Some("bench-client") => bench::instructions::client_main(&args[1..]),
        Some("ci") => ci::run(),
        Some("features") => ci::features(),
        Some("contract") => contract::run(&args[1..]),
        Some("chaos") => chaos::run(&args[1..]),
        Some("interop") => interop::run(&args[1..]),
        Some("fleet-client") => fleet::run(&args[1..]),
        Some("outbox-worker") => outbox::worker(&args[1..]),
        Some("outbox") => outbox::admin(&args[1..]),
        Some("policy") => policy(&args[1..]),
        Some("guides") => guides::run(),
        Some("tidy") => tidy::check(&project_root()).map_err(|problems| problems.join("\n")),
        Some("help" | "-h" | "--help") | None => {
            eprint!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask policy ARGS`: the `soulbase-net policy` command, from this repository;
/// `schema --write` writes the checked-in `docs/policy.schema.json`.
fn policy(args: &[String]) -> Result<(), String> {
    let mut all = vec!["policy".to_owned()];
    all.extend_from_slice(args);
    if args.len() == 2 && args[0] == "schema" && args[1] == "--write" {
        all.push(schema_path().display().to_string());
    }
    cli(&all)
}

/// Where the checked-in schema of policy documents lives.
fn schema_path() -> PathBuf {
    project_root().join("docs/policy.schema.json")
}

/// Runs the `soulbase-net` command-line tool with `args` and prints what it prints.
pub(crate) fn cli(args: &[String]) -> Result<(), String> {
    let out = soulbase_net_cli::run(args)?;
    #[allow(clippy::print_stdout, reason = "the command's output")]
    {
        print!("{out}");
    }
    Ok(())
}

/// The workspace root: the parent of this crate's manifest directory.
pub(crate) fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}
