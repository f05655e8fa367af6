//! `cargo xtask bench [--scenario NAME[,NAME]] [--clients K[,K]] [--secs S] [--rounds R]
//! [--concurrency C] [--json PATH]`: soulbase-net against the clients people would use
//! instead, over loopback, with the server in a process of its own.
//!
//! The server ([`server`], `xtask bench-server`) is a minimal hyper server in a child
//! process, so this process runs the clients alone and its CPU time (`getrusage`) is theirs.
//! Four clients ([`clients`]): the limit (hyper-util's pooled legacy client, over HTTP/1.1,
//! h2c and HTTP/2 with TLS), `reqwest`, and soulbase-net with a minimal and with the full
//! policy. Each load scenario ([`scenario`]) runs `R` rounds (5
//! by default); in each round every client runs once for `S` seconds (2 by default) on a
//! freshly built client, the order rotated from round to round. Per client: req/s, p50/p95/p99,
//! CPU µs per request and connections opened, as medians over the rounds (req/s and CPU with
//! their interquartile range); against the limit, ratios **paired by round** (each round's
//! client / limit, then the median and interquartile range of those), so a round in which
//! the shared machine was slow for both cancels out. Then the failing upstream (breaker and
//! retry budget) and, with `redis-server` installed, the fleet row.
//!
//! `cargo xtask bench --h3` runs one scenario instead: soulbase-net over HTTP/3 and over
//! HTTP/2 with TLS (the full policy, metrics and TraceUa on both) against the same server (a
//! testkit FaultServer on QUIC and TLS in the server process), 64 callers, with a raw `h3` +
//! `h3-quinn` client ([`h3raw`]) as the limit; below the table, HTTP/3 against HTTP/2 + TLS,
//! paired by round.
//!
//! `cargo xtask bench --instructions` counts instructions per request instead, under
//! callgrind, and checks them against `docs/bench-budget.json` (see [`instructions`]).
//! `cargo xtask bench --outbox` measures the outbox (see [`outbox`]).
//!
//! Wall-clock figures are only representative in release: `cargo run --release -p xtask --
//! bench` (`cargo xtask bench` runs in whatever profile xtask was built, and says which).
#![allow(
    clippy::print_stdout,
    reason = "a command a person runs: the table goes to stdout"
)]

mod budget;
mod clients;
mod delay;
mod failing;
mod h3raw;
pub(crate) mod instructions;
mod legacy_tls;
mod measure;
mod outbox;
mod report;
mod scenario;
pub(crate) mod server;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use self::{
    clients::{BenchClient, Kind, CLIENTS, H3_CLIENTS},
    measure::{load, Run, Summary},
    report::{Report, ScenarioResult},
    scenario::{Scenario, EXTRAS},
    server::ServerProcess,
};

/// Options from the command line.
#[derive(Clone, Debug, PartialEq)]
struct Options {
    json: Option<PathBuf>,
    secs: f64,
    /// Callers for every load scenario instead of its own.
    concurrency: Option<usize>,
    rounds: usize,
    clients: Vec<Kind>,
    /// Load scenarios and extras (`breaker`, `fleet`) to run, in their order.
    scenarios: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            json: None,
            secs: 2.0,
            concurrency: None,
            rounds: 5,
            clients: CLIENTS.to_vec(),
            scenarios: all_scenario_names(),
        }
    }
}

fn all_scenario_names() -> Vec<String> {
    let load = scenario::all().into_iter().map(|s| s.name);
    load.chain(EXTRAS).map(str::to_owned).collect()
}

/// The value after `flag`, parsed.
fn parsed<T: std::str::FromStr>(flag: &str, value: Option<&String>) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    value
        .ok_or_else(|| format!("bench: `{flag}` needs a value"))?
        .parse()
        .map_err(|e| format!("bench: {flag}: {e}"))
}

/// The count a store bench takes as its one option, `flag N` (`bench --outbox --items N`,
/// `bench --delay --pending N`), or `default` without it. One parser for both, so they
/// refuse mistakes alike; `bench` names the command in the errors.
fn count_option(args: &[String], bench: &str, flag: &str, default: usize) -> Result<usize, String> {
    let mut count = default;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg != flag {
            return Err(format!("{bench}: unknown option `{arg}`"));
        }
        count = it
            .next()
            .ok_or_else(|| format!("{bench}: {flag} needs a value"))?
            .parse()
            .map_err(|e| format!("{bench}: {flag}: {e}"))?;
    }
    Ok(count)
}

/// The runtime the store benches (outbox, delay) drive their clients on: the same two
/// workers for both, so that their figures are taken alike.
fn store_bench_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--json" => o.json = Some(parsed(flag, it.next())?),
            "--h3" => {
                o.scenarios = vec![scenario::H3.to_owned()];
                o.clients = H3_CLIENTS.to_vec();
            }
            "--secs" => o.secs = parsed(flag, it.next())?,
            "--concurrency" => o.concurrency = Some(parsed(flag, it.next())?),
            "--rounds" => o.rounds = parsed(flag, it.next())?,
            "--clients" => o.clients = parse_clients(&parsed::<String>(flag, it.next())?)?,
            "--scenario" => {
                let known = all_scenario_names();
                let names: String = parsed(flag, it.next())?;
                for name in names.split(',') {
                    if !known.iter().any(|k| k == name) {
                        return Err(format!(
                            "bench: --scenario: unknown scenario `{name}` (known: {})",
                            known.join(", ")
                        ));
                    }
                }
                // In their own order, whatever the order asked.
                o.scenarios = known
                    .into_iter()
                    .filter(|k| names.split(',').any(|n| n == k))
                    .collect();
            }
            other => return Err(format!("bench: unknown option `{other}`")),
        }
    }
    if !(o.secs.is_finite() && o.secs > 0.0) {
        return Err("bench: --secs must be a positive number".to_owned());
    }
    if o.concurrency == Some(0) {
        return Err("bench: --concurrency must be at least 1".to_owned());
    }
    if o.rounds < 3 {
        return Err("bench: --rounds must be at least 3 (figures are medians)".to_owned());
    }
    Ok(o)
}

/// `K[,K]` as clients.
fn parse_clients(list: &str) -> Result<Vec<Kind>, String> {
    list.split(',')
        .map(|key| Kind::parse(key).ok_or_else(|| format!("bench: unknown client `{key}`")))
        .collect()
}

/// `cargo xtask bench`: runs the scenarios, prints the tables, writes JSON (and a chart).
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("--outbox") => return outbox::run(&args[1..]),
        Some("--delay") => return delay::run(&args[1..]),
        _ if args.iter().any(|a| a == "--instructions") => return instructions::run(args),
        _ => {}
    }
    let opts = parse_args(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("could not start a tokio runtime: {e}"))?;
    let report = rt.block_on(bench(&opts))?;
    println!("{}", report.tables());
    if let Some(path) = &opts.json {
        let text = serde_json::to_string_pretty(&report.json())
            .map_err(|e| format!("bench: could not encode the JSON: {e}"))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("bench: could not write {}: {e}", path.display()))?;
        let chart = path.with_extension("svg");
        std::fs::write(&chart, report.svg())
            .map_err(|e| format!("bench: could not write {}: {e}", chart.display()))?;
        println!("wrote {} and {}", path.display(), chart.display());
    }
    Ok(())
}

fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// This very program: `/proc/self/exe` where there is one (it names the running file even
/// when a build has replaced the path since), else the path it was started from.
pub(crate) fn this_program() -> Result<PathBuf, String> {
    let proc = Path::new("/proc/self/exe");
    if proc.exists() {
        return Ok(proc.to_path_buf());
    }
    std::env::current_exe().map_err(|e| format!("bench: current exe: {e}"))
}

async fn bench(opts: &Options) -> Result<Report, String> {
    let mut server = ServerProcess::start(&this_program()?).await?;
    println!(
        "bench ({} build): {} rounds, {} s per client per round, server in process {}",
        profile(),
        opts.rounds,
        opts.secs,
        server.pid().unwrap_or(0),
    );
    if cfg!(debug_assertions) {
        println!(
            "  (debug build: `cargo run --release -p xtask -- bench` for representative numbers)"
        );
    }
    let wanted = |name: &str| opts.scenarios.iter().any(|s| s == name);
    let mut report = Report::new(opts.secs, opts.rounds, profile());
    let load = scenario::all().into_iter().chain([scenario::h3()]);
    for mut scenario in load.filter(|s| wanted(s.name)) {
        if let Some(c) = opts.concurrency {
            scenario.callers = c;
        }
        report
            .scenarios
            .push(race(&scenario, opts, &mut server).await?);
    }
    if wanted("breaker") {
        println!("  breaker and retry budget: a failing upstream");
        report.breaker = Some(failing::breaker(&mut server).await?);
        report.budget = Some(failing::budget(&mut server).await?);
    }
    if wanted("fleet") {
        let first = scenario::all().into_iter().next();
        let mut s = first.ok_or("bench: no scenario")?;
        if let Some(c) = opts.concurrency {
            s.callers = c;
        }
        report.fleet = failing::fleet(&mut server, &s, opts.rounds, opts.secs).await?;
    }
    Ok(report)
}

/// One load scenario: the clients take turns for the rounds, the first of each round
/// rotating.
async fn race(
    scenario: &Scenario,
    opts: &Options,
    server: &mut ServerProcess,
) -> Result<ScenarioResult, String> {
    let clients: Vec<Kind> = opts
        .clients
        .iter()
        .copied()
        .filter(|k| scenario.runs(*k))
        .collect();
    println!(
        "  {}: {} ({} callers)",
        scenario.name, scenario.title, scenario.callers
    );
    let targets = scenario.targets(server)?;
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); clients.len()];
    for round in 0..opts.rounds {
        for turn in 0..clients.len() {
            let i = (round + turn) % clients.len();
            let kind = clients[i];
            let before = server.stats().await?;
            let client = BenchClient::build(kind, scenario, targets.clone()).await?;
            let at = (&mut *server, scenario.listener(), before);
            let run = load(client, scenario.callers, opts.secs, at).await?;
            println!(
                "    round {}/{} {:<21} {:>9.0} req/s  p99 {:>7.2} ms  cpu {:>6.1} µs/req  conns {:>5}  errors {}",
                round + 1,
                opts.rounds,
                kind.label(),
                run.rps,
                run.p99_ms,
                run.cpu_us,
                run.conns,
                run.errors,
            );
            runs[i].push(run);
            // Closed connections drain before the next client starts.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let limit = clients.iter().position(|k| k.is_limit());
    let summaries = clients
        .iter()
        .zip(&runs)
        .map(|(kind, r)| Summary::of(*kind, r, limit.map(|l| runs[l].as_slice())))
        .collect();
    Ok(ScenarioResult {
        scenario: scenario.clone(),
        clients: summaries,
        beside: measure::beside(&clients, &runs),
    })
}

/// `xtask bench-server`: the server process of the bench.
pub(crate) fn server_main() -> Result<(), String> {
    server::serve()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_with_defaults_and_reject_nonsense() {
        let args = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(parse_args(&[]).unwrap(), Options::default());
        let o = parse_args(&args("--json out.json --secs 0.5 --concurrency 8")).unwrap();
        assert_eq!(o.json, Some(PathBuf::from("out.json")));
        assert_eq!((o.secs, o.concurrency, o.rounds), (0.5, Some(8), 5));
        assert!(parse_args(&args("--secs")).is_err());
        assert!(parse_args(&args("--secs 0")).is_err());
        assert!(parse_args(&args("--concurrency 0")).is_err());
        assert!(parse_args(&args("--rounds 2")).is_err());
        assert!(parse_args(&args("--fast")).is_err());
        let o = parse_args(&args("--clients hyper,soulbase_full")).unwrap();
        assert_eq!(o.clients, vec![Kind::Hyper, Kind::SoulbaseFull]);
        assert!(parse_args(&args("--clients hyper,curl")).is_err());
        let o = parse_args(&args("--scenario fleet,h2c-256,h1-1")).unwrap();
        assert_eq!(o.scenarios, ["h1-1", "h2c-256", "fleet"]);
        assert!(parse_args(&args("--scenario h3")).is_err());
        let o = parse_args(&args("--h3")).unwrap();
        assert_eq!(o.scenarios, ["h3-64"]);
        assert_eq!(o.clients, H3_CLIENTS);
        assert_eq!(Options::default().scenarios.len(), 9);
    }
}
