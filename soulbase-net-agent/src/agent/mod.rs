//! The agent: registers with its control plane, claims leased tasks as its queues have room,
//! runs them, keeps their leases alive while they run, and reports what they observed.
//!
//! It owns its leases while it holds them and nothing else: tasks, their schedule and their
//! results are the control plane's.
//!
//! The parts, each a task of its own (seed 002's flow, Claim → Dispatch → Execute → Report):
//!
//! - the **claim loop** asks for as many leases of each kind as the dispatcher can hold
//!   ([`ClaimRequest`]'s `capacity`), waits while it can hold
//!   none (backpressure), and backs off (doubling, jittered) when a batch comes back empty or
//!   a call fails;
//! - the **dispatcher** (`dispatch`): a bounded queue and a pool per kind; each probe enters
//!   the AIMD windows (`limits`) of its target, its kind and the agent — ceilings
//!   [`TargetLimits::max`], the kind's pool, `max_inflight` — and feeds its outcome back
//!   ([`AgentHandle::concurrency`] shows them);
//! - the **timer service** (`timer`): one timer queue for the claim loop's and the
//!   reporter's back-off, the heartbeat and the extender's schedule, its depth and lag warned
//!   about and measured;
//! - the **lease extender** (`extender`): extends every held lease on schedule; a lease the
//!   control plane says is lost, or that ran out before it could be extended, has its probe
//!   cancelled and is never reported done;
//! - the **reporter** (`reporter`): sends reports in batches, retried until acknowledged;
//! - the **heartbeat**: every `heartbeat_every`, or as often as the control plane asks at
//!   registration when that is more often, with the agent's load; a refused heartbeat
//!   makes the agent register again (resume).

mod backoff;
mod client;
mod config;
mod dispatch;
mod extender;
mod limits;
mod reporter;
mod timer;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use soulbase_net_core::{ErrorKind, NetError};
use soulbase_net_runtime::serve::Http1Server;
use soulbase_net_runtime::CancellationToken;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use self::client::ControlClient;
pub use self::config::AgentConfig;
pub use self::limits::{ConcurrencySnapshot, TargetLimits, WindowSnapshot};

use self::backoff::Backoff;
use self::dispatch::{Context, Dispatcher, Job, ProbeRuntime};
use self::extender::{Command, ExtenderStats};
use self::limits::Limits;
use self::reporter::ReporterStats;
use self::timer::TimerService;
use crate::forwarder::{Forwarder, LiveStats};
use crate::protocol::{
    ClaimRequest, HeartbeatRequest, RegisterRequest, RegisterResponse, TaskKind,
};
use crate::workers::Probes;

/// What an agent has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentStats {
    /// Leases claimed.
    pub claimed: u64,
    /// Probes finished and handed to the reporter.
    pub completed: u64,
    /// Probes cancelled (lease lost, run out, or the agent stopping): never reported.
    pub cancelled: u64,
    /// Reports the control plane accepted.
    pub reports_accepted: u64,
    /// Reports it refused (the lease was no longer this agent's).
    pub reports_refused: u64,
    /// Reports dropped before sending because their lease was lost meanwhile.
    pub reports_dropped: u64,
    /// Lease extensions granted.
    pub extended: u64,
    /// Leases the control plane said were lost (revoked or taken over).
    pub lost: u64,
    /// Leases that ran out before they could be extended.
    pub expired: u64,
    /// Probes running now.
    pub inflight: u32,
    /// Leases waiting in the queues now.
    pub queued: u32,
    /// Leases tracked by the extender now (queued, running, or waiting for their report's
    /// acknowledgement).
    pub held: u32,
    /// The longest a lease waited in a queue so far.
    pub max_queue_wait: Duration,
    /// Timers waiting in the timer service now.
    pub timer_depth: u64,
    /// The latest a timer of the timer service fired after its instant, so far.
    pub timer_max_lag: Duration,
    /// Timers that fired later than the lag threshold (100 ms).
    pub timers_late: u64,
}

/// What the agent's tasks share.
#[derive(Debug)]
struct Shared {
    config: AgentConfig,
    client: ControlClient,
    dispatcher: Dispatcher,
    extender: mpsc::UnboundedSender<Command>,
    extender_stats: Arc<ExtenderStats>,
    reporter_stats: Arc<ReporterStats>,
    timers: TimerService,
    heartbeat_every: Duration,
    claimed: AtomicU64,
    lease: Duration,
    /// The UDP DNS forwarder's counters, once one is attached to the metrics.
    forwarder: OnceLock<LiveStats>,
}

/// A running agent. [`shutdown`](Self::shutdown) stops it gracefully, [`kill`](Self::kill)
/// at once (as a crash would); dropping it kills it.
#[derive(Debug)]
pub struct AgentHandle {
    shared: Arc<Shared>,
    /// The parent of every lease's token: cancelled, every probe stops.
    root: CancellationToken,
    /// Cancelled, the claim loop stops.
    stop_claiming: CancellationToken,
    /// The claim loop: `shutdown` waits for it to end before it judges the agent idle.
    claimer: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    registration: RegisterResponse,
}

/// Starts an agent: registers (or resumes) with the control plane, then runs until stopped.
///
/// # Errors
/// `InvalidRequest` for a configuration that cannot work; the registration's error when the
/// control plane refuses it or cannot be reached.
pub async fn start(config: AgentConfig) -> Result<AgentHandle, NetError> {
    config.validate()?;
    let client = ControlClient::new(&config)?;
    let probes = Probes::new(&config.probe_policy, &config.dns_servers)?;
    let registration = client.register(&register_request(&config)).await?;
    tracing::info!(agent = %config.agent_id, session = registration.session, resumed = registration.resumed, "registered");
    let lease = Duration::from_millis(registration.lease_ms.max(2));
    let extend_every = config
        .extend_every
        .min(lease / 3)
        .max(Duration::from_millis(1));
    // A control plane that wants beats more often than configured counts an agent beating
    // less often as stale (and returns its leases): its period wins.
    let heartbeat_every = match registration.heartbeat_ms {
        0 => config.heartbeat_every,
        ms => config.heartbeat_every.min(Duration::from_millis(ms)),
    }
    .max(Duration::from_millis(1));

    let (extender_tx, extender_rx) = mpsc::unbounded_channel();
    let (reporter_tx, reporter_rx) = mpsc::unbounded_channel();
    let extender_stats = Arc::new(ExtenderStats::default());
    let reporter_stats = Arc::new(ReporterStats::default());
    let probe_runtime = probe_runtime(&config)?;
    let ctx = Arc::new(Context {
        probes,
        extender: extender_tx.clone(),
        reporter: reporter_tx,
        limits: Limits::new(
            config.max_inflight,
            &config.pools,
            config.target_limits.clone(),
        ),
        probe_runtime,
        inflight: Default::default(),
        changed: Default::default(),
        cancelled: Default::default(),
        completed: Default::default(),
        max_queue_wait_us: Default::default(),
    });
    let (dispatcher, feeds) = Dispatcher::new(&config.pools, config.max_inflight, ctx);
    let mut tasks: Vec<JoinHandle<()>> = feeds.into_iter().map(tokio::spawn).collect();
    let (timers, timer_driver) = TimerService::new();
    tasks.push(tokio::spawn(timer_driver));
    tasks.push(tokio::spawn(extender::run(
        client.clone(),
        extender_rx,
        (extend_every, lease),
        timers.clone(),
        extender_stats.clone(),
    )));
    tasks.push(tokio::spawn(reporter::run(
        client.clone(),
        reporter_rx,
        extender_tx.clone(),
        (config.claim_backoff_min, config.claim_backoff_max),
        timers.clone(),
        reporter_stats.clone(),
    )));
    let shared = Arc::new(Shared {
        config,
        client,
        dispatcher,
        extender: extender_tx,
        extender_stats,
        reporter_stats,
        timers,
        heartbeat_every,
        claimed: AtomicU64::new(0),
        lease,
        forwarder: OnceLock::new(),
    });
    let root = CancellationToken::new();
    let stop_claiming = CancellationToken::new();
    tasks.push(tokio::spawn(heartbeat_loop(shared.clone())));
    let claimer = tokio::spawn(claim_loop(
        shared.clone(),
        root.clone(),
        stop_claiming.clone(),
    ));
    Ok(AgentHandle {
        shared,
        root,
        stop_claiming,
        claimer: Some(claimer),
        tasks,
        registration,
    })
}

/// The runtime of ping and trace probes: `trace_runtime_workers` threads (at least 2, the
/// seed's minimum), when either kind has a pool.
fn probe_runtime(config: &AgentConfig) -> Result<Option<ProbeRuntime>, NetError> {
    let wanted = [TaskKind::Ping, TaskKind::Trace]
        .iter()
        .any(|k| config.pools.get(k).is_some_and(|&n| n > 0));
    if !wanted {
        return Ok(None);
    }
    let workers = config.trace_runtime_workers.max(2);
    ProbeRuntime::new(workers).map(Some).map_err(|e| {
        NetError::new(ErrorKind::Io)
            .with_message(format!(
                "agent: cannot start the trace runtime's {workers} threads"
            ))
            .with_source(e)
    })
}

fn register_request(config: &AgentConfig) -> RegisterRequest {
    RegisterRequest {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        kinds: config
            .pools
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(&k, _)| k)
            .collect(),
        max_inflight: config.max_inflight,
        hostname: std::env::var("HOSTNAME").ok(),
    }
}

/// Claims while there is room, backing off while nothing comes.
async fn claim_loop(shared: Arc<Shared>, root: CancellationToken, stop: CancellationToken) {
    let config = &shared.config;
    let mut backoff = Backoff::new(config.claim_backoff_min, config.claim_backoff_max);
    let ctx = shared.dispatcher.ctx.clone();
    while !stop.is_cancelled() {
        // Registered before the check, so a probe ending in between is not missed.
        let changed = ctx.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let capacity = shared.dispatcher.free();
        if capacity.is_empty() {
            tokio::select! {
                () = stop.cancelled() => break,
                () = changed => continue,
            }
        }
        let sent = Instant::now();
        let request = ClaimRequest { capacity };
        // A claim in flight is not given up when the agent stops: the control plane may have
        // leased tasks to it already, and dropping its answer would leave them held, unknown
        // to anyone, until their leases run out. Its leases are queued and run as any other
        // (`shutdown` waits for this loop first); `kill` aborts the loop, answer and all.
        let answer = shared.client.claim(&request).await;
        let wait = match answer {
            Ok(batch) if batch.leases.is_empty() => backoff.next_delay(),
            Ok(batch) => {
                backoff.reset();
                shared
                    .claimed
                    .fetch_add(batch.leases.len() as u64, Ordering::Relaxed);
                for lease in batch.leases {
                    let cancel = root.child_token();
                    let until = sent + Duration::from_millis(lease.lease_ms);
                    let lease_id = lease.lease_id.clone();
                    let _ = shared.extender.send(Command::Track {
                        lease_id: lease_id.clone(),
                        cancel: cancel.clone(),
                        until,
                    });
                    let job = Job {
                        lease,
                        cancel,
                        claimed_at: sent,
                    };
                    if !shared.dispatcher.push(job) {
                        tracing::warn!(lease = %lease_id, "no room for a claimed lease: dropped, it will run out");
                        let _ = shared.extender.send(Command::Revoke(lease_id));
                    }
                }
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Blocked => {
                // The control plane does not know this agent (any more): register again.
                tracing::warn!(error = %e, "claim refused: registering again");
                if let Err(e) = shared.client.register(&register_request(config)).await {
                    tracing::warn!(error = %e, "registering again failed");
                }
                backoff.next_delay()
            }
            Err(e) => {
                tracing::warn!(error = %e, "claim failed");
                backoff.next_delay()
            }
        };
        tokio::select! {
            () = stop.cancelled() => break,
            () = shared.timers.sleep(wait) => {}
        }
    }
}

/// Beats every `heartbeat_every` (or the control plane's period); registers again when the
/// control plane no longer knows the agent.
async fn heartbeat_loop(shared: Arc<Shared>) {
    let every = shared.heartbeat_every;
    let mut next = Instant::now();
    loop {
        shared.timers.sleep_until(next).await;
        // A beat late (a slow call, a starved runtime) is not made up: the next is a period on.
        next = (next + every).max(Instant::now());
        let beat = HeartbeatRequest {
            inflight: shared.dispatcher.ctx.inflight.load(Ordering::Relaxed),
            queued: shared.dispatcher.queued(),
            leases: u32::try_from(shared.extender_stats.tracked.load(Ordering::Relaxed))
                .unwrap_or(u32::MAX),
        };
        match shared.client.heartbeat(&beat).await {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Blocked => {
                tracing::warn!(error = %e, "heartbeat refused: registering again");
                if let Err(e) = shared
                    .client
                    .register(&register_request(&shared.config))
                    .await
                {
                    tracing::warn!(error = %e, "registering again failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
    }
}

impl Shared {
    /// What the agent has done so far.
    fn stats(&self) -> AgentStats {
        let ctx = &self.dispatcher.ctx;
        let ext = &self.extender_stats;
        let rep = &self.reporter_stats;
        AgentStats {
            claimed: self.claimed.load(Ordering::Relaxed),
            completed: ctx.completed.load(Ordering::Relaxed),
            cancelled: ctx.cancelled.load(Ordering::Relaxed),
            reports_accepted: rep.accepted.load(Ordering::Relaxed),
            reports_refused: rep.refused.load(Ordering::Relaxed),
            reports_dropped: rep.dropped.load(Ordering::Relaxed),
            extended: ext.extended.load(Ordering::Relaxed),
            lost: ext.lost.load(Ordering::Relaxed),
            expired: ext.expired.load(Ordering::Relaxed),
            inflight: ctx.inflight.load(Ordering::Relaxed),
            queued: self.dispatcher.queued(),
            held: u32::try_from(ext.tracked.load(Ordering::Relaxed)).unwrap_or(u32::MAX),
            max_queue_wait: Duration::from_micros(ctx.max_queue_wait_us.load(Ordering::Relaxed)),
            timer_depth: self.timers.stats().depth.load(Ordering::Relaxed) as u64,
            timer_max_lag: Duration::from_micros(
                self.timers.stats().max_lag_us.load(Ordering::Relaxed),
            ),
            timers_late: self.timers.stats().late.load(Ordering::Relaxed),
        }
    }

    /// The agent's metrics in the Prometheus text format (see
    /// [`AgentHandle::metrics_text`]).
    fn metrics_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP agent_dispatcher_queue_fill Leases outstanding per kind, as a share of the kind's capacity.\n# TYPE agent_dispatcher_queue_fill gauge");
        for (kind, q) in &self.dispatcher.queues {
            let fill =
                f64::from(q.outstanding.load(Ordering::Relaxed)) / f64::from(q.capacity.max(1));
            let _ = writeln!(out, "agent_dispatcher_queue_fill{{kind=\"{kind}\"}} {fill}");
        }
        let s = self.stats();
        let _ = writeln!(
            out,
            "# HELP agent_inflight Probes running.\n# TYPE agent_inflight gauge\nagent_inflight {}",
            s.inflight
        );
        for (name, v) in [
            ("agent_claimed_total", s.claimed),
            ("agent_completed_total", s.completed),
            ("agent_cancelled_total", s.cancelled),
            ("agent_reports_accepted_total", s.reports_accepted),
            ("agent_reports_refused_total", s.reports_refused),
            ("agent_leases_lost_total", s.lost),
            ("agent_leases_expired_total", s.expired),
        ] {
            let _ = writeln!(out, "# TYPE {name} counter\n{name} {v}");
        }
        self.concurrency_metrics(&mut out);
        let _ = writeln!(
            out,
            "# HELP agent_timer_queue_depth Timers waiting in the timer service.\n\
             # TYPE agent_timer_queue_depth gauge\nagent_timer_queue_depth {}\n\
             # HELP agent_timer_lag_seconds_max The latest a timer fired after its instant.\n\
             # TYPE agent_timer_lag_seconds_max gauge\nagent_timer_lag_seconds_max {}\n\
             # TYPE agent_timer_late_total counter\nagent_timer_late_total {}",
            s.timer_depth,
            s.timer_max_lag.as_secs_f64(),
            s.timers_late
        );
        if let Some(forwarder) = self.forwarder.get() {
            forwarder.snapshot().write_metrics(&mut out);
        }
        out
    }

    /// The seed's `concurrency.inflight` and the windows, per level:
    /// `agent_concurrency_window{level,kind|target}` (the limit),
    /// `agent_concurrency_inflight{…}`, and `agent_concurrency_backpressure_total` (probes
    /// that waited for a window).
    fn concurrency_metrics(&self, out: &mut String) {
        let c = self.dispatcher.ctx.limits.snapshot();
        let _ = writeln!(out, "# HELP agent_concurrency_window The AIMD window's limit.\n# TYPE agent_concurrency_window gauge\n# HELP agent_concurrency_inflight Probes in the AIMD window.\n# TYPE agent_concurrency_inflight gauge");
        let mut line = |labels: String, w: &WindowSnapshot| {
            let _ = writeln!(out, "agent_concurrency_window{{{labels}}} {}", w.limit);
            let _ = writeln!(
                out,
                "agent_concurrency_inflight{{{labels}}} {}",
                w.in_flight
            );
        };
        if let Some(g) = &c.global {
            line("level=\"global\"".to_owned(), g);
        }
        for (kind, w) in &c.kinds {
            line(format!("level=\"kind\",kind=\"{kind}\""), w);
        }
        for (target, w) in &c.targets {
            let target = target.replace('\\', "\\\\").replace('"', "\\\"");
            line(format!("level=\"target\",target=\"{target}\""), w);
        }
        let _ = writeln!(
            out,
            "# TYPE agent_concurrency_backpressure_total counter\nagent_concurrency_backpressure_total {}\n\
             # TYPE agent_concurrency_targets_evicted_total counter\nagent_concurrency_targets_evicted_total {}",
            c.waits, c.evicted
        );
    }
}

impl AgentHandle {
    /// What the control plane answered at registration.
    pub fn registration(&self) -> &RegisterResponse {
        &self.registration
    }

    /// The lease time the control plane gives.
    pub fn lease(&self) -> Duration {
        self.shared.lease
    }

    /// What the agent has done so far.
    pub fn stats(&self) -> AgentStats {
        self.shared.stats()
    }

    /// The agent's metrics in the Prometheus text format: the seed's
    /// `dispatcher.queue.fill` per kind (as `agent_dispatcher_queue_fill{kind}`, the share of
    /// the kind's capacity outstanding), probes in flight, the counters of [`AgentStats`],
    /// the AIMD windows (`agent_concurrency_window{level="global"|"kind"|"target",…}`, their
    /// `agent_concurrency_inflight`, `agent_concurrency_backpressure_total`) and the timer
    /// service (`agent_timer_queue_depth`, `agent_timer_lag_seconds_max`,
    /// `agent_timer_late_total`); with a forwarder attached
    /// ([`attach_forwarder`](Self::attach_forwarder)), its counters
    /// (`agent_dns_forwarder_*`: received, dropped, forwarded, timed out, failed, mismatched,
    /// in flight and its peak, the latency histogram `agent_dns_forwarder_latency_seconds`).
    pub fn metrics_text(&self) -> String {
        self.shared.metrics_text()
    }

    /// The soulbase-net client's metrics of the agent's calls to its control plane (requests
    /// by outcome, latency, retries, breaker transitions) in the OpenMetrics text format,
    /// ending in `# EOF`; served at `/metrics/client` by
    /// [`serve_metrics`](Self::serve_metrics).
    pub fn client_metrics_text(&self) -> String {
        self.shared.client.metrics().encode()
    }

    /// Shows `forwarder`'s counters ([`Forwarder::stats`]) on the agent's metrics
    /// ([`metrics_text`](Self::metrics_text), `/metrics`) from now on; after the forwarder
    /// stops, its final counts. The forwarder runs on its own (it serves before the agent
    /// registers), so it is attached once both are started.
    ///
    /// One forwarder per agent: `false`, and nothing changes, when one is attached already.
    pub fn attach_forwarder(&self, forwarder: &Forwarder) -> bool {
        self.shared.forwarder.set(forwarder.counters()).is_ok()
    }

    /// Serves `GET /metrics` (as [`metrics_text`](Self::metrics_text)) and `GET /health` on
    /// `addr` until the agent stops; the address bound.
    ///
    /// # Errors
    /// `Io` when `addr` cannot be bound.
    pub async fn serve_metrics(&mut self, addr: SocketAddr) -> Result<SocketAddr, NetError> {
        let io = |e: std::io::Error| {
            NetError::new(ErrorKind::Io)
                .with_message(format!("agent metrics: cannot listen on {addr}"))
                .with_source(e)
        };
        let listener = TcpListener::bind(addr).await.map_err(io)?;
        let local = listener.local_addr().map_err(io)?;
        self.tasks
            .push(tokio::spawn(serve_metrics(self.shared.clone(), listener)));
        Ok(local)
    }

    /// The AIMD windows now: the agent's, each kind's, each target's (see
    /// [`TargetLimits`]).
    pub fn concurrency(&self) -> ConcurrencySnapshot {
        self.shared.dispatcher.ctx.limits.snapshot()
    }

    /// The worker threads of the runtime ping and trace probes run on (0 when there is none:
    /// neither kind has a pool).
    pub fn trace_runtime_workers(&self) -> usize {
        self.shared
            .dispatcher
            .ctx
            .probe_runtime
            .as_ref()
            .map_or(0, ProbeRuntime::workers)
    }

    /// The free capacity of each kind now (what the next claim would ask for).
    pub fn free_capacity(&self) -> std::collections::BTreeMap<TaskKind, u32> {
        self.shared.dispatcher.free()
    }

    /// Stops claiming (a claim in flight is answered, and its leases are queued), lets the
    /// probes running and queued finish and their reports be acknowledged, within `grace`;
    /// then stops everything (what is left is cancelled and unreported, its leases run out at
    /// the control plane).
    pub async fn shutdown(mut self, grace: Duration) {
        self.stop_claiming.cancel();
        let deadline = Instant::now() + grace;
        if let Some(claimer) = self.claimer.as_mut() {
            // Ends at the next turn of the loop, or when the claim in flight is answered.
            let _ = tokio::time::timeout_at(deadline, claimer).await;
        }
        let ctx = self.shared.dispatcher.ctx.clone();
        loop {
            let changed = ctx.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let idle = self.shared.dispatcher.outstanding() == 0
                && self.shared.extender_stats.tracked.load(Ordering::Relaxed) == 0;
            if idle || Instant::now() >= deadline {
                break;
            }
            // Reports are acknowledged without a probe ending: look again now and then.
            let _ = tokio::time::timeout_at(
                deadline.min(Instant::now() + Duration::from_millis(20)),
                changed,
            )
            .await;
        }
        self.kill();
    }

    /// Stops at once, as a crash would: every probe is cancelled, nothing more is reported
    /// or extended, and the leases held run out at the control plane.
    pub fn kill(mut self) {
        self.abort();
    }

    fn abort(&mut self) {
        self.stop_claiming.cancel();
        for task in self.claimer.take().into_iter().chain(self.tasks.drain(..)) {
            task.abort();
        }
        self.root.cancel();
    }
}

/// The metrics endpoint: `GET /metrics` and `GET /health` on the runtime's HTTP/1.1 server
/// loop, until the agent's tasks are aborted.
async fn serve_metrics(shared: Arc<Shared>, listener: TcpListener) {
    use bytes::Bytes;
    use http_body_util::Full;

    let answer = move |req: hyper::Request<hyper::body::Incoming>| {
        let shared = shared.clone();
        async move {
            let (status, body) = match (req.method(), req.uri().path()) {
                (&hyper::Method::GET, "/metrics") => (200, shared.metrics_text()),
                (&hyper::Method::GET, "/metrics/client") => {
                    let mut res = shared
                        .client
                        .metrics()
                        .http_response()
                        .map(|text| Full::new(Bytes::from(text)));
                    *res.status_mut() = hyper::StatusCode::OK;
                    return res;
                }
                (&hyper::Method::GET, "/health") => (200, "{\"status\":\"ok\"}".to_owned()),
                _ => (404, "GET /metrics, /metrics/client or /health\n".to_owned()),
            };
            let mut res = hyper::Response::new(Full::new(Bytes::from(body)));
            *res.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
            res
        }
    };
    Http1Server::new(listener)
        .serve(answer, std::future::pending())
        .await;
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        self.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tokio::net::UdpSocket;

    use super::*;
    use crate::control::{ControlConfig, ControlPlane};
    use crate::forwarder::ForwarderConfig;

    #[tokio::test]
    async fn the_control_clients_own_metrics_are_served_at_metrics_client() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let control = ControlPlane::start(ControlConfig::default()).await.unwrap();
        let config = AgentConfig::new(control.url(), "agent-client-metrics", "a-long-token");
        let mut agent = start(config).await.unwrap();
        // Registered: at least one call to the control plane went through the client.
        let text = agent.client_metrics_text();
        let requests = text
            .lines()
            .find(|l| l.starts_with("net_requests_total{") && l.contains("outcome=\"ok\""))
            .unwrap_or_else(|| panic!("no successful request counted in\n{text}"));
        let count: f64 = requests.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(count >= 1.0, "{requests}");
        assert!(text.ends_with("# EOF\n"));

        let addr = agent
            .serve_metrics("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics/client HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("content-type: application/openmetrics-text"),
            "{answer}"
        );
        assert!(answer.contains("net_requests_total{"), "{answer}");
        agent.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn the_dns_forwarders_counters_are_on_the_agents_metrics_once_attached() {
        let control = ControlPlane::start(ControlConfig::default()).await.unwrap();
        let mut config = AgentConfig::new(control.url(), "agent-fwd", "a-long-token");
        config.pools = BTreeMap::from([(TaskKind::Dns, 1)]);
        let agent = start(config).await.unwrap();
        // An upstream answering each query with its own bytes, the response bit set.
        let upstream = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let upstream_addr = upstream.local_addr().unwrap();
        let answering = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            loop {
                let (n, from) = upstream.recv_from(&mut buf).await.unwrap();
                buf[2] |= 0x80;
                upstream.send_to(&buf[..n], from).await.unwrap();
            }
        });
        let listen = "127.0.0.1:0".parse().unwrap();
        let forwarder = Forwarder::start(ForwarderConfig::new(listen, upstream_addr))
            .await
            .unwrap();
        assert!(!agent.metrics_text().contains("agent_dns_forwarder"));
        assert!(agent.attach_forwarder(&forwarder));
        assert!(
            !agent.attach_forwarder(&forwarder),
            "one forwarder per agent"
        );

        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let query = [0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        client
            .send_to(&query, forwarder.local_addr())
            .await
            .unwrap();
        let mut answer = [0u8; 512];
        let (n, _) = tokio::time::timeout(Duration::from_secs(5), client.recv_from(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&answer[..2], &query[..2]);
        assert_eq!(n, query.len());

        // The answer is sent before it is counted: wait for the count.
        let deadline = Instant::now() + Duration::from_secs(5);
        while forwarder.stats().forwarded == 0 {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let text = agent.metrics_text();
        for line in [
            "agent_dns_forwarder_received_total 1",
            "agent_dns_forwarder_forwarded_total 1",
            "agent_dns_forwarder_timed_out_total 0",
            "agent_dns_forwarder_inflight_peak 1",
            "agent_dns_forwarder_latency_seconds_bucket{le=\"+Inf\"} 1",
            "agent_dns_forwarder_latency_seconds_count 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        // The agent's own metrics are still there.
        assert!(text.contains("agent_timer_queue_depth"));

        forwarder.shutdown().await;
        assert!(agent
            .metrics_text()
            .contains("agent_dns_forwarder_forwarded_total 1"));
        answering.abort();
        agent.kill();
        control.shutdown().await;
    }
}
