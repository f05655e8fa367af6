//! [`Outbox`]: enqueue durably, deliver through a `NetClient`, retry across time, ack or
//! dead-letter.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use soulbase_net_core::{
    ErrorKind, GaugeReading, GaugeSource, NetClient, NetError, NetEvent, NetRequest, NoopObserver,
    Observer, OutboxStep,
};
use tokio::sync::{mpsc, watch, Notify};

use soulbase_net_store::{
    lease,
    outbox::{Enqueued, OutboxItem, OutboxStore, StoredItem},
};

/// Builds an [`Outbox`]; from [`Outbox::builder`].
///
/// The store and the client are required, and the type keeps count of them (a typestate, as
/// rustls' `ConfigBuilder`): `S` is [`NoStore`] until [`store`](Self::store) is called and
/// `C` is [`NoClient`] until [`client`](Self::client) is, and [`build`](Self::build) exists
/// only once both are given, so an outbox without either is a compile error rather than an
/// error at run time. The other setters may be called in any state and in any order.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::{sync::Arc, time::Duration};
/// use soulbase_net_outbox::{Outbox, OutboxStore, SqliteStore};
///
/// # let dir = std::env::temp_dir().join(format!("outbox-builder-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let store = Arc::new(SqliteStore::open(dir.join("outbox.db")).await?);
/// let client = Arc::new(soulbase_net_runtime::Client::builder().build()?);
/// let outbox = Outbox::builder()
///     .workers(16)
///     .store(store)
///     .lease(Duration::from_secs(5))
///     .client(client)
///     .build()?;
/// assert_eq!(outbox.store().pending().await?, 0);
/// # drop(outbox);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
///
/// Without a store there is no `build` to call:
/// ```compile_fail,E0599
/// # fn no_store(client: std::sync::Arc<dyn soulbase_net_core::NetClient>) {
/// let outbox = soulbase_net_outbox::Outbox::builder().client(client).build();
/// # }
/// ```
///
/// Nor without a client:
/// ```compile_fail,E0599
/// # fn no_client(store: std::sync::Arc<dyn soulbase_net_outbox::OutboxStore>) {
/// let outbox = soulbase_net_outbox::Outbox::builder().store(store).build();
/// # }
/// ```
pub struct OutboxBuilder<S = NoStore, C = NoClient> {
    store: S,
    client: C,
    settings: Settings,
}

/// An [`OutboxBuilder`] state: no store given yet (see [`OutboxBuilder::store`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoStore;

/// An [`OutboxBuilder`] state: no client given yet (see [`OutboxBuilder::client`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoClient;

/// What an [`OutboxBuilder`] holds besides the store and the client, whatever its state.
#[derive(Clone)]
struct Settings {
    workers: u32,
    lease: Duration,
    poll: Duration,
    backoff_base: Duration,
    backoff_cap: Duration,
    grace: Duration,
    delivery_timeout: Duration,
    observer: Option<Arc<dyn Observer>>,
}

impl Default for Settings {
    /// The defaults each setter of [`OutboxBuilder`] states.
    fn default() -> Self {
        Self {
            workers: 64,
            lease: Duration::from_secs(10),
            poll: Duration::from_millis(500),
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(300),
            grace: Duration::from_secs(30),
            delivery_timeout: Duration::from_secs(30),
            observer: None,
        }
    }
}

/// Durable delivery of [`OutboxItem`]s (see the crate docs).
///
/// What a delivery attempt's outcome does:
/// - a 2xx acknowledges the item (it is forgotten);
/// - a retryable failure — 5xx, 408, 425, 429, a timeout, a connect or DNS failure, a
///   transient I/O error, a breaker or a limiter refusal — reschedules it after
///   `min(cap, base × 2^(attempt − 1))` with full jitter, or after `Retry-After` when the
///   answer says so (bounded by the cap);
/// - anything else (another 4xx, `AUTH.FORBIDDEN`, an invalid request), or the deadline, or
///   `max_attempts`, moves it to the dead letters with the reason.
///
/// The `Idempotency-Key` drawn at enqueue goes on every attempt, so a receiver that dedups by
/// it applies the effect once however often the call arrives (after a crash between the
/// upstream's answer and the ack, it arrives again: at-least-once delivery).
///
/// Items with an [ordering key](OutboxItem::ordering_key) are claimed one at a time per key,
/// in enqueue order: the next of a key only once the one before it was acknowledged or
/// dead-lettered (a rescheduled one keeps its key waiting). The outbox looks for the next one
/// as soon as such an outcome is recorded, not at the next poll.
pub struct Outbox {
    store: Arc<dyn OutboxStore>,
    client: Arc<dyn NetClient>,
    workers: u32,
    lease: Duration,
    poll: Duration,
    backoff_base: Duration,
    backoff_cap: Duration,
    grace: Duration,
    delivery_timeout: Duration,
    wake: Notify,
    stop: watch::Sender<bool>,
    observer: Arc<dyn Observer>,
    gauges: Arc<Gauges>,
}

/// What the outbox last saw of its store, for `net_outbox_pending` and
/// `net_outbox_oldest_pending_age_seconds` (read at scrape time).
#[derive(Debug, Default)]
struct Gauges {
    pending: AtomicU64,
    oldest_age_secs: AtomicU64,
}

impl GaugeSource for Gauges {
    fn read_gauges(&self, visit: &mut dyn FnMut(GaugeReading<'_>)) {
        visit(GaugeReading::OutboxPending {
            value: self.pending.load(Ordering::Relaxed),
        });
        visit(GaugeReading::OutboxOldestPendingAge {
            value: self.oldest_age_secs.load(Ordering::Relaxed),
        });
    }
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("store", &self.store)
            .field("workers", &self.workers)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl<S: std::fmt::Debug, C> std::fmt::Debug for OutboxBuilder<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxBuilder")
            .field("store", &self.store)
            .field("workers", &self.settings.workers)
            .field("lease", &self.settings.lease)
            .finish_non_exhaustive()
    }
}

impl<S, C> OutboxBuilder<S, C> {
    /// Where items live (required). Given again, the last one counts.
    pub fn store(self, store: Arc<dyn OutboxStore>) -> OutboxBuilder<Arc<dyn OutboxStore>, C> {
        OutboxBuilder {
            store,
            client: self.client,
            settings: self.settings,
        }
    }

    /// What delivers them (required): a `soulbase_net_runtime::Client`, with its policy.
    /// Given again, the last one counts.
    pub fn client(self, client: Arc<dyn NetClient>) -> OutboxBuilder<S, Arc<dyn NetClient>> {
        OutboxBuilder {
            store: self.store,
            client,
            settings: self.settings,
        }
    }

    /// The most deliveries in flight at once. Within it the outbox adapts to the upstream:
    /// it starts at 16 (or `n` when lower), adds one per window's worth of deliveries
    /// acknowledged and halves on a sign of overload (a timeout, 429 or 503, the client's
    /// breaker or limiter refusing). Keep it at or under the client's
    /// `limits.per_host_concurrency` (64 by default) when the items go to one host: calls over
    /// the client's limit are refused and come back later. Default is 64.
    pub fn workers(mut self, n: u32) -> Self {
        self.settings.workers = n.max(1);
        self
    }

    /// How long a claim lasts unless extended. The outbox extends the claims of what it holds
    /// (claimed, in flight, or waiting for its acknowledgement's commit) every half lease, on
    /// the store, so a live worker keeps its items however long a delivery takes, and a
    /// killed worker's items come back within one lease — two heartbeats. Default is 10s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// Longest one delivery may take: its time limit, and so how long the outbox holds its
    /// claim. A delivery still running after `timeout` — or when the item has a
    /// [deadline](OutboxItem::deadline), after what is left of it, if sooner — is cancelled
    /// and counts as a timeout (retried later, or dead-lettered past the deadline); the
    /// client's own `timeout.total` still ends it sooner when it is shorter. Its claim is
    /// extended no longer than this limit plus a margin of one second from the delivery's
    /// start, so a delivery stuck even past its cancellation (a task that never yields) stops
    /// being held: its lease runs out and the item is delivered again (fenced: the stuck
    /// delivery's outcome then changes nothing). Set it at or above the client's
    /// `timeout.total` (30 s by default). Default is 30s.
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.settings.delivery_timeout = timeout;
        self
    }

    /// Longest sleep between looks at the store when nothing wakes the outbox. Default 500ms.
    pub fn poll(mut self, poll: Duration) -> Self {
        self.settings.poll = poll;
        self
    }

    /// Reports what happens to items (`NetEvent::Outbox`: enqueued, delivered with its
    /// lateness, retried, dead) and the pending gauges (`Observer::on_gauges`): give it the
    /// same `Metrics` as the client for `net_outbox_*`. Default is none.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.settings.observer = Some(observer);
        self
    }

    /// Backoff between delivery attempts: `base × 2^(attempt − 1)` up to `cap`, full jitter.
    /// Default is 1s up to 5m.
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.settings.backoff_base = base;
        self.settings.backoff_cap = cap.max(base);
        self
    }

    /// How long [`Outbox::shutdown`] lets deliveries in flight finish before
    /// [`run`](Outbox::run) abandons them (their items stay claimed until the lease ends, then
    /// are delivered again: nothing is lost). Default 30s.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.settings.grace = grace;
        self
    }
}

impl OutboxBuilder<Arc<dyn OutboxStore>, Arc<dyn NetClient>> {
    /// The outbox. Only a builder given both a [store](Self::store) and a
    /// [client](Self::client) has this method.
    ///
    /// # Errors
    /// None today: what was checked at run time (a missing store or client) is now checked by
    /// the compiler, and every setting is clamped to a valid value when set. The `Result`
    /// stays so that call chains written as `.build()?` compile unchanged and a check added
    /// later does not change the signature.
    pub fn build(self) -> Result<Outbox, NetError> {
        let Settings {
            workers,
            lease,
            poll,
            backoff_base,
            backoff_cap,
            grace,
            delivery_timeout,
            observer,
        } = self.settings;
        let observer = observer.unwrap_or_else(|| Arc::new(NoopObserver));
        let gauges = Arc::new(Gauges::default());
        let source: Arc<dyn GaugeSource> = gauges.clone();
        observer.on_gauges(&source);
        Ok(Outbox {
            store: self.store,
            client: self.client,
            workers,
            lease,
            poll,
            backoff_base,
            backoff_cap,
            grace,
            delivery_timeout,
            wake: Notify::new(),
            stop: watch::Sender::new(false),
            observer,
            gauges,
        })
    }
}

/// What became of one delivery attempt.
enum Verdict {
    Delivered,
    Retry(Option<Duration>, String),
    Dead(String, Option<u16>),
    /// The item's deadline passed before this delivery could start: dead-lettered with the
    /// attempts already made, since nothing was sent.
    Expired,
}

impl Outbox {
    /// A builder, with neither a store nor a client yet: both must be given before
    /// [`build`](OutboxBuilder::build) can be called.
    pub fn builder() -> OutboxBuilder {
        OutboxBuilder {
            store: NoStore,
            client: NoClient,
            settings: Settings::default(),
        }
    }

    /// Stores `item` durably and returns once it is committed; a running outbox is woken
    /// when the item is due at once. An `Idempotency-Key` is drawn from the OS CSPRNG unless
    /// the item carries one.
    ///
    /// # Errors
    /// `SCHEMA.VALIDATION_FAILED` for an invalid URL or header; `Io` when the store fails
    /// (nothing is half-written).
    pub async fn enqueue(&self, item: OutboxItem) -> Result<Enqueued, NetError> {
        let stored = item.into_stored(SystemTime::now())?;
        let done = self.store.enqueue(stored).await?;
        if matches!(done, Enqueued::New(_)) {
            self.observer.on_event(&NetEvent::Outbox {
                step: OutboxStep::Enqueued,
                lateness: None,
            });
        }
        // A sleeping outbox looks again: the item may be due before what it waits for.
        self.wake.notify_one();
        Ok(done)
    }

    /// Stores `items` durably in one transaction — all or none — and returns once they are
    /// committed: one commit (one `fsync`) for the lot, so far more items a second than one
    /// [`enqueue`](Self::enqueue) each.
    ///
    /// # Errors
    /// As [`enqueue`](Self::enqueue); on an error none of the items is stored.
    pub async fn enqueue_batch(
        &self,
        items: impl IntoIterator<Item = OutboxItem>,
    ) -> Result<Vec<Enqueued>, NetError> {
        let now = SystemTime::now();
        let stored = items
            .into_iter()
            .map(|item| item.into_stored(now))
            .collect::<Result<Vec<_>, _>>()?;
        let done = self.store.enqueue_batch(stored).await?;
        for _ in done.iter().filter(|d| matches!(d, Enqueued::New(_))) {
            self.observer.on_event(&NetEvent::Outbox {
                step: OutboxStep::Enqueued,
                lateness: None,
            });
        }
        self.wake.notify_one();
        Ok(done)
    }

    /// The store, for listing, requeueing and purging dead letters.
    pub fn store(&self) -> &Arc<dyn OutboxStore> {
        &self.store
    }

    /// Delivers due items until [`shutdown`](Self::shutdown); deliveries in flight then finish
    /// within the grace period ([`OutboxBuilder::grace`]), and what is left stays in the store.
    ///
    /// How it runs: due items are claimed in batches (one statement claims up to twice the
    /// window, less what is already in hand) into a queue, and delivered with at most the
    /// [window](OutboxBuilder::workers) in flight; acknowledgements are committed in batches
    /// by a task of their own (one commit for whatever was delivered meanwhile). With nothing
    /// due, the loop sleeps until the next item is due, a new one is stored, or the poll
    /// interval passes (then it looks at the store with one `next_due`, and claims only when
    /// something is due); the pending gauges are read once a second while items move, once
    /// every 30 s when idle, not per delivery.
    ///
    /// # Errors
    /// The store failing to claim items (reported, and the loop goes on after a poll
    /// interval, so a brief outage is ridden out; only a closed store ends it).
    pub async fn run(&self) -> Result<(), NetError> {
        let mut stop = self.stop.subscribe();
        let mut in_flight = tokio::task::JoinSet::new();
        // Another process's enqueue, where the store can say so (else the poll finds it).
        let elsewhere = self.store.wakeups();
        let now = tokio::time::Instant::now();
        let (mut next_sweep, mut next_gauges) = (now, now);
        // The gauges are read once a second while something changes (a claim, a delivery,
        // an enqueue), else once every `IDLE_GAUGES_EVERY`.
        let (mut idle_gauges_at, mut changed) = (now, true);
        // When the store is next looked at (one `next_due`) if nothing wakes the loop.
        let mut poll_at = now + self.poll;
        let window = Arc::new(Window::new(self.workers));
        let held = Held::default();
        // Woken when an item with an ordering key is acknowledged, dead-lettered or
        // rescheduled: the next item of its key may be claimable now, not at the next poll.
        let freed = Arc::new(Notify::new());
        let (acks, acker) = Acker::start(
            self.store.clone(),
            self.workers as usize,
            held.clone(),
            freed.clone(),
        );
        let _heartbeat = heartbeat(self.store.clone(), held.clone(), self.lease);
        let mut queue: VecDeque<StoredItem> = VecDeque::new();
        // The last claim came back short: nothing more is due until woken or `due_at`.
        let mut exhausted = false;
        let mut due_at: Option<tokio::time::Instant> = None;
        loop {
            if *stop.borrow() {
                break;
            }
            while in_flight.len() < window.get() {
                let Some(item) = queue.pop_front() else { break };
                let ctx = Delivery {
                    store: self.store.clone(),
                    client: self.client.clone(),
                    observer: self.observer.clone(),
                    backoff: (self.backoff_base, self.backoff_cap),
                    acks: acks.clone(),
                    window: window.clone(),
                    held: held.clone(),
                    freed: freed.clone(),
                    limit: self.delivery_timeout,
                };
                in_flight.spawn(async move { ctx.deliver(item).await });
            }
            while in_flight.try_join_next().is_some() {}
            let w = window.get();
            let want = (2 * w).saturating_sub(in_flight.len() + queue.len());
            if !exhausted && want >= (w / 2).max(1) {
                let asked = u32::try_from(want).unwrap_or(u32::MAX);
                match (self.store)
                    .claim_due(SystemTime::now(), asked, self.lease)
                    .await
                {
                    Ok(items) => {
                        exhausted = items.len() < want;
                        changed |= !items.is_empty();
                        held.hold(&items);
                        queue.extend(items);
                        if exhausted {
                            due_at = self.next_due().await;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "outbox: claiming due items failed");
                        exhausted = true;
                        // Claimed again after a poll interval.
                        due_at = Some(tokio::time::Instant::now() + self.poll);
                    }
                }
                poll_at = tokio::time::Instant::now() + self.poll;
                continue;
            }
            let now = tokio::time::Instant::now();
            if (changed && now >= next_gauges) || now >= idle_gauges_at {
                next_gauges = now + GAUGES_EVERY;
                idle_gauges_at = now + IDLE_GAUGES_EVERY;
                changed = false;
                self.note_gauges().await;
            }
            if now >= next_sweep {
                next_sweep = now + SWEEP_EVERY;
                if let Err(e) = self.store.sweep(SystemTime::now()).await {
                    tracing::warn!(error = %e, "outbox: forgetting acknowledged items failed");
                }
            }
            // Until something is due, stored, or a slot frees (which may let the queue move
            // or a claim go out); at most the next poll and the next gauges reading. Idle,
            // the loop costs one `next_due` (an indexed lookup) per poll interval: it claims
            // only when that says something is due.
            let gauges_at = if changed { next_gauges } else { idle_gauges_at };
            let until = match due_at.filter(|_| exhausted) {
                Some(at) => at.min(poll_at),
                None => poll_at,
            }
            .min(gauges_at);
            tokio::select! {
                () = self.wake.notified() => {
                    exhausted = false;
                    changed = true;
                }
                () = notified_or_never(elsewhere.as_deref()) => {
                    exhausted = false;
                    changed = true;
                }
                () = freed.notified() => {
                    exhausted = false;
                    changed = true;
                }
                () = tokio::time::sleep_until(until) => {
                    let now = tokio::time::Instant::now();
                    if due_at.is_some_and(|at| at <= now) {
                        exhausted = false;
                    } else if now >= poll_at {
                        poll_at = now + self.poll;
                        match self.store.next_due().await {
                            Ok(at) => {
                                due_at = at.map(|at| {
                                    let wait = at
                                        .duration_since(SystemTime::now())
                                        .unwrap_or(Duration::ZERO);
                                    now + wait
                                });
                                exhausted = due_at.is_none_or(|at| at > now);
                            }
                            // Let the claim find out (and report) what is wrong.
                            Err(_) => exhausted = false,
                        }
                    }
                }
                Some(_) = in_flight.join_next(), if !in_flight.is_empty() => changed = true,
                _ = stop.changed() => {}
            }
        }
        // Claimed but not started: given back at once rather than left to their lease.
        for item in queue.drain(..) {
            held.release(&item);
            if let Err(e) = self
                .store
                .reschedule(&item, item.deliver_at, item.attempts)
                .await
            {
                tracing::warn!(error = %e, id = item.id, "outbox: giving back a claimed item failed");
            }
        }
        // Deliveries in flight get the grace period; what is still running then is dropped
        // (its claim runs out and the item is delivered again later).
        let drained = async { while in_flight.join_next().await.is_some() {} };
        if tokio::time::timeout(self.grace, drained).await.is_err() {
            tracing::warn!(
                abandoned = in_flight.len(),
                "outbox: deliveries still in flight after the grace period are left to their lease"
            );
            in_flight.abort_all();
            while in_flight.join_next().await.is_some() {}
        }
        // The acknowledgements still queued are committed before `run` returns.
        drop(acks);
        let _ = acker.await;
        Ok(())
    }

    /// When the next item is due, on the runtime's clock; `None` when none waits or the
    /// store cannot say.
    async fn next_due(&self) -> Option<tokio::time::Instant> {
        let at = self.store.next_due().await.ok()??;
        let wait = at
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        Some(tokio::time::Instant::now() + wait)
    }

    /// Counts what waits, for the gauges.
    async fn note_gauges(&self) {
        if let Ok(n) = self.store.pending().await {
            self.gauges.pending.store(n, Ordering::Relaxed);
        }
        let late = match self.store.next_due().await {
            Ok(Some(due)) => SystemTime::now()
                .duration_since(due)
                .unwrap_or(Duration::ZERO),
            _ => Duration::ZERO,
        };
        self.gauges
            .oldest_age_secs
            .store(late.as_secs(), Ordering::Relaxed);
    }

    /// Stops [`run`](Self::run): no new claims; deliveries in flight finish.
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
        self.wake.notify_waiters();
    }
}

/// What one delivery needs: the store, the client, where its events and acknowledgement go,
/// and the window it reports to.
struct Delivery {
    store: Arc<dyn OutboxStore>,
    client: Arc<dyn NetClient>,
    observer: Arc<dyn Observer>,
    backoff: (Duration, Duration),
    acks: mpsc::Sender<StoredItem>,
    window: Arc<Window>,
    held: Held,
    /// Notified once the outcome of an item with an ordering key is recorded.
    freed: Arc<Notify>,
    /// The longest a delivery may take ([`OutboxBuilder::delivery_timeout`]).
    limit: Duration,
}

impl Delivery {
    /// One delivery attempt of `item`, and what it leads to: an acknowledgement handed to the
    /// [`Acker`], or a reschedule or a dead letter recorded here; and what the window learns.
    async fn deliver(self, item: StoredItem) {
        let mut req = NetRequest::new(item.method.clone(), item.url.as_str())
            .headers(item.headers.clone())
            .body(item.body.clone())
            .idempotency_key(item.idempotency_key.as_str());
        if let Some(t) = &item.tenant {
            req = req.tenant(t.as_str());
        }
        // This delivery's time limit: the outbox's, or what is left of the item's deadline.
        let left = item.deadline.map(|d| {
            d.duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        });
        let limit = left.map_or(self.limit, |left| left.min(self.limit));
        // Its claim is extended until the limit and a margin, never past (the lease
        // discipline's bound): a delivery stuck past it lets its item go.
        self.held
            .bound(&item, tokio::time::Instant::now() + limit + Held::MARGIN);
        if limit.is_zero() {
            return self.record(item, Verdict::Expired).await;
        }
        let Ok(sent) = tokio::time::timeout(limit, self.client.send(req)).await else {
            self.window.overload();
            let reason = format!("the delivery did not finish within {limit:?}");
            return self.record(item, Verdict::Retry(None, reason)).await;
        };
        let verdict = match sent {
            Ok(res) if res.status.is_success() => Verdict::Delivered,
            Ok(res) => {
                let status = res.status.as_u16();
                let after = res.error_for_status().err().and_then(|e| e.retry_after());
                if matches!(status, 429 | 503) {
                    self.window.overload();
                }
                if matches!(status, 408 | 425 | 429) || res_is_5xx(status) {
                    Verdict::Retry(after, format!("HTTP {status}"))
                } else {
                    Verdict::Dead(format!("HTTP {status}"), Some(status))
                }
            }
            Err(e) => match e.kind() {
                ErrorKind::Dns
                | ErrorKind::Connect
                | ErrorKind::Timeout(_)
                | ErrorKind::Io
                | ErrorKind::CircuitOpen
                | ErrorKind::RateLimited
                | ErrorKind::Proxy
                | ErrorKind::Cancelled => {
                    if matches!(
                        e.kind(),
                        ErrorKind::Timeout(_) | ErrorKind::CircuitOpen | ErrorKind::RateLimited
                    ) {
                        self.window.overload();
                    }
                    Verdict::Retry(e.retry_after(), e.code().as_str().to_owned())
                }
                _ => Verdict::Dead(format!("{}: {e}", e.code().as_str()), None),
            },
        };
        self.record(item, verdict).await;
    }

    /// Records what one delivery attempt of `item` came to.
    async fn record(self, item: StoredItem, verdict: Verdict) {
        let attempt = item.attempts + 1;
        let now = SystemTime::now();
        let event = |step, lateness| {
            self.observer.on_event(&NetEvent::Outbox { step, lateness });
        };
        let store = &*self.store;
        let (base, cap) = self.backoff;
        let result = match verdict {
            Verdict::Delivered => {
                event(
                    OutboxStep::Delivered,
                    Some(
                        now.duration_since(item.deliver_at)
                            .unwrap_or(Duration::ZERO),
                    ),
                );
                self.window.success();
                // Done: held without a bound until its acknowledgement is committed.
                self.held.settle(&item);
                // Committed with the others delivered meanwhile; the slot is held while the
                // acknowledgements back up (so a crash delivers again at most what is in
                // flight and what waits to be committed). If the acker is gone, the claim
                // runs out and the item is delivered again.
                let _ = self.acks.send(item).await;
                return;
            }
            Verdict::Dead(reason, status) => {
                event(OutboxStep::Dead, None);
                store.dead(&item, attempt, &reason, status).await
            }
            Verdict::Expired => {
                event(OutboxStep::Dead, None);
                let why = "the deadline passed before the next attempt could start";
                store.dead(&item, item.attempts, why, None).await
            }
            Verdict::Retry(after, reason) => {
                let wait = after
                    .map(|a| a.min(cap))
                    .unwrap_or_else(|| jittered(base, cap, attempt));
                let next = now + wait;
                let past_deadline = item.deadline.is_some_and(|d| next > d);
                if attempt >= item.max_attempts || past_deadline {
                    let why = if past_deadline {
                        format!("{reason}; the deadline passed")
                    } else {
                        format!("{reason}; {attempt} attempts made")
                    };
                    event(OutboxStep::Dead, None);
                    store.dead(&item, attempt, &why, None).await
                } else {
                    event(OutboxStep::Retried, None);
                    store.reschedule(&item, next, attempt).await
                }
            }
        };
        self.held.release(&item);
        if item.ordering_key.is_some() {
            self.freed.notify_one();
        }
        recorded(result, item.id);
    }
}

/// The claims this outbox holds — claimed items from their claim until their outcome is
/// recorded — whose leases the [`heartbeat`] extends: by id, the claim token and, while the
/// item is being delivered, how long its claim may still be extended.
#[derive(Clone, Debug, Default)]
struct Held(Arc<parking_lot::Mutex<HashMap<i64, Hold>>>);

/// One held claim: its token, and until when it may be extended (`None`: while held).
type Hold = (i64, Option<tokio::time::Instant>);

impl Held {
    /// How long past a delivery's time limit its claim is still extended: the time to record
    /// its outcome once the delivery is cancelled.
    const MARGIN: Duration = Duration::from_secs(1);

    /// Holds `items` (just claimed: extended without a bound until their delivery starts).
    fn hold(&self, items: &[StoredItem]) {
        let mut held = self.0.lock();
        for item in items {
            held.insert(item.id, (item.claim, None));
        }
    }

    /// `item`'s delivery started: its claim is extended until `until`, no longer.
    fn bound(&self, item: &StoredItem, until: tokio::time::Instant) {
        self.set(item, Some(until));
    }

    /// `item` was delivered: held without a bound until its acknowledgement is committed.
    fn settle(&self, item: &StoredItem) {
        self.set(item, None);
    }

    fn set(&self, item: &StoredItem, until: Option<tokio::time::Instant>) {
        if let Some(entry) = self.0.lock().get_mut(&item.id) {
            if entry.0 == item.claim {
                entry.1 = until;
            }
        }
    }

    /// Lets `item` go, if this copy's claim is still the one held (a copy whose lease lapsed
    /// and whose item was claimed again leaves the new claim alone).
    fn release(&self, item: &StoredItem) {
        let mut held = self.0.lock();
        if held
            .get(&item.id)
            .is_some_and(|(claim, _)| *claim == item.claim)
        {
            held.remove(&item.id);
        }
    }

    /// The claims to extend now: every one held whose bound has not passed.
    fn claims(&self) -> Vec<(i64, i64)> {
        let now = tokio::time::Instant::now();
        self.0
            .lock()
            .iter()
            .filter(|(_, (_, until))| until.is_none_or(|u| now < u))
            .map(|(id, (claim, _))| (*id, *claim))
            .collect()
    }
}

/// Extends the leases of what the outbox holds every half lease (the lease discipline's
/// heartbeat, one statement for the whole batch; see [`OutboxBuilder::lease`]); stopped when
/// dropped. The heartbeat itself has no deadline: each claim in the batch has its own, its
/// delivery's time limit and a margin ([`Held::claims`] leaves out those past it), so a
/// stuck delivery stops being held while the others go on.
fn heartbeat(store: Arc<dyn OutboxStore>, held: Held, lease: Duration) -> lease::Heartbeat {
    lease::Heartbeat::start(lease::Lease::new(lease), None, move || {
        let (store, claims) = (store.clone(), held.claims());
        async move {
            if claims.is_empty() {
                return Ok(true);
            }
            // A lease lost (taken over after a stall) stays lost: that holder's outcome is
            // fenced off, and the new holder's counts.
            if let Err(e) = store.extend(&claims, lease).await {
                tracing::warn!(error = %e, items = claims.len(), "outbox: extending leases failed");
            }
            Ok(true)
        }
    })
}

/// Logs what recording an outcome in the store came to.
fn recorded(result: Result<bool, NetError>, id: i64) {
    match result {
        Ok(true) => {}
        // The lease ran out during the attempt and another worker holds the item now: its
        // outcome counts, not this one's.
        Ok(false) => tracing::debug!(id, "outbox: the claim was taken over"),
        // The lease runs out and the item is delivered again: at least once.
        Err(e) => tracing::warn!(error = %e, id, "outbox: recording a delivery failed"),
    }
}

/// Commits acknowledgements in batches, in a task of its own: whatever was delivered while
/// the previous commit ran goes in the next one (group commit), so a store with `fsync` on
/// pays one commit per batch, not per delivery. At most `workers` wait and `workers` are
/// being committed: a crash delivers again at most three times `workers` items (those in
/// flight, those waiting, those in the commit).
struct Acker;

impl Acker {
    /// Starts the task; it ends once every sender is gone and what they sent is committed.
    /// `freed` is notified after a commit that acknowledged an item with an ordering key (the
    /// next item of its key may be claimed).
    fn start(
        store: Arc<dyn OutboxStore>,
        workers: usize,
        held: Held,
        freed: Arc<Notify>,
    ) -> (mpsc::Sender<StoredItem>, tokio::task::JoinHandle<()>) {
        let workers = workers.max(1);
        let (tx, mut rx) = mpsc::channel::<StoredItem>(workers);
        let task = tokio::spawn(async move {
            let mut batch = Vec::with_capacity(workers);
            while rx.recv_many(&mut batch, workers).await > 0 {
                let result = store.ack_batch(&batch).await;
                for item in &batch {
                    held.release(item);
                }
                if batch.iter().any(|item| item.ordering_key.is_some()) {
                    freed.notify_one();
                }
                match result {
                    Ok(done) => {
                        for (item, kept) in batch.iter().zip(done) {
                            recorded(Ok(kept), item.id);
                        }
                    }
                    // Their claims run out and they are delivered again: at least once.
                    Err(e) => tracing::warn!(
                        error = %e,
                        items = batch.len(),
                        "outbox: acknowledging delivered items failed"
                    ),
                }
                batch.clear();
            }
        });
        (tx, task)
    }
}

/// How many deliveries may be in flight: AIMD between 1 and the outbox's cap, starting at
/// [`Window::START`] (or the cap when lower). +1 once per window's worth of deliveries
/// acknowledged, halved on a sign of overload (a timeout, 429 or 503, the client's breaker
/// or limiter refusing) — at most once per [`Window::CALM`], so that one burst of failures
/// halves it once.
#[derive(Debug)]
struct Window {
    max: usize,
    state: parking_lot::Mutex<WindowState>,
    now: AtomicUsize,
}

#[derive(Debug)]
struct WindowState {
    successes: usize,
    last_cut: Option<tokio::time::Instant>,
}

impl Window {
    const START: usize = 16;
    const CALM: Duration = Duration::from_millis(100);

    fn new(max: u32) -> Self {
        let max = (max as usize).max(1);
        Self {
            max,
            state: parking_lot::Mutex::new(WindowState {
                successes: 0,
                last_cut: None,
            }),
            now: AtomicUsize::new(Self::START.min(max)),
        }
    }

    fn get(&self) -> usize {
        self.now.load(Ordering::Relaxed)
    }

    fn success(&self) {
        let mut s = self.state.lock();
        s.successes += 1;
        let now = self.get();
        if s.successes >= now {
            s.successes = 0;
            self.now.store((now + 1).min(self.max), Ordering::Relaxed);
        }
    }

    fn overload(&self) {
        let mut s = self.state.lock();
        let at = tokio::time::Instant::now();
        if s.last_cut
            .is_some_and(|t| at.duration_since(t) < Self::CALM)
        {
            return;
        }
        s.last_cut = Some(at);
        s.successes = 0;
        self.now.store((self.get() / 2).max(1), Ordering::Relaxed);
    }
}

/// How often acknowledged items past the store's retention are forgotten.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// How often the pending gauges are read from the store (two queries) while claims,
/// deliveries or enqueues happen.
const GAUGES_EVERY: Duration = Duration::from_secs(1);

/// How often the pending gauges are read when nothing happened since the last reading (only
/// other processes could have changed them).
const IDLE_GAUGES_EVERY: Duration = Duration::from_secs(30);

/// Woken by `n`, or never.
async fn notified_or_never(n: Option<&Notify>) {
    match n {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

fn res_is_5xx(status: u16) -> bool {
    (500..600).contains(&status)
}

/// `min(cap, base × 2^(attempt − 1))`, full jitter.
fn jittered(base: Duration, cap: Duration, attempt: u32) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    exp.min(cap).mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimed(id: i64, claim: i64) -> StoredItem {
        StoredItem {
            id,
            dedup_id: None,
            method: soulbase_net_core::http::Method::POST,
            url: "http://127.0.0.1:1/".to_owned(),
            headers: soulbase_net_core::http::HeaderMap::new(),
            body: soulbase_net_core::bytes::Bytes::new(),
            tenant: None,
            idempotency_key: "k".repeat(32),
            deliver_at: SystemTime::now(),
            deadline: None,
            attempts: 0,
            max_attempts: 5,
            claim,
            ordering_key: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_claim_is_extended_until_its_deliverys_bound_and_no_longer() {
        let held = Held::default();
        let (queued, stuck, done) = (claimed(1, 10), claimed(2, 20), claimed(3, 30));
        held.hold(&[queued.clone(), stuck.clone(), done.clone()]);
        let start = tokio::time::Instant::now();
        held.bound(&stuck, start + Duration::from_secs(2));
        held.bound(&done, start + Duration::from_secs(2));
        held.settle(&done);
        let mut now = held.claims();
        now.sort_unstable();
        assert_eq!(now, [(1, 10), (2, 20), (3, 30)]);
        // Past the bound: the stuck delivery's claim is no longer extended; the queued one
        // and the delivered one (waiting for its acknowledgement) still are.
        tokio::time::advance(Duration::from_secs(2)).await;
        let mut later = held.claims();
        later.sort_unstable();
        assert_eq!(later, [(1, 10), (3, 30)]);
        // The item claimed again under a new token: the stale copy neither bounds nor
        // releases the new claim.
        held.hold(&[claimed(2, 21)]);
        held.bound(&stuck, start);
        held.release(&stuck);
        assert!(held.claims().contains(&(2, 21)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_grows_by_one_per_window_and_halves_once_per_burst_of_overload() {
        let w = Window::new(64);
        assert_eq!(w.get(), 16);
        for _ in 0..15 {
            w.success();
        }
        assert_eq!(w.get(), 16, "not a whole window yet");
        w.success();
        assert_eq!(w.get(), 17);
        // A burst of overload halves it once; after the calm, again.
        for _ in 0..10 {
            w.overload();
        }
        assert_eq!(w.get(), 8);
        tokio::time::advance(Window::CALM).await;
        w.overload();
        assert_eq!(w.get(), 4);
        // Never under one, never over the cap.
        for _ in 0..10 {
            tokio::time::advance(Window::CALM).await;
            w.overload();
        }
        assert_eq!(w.get(), 1);
        let small = Window::new(4);
        assert_eq!(small.get(), 4, "starts at the cap when the cap is lower");
        for _ in 0..100 {
            small.success();
        }
        assert_eq!(small.get(), 4);
    }
}
