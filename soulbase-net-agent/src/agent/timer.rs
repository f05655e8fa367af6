//! The timer service (seed 002's `runtime::timer`, `TimerService`): one queue of timers,
//! earliest first, for the agent's own waits — the claim loop's and the reporter's back-off,
//! the heartbeat, the lease extender's schedule — driven by one task with one runtime timer.
//!
//! Why one queue: its depth and its lag (how late a timer fires after its instant) are the
//! agent's scheduling health in two numbers. A depth above [`QUEUE_WARN_DEPTH`] means timers
//! are made faster than they fire (a leak); a lag above [`LAG_WARN_THRESHOLD`] means the
//! runtime is starved (blocking work, too few threads), and heartbeats and extensions go
//! out late — what makes leases run out. Each is warned about (`tracing::warn`, at most once
//! a second for the lag, once per crossing for the depth) and reported as metrics
//! (`agent_timer_queue_depth`, `agent_timer_lag_seconds_max`, `agent_timer_late_total`).
//!
//! A sleep given up (its future dropped) leaves its entry until it is due or the queue is
//! swept: the queue drops abandoned entries whenever it has doubled since the last sweep.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// A queue deeper than this is warned about. The seed names the threshold without a value:
/// the agent's own users hold a handful of timers (one per loop), so a thousand means a leak.
pub(crate) const QUEUE_WARN_DEPTH: usize = 1024;

/// A timer firing later than this after its instant is warned about. The seed names the
/// threshold without a value: 100 ms is a twentieth of the default extension period (2 s),
/// late enough to be a starved runtime rather than scheduling noise.
pub(crate) const LAG_WARN_THRESHOLD: Duration = Duration::from_millis(100);

/// The shortest time between two lag warnings.
const LAG_WARN_EVERY: Duration = Duration::from_secs(1);

/// What the timer service counts.
#[derive(Debug, Default)]
pub(crate) struct TimerStats {
    /// Timers waiting now.
    pub(crate) depth: AtomicUsize,
    /// Timers fired.
    pub(crate) fired: AtomicU64,
    /// Timers fired later than [`LAG_WARN_THRESHOLD`].
    pub(crate) late: AtomicU64,
    /// The longest lag so far, in microseconds.
    pub(crate) max_lag_us: AtomicU64,
    /// Times the depth crossed [`QUEUE_WARN_DEPTH`].
    pub(crate) depth_warnings: AtomicU64,
}

/// The handle to the timer queue; clones share it.
#[derive(Clone, Debug)]
pub(crate) struct TimerService {
    tx: mpsc::UnboundedSender<Entry>,
    stats: Arc<TimerStats>,
}

#[derive(Debug)]
struct Entry {
    at: Instant,
    seq: u64,
    fire: oneshot::Sender<()>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed: the earliest on top of the (max-)heap, first made first among equals.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl TimerService {
    /// A timer service and its driver, to be spawned; the driver ends when every handle is
    /// gone.
    pub(crate) fn new() -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(TimerStats::default());
        (
            Self {
                tx,
                stats: stats.clone(),
            },
            drive(rx, stats),
        )
    }

    /// Resolves at `at` (or just after: its lag is measured). Should the driver be gone, it
    /// sleeps on the runtime's timer instead.
    pub(crate) fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + 'static {
        let (fire, fired) = oneshot::channel();
        let queued = self.tx.send(Entry { at, seq: 0, fire }).is_ok();
        async move {
            if !queued || fired.await.is_err() {
                tokio::time::sleep_until(at).await;
            }
        }
    }

    /// Resolves after `wait`.
    pub(crate) fn sleep(&self, wait: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.sleep_until(Instant::now() + wait)
    }

    /// What the service counts.
    pub(crate) fn stats(&self) -> &TimerStats {
        &self.stats
    }
}

/// The driver: takes new timers, fires those due.
async fn drive(mut rx: mpsc::UnboundedReceiver<Entry>, stats: Arc<TimerStats>) {
    let mut queue = Queue::new(stats);
    loop {
        let next = queue.next_at();
        tokio::select! {
            biased;
            entry = rx.recv() => match entry {
                Some(entry) => queue.push(entry),
                None => break,
            },
            () = sleep_until_some(next) => {}
        }
        while let Ok(entry) = rx.try_recv() {
            queue.push(entry);
        }
        queue.fire_due(Instant::now());
    }
    // Every handle is gone: whoever still waits falls back to the runtime's timer.
    queue.stats.depth.store(0, Ordering::Relaxed);
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The queue and its bookkeeping, without I/O: the time is an argument.
#[derive(Debug)]
struct Queue {
    heap: BinaryHeap<Entry>,
    seq: u64,
    /// The size at which abandoned entries are swept next.
    sweep_at: usize,
    depth_warned: bool,
    last_lag_warning: Option<Instant>,
    stats: Arc<TimerStats>,
}

impl Queue {
    fn new(stats: Arc<TimerStats>) -> Self {
        Self {
            heap: BinaryHeap::new(),
            seq: 0,
            sweep_at: 64,
            depth_warned: false,
            last_lag_warning: None,
            stats,
        }
    }

    fn next_at(&self) -> Option<Instant> {
        self.heap.peek().map(|e| e.at)
    }

    fn push(&mut self, mut entry: Entry) {
        self.seq = self.seq.wrapping_add(1);
        entry.seq = self.seq;
        self.heap.push(entry);
        if self.heap.len() >= self.sweep_at {
            self.heap.retain(|e| !e.fire.is_closed());
            self.sweep_at = self.heap.len().saturating_mul(2).max(64);
        }
        self.depth_changed();
    }

    fn depth_changed(&mut self) {
        let depth = self.heap.len();
        self.stats.depth.store(depth, Ordering::Relaxed);
        if depth > QUEUE_WARN_DEPTH && !self.depth_warned {
            self.depth_warned = true;
            self.stats.depth_warnings.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                depth,
                threshold = QUEUE_WARN_DEPTH,
                "timer queue deeper than QUEUE_WARN_DEPTH"
            );
        } else if depth <= QUEUE_WARN_DEPTH / 2 {
            self.depth_warned = false;
        }
    }

    /// Fires every timer due at `now`, measuring how late each is.
    fn fire_due(&mut self, now: Instant) {
        let mut worst = Duration::ZERO;
        let mut late = 0u64;
        while self.heap.peek().is_some_and(|e| e.at <= now) {
            let Some(entry) = self.heap.pop() else { break };
            let lag = now.saturating_duration_since(entry.at);
            let _ = entry.fire.send(());
            self.stats.fired.fetch_add(1, Ordering::Relaxed);
            worst = worst.max(lag);
            if lag > LAG_WARN_THRESHOLD {
                late += 1;
            }
        }
        let lag_us = u64::try_from(worst.as_micros()).unwrap_or(u64::MAX);
        self.stats.max_lag_us.fetch_max(lag_us, Ordering::Relaxed);
        if late > 0 {
            self.stats.late.fetch_add(late, Ordering::Relaxed);
            let quiet = self
                .last_lag_warning
                .is_none_or(|at| now.saturating_duration_since(at) >= LAG_WARN_EVERY);
            if quiet {
                self.last_lag_warning = Some(now);
                tracing::warn!(
                    lag = ?worst,
                    late,
                    threshold = ?LAG_WARN_THRESHOLD,
                    "timers fired later than LAG_WARN_THRESHOLD: the runtime is starved"
                );
            }
        }
        self.depth_changed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: Instant) -> (Entry, oneshot::Receiver<()>) {
        let (fire, fired) = oneshot::channel();
        (Entry { at, seq: 0, fire }, fired)
    }

    #[test]
    fn due_timers_fire_in_order_and_late_ones_are_counted() {
        let stats = Arc::new(TimerStats::default());
        let mut q = Queue::new(stats.clone());
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let (a, mut ra) = entry(t0 + ms(30));
        let (b, mut rb) = entry(t0 + ms(10));
        let (c, mut rc) = entry(t0 + ms(500));
        q.push(a);
        q.push(b);
        q.push(c);
        assert_eq!(stats.depth.load(Ordering::Relaxed), 3);
        assert_eq!(q.next_at(), Some(t0 + ms(10)));
        q.fire_due(t0 + ms(20));
        assert!(rb.try_recv().is_ok());
        assert!(ra.try_recv().is_err(), "not due yet");
        // 30 ms due, fired at 200 ms: 170 ms late, above the threshold.
        q.fire_due(t0 + ms(200));
        assert!(ra.try_recv().is_ok());
        assert!(rc.try_recv().is_err());
        assert_eq!(stats.fired.load(Ordering::Relaxed), 2);
        assert_eq!(stats.late.load(Ordering::Relaxed), 1);
        assert_eq!(stats.max_lag_us.load(Ordering::Relaxed), 170_000);
        assert_eq!(stats.depth.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_deep_queue_is_warned_about_once_and_abandoned_entries_are_swept() {
        let stats = Arc::new(TimerStats::default());
        let mut q = Queue::new(stats.clone());
        let at = Instant::now() + Duration::from_secs(60);
        let mut kept = Vec::new();
        for _ in 0..=QUEUE_WARN_DEPTH + 10 {
            let (e, r) = entry(at);
            q.push(e);
            kept.push(r);
        }
        assert_eq!(stats.depth_warnings.load(Ordering::Relaxed), 1);
        assert!(stats.depth.load(Ordering::Relaxed) > QUEUE_WARN_DEPTH);
        // Given up: swept when the queue has doubled since the last sweep.
        drop(kept);
        let mut more = Vec::new();
        for _ in 0..2 * QUEUE_WARN_DEPTH {
            let (e, r) = entry(at);
            q.push(e);
            more.push(r);
        }
        // Only the live ones are left; still deep, so no second warning.
        assert_eq!(stats.depth.load(Ordering::Relaxed), 2 * QUEUE_WARN_DEPTH);
        assert_eq!(stats.depth_warnings.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn sleeps_resolve_at_their_instant_through_one_queue() {
        let (timers, driver) = TimerService::new();
        let driver = tokio::spawn(driver);
        let start = Instant::now();
        let long = timers.sleep(Duration::from_millis(300));
        let short = timers.sleep(Duration::from_millis(100));
        short.await;
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        long.await;
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        assert_eq!(timers.stats().fired.load(Ordering::Relaxed), 2);
        assert_eq!(timers.stats().late.load(Ordering::Relaxed), 0);
        drop(timers);
        driver.await.unwrap();
    }
}
