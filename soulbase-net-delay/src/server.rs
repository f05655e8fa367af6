//! The server: connections, routes, and the dispatcher that claims due tasks and writes them
//! to a connection registered for their route.
//!
//! - A `schedule` is answered `ack` only once the task is in the store (its commit returned).
//!   Schedules and acknowledgements from every connection go through one writer that commits
//!   whatever arrived meanwhile in one transaction (group commit: one `fsync` for many), and a
//!   connection's answers are written in the order of its lines while later lines are already
//!   being read (pipelined).
//! - A claimer claims, for the routes that have a connection, the tasks due within the next
//!   [`AHEAD`], and the dispatcher keeps them in memory ordered by due time (a time wheel of
//!   the near term: what is due later stays only in the store, so memory does not grow with
//!   it) until each fires, on time rather than one claim's round trip late. The dispatcher
//!   never waits on the store: claims, and the rescheduling of deliveries that could not be
//!   written, run in tasks of their own. The lease covers the wait,
//!   the write and the acknowledgement timeout (the delivery's deadline), so a server that dies
//!   leaves its tasks to be claimed again within that lease, and a live one never needs to
//!   extend it: a delivery ends — acknowledged, failed or timed out — before its lease does.
//! - A delivery whose connection is gone, whose write queue is full (`connection_write_channel`:
//!   a slow client's deliveries wait in the store, other clients are not slowed), or whose `ack`
//!   does not come within `ack_timeout_ms`, is due again after `retry_delay_ms`, with the same
//!   id, until a client acknowledges it (at least once).
//! - An `ack` counts only for a delivery made on the same connection and still waiting for it
//!   (see `take_delivery`): a connection cannot delete another route's task by naming its id.

use std::{
    collections::HashMap,
    io,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use parking_lot::Mutex;
use soulbase_net_core::NetError;
use soulbase_net_store::delay::{DelayStore, DelayTask, Scheduled};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{mpsc, oneshot, watch, Notify},
    task::JoinSet,
    time::Instant,
};

use crate::{
    metrics::{Gauges, Metrics},
    protocol::{self, Inbound, Outbound, MAX_LINE},
    Config,
};

mod http;

/// How much longer than the acknowledgement timeout a claim's lease runs.
const LEASE_MARGIN: Duration = Duration::from_secs(2);

/// The longest the dispatcher sleeps when nothing is due (a schedule or a registration wakes
/// it sooner).
const IDLE: Duration = Duration::from_secs(1);

/// How far ahead the dispatcher claims: tasks due within this are held in memory and fired
/// on time.
const AHEAD: Duration = Duration::from_millis(500);

/// Schedules and acknowledgements committed together at most.
const WRITE_BATCH: usize = 1024;

/// A running server; dropping it stops it (as [`shutdown`](Self::shutdown) does, without
/// waiting).
#[derive(Debug)]
pub struct DelayServer {
    addr: SocketAddr,
    http: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl DelayServer {
    /// Binds `config.bind_addr` (port 0 picks a free one) and starts serving from `store`.
    ///
    /// # Errors
    /// `Io` when the address cannot be bound.
    pub async fn start(config: Config, store: Arc<dyn DelayStore>) -> Result<Self, NetError> {
        Self::start_with_http_tasks(config, store, None).await
    }

    /// Like [`start`](Self::start), with HTTP tasks: a `schedule` carrying a `target` (an HTTP
    /// call) is enqueued in `outbox`, due at its `fire_at`, with the task's id as the outbox
    /// item's id, and made when due through the outbox's client — its policy, address guard,
    /// retries and dead letters — for services that cannot hold a connection. The outbox runs
    /// until the server stops. Without an outbox, such a schedule gets an error line.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_with_http_tasks(
        config: Config,
        store: Arc<dyn DelayStore>,
        outbox: Option<Arc<soulbase_net_outbox::Outbox>>,
    ) -> Result<Self, NetError> {
        let listener = TcpListener::bind(config.bind_addr).await.map_err(|e| {
            NetError::new(soulbase_net_core::ErrorKind::Io)
                .with_message(format!("delay server: binding {}", config.bind_addr))
                .with_source(e)
        })?;
        let addr = listener.local_addr().map_err(|e| {
            NetError::new(soulbase_net_core::ErrorKind::Io)
                .with_message("delay server: reading the bound address")
                .with_source(e)
        })?;
        let http = match config.http_addr {
            Some(at) => {
                let l = TcpListener::bind(at).await.map_err(|e| {
                    NetError::new(soulbase_net_core::ErrorKind::Io)
                        .with_message(format!("delay server: binding the HTTP face {at}"))
                        .with_source(e)
                })?;
                let bound = l.local_addr().ok();
                Some((l, bound))
            }
            None => None,
        };
        let (stop, stopped) = watch::channel(false);
        let wake = Arc::new(Notify::new());
        let (writes, queued) = mpsc::channel(WRITE_BATCH * 4);
        let soonest = Arc::new(std::sync::atomic::AtomicI64::new(i64::MAX));
        let metrics = Arc::new(Metrics::default());
        let writer = tokio::spawn(write_batches(
            store.clone(),
            wake.clone(),
            soonest.clone(),
            metrics.clone(),
            queued,
        ));
        let inner = Arc::new(Inner {
            config,
            store,
            writes,
            routes: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
            connections: AtomicU64::new(0),
            turn: AtomicU64::new(0),
            soonest,
            wake,
            metrics,
            ready: AtomicU64::new(0),
            held_redeliveries: AtomicU64::new(0),
            outbox,
        });
        let http_addr = http.as_ref().and_then(|(_, a)| *a);
        let task = tokio::spawn(async move {
            serve(inner, listener, http.map(|(l, _)| l), stopped).await;
            // The last sender went with the server's tasks: what was queued is committed.
            let _ = writer.await;
        });
        Ok(Self {
            addr,
            http: http_addr,
            stop,
            task: Some(task),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where its HTTP face listens, when `http_addr` is set.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http
    }

    /// Stops accepting, stops delivering, gives the tasks it was delivering back to the store
    /// (due again at once), and returns once every connection has written what was queued
    /// for it.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for DelayServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// What the server's tasks share.
struct Inner {
    config: Config,
    store: Arc<dyn DelayStore>,
    /// To the writer: schedules and acknowledgements, committed in batches.
    writes: mpsc::Sender<Write>,
    /// Route → the connections registered for it.
    routes: Mutex<HashMap<String, Vec<Conn>>>,
    /// Task id → the delivery waiting for its `ack`.
    in_flight: Mutex<HashMap<String, InFlight>>,
    connections: AtomicU64,
    /// Whose turn it is among a route's connections.
    turn: AtomicU64,
    /// The earliest `fire_at` stored since the dispatcher last looked (epoch ms; `i64::MAX`:
    /// none, 0: a registration), so that a schedule for tomorrow costs it no claim.
    soonest: Arc<std::sync::atomic::AtomicI64>,
    /// A schedule, a registration or a freed connection: the dispatcher looks again.
    wake: Arc<Notify>,
    metrics: Arc<Metrics>,
    /// Tasks claimed ahead, waiting in memory to fire.
    ready: AtomicU64,
    /// Of those, redeliveries: due already, waiting for their retry delay to end.
    held_redeliveries: AtomicU64,
    /// Where HTTP tasks go, when enabled.
    outbox: Option<Arc<soulbase_net_outbox::Outbox>>,
}

impl Inner {
    /// The gauges, read now.
    async fn gauges(&self) -> Gauges {
        let connections = {
            let routes = self.routes.lock();
            let mut c: Vec<(String, usize)> = routes
                .iter()
                .map(|(r, conns)| (r.clone(), conns.len()))
                .collect();
            c.sort();
            c
        };
        let in_flight = self.in_flight.lock().len();
        Gauges {
            pending: self.store.pending().await.ok(),
            in_flight,
            // Every stored task whose `fire_at` has passed (acknowledged ones are deleted),
            // on every server of the store; what this server holds when the store is away.
            due_undelivered: match self.store.due().await {
                Ok(due) => due,
                Err(_) => in_flight as u64 + self.held_redeliveries.load(Ordering::Relaxed),
            },
            ready: self.ready.load(Ordering::Relaxed),
            connections,
        }
    }
}

/// What the writer commits.
enum Write {
    /// A task to store; the answer goes back to its connection.
    Schedule(
        DelayTask,
        oneshot::Sender<Result<Scheduled, (&'static str, String)>>,
    ),
    /// A delivery the client acknowledged (`claim` 0: whoever holds it).
    Ack(String, i64),
}

/// Commits what arrives, a batch at a time: one transaction for every schedule and
/// acknowledgement queued meanwhile.
async fn write_batches(
    store: Arc<dyn DelayStore>,
    wake: Arc<Notify>,
    soonest: Arc<std::sync::atomic::AtomicI64>,
    metrics: Arc<Metrics>,
    mut queued: mpsc::Receiver<Write>,
) {
    while let Some(first) = queued.recv().await {
        let mut batch = vec![first];
        while batch.len() < WRITE_BATCH {
            match queued.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        let mut tasks = Vec::new();
        let mut answers = Vec::new();
        let mut acks = Vec::new();
        for w in batch {
            match w {
                Write::Schedule(task, answer) => {
                    tasks.push(task);
                    answers.push(answer);
                }
                Write::Ack(id, claim) => acks.push((id, claim)),
            }
        }
        match store.write(&tasks, &acks).await {
            Ok((stored, _)) => {
                let first = tasks
                    .iter()
                    .zip(&stored)
                    .filter(|(_, s)| **s == Scheduled::New)
                    .map(|(t, _)| t.fire_at)
                    .min();
                if let Some(first) = first {
                    soonest.fetch_min(first, Ordering::AcqRel);
                    wake.notify_one();
                }
                for done in &stored {
                    Metrics::add(match done {
                        Scheduled::New => &metrics.scheduled,
                        Scheduled::Duplicate => &metrics.duplicates,
                    });
                }
                for (answer, done) in answers.into_iter().zip(stored) {
                    let _ = answer.send(Ok(done));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, tasks = tasks.len(), acks = acks.len(), "delay server: a write failed");
                let code = e.code().as_str();
                let message = format!("not stored: {e}");
                for answer in answers {
                    let _ = answer.send(Err((code, message.clone())));
                }
            }
        }
    }
}

#[derive(Clone)]
struct Conn {
    id: u64,
    tx: mpsc::Sender<String>,
}

struct InFlight {
    claim: i64,
    conn: u64,
    deadline: Instant,
}

/// Accepts connections and runs the dispatcher until told to stop.
async fn serve(
    inner: Arc<Inner>,
    listener: TcpListener,
    http: Option<TcpListener>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut tasks = JoinSet::new();
    if let Some(outbox) = inner.outbox.clone() {
        let mut stop = stopped.clone();
        tasks.spawn(async move {
            let running = outbox.clone();
            let run = tokio::spawn(async move { running.run().await });
            let _ = stop.changed().await;
            outbox.shutdown();
            let _ = run.await;
        });
    }
    if let Some(http) = http {
        tasks.spawn(http::serve(inner.clone(), http, stopped.clone()));
    }
    tasks.spawn(dispatch(inner.clone(), stopped.clone()));
    tasks.spawn(expire(inner.clone(), stopped.clone()));
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if !inner.config.allows(peer.ip()) {
                        tracing::warn!(%peer, "delay server: refused a peer outside allowed_hosts");
                        drop(stream);
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    tasks.spawn(connection(inner.clone(), stream, stopped.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "delay server: accept failed");
                    // Out of descriptors and the like: give the process a moment.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
    // What was being delivered goes back to the store, due now.
    let held: Vec<(String, InFlight)> = inner.in_flight.lock().drain().collect();
    for (id, f) in held {
        let _ = inner.store.retry(&id, f.claim, Duration::ZERO).await;
    }
}

/// Fires the tasks claimed ahead, each when it is due. Claims run in a task of their own
/// ([`claim_ahead`]) and hand their tasks over, so a slow store never holds up a delivery
/// that is due; a delivery that cannot be written goes back to the store from another task
/// ([`retry_later`]) for the same reason.
async fn dispatch(inner: Arc<Inner>, mut stopped: watch::Receiver<bool>) {
    let (claimed_tx, mut claimed) = mpsc::channel::<(Instant, Vec<DelayTask>)>(2);
    let (retry_tx, retry_rx) = mpsc::unbounded_channel::<(String, i64)>();
    let claimer = tokio::spawn(claim_ahead(inner.clone(), stopped.clone(), claimed_tx));
    let retrier = tokio::spawn(retry_later(inner.clone(), retry_rx));
    let mut wheel = Wheel::default();
    loop {
        let now = Instant::now();
        while let Some(task) = wheel.pop_due(now) {
            // The store's clock put it here; never before its `fire_at` on this server's own
            // clock either (the claim's time is taken before the claim is sent, so a task can
            // come up to a round trip early).
            let early = task.fire_at - epoch_ms();
            if task.attempts == 0 && early > 0 {
                let at = now + Duration::from_millis(u64::try_from(early).unwrap_or(0));
                wheel.insert(at, task);
                continue;
            }
            if let Some(failed) = deliver(&inner, task) {
                let _ = retry_tx.send(failed);
            }
        }
        inner.ready.store(wheel.len() as u64, Ordering::Relaxed);
        inner
            .held_redeliveries
            .store(wheel.redeliveries as u64, Ordering::Relaxed);
        let first = wheel.first();
        tokio::select! {
            _ = stopped.changed() => break,
            batch = claimed.recv() => match batch {
                Some((at, tasks)) => wheel.add(at, tasks),
                None => break,
            },
            () = sleep_until_some(first) => {}
        }
    }
    // Stopping: what was claimed ahead — held here or still on its way — goes back to the
    // store, due as it was.
    let _ = claimer.await;
    while let Ok((at, tasks)) = claimed.try_recv() {
        wheel.add(at, tasks);
    }
    inner.ready.store(0, Ordering::Relaxed);
    inner.held_redeliveries.store(0, Ordering::Relaxed);
    for task in wheel.tasks.into_values() {
        let _ = inner.store.release(&task.id, task.claim).await;
    }
    drop(retry_tx);
    let _ = retrier.await;
}

/// Tasks claimed, not yet due: by due time (and a sequence number, for ties).
#[derive(Default)]
struct Wheel {
    tasks: std::collections::BTreeMap<(Instant, u64), DelayTask>,
    seq: u64,
    /// Of these, the redeliveries: tasks whose `fire_at` has passed (they were delivered
    /// before) waiting for their retry delay to end.
    redeliveries: usize,
}

impl Wheel {
    fn insert(&mut self, at: Instant, task: DelayTask) {
        self.seq += 1;
        if task.attempts > 0 {
            self.redeliveries += 1;
        }
        self.tasks.insert((at, self.seq), task);
    }

    /// A claim's tasks, each due `due_in` after `at`.
    fn add(&mut self, at: Instant, tasks: Vec<DelayTask>) {
        for task in tasks {
            self.insert(at + task.due_in, task);
        }
    }

    /// The first task due at `now`, taken out.
    fn pop_due(&mut self, now: Instant) -> Option<DelayTask> {
        let entry = self.tasks.first_entry()?;
        let task = (entry.key().0 <= now).then(|| entry.remove())?;
        if task.attempts > 0 {
            self.redeliveries -= 1;
        }
        Some(task)
    }

    /// When the next task is due.
    fn first(&self) -> Option<Instant> {
        self.tasks.first_key_value().map(|((at, _), _)| *at)
    }

    fn len(&self) -> usize {
        self.tasks.len()
    }
}

/// Sleeps until `at`, or for ever when there is nothing to wait for.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Claims, for the routes that have a connection, the tasks due within [`AHEAD`], and hands
/// them to the dispatcher: every half of that, at once when a claim came back full, and
/// sooner when a registration or a schedule due within the horizon wakes it. It claims no
/// more while the dispatcher holds a full batch.
async fn claim_ahead(
    inner: Arc<Inner>,
    mut stopped: watch::Receiver<bool>,
    to: mpsc::Sender<(Instant, Vec<DelayTask>)>,
) {
    let limit = u32::try_from(inner.config.ready_channel_capacity).unwrap_or(u32::MAX);
    let lease = AHEAD + inner.config.ack_timeout() + LEASE_MARGIN;
    let mut next_claim = Instant::now();
    loop {
        if *stopped.borrow() {
            return;
        }
        let now = Instant::now();
        if now >= next_claim {
            let routes: Vec<String> = inner.routes.lock().keys().cloned().collect();
            next_claim = now + AHEAD / 2;
            if routes.is_empty() {
                next_claim = now + IDLE;
            } else if inner.ready.load(Ordering::Relaxed) >= u64::from(limit) {
                // The dispatcher holds a full batch already: look again in a tick.
                next_claim = now + inner.config.tick();
            } else {
                // A task's `due_in` is read on the store's clock while the claim runs: counted
                // from when the claim was sent, not from its answer (a claim of a full batch
                // takes milliseconds, which every task would otherwise be late by).
                let asked = Instant::now();
                match inner.store.claim_due(&routes, limit, lease, AHEAD).await {
                    Ok(tasks) => {
                        if tasks.len() as u64 >= u64::from(limit) {
                            next_claim = Instant::now();
                        }
                        if !tasks.is_empty() && to.send((asked, tasks)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "delay server: claiming due tasks failed");
                        next_claim = now + inner.config.tick().max(Duration::from_millis(100));
                    }
                }
            }
        }
        tokio::select! {
            _ = stopped.changed() => return,
            // A registration, or a task stored that is due within the horizon: claim now.
            () = inner.wake.notified() => {
                let soonest = inner.soonest.swap(i64::MAX, Ordering::AcqRel);
                if soonest <= epoch_ms() + i64::try_from(AHEAD.as_millis()).unwrap_or(0) {
                    next_claim = Instant::now();
                }
            }
            () = tokio::time::sleep_until(next_claim) => {}
        }
    }
}

/// Gives deliveries that could not be written back to the store, due again after the retry
/// delay, a few at a time; returns once the dispatcher has stopped and every one is done.
async fn retry_later(inner: Arc<Inner>, mut failed: mpsc::UnboundedReceiver<(String, i64)>) {
    const AT_ONCE: usize = 8;
    let mut running = JoinSet::new();
    while let Some((id, claim)) = failed.recv().await {
        while running.len() >= AT_ONCE {
            let _ = running.join_next().await;
        }
        let inner = inner.clone();
        running.spawn(async move {
            if let Err(e) = inner
                .store
                .retry(&id, claim, inner.config.retry_delay())
                .await
            {
                tracing::warn!(error = %e, %id, "delay server: rescheduling failed");
            }
        });
    }
    while running.join_next().await.is_some() {}
}

/// Now, in ms since the epoch (the clock `fire_at` is on).
fn epoch_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Writes `task` to a connection of its route; when it cannot, returns its id and claim, to
/// be given back to the store for later.
fn deliver(inner: &Inner, task: DelayTask) -> Option<(String, i64)> {
    let conn = {
        let routes = inner.routes.lock();
        routes.get(&task.route_key).and_then(|conns| {
            // Competing consumers: the connections of a route take turns.
            let n = conns.len() as u64;
            let turn = inner.turn.fetch_add(1, Ordering::Relaxed);
            (n > 0).then(|| conns[usize::try_from(turn % n).unwrap_or(0)].clone())
        })
    };
    let Some(conn) = conn else {
        // No connection for the route any more: due again later.
        Metrics::add(&inner.metrics.redelivered);
        return Some((task.id, task.claim));
    };
    // In flight before it is written: the client's `ack` can never arrive before the server
    // knows the delivery was made on this connection (and would then be ignored).
    inner.in_flight.lock().insert(
        task.id.clone(),
        InFlight {
            claim: task.claim,
            conn: conn.id,
            deadline: Instant::now() + inner.config.ack_timeout(),
        },
    );
    if conn.tx.try_send(Outbound::delivery(&task).line()).is_err() {
        // Its queue is full (or it is closing): due again later.
        inner.in_flight.lock().remove(&task.id);
        Metrics::add(&inner.metrics.redelivered);
        return Some((task.id, task.claim));
    }
    Metrics::add(&inner.metrics.delivered);
    if task.attempts == 0 {
        let late = epoch_ms().saturating_sub(task.fire_at).max(0);
        inner
            .metrics
            .observe_lateness(u64::try_from(late).unwrap_or(0));
    }
    None
}

/// Deliveries not acknowledged within the timeout are due again after the retry delay.
async fn expire(inner: Arc<Inner>, mut stopped: watch::Receiver<bool>) {
    let every = inner.config.tick().max(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            () = tokio::time::sleep(every) => {}
        }
        let now = Instant::now();
        let late: Vec<(String, i64)> = {
            let mut in_flight = inner.in_flight.lock();
            let ids: Vec<String> = in_flight
                .iter()
                .filter(|(_, f)| f.deadline <= now)
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| in_flight.remove(&id).map(|f| (id, f.claim)))
                .collect()
        };
        for (id, claim) in late {
            Metrics::add(&inner.metrics.redelivered);
            tracing::debug!(%id, "delay server: no ack in time; due again after the retry delay");
            let _ = inner
                .store
                .retry(&id, claim, inner.config.retry_delay())
                .await;
        }
    }
}

/// Serves one client connection.
async fn connection(inner: Arc<Inner>, stream: TcpStream, mut stopped: watch::Receiver<bool>) {
    let n = inner.connections.fetch_add(1, Ordering::Relaxed) + 1;
    let own_route = format!("conn-{n}");
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<String>(inner.config.connection_write_channel);
    let writer = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            if write.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
    });
    // The answers, in the order of the lines, each once it is known.
    let (answers, mut pending) = mpsc::channel::<Answer>(inner.config.connection_write_channel);
    let answering = {
        let tx = tx.clone();
        let store = inner.store.clone();
        tokio::spawn(async move {
            while let Some(answer) = pending.recv().await {
                let line = match answer {
                    Answer::Now(out) => out.line(),
                    Answer::Stored { id, fire_at, done } => match done.await {
                        Ok(Ok(done)) => {
                            let fire_at = acked_fire_at(&*store, &id, done, fire_at).await;
                            Outbound::Ack { id, fire_at }.line()
                        }
                        Ok(Err((code, message))) => Outbound::Error {
                            id: Some(id),
                            code,
                            message,
                        }
                        .line(),
                        Err(_) => Outbound::Error {
                            id: Some(id),
                            code: soulbase_net_core::ErrorKind::Io.code().as_str(),
                            message: "not stored: the server is stopping".to_owned(),
                        }
                        .line(),
                    },
                };
                if tx.send(line).await.is_err() {
                    break;
                }
            }
        })
    };
    let mut lines = LineReader::new(read);
    let mut registered: Vec<String> = Vec::new();
    loop {
        let line = tokio::select! {
            _ = stopped.changed() => break,
            line = lines.next() => line,
        };
        let reply = match line {
            Ok(None) | Err(_) => break,
            Ok(Some(Err(TooLong))) => Some(Answer::Now(Outbound::Error {
                id: None,
                code: soulbase_net_core::ErrorKind::InvalidRequest.code().as_str(),
                message: format!("line over {MAX_LINE} bytes, skipped"),
            })),
            Ok(Some(Ok(line))) => match protocol::parse(&line) {
                Err(bad) => Some(Answer::Now(bad.reply())),
                Ok(Inbound::Register { route_key, token }) => {
                    if !inner.config.admits(&route_key, token.as_deref()) {
                        let _ = answers
                            .send(Answer::Now(forbidden(&inner.metrics, None, &route_key)))
                            .await;
                        break;
                    }
                    if !registered.contains(&route_key) {
                        inner
                            .routes
                            .lock()
                            .entry(route_key.clone())
                            .or_default()
                            .push(Conn {
                                id: n,
                                tx: tx.clone(),
                            });
                        registered.push(route_key.clone());
                    }
                    inner.soonest.fetch_min(0, Ordering::AcqRel);
                    inner.wake.notify_one();
                    Some(Answer::Now(Outbound::Registered { route_key }))
                }
                Ok(Inbound::Schedule(s)) => {
                    let route = s.route_key.as_deref().unwrap_or(&own_route);
                    if !inner.config.admits(route, s.token.as_deref()) {
                        let _ = answers
                            .send(Answer::Now(forbidden(&inner.metrics, s.id.clone(), route)))
                            .await;
                        break;
                    }
                    Some(schedule(&inner, s, &own_route).await)
                }
                Ok(Inbound::Ack { id }) => {
                    if let Some(claim) = take_delivery(&inner, &id, n) {
                        Metrics::add(&inner.metrics.acked);
                        // Committed with the next batch; a failure leaves the task to come
                        // again.
                        let _ = inner.writes.send(Write::Ack(id, claim)).await;
                    } else {
                        // Not a delivery waiting on this connection: another connection's, one
                        // that timed out, or none. It changes nothing (an ack is never
                        // answered, so neither is this one).
                        Metrics::add(&inner.metrics.acks_ignored);
                        tracing::debug!(%id, "delay server: an ack of no delivery waiting on this connection, ignored");
                    }
                    None
                }
            },
        };
        if let Some(reply) = reply {
            if matches!(reply, Answer::Now(Outbound::Error { .. })) {
                Metrics::add(&inner.metrics.refused);
            }
            if answers.send(reply).await.is_err() {
                break;
            }
        }
    }
    drop(answers);
    let _ = answering.await;
    // Gone: its routes lose it, and what it had not acknowledged is due again later.
    {
        let mut routes = inner.routes.lock();
        for route in &registered {
            if let Some(conns) = routes.get_mut(route) {
                conns.retain(|c| c.id != n);
                if conns.is_empty() {
                    routes.remove(route);
                }
            }
        }
    }
    let orphaned: Vec<(String, i64)> = {
        let mut in_flight = inner.in_flight.lock();
        let ids: Vec<String> = in_flight
            .iter()
            .filter(|(_, f)| f.conn == n)
            .map(|(id, _)| id.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| in_flight.remove(&id).map(|f| (id, f.claim)))
            .collect()
    };
    for (id, claim) in orphaned {
        Metrics::add(&inner.metrics.redelivered);
        let _ = inner
            .store
            .retry(&id, claim, inner.config.retry_delay())
            .await;
    }
    drop(tx);
    let _ = writer.await;
}

/// The claim of the delivery `id` if it is waiting for its `ack` on the connection `conn`,
/// taken out of the deliveries in flight; `None` (and nothing taken) otherwise — so that a
/// connection can acknowledge (delete) only what was delivered to it, never another route's
/// task by its id.
fn take_delivery(inner: &Inner, id: &str, conn: u64) -> Option<i64> {
    let mut in_flight = inner.in_flight.lock();
    match in_flight.get(id) {
        Some(f) if f.conn == conn => in_flight.remove(id).map(|f| f.claim),
        _ => None,
    }
}

/// The `fire_at` to acknowledge a schedule with: `given` for a new task; for a duplicate (an
/// id already stored, kept as it was) the stored task's, since that is when it fires — or
/// `given` if it is gone meanwhile (delivered and acknowledged since).
async fn acked_fire_at(store: &dyn DelayStore, id: &str, done: Scheduled, given: i64) -> i64 {
    match done {
        Scheduled::New => given,
        Scheduled::Duplicate => match store.get(id).await {
            Ok(Some(stored)) => stored.fire_at,
            Ok(None) => given,
            Err(e) => {
                tracing::warn!(error = %e, %id, "delay server: reading a duplicate's fire_at failed");
                given
            }
        },
    }
}

/// The answer to a line whose route needs a token it did not carry (the connection closes),
/// counted as refused.
fn forbidden(metrics: &Metrics, id: Option<String>, route: &str) -> Outbound {
    Metrics::add(&metrics.refused);
    Outbound::Error {
        id,
        code: soulbase_net_core::ErrorKind::Blocked.code().as_str(),
        message: format!("route `{route}` needs its token; the connection is closed"),
    }
}

/// An answer to a line: known now, or once the task's batch is committed.
enum Answer {
    Now(Outbound),
    Stored {
        id: String,
        fire_at: i64,
        done: oneshot::Receiver<Result<Scheduled, (&'static str, String)>>,
    },
}

/// Queues a scheduled task for the writer; its answer comes once it is committed.
async fn schedule(inner: &Inner, s: protocol::Schedule, own_route: &str) -> Answer {
    let id = match s.id {
        Some(id) => id,
        None => match soulbase_net_core::new_idempotency_key() {
            Ok(id) => id,
            Err(e) => {
                return Answer::Now(Outbound::Error {
                    id: None,
                    code: e.code().as_str(),
                    message: e.to_string(),
                })
            }
        },
    };
    if let Some(target) = s.target {
        return http_task(inner, id, s.fire_at, &s.compression, s.payload, target).await;
    }
    if let Err(message) =
        crate::compress::check(&s.compression, &s.payload, inner.config.max_payload_bytes)
    {
        return Answer::Now(Outbound::Error {
            id: Some(id),
            code: soulbase_net_core::ErrorKind::InvalidRequest.code().as_str(),
            message,
        });
    }
    let task = DelayTask {
        id: id.clone(),
        route_key: s.route_key.unwrap_or_else(|| own_route.to_owned()),
        fire_at: s.fire_at,
        compression: s.compression,
        payload: s.payload,
        attempts: 0,
        claim: 0,
        due_in: Duration::ZERO,
    };
    let fire_at = task.fire_at;
    let (answer, done) = oneshot::channel();
    if inner
        .writes
        .send(Write::Schedule(task, answer))
        .await
        .is_err()
    {
        return Answer::Now(Outbound::Error {
            id: Some(id),
            code: soulbase_net_core::ErrorKind::Io.code().as_str(),
            message: "not stored: the server is stopping".to_owned(),
        });
    }
    Answer::Stored { id, fire_at, done }
}

/// Enqueues an HTTP task in the outbox (committed before the answer).
async fn http_task(
    inner: &Inner,
    id: String,
    fire_at: i64,
    compression: &str,
    payload: bytes::Bytes,
    target: protocol::Target,
) -> Answer {
    let refuse = |message: String| {
        Answer::Now(Outbound::Error {
            id: Some(id.clone()),
            code: soulbase_net_core::ErrorKind::InvalidRequest.code().as_str(),
            message,
        })
    };
    let Some(outbox) = &inner.outbox else {
        return refuse("HTTP tasks are not enabled on this server".to_owned());
    };
    if compression != "none" {
        return refuse("an HTTP task's payload is its body: compression must be `none`".to_owned());
    }
    let Ok(method) = ::http::Method::from_bytes(target.method.as_bytes()) else {
        return refuse(format!("`{}` is not an HTTP method", target.method));
    };
    let due = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(fire_at).unwrap_or(0));
    let mut item = soulbase_net_outbox::OutboxItem::new(method, target.url, payload)
        .id(id.clone())
        .deliver_at(due);
    for (name, value) in &target.headers {
        item = item.header(name, value);
    }
    match outbox.enqueue(item).await {
        Ok(_) => Answer::Now(Outbound::Ack { id, fire_at }),
        Err(e) => Answer::Now(Outbound::Error {
            id: Some(id),
            code: e.code().as_str(),
            message: format!("not stored: {e}"),
        }),
    }
}

/// A line longer than [`MAX_LINE`]: skipped up to its newline.
#[derive(Debug)]
struct TooLong;

/// Lines of at most [`MAX_LINE`] bytes from a stream.
struct LineReader<R> {
    read: R,
    buf: Vec<u8>,
    /// Inside a line that is too long: dropping bytes until its newline.
    skipping: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    fn new(read: R) -> Self {
        Self {
            read,
            buf: Vec::with_capacity(4096),
            skipping: false,
        }
    }

    /// The next line (without its newline, `\r\n` accepted), a line too long, or `None` at
    /// the end of the stream.
    async fn next(&mut self) -> io::Result<Option<Result<Vec<u8>, TooLong>>> {
        loop {
            if let Some(at) = self.buf.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=at).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if std::mem::take(&mut self.skipping) {
                    return Ok(Some(Err(TooLong)));
                }
                if line.len() > MAX_LINE {
                    return Ok(Some(Err(TooLong)));
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(Ok(line)));
            }
            if self.buf.len() > MAX_LINE {
                self.buf.clear();
                self.skipping = true;
            }
            let mut chunk = [0u8; 8192];
            let n = self.read.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}
