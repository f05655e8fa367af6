//! `cargo xtask bench --instructions [--h2c|--h3|--hosts N|--price-list] [--update-budget]
//! [--requests N] [--clients K[,K]]`:
//! the deterministic figure — instructions per request of each client alone, counted by
//! callgrind — checked against the budget in `docs/bench-budget.json`.
//!
//! Over HTTP/1.1 by default; `--h2c` counts the same requests over HTTP/2 with prior
//! knowledge (hyper-util's pooled client with `http2_only` as the limit, hyper's bare
//! `client::conn::http2` on one connection beside it as `hyper_conn`), against the budget's
//! `<profile>-h2c` section. `--h3` counts HTTP/3 against the server's QUIC listener — the raw
//! `h3` + `h3-quinn` client as the limit, soulbase-net over HTTP/3, and soulbase-net over
//! HTTP/2 with TLS to the same server beside them — against the `<profile>-h3` section. CI
//! checks the HTTP/1.1 figures.
//!
//! The bench server runs as its own process, not under valgrind. Each client runs as
//! `valgrind --tool=callgrind <copy of this program> bench-client …`: a current-thread Tokio
//! runtime (every task, connection driver and timer of the client is polled on the one
//! thread), [`CALLERS`] concurrent callers, first [`WARMUP`] requests to open the
//! connections and fill the caches, then `N` requests ([`REQUESTS`] by default) inside
//! [`callgrind_measured_section`]. Callgrind starts with collection off and toggles it on
//! entry to and exit from that function (`--collect-atstart=no --toggle-collect=…`), so the
//! count is of the measured requests only: no start-up, no client build, no warm-up. The
//! server's request counter must have grown by exactly warm-up + N.
//!
//! `--hosts N` counts HTTP/1.1 with each request to the next of `N` names `h<i>.bench.test`
//! (all resolving to loopback), the counted ones to names the warm-up never used: every
//! counted request takes the per-host path — a name resolved, a connection opened (the
//! server must count one per request) and added to the pool, the guard's check — against the
//! `<profile>-hosts` section (`--hosts 10000`; hyper-util, reqwest and soulbase-net minimal
//! and full).
//!
//! `--price-list` counts the minimal client and, one at a time, each feature added to it
//! (see [`price`]), and checks each feature's price against the `<profile>-price` section.
//!
//! A client more than 3 % above its budget (the section of the build profile running, see
//! [`budget`]) fails the command; `--update-budget` writes the measured figures as that
//! section instead. Valgrind must be installed (`cargo xtask ci` installs it).
#![allow(
    clippy::print_stdout,
    reason = "a command a person runs: the table goes to stdout"
)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
};

use super::{
    budget,
    clients::{
        price::{self, PRICE_REQUESTS},
        BenchClient, Kind, Targets, CLIENTS, H3_CLIENTS, HOOKS_PER_REQUEST, INSTRUCTION_CLIENTS,
        NOOP_INTERCEPTORS,
    },
    scenario::{Proto, Scenario},
    server::{Listener, ServerProcess},
};

/// Concurrent callers in the counted runs.
const CALLERS: usize = 4;
/// Requests before counting starts.
const WARMUP: usize = 200;
/// Requests counted, by default.
const REQUESTS: usize = 2000;
/// The function whose frames callgrind counts (see the module docs).
const MEASURED: &str = "*callgrind_measured_section*";
/// The environment variable that hands the server's root certificate (PEM) to a counted
/// client over TLS (`--h3`).
const ROOT_PEM_ENV: &str = "XTASK_BENCH_ROOT_PEM";

/// Options of `bench --instructions`.
#[derive(Clone, Debug, PartialEq)]
struct Options {
    update: bool,
    proto: Proto,
    requests: usize,
    clients: Vec<Kind>,
    budget: PathBuf,
    /// `--hosts N`: each request to the next of `N` host names (HTTP/1.1).
    hosts: Option<usize>,
    /// `--price-list`: the minimal client and each feature's variant (see [`price`]).
    price: bool,
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        update: false,
        proto: Proto::H1,
        requests: REQUESTS,
        clients: INSTRUCTION_CLIENTS.to_vec(),
        budget: crate::project_root().join(budget::BUDGET_FILE),
        hosts: None,
        price: false,
    };
    let (mut requests, mut clients) = (None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--instructions" => {}
            "--update-budget" => o.update = true,
            "--h2c" => o.proto = Proto::H2c,
            "--h3" => {
                o.proto = Proto::Quic;
                o.clients = H3_CLIENTS.to_vec();
            }
            "--requests" => requests = Some(super::parsed(flag, it.next())?),
            "--clients" => {
                clients = Some(super::parse_clients(&super::parsed::<String>(
                    flag,
                    it.next(),
                )?)?)
            }
            "--hosts" => o.hosts = Some(super::parsed(flag, it.next())?),
            "--price-list" => o.price = true,
            "--budget" => o.budget = super::parsed(flag, it.next())?,
            other => return Err(format!("bench --instructions: unknown option `{other}`")),
        }
    }
    if (o.price || o.hosts.is_some()) && o.proto != Proto::H1 {
        return Err(
            "bench --instructions: --price-list and --hosts count HTTP/1.1 only".to_owned(),
        );
    }
    if o.price && o.hosts.is_some() {
        return Err("bench --instructions: --price-list or --hosts, not both".to_owned());
    }
    if o.hosts.is_some_and(|n| n < 2) {
        return Err("bench --instructions: --hosts needs at least 2 names".to_owned());
    }
    o.requests = requests.unwrap_or(if o.price { PRICE_REQUESTS } else { REQUESTS });
    o.clients = clients.unwrap_or_else(|| default_clients(&o));
    if o.requests == 0 || !o.requests.is_multiple_of(CALLERS) {
        return Err(format!(
            "bench --instructions: --requests must be a positive multiple of {CALLERS}"
        ));
    }
    Ok(o)
}

/// The clients counted unless `--clients` says otherwise: the price list's; the rounds' four
/// for many hosts; over h2c, those of HTTP/1.1 and hyper's bare connection beside the pooled
/// client; over HTTP/3, its own.
fn default_clients(o: &Options) -> Vec<Kind> {
    if o.price {
        price::clients()
    } else if o.hosts.is_some() {
        CLIENTS.to_vec()
    } else {
        match o.proto {
            Proto::H2c => INSTRUCTION_CLIENTS
                .into_iter()
                .chain([Kind::HyperConn])
                .collect(),
            Proto::Quic => H3_CLIENTS.to_vec(),
            _ => INSTRUCTION_CLIENTS.to_vec(),
        }
    }
}

/// The scenario of the counted runs: a 2-byte body, [`CALLERS`] callers, over `proto`
/// (HTTP/1.1 or h2c).
fn scenario(proto: Proto) -> Scenario {
    let (name, title) = match proto {
        Proto::H2c => ("h2c-4", "h2c, 4 callers on one connection"),
        Proto::Quic => (
            "h3-4",
            "HTTP/3 and HTTP/2 over TLS, 4 callers on one connection",
        ),
        _ => ("h1-4", "HTTP/1.1, 4 callers"),
    };
    Scenario {
        name,
        title,
        proto,
        callers: CALLERS,
        path: "/",
        hosts: 1,
    }
}

/// `cargo xtask bench --instructions`.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let opts = parse_args(args)?;
    let version = Command::new("valgrind").arg("--version").output();
    if !version.is_ok_and(|o| o.status.success()) {
        return Err("bench --instructions: valgrind is not installed \
                    (`apt-get install valgrind`; `cargo xtask ci` installs it)"
            .to_owned());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("could not start a tokio runtime: {e}"))?;
    let copy = ProgramCopy::new()?;
    if opts.hosts.is_some() {
        // Inherited by the server and by valgrind's clients: each client keeps a connection
        // per host open.
        raise_open_files();
    }
    let mut server = rt.block_on(ServerProcess::start(&copy.0))?;
    let (listener, protocol, section) = match opts.proto {
        Proto::H2c => (Listener::H2c, "h2c", format!("{}-h2c", super::profile())),
        Proto::Quic => (Listener::Quic, "h3", format!("{}-h3", super::profile())),
        _ => (Listener::H1, "h1", super::profile().to_owned()),
    };
    let (scheme, root) = match opts.proto {
        Proto::Quic => ("https", Some(server.root_pem().to_owned())),
        _ => ("http", None),
    };
    let url = format!("{scheme}://127.0.0.1:{}/", server.port(listener));
    let section = match (opts.price, opts.hosts) {
        (true, _) => format!("{}-price", super::profile()),
        (_, Some(_)) => format!("{}-hosts", super::profile()),
        _ => section,
    };
    let profile = section.as_str();
    let what = format!(
        "client-only instructions per request (valgrind --tool=callgrind), GET of a 2-byte \
         body over loopback, {CALLERS} callers, {} requests counted after {WARMUP}, the server \
         in its own process; sections `release` and `debug` over HTTP/1.1, `release-h2c` and \
         `debug-h2c` over one h2c connection (`--h2c`), `release-h3` and `debug-h3` over HTTP/3 \
         and HTTP/2 with TLS (`--h3`), `release-hosts` and `debug-hosts` over HTTP/1.1 with \
         each counted request to a host name of its own (`--hosts 10000`), `release-price` and \
         `debug-price` the price of each feature over the minimal client (`--price-list`, 1000 \
         requests counted)",
        opts.requests
    );
    println!("{what}; {profile} ({protocol})");
    let old = budget::read(&opts.budget)?;
    let mut measured = Vec::new();
    for &kind in &opts.clients {
        let stats = rt.block_on(server.stats())?;
        let (before, conns) = (stats.requests, stats.conns(listener));
        let total = count(
            &copy.0,
            kind,
            &url,
            protocol,
            opts.requests,
            root.as_deref(),
            opts.hosts,
        )?;
        let stats = rt.block_on(server.stats())?;
        let served = stats.requests - before;
        let expected = (WARMUP + opts.requests) as u64;
        if served != expected {
            return Err(format!(
                "bench --instructions: {} sent {served} requests, not {expected}",
                kind.key()
            ));
        }
        // With a name per request, a connection per request: the per-host path, every time.
        let opened = stats.conns(listener) - conns;
        if opts.hosts.is_some_and(|n| n as u64 >= expected) && opened != expected {
            return Err(format!(
                "bench --instructions: {} opened {opened} connections for {expected} hosts",
                kind.key()
            ));
        }
        measured.push((kind, total as f64 / opts.requests as f64));
    }
    drop(server);
    if opts.price {
        return price::finish(&measured, &old, profile, opts.update, &opts.budget, &what);
    }
    let verdicts = budget::judge(&measured, &old, profile);
    budget::print_table(&verdicts, opts.update);
    if let Some(hook) = hook_cost(&measured) {
        println!(
            "a no-op interceptor hook: {hook:.0} instructions ({NOOP_INTERCEPTORS} interceptors \
             × {HOOKS_PER_REQUEST} hooks per request over the minimal client)"
        );
    }
    let over: Vec<&str> = verdicts
        .iter()
        .filter(|v| !v.ok)
        .map(|v| v.kind.key())
        .collect();
    let outcome = budget::Outcome {
        path: &opts.budget,
        section: profile,
        command: "bench --instructions",
        row: "client",
        written: "budget",
        within: format!("{:.0} %", budget::TOLERANCE * 100.0),
        allowed: format!("+{:.0} %", budget::TOLERANCE * 100.0),
    };
    let update = opts
        .update
        .then(|| budget::updated(&old, profile, &measured, &what));
    budget::conclude(&outcome, &over, update)
}

/// What one no-op hook costs: the minimal client with no-op interceptors against the
/// minimal client, per hook called; when both were counted.
fn hook_cost(measured: &[(Kind, f64)]) -> Option<f64> {
    let of = |kind| measured.iter().find(|(k, _)| *k == kind).map(|(_, m)| *m);
    let (hooks, min) = (of(Kind::SoulbaseHooks)?, of(Kind::SoulbaseMin)?);
    Some((hooks - min) / (NOOP_INTERCEPTORS * HOOKS_PER_REQUEST) as f64)
}

/// A private copy of this program for valgrind to run: valgrind needs a path, and a build
/// may replace `target/release/xtask` meanwhile. Removed when dropped.
#[derive(Debug)]
struct ProgramCopy(PathBuf);

impl ProgramCopy {
    fn new() -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
        let dir = crate::interop::target_dir(&exe).join("bench");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let copy = dir.join(format!("xtask-callgrind-{}", std::process::id()));
        std::fs::copy(super::this_program()?, &copy)
            .map_err(|e| format!("copying this program to {}: {e}", copy.display()))?;
        Ok(Self(copy))
    }
}

impl Drop for ProgramCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `kind` under callgrind for `requests` counted requests, trusting `root` (PEM) over
/// TLS; the instructions counted.
fn count(
    exe: &Path,
    kind: Kind,
    url: &str,
    protocol: &str,
    requests: usize,
    root: Option<&str>,
    hosts: Option<usize>,
) -> Result<u64, String> {
    let out = std::env::temp_dir().join(format!(
        "soulbase-callgrind-{}-{}.out",
        std::process::id(),
        kind.key()
    ));
    let run = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .args([
            "--collect-atstart=no",
            &format!("--toggle-collect={MEASURED}"),
        ])
        .arg(exe)
        .args(["bench-client", "--client", kind.key(), "--url", url])
        .args(["--proto", protocol])
        .args(["--requests", &requests.to_string()])
        .args(
            hosts
                .map(|n| ["--hosts".to_owned(), n.to_string()])
                .into_iter()
                .flatten(),
        )
        .envs(root.map(|pem| (ROOT_PEM_ENV, pem)))
        .output()
        .map_err(|e| format!("bench --instructions: running valgrind: {e}"))?;
    let text = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    if !run.status.success() {
        return Err(format!(
            "bench --instructions: {} under callgrind failed ({}):\n{}",
            kind.key(),
            run.status,
            String::from_utf8_lossy(&run.stderr)
        ));
    }
    let text = text.map_err(|e| format!("bench --instructions: callgrind's output: {e}"))?;
    let total =
        callgrind_total(&text).ok_or("bench --instructions: no total in callgrind's output")?;
    // Thousands of instructions per request at the very least: fewer means the toggle
    // never matched and the count is of nothing.
    if total < requests as u64 * 1000 {
        return Err(format!(
            "bench --instructions: callgrind counted {total} instructions for {requests} \
             requests of {}: did `{MEASURED}` match nothing?",
            kind.key()
        ));
    }
    Ok(total)
}

/// The instructions of a callgrind output file: its `totals:` (or `summary:`) line.
fn callgrind_total(text: &str) -> Option<u64> {
    let line = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
    };
    line("totals:").or_else(|| line("summary:"))
}

/// `xtask bench-client --client K --url URL [--proto h1|h2c|h3] [--requests N] [--hosts N]`: the process
/// callgrind runs.
pub(crate) fn client_main(args: &[String]) -> Result<(), String> {
    let (mut kind, mut url, mut requests, mut proto) = (None, None, REQUESTS, Proto::H1);
    let mut hosts = 1usize;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--client" => kind = Kind::parse(&super::parsed::<String>(flag, it.next())?),
            "--url" => url = Some(super::parsed::<String>(flag, it.next())?),
            "--requests" => requests = super::parsed(flag, it.next())?,
            "--hosts" => hosts = super::parsed::<usize>(flag, it.next())?.max(1),
            "--proto" => {
                proto = match super::parsed::<String>(flag, it.next())?.as_str() {
                    "h1" => Proto::H1,
                    "h2c" => Proto::H2c,
                    "h3" => Proto::Quic,
                    other => return Err(format!("bench-client: --proto h1|h2c|h3, not `{other}`")),
                }
            }
            other => return Err(format!("bench-client: unknown option `{other}`")),
        }
    }
    let kind = kind.ok_or("bench-client: --client hyper|reqwest|soulbase_min|soulbase_full")?;
    let url = url.ok_or("bench-client: --url needed")?;
    if let Kind::Price(feature) = kind {
        feature.prepare_process()?;
    }
    if hosts > 1 {
        raise_open_files();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("could not start a tokio runtime: {e}"))?;
    // `--hosts N` (for profiling the many-hosts scenario): the same server under N names,
    // `h<i>.bench.test`, taken in turn.
    let urls = if hosts == 1 {
        vec![url]
    } else {
        (0..hosts)
            .map(|i| url.replacen("127.0.0.1", &format!("h{i}.bench.test"), 1))
            .collect()
    };
    // Over TLS (`--proto h3`), the server's root certificate from the bench.
    let root = std::env::var(ROOT_PEM_ENV).ok();
    let targets = Targets::new(urls, root.as_deref())?;
    let client = Arc::new(rt.block_on(BenchClient::build(kind, &scenario(proto), targets))?);
    rt.block_on(drive(client.clone(), 0, WARMUP))?;
    // The section gets a clone: the client (its pools, caches and policy; with `--hosts`,
    // thousands of connections and names) is dropped after it, so its teardown is not
    // counted as the requests' work.
    let counted = callgrind_measured_section(&rt, client.clone(), requests);
    drop(client);
    counted
}

/// The soft limit of open files raised to the hard one (the many-hosts runs keep a
/// connection per host open); left as it is when that fails.
fn raise_open_files() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// The requests callgrind counts: the only frames collected (see the module docs). Not
/// inlined, not generic, no closure inside, so that its name matches exactly one function.
#[inline(never)]
fn callgrind_measured_section(
    rt: &tokio::runtime::Runtime,
    client: Arc<BenchClient>,
    requests: usize,
) -> Result<(), String> {
    rt.block_on(drive(client, WARMUP, requests))
}

/// `requests` GETs from [`CALLERS`] concurrent callers, each its share, to the targets from
/// the `first` on (so that with `--hosts` the counted requests go to names the warm-up
/// never used).
async fn drive(client: Arc<BenchClient>, first: usize, requests: usize) -> Result<(), String> {
    let mut set = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let client = client.clone();
        set.spawn(async move {
            // The targets in turn (there is one unless `--hosts` says otherwise).
            for n in 0..requests / CALLERS {
                client.get(first + n * CALLERS + caller).await?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = set.join_next().await {
        done.map_err(|e| format!("bench-client: a caller failed: {e}"))??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_read_from_callgrind_output() {
        let out = "version: 1\ncmd: xtask\nevents: Ir\nfn=(1) main\n5 10\nsummary: 123456\ntotals: 123456\n";
        assert_eq!(callgrind_total(out), Some(123_456));
        assert_eq!(callgrind_total("summary: 77\n"), Some(77));
        assert_eq!(callgrind_total("events: Ir\n"), None);
    }

    #[test]
    fn a_hook_costs_the_difference_per_hook_called() {
        let measured = [(Kind::SoulbaseMin, 1000.0), (Kind::SoulbaseHooks, 3000.0)];
        let per_hook = hook_cost(&measured).unwrap();
        assert!((per_hook - 2000.0 / (NOOP_INTERCEPTORS * HOOKS_PER_REQUEST) as f64).abs() < 1e-9);
        assert_eq!(hook_cost(&measured[..1]), None);
    }

    #[test]
    fn options() {
        let args = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        let o = parse_args(&args("--instructions --update-budget --requests 400")).unwrap();
        assert!(o.update);
        assert_eq!((o.requests, o.clients.len()), (400, 5));
        assert_eq!(o.clients.last(), Some(&Kind::SoulbaseHooks));
        assert!(parse_args(&args("--instructions --requests 3")).is_err());
        assert!(parse_args(&args("--instructions --secs 2")).is_err());
        assert_eq!(
            parse_args(&args("--instructions")).unwrap().proto,
            Proto::H1
        );
        assert_eq!(
            parse_args(&args("--instructions --h2c")).unwrap().proto,
            Proto::H2c
        );
        let h3 = parse_args(&args("--instructions --h3")).unwrap();
        assert_eq!(h3.proto, Proto::Quic);
        assert_eq!(h3.clients, H3_CLIENTS);
    }

    #[test]
    fn options_for_many_hosts_and_the_price_list() {
        let args = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        let h2c = parse_args(&args("--instructions --h2c")).unwrap();
        assert_eq!(h2c.clients.last(), Some(&Kind::HyperConn));
        assert!(!parse_args(&args("--instructions"))
            .unwrap()
            .clients
            .contains(&Kind::HyperConn));
        let hosts = parse_args(&args("--instructions --hosts 10000")).unwrap();
        assert_eq!((hosts.hosts, hosts.requests), (Some(10_000), REQUESTS));
        assert_eq!(hosts.clients, CLIENTS);
        assert!(parse_args(&args("--instructions --hosts")).is_err());
        assert!(parse_args(&args("--instructions --hosts 1")).is_err());
        assert!(parse_args(&args("--instructions --hosts 10 --h2c")).is_err());
        let price = parse_args(&args("--instructions --price-list")).unwrap();
        assert!(price.price);
        assert_eq!(price.requests, PRICE_REQUESTS);
        assert_eq!(price.clients, price::clients());
        assert_eq!(price.clients[0], Kind::SoulbaseMin);
        let fewer = parse_args(&args("--instructions --price-list --requests 400")).unwrap();
        assert_eq!(fewer.requests, 400);
        assert!(parse_args(&args("--instructions --price-list --h2c")).is_err());
        assert!(parse_args(&args("--instructions --price-list --hosts 10")).is_err());
        let some = parse_args(&args("--instructions --h2c --clients hyper,hyper_conn")).unwrap();
        assert_eq!(some.clients, [Kind::Hyper, Kind::HyperConn]);
    }
}
