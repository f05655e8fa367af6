//! `cargo xtask demo`: the project's main job on an embedded default, in a few seconds.
//!
//! Starts [`FaultServer`]s on loopback and drives one [`Client`] through phases a person can
//! watch: a flaky endpoint retried to success, a failing one tripping the circuit breaker and
//! recovering through HalfOpen, a concurrency limit, SSRF attempts refused, a first-byte
//! timeout, a cached GET (the same client with a `CacheHook`), two instances sharing a quota
//! on Redis, an outbox on SQLite (a temp file) delivering a POST on its third try with one
//! `Idempotency-Key` and a delayed item not before its time, and the SLO controller slowing
//! down a host whose calls start timing out, then letting it go once healed. Each phase prints a live progress
//! line and a verdict; a final table and the events counted by the demo's own [`Observer`]
//! follow. The exit code is non-zero when any phase did not behave as expected, so the demo
//! doubles as a smoke test (and a `#[test]` runs the same scenario in-process).
//!
//! It never leaves loopback: the guard grants only `127.0.0.0/8`, DNS goes to a closed
//! loopback port (the system resolver is never used), and the dialer refuses — and counts —
//! anything that is not loopback. Each phase's server listens on its own loopback address
//! (`127.0.0.1`, `127.0.0.2`, …) because the breaker and the limiter are keyed by host.
#![allow(
    clippy::print_stdout,
    reason = "a command a person watches: progress lines and tables go to stdout"
)]

use std::{
    fmt::Write as _,
    io::{IsTerminal as _, Write as _},
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use parking_lot::Mutex;
use soulbase_net_core::{
    BreakerState, ErrorCode, ErrorKind, GaugeReading, NetClient, NetError, NetEvent, NetRequest,
    NetResponse, Observer, OutboxStep, Phase, TimeoutCfg,
};
use soulbase_net_interceptors::CacheHook;
use soulbase_net_outbox::{Outbox, OutboxItem, SqliteStore};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{FaultServer, FaultServerBuilder, RandomFaults, Reply, Script};
use tokio::time::Instant;

use crate::{
    contract::slo::{load, policy as slo_policy, storm},
    loopback::LoopbackDialer,
    outbox_kit::{self, Applied, TempDir},
};

/// The breaker opens after this many failed attempts in a row.
const BREAKER_THRESHOLD: u32 = 5;
/// How long the breaker stays open before letting a probe through.
const BREAKER_COOLDOWN: Duration = Duration::from_millis(600);
/// Concurrent calls per host in the rate-limit phase.
const HOST_CONCURRENCY: u32 = 2;
/// Requests against the randomly flaky route.
const RANDOM_REQUESTS: u32 = 20;

/// `cargo xtask demo`: runs the scenario on a fresh runtime and prints the report.
pub(crate) fn run() -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("could not start a tokio runtime: {e}"))?;
    println!("soulbase-net demo: one client, fault servers on loopback, nothing else dialled\n");
    let report = rt.block_on(scenario(Progress { live: true }))?;
    println!("\n{}", report.table());
    println!("{}", report.events());
    println!(
        "Prometheus exposition (soulbase-net-observe):\n{}",
        report.exposition
    );
    if report.passed() {
        println!("demo passed: every phase showed the expected behaviour");
        Ok(())
    } else {
        let failed: Vec<&str> = report
            .phases
            .iter()
            .filter(|p| !p.passed)
            .map(|p| p.name)
            .collect();
        Err(format!(
            "demo failed: phase(s) {} did not behave as expected (see the table above)",
            failed.join(", ")
        ))
    }
}

/// What the scenario found: one row per phase and the counted events.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) phases: Vec<PhaseResult>,
    counts: Counts,
    transitions: Vec<String>,
    off_loopback_dials: Vec<SocketAddr>,
    /// The Prometheus (OpenMetrics) exposition of the run.
    pub(crate) exposition: String,
}

/// One phase: what was expected, what was measured, and whether they agree.
#[derive(Debug)]
pub(crate) struct PhaseResult {
    pub(crate) name: &'static str,
    expected: String,
    measured: String,
    pub(crate) passed: bool,
    elapsed: Duration,
}

impl Report {
    /// Whether every phase passed.
    pub(crate) fn passed(&self) -> bool {
        self.phases.iter().all(|p| p.passed)
    }

    fn table(&self) -> String {
        let w_name = self.phases.iter().map(|p| p.name.len()).max().unwrap_or(5);
        let w_exp = self
            .phases
            .iter()
            .map(|p| p.expected.len())
            .max()
            .unwrap_or(8);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<w_name$}  {:<w_exp$}  {:>7}  result  measured",
            "phase", "expected", "time"
        );
        for p in &self.phases {
            let _ = writeln!(
                out,
                "{:<w_name$}  {:<w_exp$}  {:>6.2}s  {:<6}  {}",
                p.name,
                p.expected,
                p.elapsed.as_secs_f64(),
                if p.passed { "ok" } else { "FAILED" },
                p.measured
            );
        }
        out
    }

    fn events(&self) -> String {
        let c = &self.counts;
        let mut out = String::from("events counted by the demo's observer:\n");
        let rows = [
            ("requests", c.requests),
            ("attempts", c.attempts),
            ("retries scheduled", c.retries),
            ("retry budget exhausted", c.budget_exhausted),
            ("breaker transitions", c.transitions),
            ("breaker rejections (fail fast)", c.breaker_rejected),
            ("SLO policy changes", c.policy_changes),
            ("rate limited", c.rate_limited),
            ("blocked (guard)", c.blocked),
            ("timed out", c.timed_out),
            ("redirects followed", c.redirected),
            ("outbox deliveries", c.outbox_delivered),
            ("outbox retries", c.outbox_retried),
            ("outbox dead letters", c.outbox_dead),
        ];
        for (name, n) in rows {
            let _ = writeln!(out, "  {name:<31} {n}");
        }
        let _ = writeln!(
            out,
            "  {:<31} {}",
            "breaker path",
            if self.transitions.is_empty() {
                "-".to_owned()
            } else {
                self.transitions.join(", ")
            }
        );
        let _ = writeln!(
            out,
            "  {:<31} {}",
            "dials off loopback",
            self.off_loopback_dials.len()
        );
        out
    }
}

/// Event counters (a snapshot of [`DemoObserver`]).
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    requests: u64,
    attempts: u64,
    retries: u64,
    budget_exhausted: u64,
    transitions: u64,
    breaker_rejected: u64,
    policy_changes: u64,
    rate_limited: u64,
    blocked: u64,
    timed_out: u64,
    redirected: u64,
    outbox_delivered: u64,
    outbox_retried: u64,
    outbox_dead: u64,
}

/// Counts the events the client reports; keeps the breaker transitions in order.
#[derive(Debug, Default)]
struct DemoObserver {
    requests: AtomicU64,
    attempts: AtomicU64,
    retries: AtomicU64,
    budget_exhausted: AtomicU64,
    breaker_rejected: AtomicU64,
    policy_changes: AtomicU64,
    rate_limited: AtomicU64,
    blocked: AtomicU64,
    timed_out: AtomicU64,
    redirected: AtomicU64,
    outbox_delivered: AtomicU64,
    outbox_retried: AtomicU64,
    outbox_dead: AtomicU64,
    transitions: Mutex<Vec<(String, BreakerState, BreakerState)>>,
}

impl Observer for DemoObserver {
    fn on_event(&self, event: &NetEvent<'_>) {
        let counter = match event {
            NetEvent::RequestStarted { .. } => &self.requests,
            NetEvent::AttemptStarted { .. } => &self.attempts,
            NetEvent::RetryScheduled { .. } => &self.retries,
            NetEvent::RetryBudgetExhausted { .. } => &self.budget_exhausted,
            NetEvent::BreakerRejected { .. } => &self.breaker_rejected,
            NetEvent::PolicyChange { .. } => &self.policy_changes,
            NetEvent::RateLimited { .. } => &self.rate_limited,
            NetEvent::Blocked { .. } => &self.blocked,
            NetEvent::TimedOut { .. } => &self.timed_out,
            NetEvent::Redirected { .. } => &self.redirected,
            NetEvent::Outbox { step, .. } => match step {
                OutboxStep::Delivered => &self.outbox_delivered,
                OutboxStep::Retried => &self.outbox_retried,
                OutboxStep::Dead => &self.outbox_dead,
                _ => return,
            },
            NetEvent::BreakerTransition { key, from, to } => {
                self.transitions
                    .lock()
                    .push(((*key).to_owned(), *from, *to));
                return;
            }
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl DemoObserver {
    fn counts(&self) -> Counts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counts {
            requests: get(&self.requests),
            attempts: get(&self.attempts),
            retries: get(&self.retries),
            budget_exhausted: get(&self.budget_exhausted),
            transitions: self.transitions.lock().len() as u64,
            breaker_rejected: get(&self.breaker_rejected),
            policy_changes: get(&self.policy_changes),
            rate_limited: get(&self.rate_limited),
            blocked: get(&self.blocked),
            timed_out: get(&self.timed_out),
            redirected: get(&self.redirected),
            outbox_delivered: get(&self.outbox_delivered),
            outbox_retried: get(&self.outbox_retried),
            outbox_dead: get(&self.outbox_dead),
        }
    }

    /// The transitions of the breaker keyed by `key`, in order.
    fn path_of(&self, key: &str) -> Vec<BreakerState> {
        let seen = self.transitions.lock();
        let mut path: Vec<BreakerState> = Vec::new();
        for (_, from, to) in seen.iter().filter(|(k, ..)| k == key) {
            if path.is_empty() {
                path.push(*from);
            }
            path.push(*to);
        }
        path
    }
}

/// Prints one live line per phase (overwritten as it progresses), then its verdict.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Progress {
    /// Print at all (the in-process test runs quietly).
    pub(crate) live: bool,
}

impl Progress {
    /// Overwrites the phase's line; only on a terminal (a log gets the verdicts alone).
    fn update(&self, name: &str, line: &str) {
        if self.live && std::io::stdout().is_terminal() {
            print!("\r\x1b[2K  {name:<14} {line}");
            let _ = std::io::stdout().flush();
        }
    }

    fn finish(&self, p: &PhaseResult) {
        if self.live {
            let verdict = if p.passed { "ok" } else { "FAILED" };
            let clear = if std::io::stdout().is_terminal() {
                "\r\x1b[2K"
            } else {
                ""
            };
            println!(
                "{clear}  {:<14} {verdict:<6} {} ({:.2}s)",
                p.name,
                p.measured,
                p.elapsed.as_secs_f64()
            );
        }
    }
}

/// The demo's policy: retries with fast backoff, a breaker that trips quickly, a small
/// per-host concurrency limit, the guard with only loopback granted, DNS never leaving
/// loopback.
pub(crate) fn demo_policy() -> NetPolicy {
    let mut p = NetPolicy::default();
    p.retry.enabled = true;
    p.retry.max_attempts = 3;
    p.retry.backoff.base = Duration::from_millis(20);
    p.retry.backoff.cap = Duration::from_millis(200);
    p.cbreaker.enabled = true;
    p.cbreaker.consecutive_failures = BREAKER_THRESHOLD;
    p.cbreaker.cooldown = BREAKER_COOLDOWN;
    p.cbreaker.half_open_probes = 1;
    p.limits.per_host_concurrency = HOST_CONCURRENCY;
    // Only loopback is granted (a literal that always parses; were it not to, nothing would
    // be granted and the demo would fail loudly rather than reach further).
    p.security.grants.cidrs = "127.0.0.0/8".parse().into_iter().collect();
    p.dns.nameservers = vec![SocketAddr::from(([127, 0, 0, 1], 9))];
    p.dns.timeout = Duration::from_millis(500);
    p
}

/// Each phase's server on its own loopback address (the breaker and limiter key by host).
async fn server(
    host: u8,
    build: impl FnOnce(FaultServerBuilder) -> FaultServerBuilder,
) -> Result<FaultServer, String> {
    build(FaultServer::http1().bind(SocketAddr::from(([127, 0, 0, host], 0))))
        .start()
        .await
        .map_err(|e| format!("could not start a fault server on 127.0.0.{host}: {e}"))
}

/// Runs every phase against one client and reports what each showed.
///
/// # Errors
/// Only when the demo cannot set itself up (a server fails to start, the client does not
/// build); a phase that misbehaves is a failed row of the report instead.
pub(crate) async fn scenario(progress: Progress) -> Result<Report, String> {
    let observer = Arc::new(DemoObserver::default());
    let metrics = Arc::new(soulbase_net_observe::Metrics::new());
    let both: Arc<dyn soulbase_net_core::Observer> = Arc::new(
        soulbase_net_observe::Fanout::new()
            .with(observer.clone())
            .with(metrics.clone()),
    );
    let dialer = Arc::new(LoopbackDialer::default());
    let client = Client::builder()
        .policy(demo_policy())
        .observer(both.clone())
        .dialer(dialer.clone())
        .build()
        .map_err(|e| format!("could not build the client: {e}"))?;
    let client = Arc::new(client);
    // The same client with a response cache in front, for the cached-GET phase.
    let cached = Client::builder()
        .policy(demo_policy())
        .observer(both.clone())
        .dialer(dialer.clone())
        .interceptor(CacheHook::new())
        .build()
        .map_err(|e| format!("could not build the caching client: {e}"))?;
    let mut phases = Vec::new();
    for phase in [
        phase_flaky(&client, progress).await?,
        phase_breaker(&client, &observer, progress).await?,
        phase_limit(&client, progress).await?,
        phase_ssrf(&client, &dialer, progress).await?,
        phase_timeout(&client, progress).await?,
        phase_cache(&cached, progress).await?,
        phase_fleet(&dialer, progress).await?,
        phase_outbox(&dialer, both.clone(), &observer, progress).await?,
        phase_slo(&dialer, both, progress).await?,
        phase_delay(progress).await?,
    ] {
        phases.push(phase);
    }
    let transitions = {
        let seen = observer.transitions.lock();
        seen.iter()
            .map(|(k, from, to)| format!("{k}: {} -> {}", from.as_str(), to.as_str()))
            .collect()
    };
    let off_loopback_dials = dialer.off_loopback();
    Ok(Report {
        phases,
        counts: observer.counts(),
        transitions,
        off_loopback_dials,
        exposition: metrics.encode(),
    })
}

/// (j) The delay server (seed 003): a client schedules a task over TCP, gets its `ack` once
/// it is stored, receives it when due on the connection registered for its route, and
/// acknowledges it; the store then holds nothing.
async fn phase_delay(progress: Progress) -> Result<PhaseResult, String> {
    use soulbase_net_delay::{Config, DelayServer};
    use soulbase_net_store::delay::{DelayStore, DelayStoreOptions, SqliteDelayStore};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    const NAME: &str = "(j) delay server";
    const FIRE_IN_MS: i64 = 300;
    let started = Instant::now();
    let dir = TempDir::new("demo-delay")?;
    let store = Arc::new(
        SqliteDelayStore::open(dir.file("delay.db"), DelayStoreOptions::default())
            .await
            .map_err(|e| e.to_string())?,
    );
    let config = Config {
        bind_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..Config::default()
    };
    let server = DelayServer::start(config, store.clone())
        .await
        .map_err(|e| e.to_string())?;
    let run = async {
        let stream = tokio::net::TcpStream::connect(server.local_addr())
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        let (read, mut write) = stream.into_split();
        let mut lines = tokio::io::BufReader::new(read).lines();
        let now_ms = || {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        };
        let fire_at = now_ms() + FIRE_IN_MS;
        let lines_out = format!(
            "{{\"kind\":\"register\",\"route_key\":\"demo\"}}\n\
             {{\"kind\":\"schedule\",\"id\":\"demo-1\",\"route_key\":\"demo\",\"fire_at\":{fire_at},\"compression\":\"none\",\"payload_base64\":\"aGVsbG8=\"}}\n"
        );
        let sent = Instant::now();
        write
            .write_all(lines_out.as_bytes())
            .await
            .map_err(|e| format!("writing: {e}"))?;
        let registered = next_json(&mut lines).await?;
        let ack = next_json(&mut lines).await?;
        let acked_in = sent.elapsed();
        let stored = store
            .get("demo-1")
            .await
            .map_err(|e| e.to_string())?
            .is_some();
        let delivery = next_json(&mut lines).await?;
        let late = now_ms() - fire_at;
        write
            .write_all(b"{\"kind\":\"ack\",\"id\":\"demo-1\"}\n")
            .await
            .map_err(|e| format!("writing: {e}"))?;
        let until = Instant::now() + Duration::from_secs(5);
        let mut pending = store.pending().await.map_err(|e| e.to_string())?;
        while pending > 0 && Instant::now() < until {
            // The store has no event to await.
            tokio::time::sleep(Duration::from_millis(10)).await;
            pending = store.pending().await.map_err(|e| e.to_string())?;
        }
        let ok = registered["kind"] == "registered"
            && ack["kind"] == "ack"
            && ack["fire_at"] == fire_at
            && stored
            && delivery["kind"] == "delivery"
            && delivery["id"] == "demo-1"
            && delivery["payload_base64"] == "aGVsbG8="
            && late >= 0
            && pending == 0;
        Ok::<_, String>((
            format!(
                "ack after {acked_in:.1?} (stored: {stored}); delivered {late} ms after fire_at; {pending} left after the client's ack"
            ),
            ok,
        ))
    };
    progress.update(NAME, "scheduling over TCP");
    let outcome = run.await;
    server.shutdown().await;
    let (measured, passed) = match outcome {
        Ok(m) => m,
        Err(e) => (e, false),
    };
    let result = PhaseResult {
        name: NAME,
        expected: "ack once stored; delivered when due (not early); deleted on the client's ack"
            .to_owned(),
        measured,
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// The next line from the delay server, as JSON, within 5 s.
async fn next_json(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>>,
) -> Result<serde_json::Value, String> {
    match tokio::time::timeout(Duration::from_secs(5), lines.next_line()).await {
        Ok(Ok(Some(line))) => {
            serde_json::from_str::<serde_json::Value>(&line).map_err(|e| format!("not JSON: {e}"))
        }
        _ => Err("no line from the server within 5 s".to_owned()),
    }
}

/// (i) The SLO controller: a host whose calls start timing out (30 %) is slowed down — its
/// backoff and rate factors move within a window — and is back at its policy once healed.
async fn phase_slo(
    dialer: &Arc<LoopbackDialer>,
    observer: Arc<dyn Observer>,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(i) slo";
    let started = Instant::now();
    let mut srv = server(20, |b| {
        b.route("/ok", Reply::ok("ok")).route("/storm", storm())
    })
    .await?;
    let mut p = demo_policy();
    // The breaker would open on the storm; this phase shows the controller alone.
    p.cbreaker.enabled = false;
    p.slo.recover_step = 0.5;
    let p = slo_policy(p, true)?;
    let client = Client::builder()
        .policy(p)
        .observer(observer)
        .dialer(dialer.clone())
        .build()
        .map_err(|e| format!("could not build the SLO client: {e}"))?;
    let factors = || {
        let mut out = (1.0, 1.0);
        client.gauge_source().read_gauges(&mut |r| {
            if let GaugeReading::SloFactors { backoff, rate, .. } = r {
                out = (backoff, rate);
            }
        });
        out
    };
    progress.update(NAME, "50 req/s, 30 % of them timing out …");
    load(
        &client,
        &srv.url("/storm"),
        Duration::from_millis(2500),
        || false,
    )
    .await;
    let storm = factors();
    progress.update(
        NAME,
        &format!("storm: backoff ×{}, rate ×{}; healed …", storm.0, storm.1),
    );
    let healed_at = Instant::now();
    let back = || factors() == (1.0, 1.0);
    load(&client, &srv.url("/ok"), Duration::from_secs(4), back).await;
    let back_after = healed_at.elapsed();
    let end = factors();
    srv.shutdown().await;
    let passed = storm == (4.0, 0.25) && end == (1.0, 1.0);
    let result = PhaseResult {
        name: NAME,
        expected: "storm: backoff ×4, rate ×0.25; healed: back to 1 within 3.2 s".to_owned(),
        measured: format!(
            "storm: backoff ×{}, rate ×{}; healed: backoff ×{}, rate ×{} after {:.1}s",
            storm.0,
            storm.1,
            end.0,
            end.1,
            back_after.as_secs_f64()
        ),
        passed: passed && back_after < Duration::from_millis(3200),
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

fn describe(result: &Result<NetResponse, NetError>) -> String {
    match result {
        Ok(res) => format!("{} after {} attempt(s)", res.status.as_u16(), res.attempts),
        Err(e) => format!("{} ({})", e.kind().label(), e.code().as_str()),
    }
}

/// (a) `/flaky` answers 503 twice then 200; `/random` answers 503 on a seeded 20 % of hits.
async fn phase_flaky(client: &Client, progress: Progress) -> Result<PhaseResult, String> {
    const NAME: &str = "(a) retries";
    let started = Instant::now();
    let srv = server(1, |b| {
        b.route("/flaky", Script::status(503).times(2).then(Reply::ok("hi")))
            .route(
                "/random",
                RandomFaults::seeded(42)
                    .fault(0.2, Reply::status(503))
                    .otherwise(Reply::ok("ok")),
            )
    })
    .await?;
    progress.update(NAME, "GET /flaky (503, 503, then 200) …");
    let first = client.send(NetRequest::get(srv.url("/flaky"))).await;
    let first_ok = matches!(&first, Ok(r) if r.status == 200 && r.attempts == 3);
    progress.update(NAME, &format!("GET /flaky: {}", describe(&first)));
    let (mut ok, mut retried, mut attempts) = (0u32, 0u32, 0u32);
    for i in 1..=RANDOM_REQUESTS {
        let res = client.send(NetRequest::get(srv.url("/random"))).await;
        if let Ok(r) = &res {
            attempts += r.attempts;
            if r.status == 200 {
                ok += 1;
            }
            if r.attempts > 1 {
                retried += 1;
            }
        }
        progress.update(
            NAME,
            &format!(
                "GET /random {i}/{RANDOM_REQUESTS}: {} — {ok} ok, {retried} needed a retry",
                describe(&res)
            ),
        );
    }
    let hits = srv.hits("/random");
    srv.join().await;
    let passed = first_ok && ok == RANDOM_REQUESTS && retried > 0 && u64::from(attempts) == hits;
    let result = PhaseResult {
        name: NAME,
        expected: "503,503,200 in 3 attempts; 20/20 ok through random 503s".to_owned(),
        measured: format!(
            "/flaky {}; /random {ok}/{RANDOM_REQUESTS} ok, {retried} retried, {attempts} attempts",
            describe(&first)
        ),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// (b) `/down` fails until healed: the breaker opens, calls fail fast, and after the cooldown
/// a HalfOpen probe against the healed upstream closes it again.
async fn phase_breaker(
    client: &Client,
    observer: &DemoObserver,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(b) breaker";
    let started = Instant::now();
    let healed = Arc::new(AtomicBool::new(false));
    let srv = {
        let healed = healed.clone();
        server(2, move |b| {
            b.route(
                "/down",
                Script::respond_with(move |_| {
                    if healed.load(Ordering::SeqCst) {
                        Reply::ok("healed")
                    } else {
                        Reply::status(503)
                    }
                }),
            )
        })
        .await?
    };
    let url = srv.url("/down");
    // Failing: until the breaker refuses a call.
    let mut opened_after = None;
    for i in 1..=10u32 {
        let res = client.send(NetRequest::get(&url)).await;
        progress.update(
            NAME,
            &format!("failing upstream, call {i}: {}", describe(&res)),
        );
        if matches!(&res, Err(e) if e.kind() == ErrorKind::CircuitOpen) {
            opened_after = Some(i);
            break;
        }
    }
    // Open: calls fail fast without reaching the server.
    let hits_at_open = srv.hits("/down");
    let mut fast_failures = 0u32;
    let mut slowest = Duration::ZERO;
    for i in 1..=10u32 {
        let t = Instant::now();
        let res = client.send(NetRequest::get(&url)).await;
        slowest = slowest.max(t.elapsed());
        if matches!(&res, Err(e) if e.kind() == ErrorKind::CircuitOpen) {
            fast_failures += 1;
        }
        progress.update(NAME, &format!("open, call {i}: {}", describe(&res)));
    }
    let hits_while_open = srv.hits("/down") - hits_at_open;
    // The upstream heals; after the cooldown a probe goes through and closes the breaker.
    healed.store(true, Ordering::SeqCst);
    progress.update(NAME, "upstream healed; waiting out the cooldown …");
    tokio::time::sleep(BREAKER_COOLDOWN + Duration::from_millis(100)).await;
    let mut recovered = 0u32;
    for i in 1..=5u32 {
        let res = client.send(NetRequest::get(&url)).await;
        if matches!(&res, Ok(r) if r.status == 200) {
            recovered += 1;
        }
        progress.update(NAME, &format!("recovering, call {i}: {}", describe(&res)));
    }
    // The breaker is keyed by origin: scheme, host and port.
    let origin = srv.origin().to_owned();
    srv.join().await;
    let path = observer.path_of(&origin);
    let expected_path = [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
        BreakerState::Closed,
    ];
    let passed = opened_after.is_some()
        && fast_failures == 10
        && hits_while_open == 0
        && slowest < Duration::from_millis(250)
        && recovered == 5
        && path == expected_path;
    let path_text: Vec<&str> = path.iter().map(|s| s.as_str()).collect();
    let result = PhaseResult {
        name: NAME,
        expected: "opens, 10/10 fail fast (0 hits), closes via half_open".to_owned(),
        measured: format!(
            "CircuitOpen at call {}; {fast_failures}/10 fast (max {:.1} ms, {hits_while_open} hits); {recovered}/5 ok after heal; {}",
            opened_after.map_or("-".to_owned(), |n| n.to_string()),
            slowest.as_secs_f64() * 1e3,
            path_text.join(" -> ")
        ),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// (c) Six concurrent calls to a slow route with a per-host limit of two.
async fn phase_limit(client: &Arc<Client>, progress: Progress) -> Result<PhaseResult, String> {
    const NAME: &str = "(c) rate limit";
    const CALLS: u32 = 6;
    let started = Instant::now();
    let mut srv = server(3, |b| {
        b.route("/slow", Reply::ok("done").delay(Duration::from_millis(500)))
    })
    .await?;
    progress.update(
        NAME,
        &format!("{CALLS} concurrent calls, per_host_concurrency = {HOST_CONCURRENCY} …"),
    );
    let mut tasks = Vec::new();
    for _ in 0..CALLS {
        let (client, url) = (client.clone(), srv.url("/slow"));
        tasks.push(tokio::spawn(async move {
            client.send(NetRequest::get(url)).await
        }));
    }
    let (mut ok, mut limited, mut other) = (0u32, 0u32, Vec::new());
    for task in tasks {
        match task.await {
            Ok(Ok(r)) if r.status == 200 => ok += 1,
            Ok(Err(e)) if e.kind() == ErrorKind::RateLimited => limited += 1,
            Ok(res) => other.push(describe(&res)),
            Err(e) => other.push(format!("task failed: {e}")),
        }
        progress.update(NAME, &format!("{ok} ok, {limited} rate limited"));
    }
    let hits = srv.hits("/slow");
    srv.shutdown().await;
    let passed = (1..=HOST_CONCURRENCY).contains(&ok)
        && ok + limited == CALLS
        && other.is_empty()
        && hits == u64::from(ok);
    let result = PhaseResult {
        name: NAME,
        expected: format!("<= {HOST_CONCURRENCY} ok, the rest RateLimited at once"),
        measured: format!(
            "{ok} ok, {limited} RateLimited (QUOTA.RATE_LIMITED), {hits} reached the server{}",
            if other.is_empty() {
                String::new()
            } else {
                format!("; unexpected: {}", other.join(", "))
            }
        ),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// (d) The cloud metadata address, directly and through a redirect: refused by the guard.
async fn phase_ssrf(
    client: &Client,
    dialer: &LoopbackDialer,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(d) SSRF guard";
    const METADATA: &str = "http://169.254.169.254/latest/meta-data/";
    let started = Instant::now();
    let srv = server(4, |b| b.route("/go", Reply::redirect(302, METADATA))).await?;
    progress.update(NAME, &format!("GET {METADATA} …"));
    let direct = client.send(NetRequest::get(METADATA)).await;
    progress.update(NAME, &format!("direct: {}", describe(&direct)));
    let redirected = client.send(NetRequest::get(srv.url("/go"))).await;
    progress.update(NAME, &format!("via redirect: {}", describe(&redirected)));
    let refused = |r: &Result<NetResponse, NetError>| matches!(r, Err(e) if e.kind() == ErrorKind::Blocked && e.code() == ErrorCode::AuthForbidden);
    let hits = srv.hits("/go");
    srv.join().await;
    let off = dialer.off_loopback().len();
    let passed = refused(&direct) && refused(&redirected) && hits == 1 && off == 0;
    let result = PhaseResult {
        name: NAME,
        expected: "direct and redirect Blocked (AUTH.FORBIDDEN), 0 dials".to_owned(),
        measured: format!(
            "direct {}; redirect {}; {off} dials off loopback",
            describe(&direct),
            describe(&redirected)
        ),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// (e) The head comes after 5 s; the request allows 200 ms to the first byte.
async fn phase_timeout(client: &Client, progress: Progress) -> Result<PhaseResult, String> {
    const NAME: &str = "(e) timeout";
    const TTFB: Duration = Duration::from_millis(200);
    let started = Instant::now();
    let mut srv = server(5, |b| {
        b.route("/late", Reply::ok("late").delay(Duration::from_secs(5)))
    })
    .await?;
    progress.update(
        NAME,
        "GET /late with ttfb = 200 ms (the head comes after 5 s) …",
    );
    let req = NetRequest::get(srv.url("/late")).timeout(TimeoutCfg::default().with_ttfb(TTFB));
    let t = Instant::now();
    let res = client.send(req).await;
    let took = t.elapsed();
    srv.shutdown().await;
    let attempts = res.as_ref().err().map_or(0, NetError::attempts);
    let passed = matches!(&res, Err(e) if e.kind() == ErrorKind::Timeout(Phase::Ttfb)
        && e.code() == ErrorCode::ProviderTimeout)
        && took < Duration::from_secs(3);
    let result = PhaseResult {
        name: NAME,
        expected: "Timeout(ttfb) -> PROVIDER.TIMEOUT, well before 5 s".to_owned(),
        measured: format!(
            "{} after {attempts} attempt(s) in {:.2}s",
            describe(&res),
            took.as_secs_f64()
        ),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// Requests answered from the cache in the cached-GET phase.
const CACHED_GETS: u32 = 5;

/// (f) A cacheable GET: the first goes to the server, the next ones are answered by the
/// CacheHook without a request (no attempt), with the same body.
async fn phase_cache(client: &Client, progress: Progress) -> Result<PhaseResult, String> {
    const NAME: &str = "(f) cache";
    let started = Instant::now();
    let srv = server(6, |b| {
        b.route(
            "/catalog",
            Reply::ok("catalog v1")
                .header("cache-control", "max-age=60")
                .header("etag", "\"v1\""),
        )
    })
    .await?;
    progress.update(NAME, "GET /catalog (max-age=60) …");
    let first = client.send(NetRequest::get(srv.url("/catalog"))).await;
    let first_body = match first {
        Ok(r) if r.status == 200 && r.attempts == 1 => r.text().await.ok(),
        _ => None,
    };
    let mut from_cache = 0u32;
    for i in 1..=CACHED_GETS {
        let res = client.send(NetRequest::get(srv.url("/catalog"))).await;
        if let Ok(r) = res {
            let cached = r.status == 200 && r.attempts == 0;
            if cached && r.text().await.ok() == first_body {
                from_cache += 1;
            }
        }
        progress.update(
            NAME,
            &format!("GET /catalog again {i}/{CACHED_GETS}: {from_cache} from the cache"),
        );
    }
    let hits = srv.hits("/catalog");
    srv.join().await;
    let passed = first_body.is_some() && from_cache == CACHED_GETS && hits == 1;
    let result = PhaseResult {
        name: NAME,
        expected: format!("1st GET from the server, the next {CACHED_GETS} from the cache"),
        measured: format!("{from_cache}/{CACHED_GETS} from the cache, {hits} server hit(s)"),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// (g) Two instances (two clients, each with its own connection) share one tenant quota on
/// Redis: 20 calls each at once against a fleet-wide rps of 10 with a burst of 10.
async fn phase_fleet(
    dialer: &Arc<LoopbackDialer>,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(g) fleet quota";
    const EACH: usize = 20;
    let started = Instant::now();
    let redis = match soulbase_net_testkit::RedisServer::try_start() {
        Ok(Some(redis)) => redis,
        Ok(None) => {
            let result = PhaseResult {
                name: NAME,
                expected: "two instances share one quota on Redis".to_owned(),
                measured: "skipped: redis-server is not installed (cargo xtask ci installs it)"
                    .to_owned(),
                passed: true,
                elapsed: started.elapsed(),
            };
            progress.finish(&result);
            return Ok(result);
        }
        Err(e) => return Err(format!("redis-server did not start: {e}")),
    };
    let srv = server(7, |b| b.route("/quota", Reply::ok("ok"))).await?;
    let instance = || -> Result<Client, String> {
        let mut p = demo_policy();
        p.retry.enabled = false;
        let mut g = soulbase_net_policy::GlobalLimit::default();
        g.rps = 10;
        g.burst = 10;
        g.store_timeout = Duration::from_millis(500);
        p.limits.global = Some(g);
        let store = <soulbase_net_runtime::fleet::RedisRateStore as soulbase_net_runtime::fleet::RedisStore>::new(&redis.url())
            .map_err(|e| e.to_string())?;
        Client::builder()
            .policy(p)
            .dialer(dialer.clone())
            .rate_store(Arc::new(store))
            .build()
            .map_err(|e| format!("could not build a fleet client: {e}"))
    };
    let (a, b) = (instance()?, instance()?);
    progress.update(
        NAME,
        &format!("2 instances × {EACH} calls, quota 10 rps + 10 burst …"),
    );
    let calls = |c: Client| {
        let url = srv.url("/quota");
        async move {
            let mut ok = 0usize;
            for _ in 0..EACH {
                if c.send(NetRequest::get(url.as_str()).tenant("shop"))
                    .await
                    .is_ok()
                {
                    ok += 1;
                }
            }
            ok
        }
    };
    let (ok_a, ok_b) = tokio::join!(calls(a), calls(b));
    let elapsed = started.elapsed();
    let hits = srv.hits("/quota");
    srv.join().await;
    drop(redis);
    // The burst, plus what 10 rps refilled while they ran.
    let ceiling = 10 + (elapsed.as_secs_f64() * 10.0).ceil() as usize;
    let admitted = ok_a + ok_b;
    let passed = admitted >= 10 && admitted <= ceiling && hits == admitted as u64;
    let result = PhaseResult {
        name: NAME,
        expected: format!(
            "≤ {ceiling} of {} admitted in all (not {EACH} each)",
            2 * EACH
        ),
        measured: format!("{ok_a} + {ok_b} admitted, {hits} server hits"),
        passed,
        elapsed,
    };
    progress.finish(&result);
    Ok(result)
}

/// When the outbox phase's delayed item is due, after it is enqueued.
const OUTBOX_DELAY: Duration = Duration::from_millis(300);

/// (h) An outbox on SQLite (a temp file, removed after): a POST whose upstream answers 503
/// twice, then 200, is delivered on the third try, the three attempts carrying one
/// `Idempotency-Key`; an item due 300 ms later arrives not before its time.
async fn phase_outbox(
    dialer: &Arc<LoopbackDialer>,
    observe: Arc<dyn Observer>,
    counted: &DemoObserver,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(h) outbox";
    let started = Instant::now();
    // The receiver notes when the delayed item arrives, on the wall clock its due time is on.
    let arrived: Arc<Mutex<Option<SystemTime>>> = Arc::default();
    let srv = {
        let arrived = arrived.clone();
        server(8, move |b| {
            b.route("/hook", Script::status(503).times(2).then(Reply::ok("ok")))
                .route(
                    "/later",
                    Script::respond_with(move |_| {
                        arrived.lock().get_or_insert_with(SystemTime::now);
                        Reply::ok("ok")
                    }),
                )
        })
        .await?
    };
    let dir = TempDir::new("demo-outbox")?;
    let outbox = Arc::new(demo_outbox(&dir.file("outbox.db"), dialer, observe).await?);
    let running = {
        let o = outbox.clone();
        tokio::spawn(async move { o.run().await })
    };
    let due = SystemTime::now() + OUTBOX_DELAY;
    let delivered = deliver_both(&outbox, &srv, due, progress).await;
    outbox.shutdown();
    let ran = match running.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("the outbox stopped: {e}")),
        Err(e) => Err(format!("the outbox's task: {e}")),
    };
    let arrival = *arrived.lock();
    let seen = OutboxSeen {
        hook: Applied::of(&srv.requests("/hook")),
        key: srv
            .requests("/hook")
            .first()
            .and_then(|r| r.header("idempotency-key"))
            .map(|k| k.chars().take(8).collect())
            .unwrap_or_default(),
        later_hits: srv.hits("/later"),
        // How far past its due time the delayed item arrived; negative: early.
        lateness_ms: arrival.map(|at| match at.duration_since(due) {
            Ok(late) => late.as_secs_f64() * 1e3,
            Err(early) => -early.duration().as_secs_f64() * 1e3,
        }),
        dead: outbox
            .store()
            .dead_letters()
            .await
            .map_or(usize::MAX, |d| d.len()),
        counts: counted.counts(),
        failure: delivered.and(ran).err(),
    };
    srv.join().await;
    let result = PhaseResult {
        name: NAME,
        expected: "delivered on the 3rd try, 1 key on 3 attempts; delayed item not early"
            .to_owned(),
        measured: seen.measured(),
        passed: seen.passed(),
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// The outbox phase's outbox: its client has the demo's policy (loopback granted, nothing
/// else) without retries of its own — the outbox retries across time —, and short backoff
/// (50 ms up to 200 ms) so the phase takes well under a second.
async fn demo_outbox(
    db: &str,
    dialer: &Arc<LoopbackDialer>,
    observe: Arc<dyn Observer>,
) -> Result<Outbox, String> {
    let mut policy = demo_policy();
    policy.retry.enabled = false;
    let client = Client::builder()
        .policy(policy)
        .observer(observe.clone())
        .dialer(dialer.clone())
        .build()
        .map_err(|e| format!("could not build the outbox's client: {e}"))?;
    let store = SqliteStore::open(db)
        .await
        .map_err(|e| format!("could not open the outbox's SQLite file: {e}"))?;
    Outbox::builder()
        .store(Arc::new(store))
        .client(Arc::new(client))
        .workers(4)
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .poll(Duration::from_millis(50))
        .observer(observe)
        .build()
        .map_err(|e| format!("could not build the outbox: {e}"))
}

/// Enqueues the phase's two items and waits (each step within 5 s) for the three attempts at
/// `/hook`, the one at `/later`, and both acknowledged.
async fn deliver_both(
    outbox: &Outbox,
    srv: &FaultServer,
    due: SystemTime,
    progress: Progress,
) -> Result<(), String> {
    const NAME: &str = "(h) outbox";
    const WITHIN: Duration = Duration::from_secs(5);
    progress.update(
        NAME,
        "enqueue POST /hook (503, 503, then 200) and POST /later (due in 300 ms) …",
    );
    for item in [
        OutboxItem::post(srv.url("/hook"), "order=42"),
        OutboxItem::post(srv.url("/later"), "reminder").deliver_at(due),
    ] {
        outbox.enqueue(item).await.map_err(|e| e.to_string())?;
    }
    for n in 1..=3 {
        tokio::time::timeout(WITHIN, srv.wait_for_hits("/hook", n))
            .await
            .map_err(|_| format!("POST /hook: attempt {n} did not come within 5 s"))?;
        progress.update(NAME, &format!("POST /hook: attempt {n} arrived …"));
    }
    tokio::time::timeout(WITHIN, srv.wait_for_hits("/later", 1))
        .await
        .map_err(|_| "POST /later did not come within 5 s".to_owned())?;
    progress.update(NAME, "POST /later arrived; waiting for the acks …");
    outbox_kit::drained(&**outbox.store(), WITHIN).await
}

/// What the outbox phase saw.
#[derive(Debug)]
struct OutboxSeen {
    /// What `/hook`'s receiver applied (dedup by key).
    hook: Applied,
    /// The start of the key `/hook` saw first.
    key: String,
    later_hits: u64,
    /// The delayed item's arrival against its due time, in ms (negative: early).
    lateness_ms: Option<f64>,
    dead: usize,
    counts: Counts,
    /// A wait that timed out, or the outbox failing.
    failure: Option<String>,
}

impl OutboxSeen {
    fn passed(&self) -> bool {
        // Three attempts, every one with the same key, one item.
        let one_key_three_tries = self.hook
            == Applied {
                on_wire: 3,
                effects: 1,
                items: 1,
                shared_keys: 0,
            };
        let c = &self.counts;
        self.failure.is_none()
            && one_key_three_tries
            && self.later_hits == 1
            && self.lateness_ms.is_some_and(|ms| ms >= 0.0)
            && self.dead == 0
            && (c.outbox_delivered, c.outbox_retried, c.outbox_dead) == (2, 2, 0)
    }

    fn measured(&self) -> String {
        let later = match self.lateness_ms {
            Some(ms) if ms >= 0.0 => format!("{ms:.1} ms after its time"),
            Some(ms) => format!("{:.1} ms EARLY", -ms),
            None => "never arrived".to_owned(),
        };
        format!(
            "/hook delivered on try {}, {} key on its attempts ({}…); /later {later}; {} delivered, {} retried, {} dead{}",
            self.hook.on_wire,
            self.hook.effects,
            self.key,
            self.counts.outbox_delivered,
            self.counts.outbox_retried,
            self.dead,
            self.failure
                .as_ref()
                .map_or(String::new(), |f| format!("; {f}"))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo is a smoke test: `cargo test` (and so `cargo xtask ci`) runs it in-process.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_demo_scenario_passes() {
        let _turn = crate::HEAVY.lock().await;
        let report =
            tokio::time::timeout(Duration::from_secs(30), scenario(Progress { live: false }))
                .await
                .expect("the demo finishes within 30 s")
                .expect("the demo sets itself up");
        assert!(report.passed(), "{}\n{}", report.table(), report.events());
        assert!(report.off_loopback_dials.is_empty());
        assert!(report.counts.retries > 0 && report.counts.blocked >= 2);
        // The metrics saw the same run: retries and a breaker opening are in the exposition.
        assert!(
            report.exposition.contains("net_retry_total"),
            "{}",
            report.exposition
        );
        assert!(
            report.exposition.contains("net_circuit_open_total"),
            "{}",
            report.exposition
        );
        // The outbox phase: two deliveries after two retries, and nothing dead.
        assert_eq!(
            (
                report.counts.outbox_delivered,
                report.counts.outbox_retried,
                report.counts.outbox_dead
            ),
            (2, 2, 0)
        );
        assert!(
            report.exposition.contains("net_outbox_delivered_total 2"),
            "{}",
            report.exposition
        );
        assert!(
            report.exposition.ends_with("# EOF\n"),
            "{}",
            report.exposition
        );
    }
}
