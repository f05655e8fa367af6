//! `cargo xtask demo`: the project's main job on an embedded default, in a few seconds.
//!
//! Starts [`FaultServer`]s on loopback and drives one [`Client`] through phases a person can
//! watch: a flaky endpoint retried to success, a failing one tripping the circuit breaker and
//! recovering through HalfOpen, a concurrency limit, SSRF attempts refused, a first-byte
//! timeout, a cached GET (the same client with a `CacheHook`), two instances sharing a quota
//! on Redis, an outbox on SQLite (a temp file) delivering a POST on its third try with one
//! `Idempotency-Key` and a delayed item not before its time, and the SLO controller slowing
//! down a host whose calls start timing out, then letting it go once healed, the delay server,
//! and the probe agent (seed 002: a control plane and an agent on loopback, a few probes of each
//! kind, their observations printed). Each phase prints a live progress
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
use soulbase_net_runtime::{testing::LoopbackDialer, Client};
use soulbase_net_testkit::{FaultServer, FaultServerBuilder, RandomFaults, Reply, Script};
use tokio::time::Instant;

use crate::{
    contract::slo::{load, policy as slo_policy, storm},
    outbox_kit::{self, Applied, TempDir},
};

mod client;
mod durable;
mod probes;

use self::{client::*, durable::*, probes::*};

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
        phase_probes(progress).await?,
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
