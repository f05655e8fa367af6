//! `cargo xtask bench [--json PATH] [--secs S] [--concurrency C] [--rounds R]`: soulbase-net
//! against the clients people would use instead, in one process, over loopback.
//!
//! One minimal hyper HTTP/1.1 server (keep-alive, a tiny `200 ok` body, counting the
//! connections it accepts) and four clients taking turns — A B C D, A B C D, … for `R ≥ 3`
//! rounds (9 by default), each run `S` seconds with `C` concurrent callers (256 by default), each run on a
//! freshly built client: the raw hyper-util legacy client (the limit), `reqwest` (what users
//! would pick instead), soulbase-net with a minimal policy (retries and breaker off, the guard
//! on with the loopback grant) and with the full policy (retries with a budget, the breaker, a
//! generous limiter, the guard). Each figure is the median over the rounds; req/s also shows
//! the spread. Then the breaker scenario: a failing upstream, and how many attempts reach it
//! with the breaker off and on.
//!
//! `cargo xtask bench --outbox` measures the outbox instead (see [`outbox`]).
//!
//! Numbers are only representative in release: `cargo run --release -p xtask -- bench`
//! (`cargo xtask bench` runs in whatever profile xtask was built, and says which).
#![allow(
    clippy::print_stdout,
    reason = "a command a person runs: the table goes to stdout"
)]

use std::{
    convert::Infallible,
    fmt::Write as _,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

mod outbox;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client as HyperClient},
    rt::{TokioExecutor, TokioIo},
};
use serde_json::{json, Value};
use soulbase_net_core::{ErrorKind, NetClient, NetRequest};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use tokio::{net::TcpListener, task::JoinHandle, time::Instant};

/// The clients, in the order they take turns.
const CLIENTS: [Kind; 4] = [
    Kind::Hyper,
    Kind::Reqwest,
    Kind::SoulbaseMin,
    Kind::SoulbaseFull,
];

/// Requests the breaker scenario sends to the failing upstream, per setting.
const BREAKER_REQUESTS: u64 = 500;

/// Options from the command line.
#[derive(Clone, Debug, PartialEq)]
struct Options {
    json: Option<PathBuf>,
    secs: f64,
    concurrency: usize,
    rounds: usize,
    clients: Vec<Kind>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            json: None,
            secs: 3.0,
            concurrency: 256,
            rounds: 9,
            clients: CLIENTS.to_vec(),
        }
    }
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("bench: `{flag}` needs a value"))
        };
        match flag.as_str() {
            "--json" => o.json = Some(PathBuf::from(value()?)),
            "--secs" => {
                o.secs = value()?
                    .parse()
                    .map_err(|e| format!("bench: --secs: {e}"))?;
            }
            "--concurrency" => {
                o.concurrency = value()?
                    .parse()
                    .map_err(|e| format!("bench: --concurrency: {e}"))?;
            }
            "--rounds" => {
                o.rounds = value()?
                    .parse()
                    .map_err(|e| format!("bench: --rounds: {e}"))?;
            }
            "--clients" => {
                o.clients = value()?
                    .split(',')
                    .map(|key| {
                        CLIENTS
                            .into_iter()
                            .find(|k| k.key() == key)
                            .ok_or_else(|| format!("bench: --clients: unknown client `{key}`"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(format!("bench: unknown option `{other}`")),
        }
    }
    if !(o.secs.is_finite() && o.secs > 0.0) {
        return Err("bench: --secs must be a positive number".to_owned());
    }
    if o.concurrency == 0 {
        return Err("bench: --concurrency must be at least 1".to_owned());
    }
    if o.rounds < 3 {
        return Err("bench: --rounds must be at least 3 (figures are medians)".to_owned());
    }
    Ok(o)
}

/// `cargo xtask bench`: runs the comparison and the breaker scenario, prints, writes JSON.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    if args.first().map(String::as_str) == Some("--outbox") {
        return outbox::run(&args[1..]);
    }
    let opts = parse_args(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("could not start a tokio runtime: {e}"))?;
    let report = rt.block_on(bench(&opts))?;
    println!("{}", report.table());
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

// === the server ===

/// What the server counted.
#[derive(Debug, Default)]
struct ServerStats {
    conns: AtomicU64,
    fail_hits: AtomicU64,
}

/// A minimal hyper HTTP/1.1 server: `/fail` answers 503, anything else `200 ok`.
#[derive(Debug)]
struct BenchServer {
    addr: SocketAddr,
    stats: Arc<ServerStats>,
    task: JoinHandle<()>,
}

impl Drop for BenchServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl BenchServer {
    async fn start() -> Result<Self, String> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .map_err(|e| format!("bench: could not listen on loopback: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("bench: no local address: {e}"))?;
        let stats = Arc::new(ServerStats::default());
        let task = tokio::spawn(accept_loop(listener, stats.clone()));
        Ok(Self { addr, stats, task })
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn conns(&self) -> u64 {
        self.stats.conns.load(Ordering::Relaxed)
    }
}

async fn accept_loop(listener: TcpListener, stats: Arc<ServerStats>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors or similar: give the clients a moment to close some.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        stats.conns.fetch_add(1, Ordering::Relaxed);
        let stats = stats.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let stats = stats.clone();
                async move {
                    let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
                    if req.uri().path() == "/fail" {
                        stats.fail_hits.fetch_add(1, Ordering::Relaxed);
                        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    }
                    Ok::<_, Infallible>(res)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

// === the clients ===

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Hyper,
    Reqwest,
    SoulbaseMin,
    SoulbaseFull,
}

impl Kind {
    /// The key in the JSON report.
    fn key(self) -> &'static str {
        match self {
            Kind::Hyper => "hyper",
            Kind::Reqwest => "reqwest",
            Kind::SoulbaseMin => "soulbase_min",
            Kind::SoulbaseFull => "soulbase_full",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Hyper => "hyper-util (legacy)",
            Kind::Reqwest => "reqwest",
            Kind::SoulbaseMin => "soulbase-net minimal",
            Kind::SoulbaseFull => "soulbase-net full",
        }
    }
}

/// One client under test, built fresh for each run.
enum BenchClient {
    Hyper(Box<HyperClient<HttpConnector, Empty<Bytes>>>, Uri),
    Reqwest(reqwest::Client, String),
    Soulbase(Client, String),
}

impl BenchClient {
    fn build(kind: Kind, url: &str, concurrency: usize) -> Result<Self, String> {
        Ok(match kind {
            Kind::Hyper => {
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                let client = HyperClient::builder(TokioExecutor::new())
                    .pool_max_idle_per_host(concurrency)
                    .build(connector);
                let uri = url
                    .parse()
                    .map_err(|e| format!("bench: bad url {url}: {e}"))?;
                BenchClient::Hyper(Box::new(client), uri)
            }
            Kind::Reqwest => {
                let client = reqwest::Client::builder()
                    .pool_max_idle_per_host(concurrency)
                    .tcp_nodelay(true)
                    .build()
                    .map_err(|e| format!("bench: reqwest client: {e}"))?;
                BenchClient::Reqwest(client, url.to_owned())
            }
            Kind::SoulbaseMin | Kind::SoulbaseFull => {
                let policy = if kind == Kind::SoulbaseMin {
                    minimal_policy(concurrency)
                } else {
                    full_policy(concurrency)
                };
                let mut builder = Client::builder()
                    .policy(policy)
                    .pool_max_idle_per_host(concurrency);
                if kind == Kind::SoulbaseFull {
                    // What a service runs in production: trace context and metrics too.
                    builder = builder
                        .interceptor(soulbase_net_interceptors::TraceUa::new())
                        .observer(Arc::new(soulbase_net_observe::Metrics::new()));
                }
                let client = builder
                    .build()
                    .map_err(|e| format!("bench: soulbase-net client: {e}"))?;
                BenchClient::Soulbase(client, url.to_owned())
            }
        })
    }

    /// One GET, the body read to the end; `Err` for an error or a status other than 200.
    async fn get(&self) -> Result<(), String> {
        match self {
            BenchClient::Hyper(client, uri) => {
                let res = client.get(uri.clone()).await.map_err(|e| e.to_string())?;
                let status = res.status();
                res.into_body().collect().await.map_err(|e| e.to_string())?;
                ok_status(status.as_u16())
            }
            BenchClient::Reqwest(client, url) => {
                let res = client.get(url).send().await.map_err(|e| e.to_string())?;
                let status = res.status();
                res.bytes().await.map_err(|e| e.to_string())?;
                ok_status(status.as_u16())
            }
            BenchClient::Soulbase(client, url) => {
                let res = client
                    .send(NetRequest::get(url.as_str()))
                    .await
                    .map_err(|e| e.to_string())?;
                let status = res.status;
                res.bytes().await.map_err(|e| e.to_string())?;
                ok_status(status.as_u16())
            }
        }
    }
}

fn ok_status(status: u16) -> Result<(), String> {
    if status == 200 {
        Ok(())
    } else {
        Err(format!("status {status}"))
    }
}

/// The common part: the guard on with only loopback granted, DNS kept on loopback, and
/// concurrency limits that never bind at `concurrency`.
fn base_policy(concurrency: usize) -> NetPolicy {
    let limit = u32::try_from(concurrency.saturating_mul(4)).unwrap_or(u32::MAX);
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = "127.0.0.0/8".parse().into_iter().collect();
    p.dns.nameservers = vec![SocketAddr::from(([127, 0, 0, 1], 9))];
    p.limits.per_host_concurrency = limit;
    p.limits.per_tenant_concurrency = limit;
    p
}

/// Retries and the breaker off; the guard on.
fn minimal_policy(concurrency: usize) -> NetPolicy {
    let mut p = base_policy(concurrency);
    p.retry.enabled = false;
    p.cbreaker.enabled = false;
    p
}

/// Retries with their budget, the breaker, a generous limiter and the guard.
fn full_policy(concurrency: usize) -> NetPolicy {
    let mut p = base_policy(concurrency);
    p.retry.enabled = true;
    p.retry.budget.enabled = true;
    p.cbreaker.enabled = true;
    p
}

// === measuring ===

/// One run of one client.
#[derive(Clone, Debug)]
struct Run {
    rps: f64,
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
    conns: u64,
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    /// Process CPU time (user + system, server included) per successful request, in µs.
    cpu_us: f64,
}

/// CPU time this process has used so far (all threads), from `/proc/self/stat`; `None`
/// where that file does not exist. The server runs in the same process, so per request it
/// adds the same amount for every client: differences between clients are the clients'.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the file, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // Linux reports them in USER_HZ, 100 per second on every architecture it supports.
    Some(Duration::from_millis(ticks * 10))
}

async fn load(
    kind: Kind,
    server: &BenchServer,
    concurrency: usize,
    secs: f64,
) -> Result<Run, String> {
    let client = BenchClient::build(kind, &server.url("/"), concurrency)?;
    load_client(client, server, concurrency, secs).await
}

/// [`load`] with a client built by the caller.
async fn load_client(
    client: BenchClient,
    server: &BenchServer,
    concurrency: usize,
    secs: f64,
) -> Result<Run, String> {
    let client = Arc::new(client);
    let conns_before = server.conns();
    let cpu_before = process_cpu();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(1024);
            let (mut errors, mut first_error) = (0u64, None);
            while Instant::now() < deadline {
                let t = Instant::now();
                match client.get().await {
                    Ok(()) => latencies.push(t.elapsed()),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e);
                    }
                }
            }
            (latencies, errors, first_error)
        }));
    }
    let mut latencies = Vec::new();
    let (mut errors, mut first_error) = (0u64, None);
    for task in tasks {
        let (l, e, f) = task
            .await
            .map_err(|e| format!("bench: a caller task failed: {e}"))?;
        latencies.extend(l);
        errors += e;
        if first_error.is_none() {
            first_error = f;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = process_cpu()
        .zip(cpu_before)
        .map_or(Duration::ZERO, |(after, before)| {
            after.saturating_sub(before)
        });
    drop(client);
    latencies.sort_unstable();
    let ok = latencies.len() as u64;
    Ok(Run {
        rps: ok as f64 / elapsed,
        p50_ms: percentile_ms(&latencies, 50.0),
        p95_ms: percentile_ms(&latencies, 95.0),
        p99_ms: percentile_ms(&latencies, 99.0),
        conns: server.conns() - conns_before,
        ok,
        errors,
        first_error,
        cpu_us: if ok == 0 {
            0.0
        } else {
            cpu.as_secs_f64() * 1e6 / ok as f64
        },
    })
}

/// The `p`-th percentile of sorted latencies, in milliseconds (nearest rank); 0 when empty.
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let i = rank.clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The medians of one client's runs.
#[derive(Clone, Debug)]
struct Summary {
    kind: Kind,
    rps: f64,
    rps_min: f64,
    rps_max: f64,
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
    conns: f64,
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    cpu_us: f64,
}

impl Summary {
    fn of(kind: Kind, runs: &[Run]) -> Self {
        let pick = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
        let rps: Vec<f64> = runs.iter().map(|r| r.rps).collect();
        Self {
            kind,
            rps: pick(|r| r.rps),
            rps_min: rps.iter().copied().fold(f64::INFINITY, f64::min),
            rps_max: rps.iter().copied().fold(0.0, f64::max),
            p50_ms: pick(|r| r.p50_ms),
            p95_ms: pick(|r| r.p95_ms),
            p99_ms: pick(|r| r.p99_ms),
            conns: pick(|r| r.conns as f64),
            cpu_us: pick(|r| r.cpu_us),
            ok: runs.iter().map(|r| r.ok).sum(),
            errors: runs.iter().map(|r| r.errors).sum(),
            first_error: runs.iter().find_map(|r| r.first_error.clone()),
        }
    }
}

/// Attempts reaching a failing upstream, breaker off and on.
#[derive(Clone, Copy, Debug)]
struct Breaker {
    attempts_off: u64,
    attempts_on: u64,
}

impl Breaker {
    fn reduction(self) -> f64 {
        if self.attempts_off == 0 {
            return 0.0;
        }
        1.0 - self.attempts_on as f64 / self.attempts_off as f64
    }
}

/// What the retry budget spared a failing upstream: attempts reaching it for
/// [`BREAKER_REQUESTS`] GETs, each allowed 3 attempts, with the budget off and on.
#[derive(Clone, Copy, Debug)]
struct Budget {
    attempts_off: u64,
    attempts_on: u64,
}

impl Budget {
    /// Attempts per request: 3.0 means every retry went out.
    fn amplification(attempts: u64) -> f64 {
        attempts as f64 / BREAKER_REQUESTS as f64
    }
}

/// Sends [`BREAKER_REQUESTS`] GETs to `/fail` (always 503) with 3 attempts each and a 1 ms
/// backoff, once without and once with the retry budget (its defaults: 20 % of requests plus
/// 10 retries a second over 10 s), breaker off: how many attempts reach the server.
async fn budget_scenario(server: &BenchServer) -> Result<Budget, String> {
    let mut attempts = [0u64; 2];
    for (i, on) in [false, true].into_iter().enumerate() {
        let mut p = minimal_policy(1);
        p.retry.enabled = true;
        p.retry.max_attempts = 3;
        p.retry.backoff.base = Duration::from_millis(1);
        p.retry.backoff.cap = Duration::from_millis(1);
        p.retry.budget.enabled = on;
        attempts[i] = hits_on_failing(server, p, false).await?;
    }
    Ok(Budget {
        attempts_off: attempts[0],
        attempts_on: attempts[1],
    })
}

/// Sends [`BREAKER_REQUESTS`] GETs (no retries) to `/fail`, which always answers 503.
async fn breaker_scenario(server: &BenchServer) -> Result<Breaker, String> {
    let mut attempts = [0u64; 2];
    for (i, on) in [false, true].into_iter().enumerate() {
        let mut p = minimal_policy(1);
        p.cbreaker.enabled = on;
        p.cbreaker.consecutive_failures = 5;
        p.cbreaker.cooldown = Duration::from_secs(60);
        attempts[i] = hits_on_failing(server, p, on).await?;
    }
    Ok(Breaker {
        attempts_off: attempts[0],
        attempts_on: attempts[1],
    })
}

/// Sends [`BREAKER_REQUESTS`] GETs to `/fail` (always 503) through a client of `policy`;
/// returns how many attempts reached the server. Every call must end in the 503, or in
/// `CircuitOpen` when `breaker` is on.
async fn hits_on_failing(
    server: &BenchServer,
    policy: NetPolicy,
    breaker: bool,
) -> Result<u64, String> {
    let client = Client::builder()
        .policy(policy)
        .build()
        .map_err(|e| format!("bench: soulbase-net client: {e}"))?;
    let before = server.stats.fail_hits.load(Ordering::Relaxed);
    for _ in 0..BREAKER_REQUESTS {
        match client.send(NetRequest::get(server.url("/fail"))).await {
            Ok(res) if res.status == StatusCode::SERVICE_UNAVAILABLE => {}
            Err(e) if breaker && e.kind() == ErrorKind::CircuitOpen => {}
            Ok(res) => return Err(format!("bench: /fail answered {}", res.status)),
            Err(e) => return Err(format!("bench: failing-upstream scenario: {e}")),
        }
    }
    Ok(server.stats.fail_hits.load(Ordering::Relaxed) - before)
}

/// The lease of the fleet scenario's shared limit: one Redis call per this many requests.
const FLEET_LEASE: u32 = 50;

/// The full policy with a shared limit on Redis beside the full policy alone.
#[derive(Clone, Debug)]
struct Fleet {
    local: Summary,
    shared: Summary,
    /// Redis round trips per successful request of the shared runs.
    redis_calls_per_request: f64,
}

/// The full policy with `limits.global` on a throwaway Redis (a rate far above the offered
/// load, leases of [`FLEET_LEASE`]) against the full policy alone, taking turns for up to 5
/// rounds; `None` (with a line) when `redis-server` is not installed.
async fn fleet_scenario(server: &BenchServer, opts: &Options) -> Result<Option<Fleet>, String> {
    let redis = match soulbase_net_testkit::RedisServer::try_start() {
        Ok(Some(redis)) => redis,
        Ok(None) => {
            println!("  fleet scenario skipped: redis-server is not installed");
            return Ok(None);
        }
        Err(e) => return Err(format!("bench: redis-server did not start: {e}")),
    };
    println!(
        "  fleet scenario: full policy + a shared limit on Redis (lease {FLEET_LEASE}) vs full policy …"
    );
    let (mut local, mut shared) = (Vec::new(), Vec::new());
    let (mut calls, mut requests) = (0u64, 0u64);
    // Up to 5 rounds: the comparison is of two soulbase-net settings, not of four clients.
    for _ in 0..opts.rounds.min(5) {
        let client = BenchClient::build(Kind::SoulbaseFull, &server.url("/"), opts.concurrency)?;
        local.push(load_client(client, server, opts.concurrency, opts.secs).await?);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let store = Arc::new(soulbase_net_runtime::fleet::Counted::new(
            soulbase_net_runtime::fleet::RedisRateStore::new(&redis.url())
                .map_err(|e| e.to_string())?,
        ));
        let mut policy = full_policy(opts.concurrency);
        let mut global = soulbase_net_policy::GlobalLimit::default();
        global.rps = 10_000_000;
        global.burst = 10_000_000;
        global.lease = FLEET_LEASE;
        global.store_timeout = Duration::from_millis(100);
        policy.limits.global = Some(global);
        let client = Client::builder()
            .policy(policy)
            .pool_max_idle_per_host(opts.concurrency)
            .interceptor(soulbase_net_interceptors::TraceUa::new())
            .observer(Arc::new(soulbase_net_observe::Metrics::new()))
            .rate_store(store.clone())
            .build()
            .map_err(|e| format!("bench: soulbase-net client: {e}"))?;
        let run = load_client(
            BenchClient::Soulbase(client, server.url("/")),
            server,
            opts.concurrency,
            opts.secs,
        )
        .await?;
        calls += store.calls();
        requests += run.ok;
        shared.push(run);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(redis);
    Ok(Some(Fleet {
        local: Summary::of(Kind::SoulbaseFull, &local),
        shared: Summary::of(Kind::SoulbaseFull, &shared),
        redis_calls_per_request: if requests == 0 {
            0.0
        } else {
            calls as f64 / requests as f64
        },
    }))
}

/// One panel of the chart: title, the figure drawn, bar colour.
type Panel = (&'static str, fn(&Summary) -> f64, &'static str);

/// Everything one `cargo xtask bench` measured.
#[derive(Debug)]
struct Report {
    opts: Options,
    clients: Vec<Summary>,
    breaker: Breaker,
    budget: Budget,
    fleet: Option<Fleet>,
}

async fn bench(opts: &Options) -> Result<Report, String> {
    let server = BenchServer::start().await?;
    println!(
        "bench ({} build): {} callers, {} s per client per round, {} rounds, server http://{}",
        profile(),
        opts.concurrency,
        opts.secs,
        opts.rounds,
        server.addr
    );
    if cfg!(debug_assertions) {
        println!(
            "  (debug build: `cargo run --release -p xtask -- bench` for representative numbers)"
        );
    }
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); opts.clients.len()];
    for round in 1..=opts.rounds {
        for (i, &kind) in opts.clients.iter().enumerate() {
            let run = load(kind, &server, opts.concurrency, opts.secs).await?;
            println!(
                "  round {round}/{} {:<21} {:>9.0} req/s  p99 {:>7.2} ms  conns {:>4}  errors {}  cpu {:.1} µs/req",
                opts.rounds,
                kind.label(),
                run.rps,
                run.p99_ms,
                run.conns,
                run.errors,
                run.cpu_us
            );
            runs[i].push(run);
            // Let the closed connections drain before the next client starts.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let clients: Vec<Summary> = opts
        .clients
        .iter()
        .copied()
        .zip(&runs)
        .map(|(kind, runs)| Summary::of(kind, runs))
        .collect();
    println!("  breaker scenario: {BREAKER_REQUESTS} GETs to an upstream that always fails …");
    let breaker = breaker_scenario(&server).await?;
    println!(
        "  retry budget scenario: {BREAKER_REQUESTS} GETs, 3 attempts each, to the same upstream …"
    );
    let budget = budget_scenario(&server).await?;
    let fleet = fleet_scenario(&server, opts).await?;
    Ok(Report {
        opts: opts.clone(),
        clients,
        breaker,
        budget,
        fleet,
    })
}

impl Report {
    fn client(&self, kind: Kind) -> Option<&Summary> {
        self.clients.iter().find(|s| s.kind == kind)
    }

    /// `a / b` of a figure of two clients; 0 when either is missing or `b` is 0.
    fn ratio(&self, a: Kind, b: Kind, f: fn(&Summary) -> f64) -> f64 {
        match (self.client(a), self.client(b)) {
            (Some(a), Some(b)) if f(b) > 0.0 => f(a) / f(b),
            _ => 0.0,
        }
    }

    fn ratios(&self) -> [(&'static str, f64, &'static str); 5] {
        use Kind::*;
        [
            (
                "full_vs_hyper_rps",
                self.ratio(SoulbaseFull, Hyper, |s| s.rps),
                ">= 0.90",
            ),
            (
                "full_vs_reqwest_rps",
                self.ratio(SoulbaseFull, Reqwest, |s| s.rps),
                ">= 1.5",
            ),
            (
                "full_vs_hyper_p99",
                self.ratio(SoulbaseFull, Hyper, |s| s.p99_ms),
                "<= 1.1",
            ),
            (
                "min_vs_hyper_rps",
                self.ratio(SoulbaseMin, Hyper, |s| s.rps),
                "",
            ),
            (
                "full_vs_hyper_cpu",
                self.ratio(SoulbaseFull, Hyper, |s| s.cpu_us),
                "",
            ),
        ]
    }

    fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nmedians of {} rounds, {} callers, {} s each ({} build)",
            self.opts.rounds,
            self.opts.concurrency,
            self.opts.secs,
            profile()
        );
        let _ = writeln!(
            out,
            "{:<21} {:>9} {:>19} {:>8} {:>8} {:>8} {:>6} {:>7} {:>10}",
            "client",
            "req/s",
            "(min..max)",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "conns",
            "errors",
            "cpu µs/req"
        );
        for s in &self.clients {
            let _ = writeln!(
                out,
                "{:<21} {:>9.0} {:>19} {:>8.2} {:>8.2} {:>8.2} {:>6.0} {:>7} {:>10.1}",
                s.kind.label(),
                s.rps,
                format!("({:.0}..{:.0})", s.rps_min, s.rps_max),
                s.p50_ms,
                s.p95_ms,
                s.p99_ms,
                s.conns,
                s.errors,
                s.cpu_us
            );
        }
        for s in self.clients.iter().filter(|s| s.errors > 0) {
            let _ = writeln!(
                out,
                "  {}: {} errors of {}, first: {}",
                s.kind.label(),
                s.errors,
                s.ok + s.errors,
                s.first_error.as_deref().unwrap_or("?")
            );
        }
        let _ = writeln!(out, "\nratios (target, reported not asserted)");
        for (name, value, target) in self.ratios() {
            let _ = writeln!(out, "  {name:<20} {value:>6.3}  {target}");
        }
        let b = self.breaker;
        let _ = writeln!(
            out,
            "\nbreaker: {BREAKER_REQUESTS} GETs to a failing upstream reached it {} times with the breaker off, {} with it on: {:.1} % fewer (target >= 90 %)",
            b.attempts_off,
            b.attempts_on,
            b.reduction() * 100.0
        );
        let r = self.budget;
        let _ = writeln!(
            out,
            "retry budget: {BREAKER_REQUESTS} GETs with 3 attempts each sent {} attempts without the budget ({:.2} per request), {} with it ({:.2} per request)",
            r.attempts_off,
            Budget::amplification(r.attempts_off),
            r.attempts_on,
            Budget::amplification(r.attempts_on)
        );
        if let Some(f) = &self.fleet {
            let ratio = if f.local.rps > 0.0 {
                f.shared.rps / f.local.rps
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "fleet: full policy {:.0} req/s (p99 {:.2} ms); + shared limit on Redis, lease {FLEET_LEASE}: {:.0} req/s (p99 {:.2} ms), {ratio:.3} × (target >= 0.9), {:.3} Redis calls per request (target <= 0.05)",
                f.local.rps,
                f.local.p99_ms,
                f.shared.rps,
                f.shared.p99_ms,
                f.redis_calls_per_request
            );
        }
        out
    }

    /// A bar chart of the comparison (req/s and p99 per client), written beside the JSON.
    fn svg(&self) -> String {
        const W: f64 = 720.0;
        const BAR: f64 = 26.0;
        const LEFT: f64 = 180.0;
        let panels: [Panel; 3] = [
            ("throughput (req/s, higher is better)", |s| s.rps, "#3b7dd8"),
            ("p99 latency (ms, lower is better)", |s| s.p99_ms, "#d8823b"),
            (
                "CPU per request (µs, lower is better)",
                |s| s.cpu_us,
                "#5a9e4b",
            ),
        ];
        let rows = self.clients.len() as f64;
        let panel_h = 34.0 + rows * (BAR + 6.0);
        let height = 40.0 + panel_h * panels.len() as f64;
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" font-size="13">"#
        );
        let _ = writeln!(
            out,
            r#"<text x="10" y="24" font-size="15" font-weight="bold">soulbase-net bench: {} callers, HTTP/1.1 keep-alive over loopback, medians of {} rounds ({})</text>"#,
            self.opts.concurrency,
            self.opts.rounds,
            profile()
        );
        for (p, (title, value, colour)) in panels.iter().enumerate() {
            let top = 40.0 + p as f64 * panel_h;
            let _ = writeln!(
                out,
                r#"<text x="10" y="{}" font-weight="bold">{title}</text>"#,
                top + 18.0
            );
            let max = self
                .clients
                .iter()
                .map(value)
                .fold(0.0_f64, f64::max)
                .max(f64::MIN_POSITIVE);
            for (i, s) in self.clients.iter().enumerate() {
                let y = top + 28.0 + i as f64 * (BAR + 6.0);
                let v = value(s);
                let w = (W - LEFT - 90.0) * v / max;
                let _ = writeln!(
                    out,
                    r#"<text x="10" y="{}">{}</text><rect x="{LEFT}" y="{y}" width="{w:.1}" height="{BAR}" fill="{colour}"/><text x="{:.1}" y="{}">{v:.1}</text>"#,
                    y + 18.0,
                    s.kind.label(),
                    LEFT + w + 6.0,
                    y + 18.0
                );
            }
        }
        out.push_str("</svg>\n");
        out
    }

    fn json(&self) -> Value {
        let mut clients = serde_json::Map::new();
        for s in &self.clients {
            clients.insert(
                s.kind.key().to_owned(),
                json!({
                    "rps": round2(s.rps),
                    "p50_ms": round2(s.p50_ms),
                    "p95_ms": round2(s.p95_ms),
                    "p99_ms": round2(s.p99_ms),
                    "conns": s.conns,
                    "rps_min": round2(s.rps_min),
                    "rps_max": round2(s.rps_max),
                    "errors": s.errors,
                    "cpu_us_per_req": round2(s.cpu_us),
                }),
            );
        }
        let ratios: serde_json::Map<String, Value> = self
            .ratios()
            .into_iter()
            .map(|(name, value, _)| (name.to_owned(), json!(round3(value))))
            .collect();
        json!({
            "concurrency": self.opts.concurrency,
            "secs": self.opts.secs,
            "rounds": self.opts.rounds,
            "profile": profile(),
            "clients": clients,
            "ratios": ratios,
            "breaker": {
                "attempts_off": self.breaker.attempts_off,
                "attempts_on": self.breaker.attempts_on,
                "reduction": round3(self.breaker.reduction()),
            },
            "fleet": self.fleet.as_ref().map(|f| json!({
                "lease": FLEET_LEASE,
                "rps_local": round2(f.local.rps),
                "rps_shared": round2(f.shared.rps),
                "rps_ratio": round3(if f.local.rps > 0.0 { f.shared.rps / f.local.rps } else { 0.0 }),
                "p99_ms_local": round2(f.local.p99_ms),
                "p99_ms_shared": round2(f.shared.p99_ms),
                "redis_calls_per_request": round3(f.redis_calls_per_request),
            })),
            "retry_budget": {
                "requests": BREAKER_REQUESTS,
                "attempts_off": self.budget.attempts_off,
                "attempts_on": self.budget.attempts_on,
                "amplification_off": round3(Budget::amplification(self.budget.attempts_off)),
                "amplification_on": round3(Budget::amplification(self.budget.attempts_on)),
            },
        })
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
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
        assert_eq!((o.secs, o.concurrency, o.rounds), (0.5, 8, 9));
        assert!(parse_args(&args("--secs")).is_err());
        assert!(parse_args(&args("--secs 0")).is_err());
        assert!(parse_args(&args("--concurrency 0")).is_err());
        assert!(parse_args(&args("--rounds 2")).is_err());
        assert!(parse_args(&args("--fast")).is_err());
        let o = parse_args(&args("--clients hyper,soulbase_full")).unwrap();
        assert_eq!(o.clients, vec![Kind::Hyper, Kind::SoulbaseFull]);
        assert!(parse_args(&args("--clients hyper,curl")).is_err());
    }

    #[test]
    fn percentiles_and_medians() {
        let ms: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&ms, 50.0), 50.0);
        assert_eq!(percentile_ms(&ms, 99.0), 99.0);
        assert_eq!(percentile_ms(&[], 99.0), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    /// A tiny run end to end: every client answers, the JSON has the issue's shape.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_bench_measures_every_client_and_the_breaker() {
        let _turn = crate::HEAVY.lock().await;
        let opts = Options {
            secs: 0.2,
            concurrency: 4,
            ..Options::default()
        };
        let report = bench(&opts).await.unwrap();
        for s in &report.clients {
            assert!(s.ok > 0 && s.errors == 0, "{s:?}");
        }
        assert_eq!(report.breaker.attempts_off, BREAKER_REQUESTS);
        assert!(report.breaker.reduction() >= 0.9, "{:?}", report.breaker);
        let json = report.json();
        for key in ["hyper", "reqwest", "soulbase_min", "soulbase_full"] {
            assert!(json["clients"][key]["p99_ms"].is_number(), "{json}");
        }
        assert!(json["ratios"]["full_vs_hyper_rps"].is_number());
        assert!(json["breaker"]["reduction"].is_number());
        // Without a budget every request makes its 3 attempts; with it, retries add at most
        // 20 % of the requests plus 10 a second over the 10 s window.
        assert_eq!(report.budget.attempts_off, 3 * BREAKER_REQUESTS);
        let cap = BREAKER_REQUESTS + BREAKER_REQUESTS / 5 + 100;
        assert!(
            (BREAKER_REQUESTS..=cap).contains(&report.budget.attempts_on),
            "{:?}",
            report.budget
        );
        // With redis-server installed (CI installs it), the fleet row: the shared limit never
        // refused (its rate is far above the load) and leases spared Redis.
        if let Some(f) = &report.fleet {
            assert!(f.shared.ok > 0 && f.shared.errors == 0, "{f:?}");
            assert!(f.redis_calls_per_request <= 1.0 / 10.0, "{f:?}");
            assert!(json["fleet"]["rps_ratio"].is_number(), "{json}");
        }
        let svg = report.svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for s in &report.clients {
            assert!(svg.contains(s.kind.label()), "{svg}");
        }
    }
}
