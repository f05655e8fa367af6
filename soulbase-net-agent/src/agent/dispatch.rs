//! The dispatcher (seed 002's `dispatcher`): a bounded queue per task kind, a pool of
//! probes per kind under one global bound, and the counts the claim loop reads to claim no
//! more than the queues can hold (backpressure).
//!
//! A kind's capacity is its pool size twice over: as many probes running as its pool allows,
//! and as many leases waiting. A lease counts as outstanding from the claim until its probe
//! ends (or is cancelled); the claim loop asks for at most the free capacity of each kind and
//! waits for `Context::changed` while there is none.
//!
//! A job taken off its queue enters the AIMD windows of its target, its kind and the agent
//! ([`Limits`]) before its probe runs, and feeds the probe's outcome back to them
//! ([`Feedback`]). Ping and trace probes run on a runtime of their own
//! ([`ProbeRuntime`], `AGENT_TRACE_RUNTIME_WORKERS` threads), so that their long waits and
//! raw-socket work do not compete with the agent's own tasks (claims, extensions, reports).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use soulbase_net_runtime::CancellationToken;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::extender::Command;
use super::limits::{Feedback, Limits};
use super::reporter::Pending;
use crate::protocol::{Lease, LeaseReport, ReportStatus, TaskKind, TaskSpec};
use crate::workers::{ProbeResult, Probes};

/// A lease on its way to a probe.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) lease: Lease,
    pub(crate) cancel: CancellationToken,
    pub(crate) claimed_at: Instant,
}

/// One kind's queue and counts.
#[derive(Debug)]
pub(crate) struct Queue {
    pub(crate) capacity: u32,
    pub(crate) outstanding: AtomicU32,
    pub(crate) queued: AtomicU32,
    tx: mpsc::Sender<Job>,
}

/// What every probe's task shares.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) probes: Probes,
    pub(crate) extender: mpsc::UnboundedSender<Command>,
    pub(crate) reporter: mpsc::UnboundedSender<Pending>,
    /// The AIMD windows every probe enters.
    pub(crate) limits: Limits,
    /// Where ping and trace probes run, when they have a runtime of their own.
    pub(crate) probe_runtime: Option<ProbeRuntime>,
    pub(crate) inflight: AtomicU32,
    pub(crate) changed: Notify,
    pub(crate) cancelled: AtomicU64,
    pub(crate) completed: AtomicU64,
    /// The longest a lease waited in a queue, in microseconds.
    pub(crate) max_queue_wait_us: AtomicU64,
}

/// The queues.
#[derive(Debug)]
pub(crate) struct Dispatcher {
    pub(crate) queues: BTreeMap<TaskKind, Arc<Queue>>,
    pub(crate) ctx: Arc<Context>,
    max_outstanding: u32,
}

impl Dispatcher {
    /// Queues for the kinds of `pools` with a pool; the loops that feed their probes are
    /// returned to be spawned.
    pub(crate) fn new(
        pools: &BTreeMap<TaskKind, u32>,
        max_inflight: u32,
        ctx: Arc<Context>,
    ) -> (
        Self,
        Vec<impl std::future::Future<Output = ()> + Send + 'static>,
    ) {
        let mut queues = BTreeMap::new();
        let mut loops = Vec::new();
        for (&kind, &pool) in pools.iter().filter(|(_, &p)| p > 0) {
            let (tx, rx) = mpsc::channel(usize::try_from(pool).unwrap_or(1) * 2);
            let queue = Arc::new(Queue {
                capacity: pool.saturating_mul(2),
                outstanding: AtomicU32::new(0),
                queued: AtomicU32::new(0),
                tx,
            });
            queues.insert(kind, queue.clone());
            loops.push(feed(
                queue,
                rx,
                Arc::new(Semaphore::new(pool as usize)),
                ctx.clone(),
            ));
        }
        (
            Self {
                queues,
                ctx,
                max_outstanding: max_inflight.saturating_mul(2),
            },
            loops,
        )
    }

    /// The free capacity of each kind (kinds with none left out), within the global bound.
    pub(crate) fn free(&self) -> BTreeMap<TaskKind, u32> {
        let total: u32 = self
            .queues
            .values()
            .map(|q| q.outstanding.load(Ordering::Acquire))
            .sum();
        let mut global_free = self.max_outstanding.saturating_sub(total);
        let mut free = BTreeMap::new();
        for (&kind, q) in &self.queues {
            let n = q
                .capacity
                .saturating_sub(q.outstanding.load(Ordering::Acquire))
                .min(global_free);
            if n > 0 {
                free.insert(kind, n);
                global_free -= n;
            }
        }
        free
    }

    /// Leases outstanding (queued or running), all kinds.
    pub(crate) fn outstanding(&self) -> u32 {
        self.queues
            .values()
            .map(|q| q.outstanding.load(Ordering::Acquire))
            .sum()
    }

    /// Leases waiting in the queues, all kinds.
    pub(crate) fn queued(&self) -> u32 {
        self.queues
            .values()
            .map(|q| q.queued.load(Ordering::Acquire))
            .sum()
    }

    /// Queues `job`; `false` (and the job dropped) when its kind has no queue or the queue is
    /// full (the claim asked for more than it could hold, or the control plane sent more).
    pub(crate) fn push(&self, job: Job) -> bool {
        let Some(q) = self.queues.get(&job.lease.spec.kind()) else {
            return false;
        };
        q.outstanding.fetch_add(1, Ordering::AcqRel);
        q.queued.fetch_add(1, Ordering::AcqRel);
        if q.tx.try_send(job).is_ok() {
            return true;
        }
        q.outstanding.fetch_sub(1, Ordering::AcqRel);
        q.queued.fetch_sub(1, Ordering::AcqRel);
        false
    }
}

/// Feeds a kind's probes: one job per permit of the kind's pool.
async fn feed(
    queue: Arc<Queue>,
    mut rx: mpsc::Receiver<Job>,
    pool: Arc<Semaphore>,
    ctx: Arc<Context>,
) {
    loop {
        let Ok(permit) = pool.clone().acquire_owned().await else {
            break;
        };
        let Some(job) = rx.recv().await else { break };
        queue.queued.fetch_sub(1, Ordering::AcqRel);
        let waited = u64::try_from(job.claimed_at.elapsed().as_micros()).unwrap_or(u64::MAX);
        ctx.max_queue_wait_us.fetch_max(waited, Ordering::Relaxed);
        tokio::spawn(run(ctx.clone(), queue.clone(), job, permit));
    }
}

/// Runs one job: its places in the windows, the probe (cancelled when its lease is lost),
/// its outcome fed back to the windows, then the report — never for a cancelled lease.
async fn run(ctx: Arc<Context>, queue: Arc<Queue>, job: Job, kind_permit: OwnedSemaphorePermit) {
    let Job { lease, cancel, .. } = job;
    let places = tokio::select! {
        biased;
        () = cancel.cancelled() => None,
        p = ctx.limits.enter(&lease.spec) => Some(p),
    };
    let result = match places {
        Some(places) => {
            ctx.inflight.fetch_add(1, Ordering::AcqRel);
            let result = tokio::select! {
                biased;
                () = cancel.cancelled() => None,
                r = probe(&ctx, &lease.spec) => Some(r),
            };
            ctx.inflight.fetch_sub(1, Ordering::AcqRel);
            // A cancelled probe says nothing about its target: its places go back uncounted.
            if let Some(r) = &result {
                places.record(Feedback::of(r));
            }
            result
        }
        None => None,
    };
    drop(kind_permit);
    queue.outstanding.fetch_sub(1, Ordering::AcqRel);
    ctx.changed.notify_waiters();
    match result {
        Some(r) if !cancel.is_cancelled() => {
            ctx.completed.fetch_add(1, Ordering::Relaxed);
            let report = LeaseReport {
                lease_id: lease.lease_id,
                task_id: lease.task_id,
                status: r.status,
                observations: r.observations,
                error: r.error,
            };
            let _ = ctx.reporter.send(Pending { report, cancel });
        }
        _ => {
            ctx.cancelled.fetch_add(1, Ordering::Relaxed);
            tracing::info!(lease = %lease.lease_id, task = %lease.task_id, "probe cancelled: not reported");
            let _ = ctx.extender.send(Command::Finish(lease.lease_id));
        }
    }
}

/// Runs `spec`'s probe: on the probe runtime for ping and trace when there is one, here
/// otherwise.
async fn probe(ctx: &Context, spec: &TaskSpec) -> ProbeResult {
    let Some(runtime) = ctx
        .probe_runtime
        .as_ref()
        .filter(|_| matches!(spec.kind(), TaskKind::Ping | TaskKind::Trace))
    else {
        return ctx.probes.run(spec).await;
    };
    let probes = ctx.probes.clone();
    let owned = spec.clone();
    let mut task = AbortOnDrop(
        runtime
            .handle()
            .spawn(async move { probes.run(&owned).await }),
    );
    match (&mut task.0).await {
        Ok(result) => result,
        Err(e) => ProbeResult {
            status: ReportStatus::Error,
            observations: Vec::new(),
            error: Some(format!("the probe's task failed: {e}")),
        },
    }
}

/// Aborts the probe runtime's task when the probe is given up (its lease cancelled).
struct AbortOnDrop(tokio::task::JoinHandle<ProbeResult>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The runtime of ping and trace probes (`AGENT_TRACE_RUNTIME_WORKERS` worker threads),
/// shut down in the background when the agent goes (a runtime cannot be dropped from
/// within another's task).
#[derive(Debug)]
pub(crate) struct ProbeRuntime {
    runtime: Option<tokio::runtime::Runtime>,
}

impl ProbeRuntime {
    /// A multi-threaded runtime of `workers` threads named `agent-trace-N`.
    ///
    /// # Errors
    /// When the threads cannot be started.
    pub(crate) fn new(workers: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .thread_name("agent-trace")
            .enable_all()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    /// Its handle.
    fn handle(&self) -> tokio::runtime::Handle {
        match &self.runtime {
            Some(rt) => rt.handle().clone(),
            // Only while being dropped; never seen by a probe.
            None => tokio::runtime::Handle::current(),
        }
    }

    /// Its worker threads.
    pub(crate) fn workers(&self) -> usize {
        self.runtime
            .as_ref()
            .map_or(0, |rt| rt.metrics().num_workers())
    }
}

impl Drop for ProbeRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
