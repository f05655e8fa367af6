//! `IdempotencyKey`: a stable `Idempotency-Key` for idempotent POST/PATCH, and a dedup window.

use std::{
    collections::{HashMap, VecDeque},
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use parking_lot::Mutex;
use soulbase_net_core::{
    bytes::Bytes,
    http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode},
    new_idempotency_key, ErrorKind, Hooks, Interceptor, NetError, NetRequest, NetResponse,
    RespBody,
};
use tokio::{sync::watch, time::Instant};

use crate::hex;

#[cfg(feature = "redis")]
mod shared;
#[cfg(feature = "redis")]
pub use self::shared::RedisDedupStore;

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The window of a shared dedup store when no `dedup_window` is set.
#[cfg(feature = "redis")]
const SHARED_WINDOW: Duration = Duration::from_secs(600);

/// Default of [`IdempotencyKey::dedup_max_entries`].
const DEFAULT_MAX_ENTRIES: usize = 100_000;

/// Default of [`IdempotencyKey::dedup_max_bytes`]: 64 MiB.
const DEFAULT_MAX_BYTES: usize = 64 << 20;

/// Adds an `Idempotency-Key` to idempotent POST and PATCH requests
/// ([`NetRequest::idempotent`]) that carry none.
///
/// The key is set once per call in [`before`](Interceptor::before), so every retry and hedge
/// of the call carries the same key. It is either random (32 hex characters,
/// [`IdempotencyKey::random`]) or derived ([`IdempotencyKey::derived`]): the SHA-256 (hex) of
/// the tenant, method, URL, body and the current time bucket, so the same request made twice
/// within a bucket gets the same key. A streamed body cannot be hashed and gets a random key.
///
/// With a [dedup window](IdempotencyKey::dedup_window), a second call with the same tenant and
/// key inside the window is not sent: it gets the first call's response (a buffered copy) or,
/// while the first is still in flight, waits for it and gets its outcome. Each such answer
/// counts as a dedup drop ([`IdempotencyKey::dedup_drops`]), and the client reports it as
/// `NetEvent::Answered` with `by: "idempotency_key"` (this interceptor's name), from which
/// `soulbase-net-observe`'s `Metrics` computes the dedup drop rate SLI and
/// `net_answered_total{by="idempotency_key"}`. Only responses below 500 are kept
/// for the window; a 5xx or an error is handed to the calls already waiting and then
/// forgotten, so a later call is sent again.
///
/// The window is bounded by [entries](IdempotencyKey::dedup_max_entries) (default 100 000)
/// and [bytes](IdempotencyKey::dedup_max_bytes) (default 64 MiB). Each call looks its key up
/// in a hash map and drops the entries whose window has ended from the front of a queue kept
/// in finishing order, so its cost does not grow with the number of entries. When the window
/// is full, the oldest finished entries are dropped first; calls in flight are never dropped.
///
/// # Examples
/// ```
/// use soulbase_net_core::{Interceptor, NetRequest};
/// use soulbase_net_interceptors::IdempotencyKey;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let keys = IdempotencyKey::random();
/// let mut req = NetRequest::post("https://api.example.com/orders").idempotent(true);
/// keys.before(&mut req).await.unwrap();
/// assert_eq!(req.headers["idempotency-key"].len(), 32);
/// # });
/// ```
pub struct IdempotencyKey {
    mode: Mode,
    limits: Limits,
    dedup: Option<Arc<Dedup>>,
    /// The fleet's window, in Redis, instead of this process's.
    #[cfg(feature = "redis")]
    shared: Option<Arc<RedisDedupStore>>,
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Random,
    Derived { bucket: Duration },
}

/// The size of the dedup window.
#[derive(Clone, Copy, Debug)]
struct Limits {
    window: Option<Duration>,
    max_entries: usize,
    max_bytes: usize,
}

/// The tenant and the key of a call.
type Key = (String, String);

/// The calls seen inside the dedup window, by (tenant, key).
struct Dedup {
    window: Duration,
    max_entries: usize,
    max_bytes: usize,
    table: Mutex<Table>,
    drops: AtomicU64,
    next_id: AtomicU64,
}

/// The entries of the window. Invariant: `kept` holds one record per `Entry::Done`.
#[derive(Default)]
struct Table {
    entries: HashMap<Arc<Key>, Entry>,
    /// The finished entries, oldest first. The window is the same for all of them, so this
    /// is also the order in which they expire: expiry and eviction pop from the front.
    kept: VecDeque<Kept>,
    /// Bytes held by all entries ([`key_cost`], plus [`Stored::cost`] once finished).
    bytes: usize,
    /// The part of `bytes` held by finished entries.
    kept_bytes: usize,
    /// Records popped from `kept`: what expiry and eviction examined.
    #[cfg(test)]
    visited: u64,
}

/// A finished entry's place in the expiry order.
struct Kept {
    /// `None` when the window reaches past what an `Instant` can hold.
    expires: Option<Instant>,
    id: u64,
    key: Arc<Key>,
}

enum Entry {
    InFlight {
        id: u64,
        tx: watch::Sender<Option<Arc<Outcome>>>,
    },
    Done {
        id: u64,
        /// Bytes counted for this entry in `Table::bytes`.
        cost: usize,
        outcome: Arc<Outcome>,
    },
}

/// What the first call ended with, in a form that can be handed out many times.
enum Outcome {
    Response(Stored),
    Error(ErrorKind, Option<String>),
}

struct Stored {
    status: StatusCode,
    headers: HeaderMap,
    content_type: Option<String>,
    body: Bytes,
    url: String,
    attempts: u32,
}

/// The part a call plays in the dedup window, kept in its extensions.
#[derive(Clone)]
enum Role {
    /// The first call with its key: its outcome is recorded.
    Leader(Arc<LeaderGuard>),
    /// A later call, answered from the recorded outcome.
    Follower(watch::Receiver<Option<Arc<Outcome>>>),
    /// A call under the fleet's shared window (in Redis).
    #[cfg(feature = "redis")]
    Shared(Arc<shared::SharedCall>),
}

/// Removes the in-flight entry of a leader that never finished (cancelled, or answered by
/// another interceptor), so followers stop waiting.
struct LeaderGuard {
    dedup: Arc<Dedup>,
    key: Arc<Key>,
    id: u64,
}

// === impl IdempotencyKey ===

impl IdempotencyKey {
    /// Random keys, no dedup window.
    pub fn random() -> Self {
        IdempotencyKey::with_mode(Mode::Random)
    }

    /// Keys derived from the tenant, method, URL, body and the time bucket of `bucket`
    /// length (a zero bucket is taken as one second); no dedup window.
    pub fn derived(bucket: Duration) -> Self {
        IdempotencyKey::with_mode(Mode::Derived {
            bucket: bucket.max(Duration::from_secs(1)),
        })
    }

    fn with_mode(mode: Mode) -> Self {
        IdempotencyKey {
            mode,
            limits: Limits {
                window: None,
                max_entries: DEFAULT_MAX_ENTRIES,
                max_bytes: DEFAULT_MAX_BYTES,
            },
            dedup: None,
            #[cfg(feature = "redis")]
            shared: None,
        }
    }

    /// Keeps the dedup window in Redis, shared by every instance that points at it, instead of
    /// in this process: a duplicate made on another instance inside the window is answered
    /// with the first call's response (or waits for it while it is in flight, up to the
    /// store's `wait`, then fails with a conflict error) instead of being sent again. The
    /// window is [`dedup_window`](Self::dedup_window)'s, 10 minutes when none is set.
    #[cfg(feature = "redis")]
    pub fn shared_dedup(mut self, store: RedisDedupStore) -> Self {
        if self.limits.window.is_none() {
            self = self.dedup_window(SHARED_WINDOW);
        }
        self.shared = Some(Arc::new(store));
        self
    }

    /// Answers a second call with the same tenant and key within `window` with the first
    /// call's outcome instead of sending it. Default is no window.
    ///
    /// The window of an entry starts when its first call finishes.
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.limits.window = Some(window);
        self.rebuild()
    }

    /// At most `n` calls are held in the dedup window at once, in flight or finished
    /// (default 100 000).
    ///
    /// When a new call needs room, the oldest finished entries are dropped first. Calls in
    /// flight are never dropped: when they alone fill the window, a new call is sent without
    /// dedup (a later call with its key is sent too) and its outcome is not kept.
    pub fn dedup_max_entries(mut self, n: usize) -> Self {
        self.limits.max_entries = n;
        self.rebuild()
    }

    /// At most `bytes` are held by the dedup window (default 64 MiB): each entry counts its
    /// tenant and key, and once finished the body, headers and URL of its response.
    ///
    /// The oldest finished entries are dropped first to make room. A response that does not
    /// fit even with every finished entry dropped is handed to the calls waiting for it and
    /// not kept, as a 5xx is: a later call with its key is sent again. A call in flight is
    /// never dropped (see [`dedup_max_entries`](IdempotencyKey::dedup_max_entries)).
    pub fn dedup_max_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_bytes = bytes;
        self.rebuild()
    }

    /// Calls answered from the dedup window instead of being sent. The client reports each
    /// one to its observer too (`NetEvent::Answered`), so metrics need not read this.
    pub fn dedup_drops(&self) -> u64 {
        self.dedup
            .as_ref()
            .map_or(0, |d| d.drops.load(Ordering::Relaxed))
    }

    /// A fresh (empty) window with the current limits; builder methods come before use.
    fn rebuild(mut self) -> Self {
        self.dedup = self.limits.window.map(|window| {
            Arc::new(Dedup {
                window,
                max_entries: self.limits.max_entries,
                max_bytes: self.limits.max_bytes,
                table: Mutex::new(Table::default()),
                drops: AtomicU64::new(0),
                next_id: AtomicU64::new(0),
            })
        });
        self
    }

    fn key_for(&self, req: &NetRequest) -> Result<String, NetError> {
        match self.mode {
            Mode::Random => new_idempotency_key(),
            Mode::Derived { bucket } => match req.body_bytes() {
                Ok(Some(body)) => Ok(derive(req, &body, bucket, SystemTime::now())),
                // A stream cannot be hashed without consuming it.
                _ => new_idempotency_key(),
            },
        }
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyKey")
            .field("mode", &self.mode)
            .field("dedup_window", &self.limits.window)
            .field("dedup_max_entries", &self.limits.max_entries)
            .field("dedup_max_bytes", &self.limits.max_bytes)
            .field("dedup_drops", &self.dedup_drops())
            .finish()
    }
}

/// Whether the interceptor handles `req`: an idempotent POST or PATCH.
fn applies(req: &NetRequest) -> bool {
    req.idempotent && (req.method == Method::POST || req.method == Method::PATCH)
}

/// The derived key: SHA-256 over the length-prefixed tenant, method, URL (with query pairs),
/// body and time bucket, as hex.
fn derive(req: &NetRequest, body: &[u8], bucket: Duration, now: SystemTime) -> String {
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let slot = secs / bucket.as_secs().max(1);
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut field = |bytes: &[u8]| {
        ctx.update(&(bytes.len() as u64).to_be_bytes());
        ctx.update(bytes);
    };
    field(req.tenant.as_deref().unwrap_or("").as_bytes());
    field(req.method.as_str().as_bytes());
    field(req.url.as_bytes());
    for (k, v) in &req.query {
        field(k.as_bytes());
        field(v.as_bytes());
    }
    field(body);
    field(&slot.to_be_bytes());
    hex::encode(ctx.finish().as_ref())
}

#[async_trait::async_trait]
impl Interceptor for IdempotencyKey {
    async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
        self.before_now(req)
    }

    /// What `before` does: the key is made without waiting (a shared store is asked in
    /// `respond`), so the client calls it in place (see [`Hooks::BEFORE_NOW`]).
    fn before_now(&self, req: &mut NetRequest) -> Result<(), NetError> {
        if !applies(req) {
            return Ok(());
        }
        if !req.headers.contains_key(&IDEMPOTENCY_KEY) {
            if let Ok(v) = HeaderValue::from_str(&self.key_for(req)?) {
                req.headers.insert(IDEMPOTENCY_KEY, v);
            }
        }
        #[cfg(feature = "redis")]
        if let (Some(store), Some(key)) = (&self.shared, req.headers.get(&IDEMPOTENCY_KEY)) {
            let call = shared::SharedCall {
                tenant: req.tenant.clone().unwrap_or_default(),
                key: String::from_utf8_lossy(key.as_bytes()).into_owned(),
                token: new_idempotency_key()?,
                leader: std::sync::atomic::AtomicBool::new(false),
                store: store.clone(),
                deadline: req.timeout.total,
                heartbeat: parking_lot::Mutex::new(None),
            };
            req.extensions.insert(Role::Shared(Arc::new(call)));
            return Ok(());
        }
        let (Some(dedup), Some(key)) = (
            &self.dedup,
            req.headers.get(&IDEMPOTENCY_KEY).map(|v| v.as_bytes()),
        ) else {
            return Ok(());
        };
        let key = (
            req.tenant.clone().unwrap_or_default(),
            String::from_utf8_lossy(key).into_owned(),
        );
        if let Some(role) = dedup.claim(key) {
            req.extensions.insert(role);
        }
        Ok(())
    }

    async fn respond(&self, req: &NetRequest) -> Option<Result<NetResponse, NetError>> {
        #[cfg(feature = "redis")]
        if let Some(Role::Shared(call)) = req.extensions.get::<Role>() {
            return self.respond_shared(call).await;
        }
        let Some(Role::Follower(rx)) = req.extensions.get::<Role>() else {
            return None;
        };
        let mut rx = rx.clone();
        let outcome = loop {
            if let Some(o) = rx.borrow_and_update().clone() {
                break o;
            }
            if rx.changed().await.is_err() {
                // The first call went away without an outcome: send this one.
                match rx.borrow().clone() {
                    Some(o) => break o,
                    None => return None,
                }
            }
        };
        if let Some(d) = &self.dedup {
            d.drops.fetch_add(1, Ordering::Relaxed);
        }
        Some(outcome.replay())
    }

    async fn after(&self, req: &NetRequest, res: &mut NetResponse) -> Result<(), NetError> {
        #[cfg(feature = "redis")]
        if let Some(Role::Shared(call)) = req.extensions.get::<Role>() {
            return self.after_shared(call, res).await;
        }
        let Some(Role::Leader(guard)) = req.extensions.get::<Role>() else {
            return Ok(());
        };
        let body = match buffer_body(res).await {
            Ok(b) => b,
            Err(e) => {
                guard.finish(Outcome::Error(e.kind(), e.message().map(str::to_owned)));
                return Err(e);
            }
        };
        guard.finish(Outcome::Response(Stored {
            status: res.status,
            headers: res.headers.clone(),
            content_type: res.content_type.clone(),
            body,
            url: res.url.clone(),
            attempts: res.attempts,
        }));
        Ok(())
    }

    async fn on_error(&self, req: &NetRequest, err: &NetError) {
        #[cfg(feature = "redis")]
        if let Some(Role::Shared(call)) = req.extensions.get::<Role>() {
            if call.done() {
                let (t, k, tok) = (&call.tenant, &call.key, &call.token);
                call.store.finish(t, k, tok, None, Duration::ZERO).await;
            }
            return;
        }
        if let Some(Role::Leader(guard)) = req.extensions.get::<Role>() {
            guard.finish(Outcome::Error(err.kind(), err.message().map(str::to_owned)));
        }
    }

    fn dedup_window(&self) -> Option<Duration> {
        self.limits.window
    }

    fn hooks(&self) -> Hooks {
        Hooks::BEFORE_NOW | Hooks::RESPOND | Hooks::AFTER | Hooks::ON_ERROR
    }

    fn name(&self) -> &'static str {
        "idempotency_key"
    }
}

#[cfg(feature = "redis")]
impl IdempotencyKey {
    /// The fleet's window: claim the key, or answer from the stored response, or wait for
    /// the call in flight elsewhere (then a conflict); `None` sends the call.
    async fn respond_shared(
        &self,
        call: &shared::SharedCall,
    ) -> Option<Result<NetResponse, NetError>> {
        let store = &call.store;
        let until = Instant::now() + store.wait_limit();
        loop {
            match store.claim(&call.tenant, &call.key, &call.token).await {
                // Redis failed (reported by the store): send without dedup, or refuse.
                None if store.refuses_when_down() => {
                    return Some(Err(shared::store_down(&call.key)));
                }
                None => return None,
                Some(shared::Claim::Claimed) => {
                    call.lead();
                    return None;
                }
                Some(shared::Claim::Stored(res)) => {
                    if let Some(d) = &self.dedup {
                        d.drops.fetch_add(1, Ordering::Relaxed);
                    }
                    return Some(Ok(*res));
                }
                Some(shared::Claim::InFlight) if Instant::now() >= until => {
                    return Some(Err(shared::conflict(&call.key, store.wait_limit())));
                }
                // Another instance's call is in flight; its response lands in Redis, which
                // cannot notify this process: look again shortly.
                Some(shared::Claim::InFlight) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// The leader stores a response below 500 for the window; otherwise it releases the key.
    async fn after_shared(
        &self,
        call: &shared::SharedCall,
        res: &mut NetResponse,
    ) -> Result<(), NetError> {
        if !call.done() {
            return Ok(());
        }
        let (t, k, tok) = (&call.tenant, &call.key, &call.token);
        if res.status.is_server_error() {
            call.store.finish(t, k, tok, None, Duration::ZERO).await;
            return Ok(());
        }
        let body = match buffer_body(res).await {
            Ok(b) => b,
            Err(e) => {
                call.store.finish(t, k, tok, None, Duration::ZERO).await;
                return Err(e);
            }
        };
        let window = self.limits.window.unwrap_or(SHARED_WINDOW);
        let stored = shared::StoredResponse::new(res, body);
        call.store.finish(t, k, tok, stored, window).await;
        Ok(())
    }
}

/// The response's body read whole and put back as bytes (the caller gets it unchanged), and
/// a copy to keep.
async fn buffer_body(res: &mut NetResponse) -> Result<Bytes, NetError> {
    let body = match std::mem::replace(&mut res.body, RespBody::Bytes(Bytes::new())) {
        RespBody::Bytes(b) => b,
        stream => collect(stream).await?,
    };
    res.body = RespBody::Bytes(body.clone());
    Ok(body)
}

/// The whole of a response body.
async fn collect(body: RespBody) -> Result<Bytes, NetError> {
    let mut tmp = NetResponse::from_bytes(StatusCode::OK, Bytes::new());
    tmp.body = body;
    tmp.bytes().await
}

/// Bytes an entry holds for its key: the tenant and the key.
fn key_cost(key: &Key) -> usize {
    key.0.len().saturating_add(key.1.len())
}

// === impl Dedup ===

impl Dedup {
    /// Registers a call with `key`: the leader if no live entry exists, else a follower;
    /// `None` (not tracked) when calls in flight alone fill the window.
    fn claim(self: &Arc<Self>, key: Key) -> Option<Role> {
        let mut table = self.table.lock();
        // Read under the lock, so `kept` is pushed in time order.
        table.expire(Instant::now());
        match table.entries.get(&key) {
            Some(Entry::Done { outcome, .. }) => {
                let (_tx, rx) = watch::channel(Some(outcome.clone()));
                return Some(Role::Follower(rx));
            }
            Some(Entry::InFlight { tx, .. }) => return Some(Role::Follower(tx.subscribe())),
            None => {}
        }
        let cost = key_cost(&key);
        if !table.make_room(1, cost, self) {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, _rx) = watch::channel(None);
        let key = Arc::new(key);
        table
            .entries
            .insert(key.clone(), Entry::InFlight { id, tx });
        table.bytes = table.bytes.saturating_add(cost);
        Some(Role::Leader(Arc::new(LeaderGuard {
            dedup: self.clone(),
            key,
            id,
        })))
    }
}

// === impl Table ===

impl Table {
    /// Drops the finished entries whose window has ended at `now`.
    fn expire(&mut self, now: Instant) {
        while self
            .kept
            .front()
            .is_some_and(|k| k.expires.is_some_and(|at| at <= now))
        {
            self.pop_oldest();
        }
    }

    /// Drops the oldest finished entry; false if there is none.
    fn pop_oldest(&mut self) -> bool {
        let Some(kept) = self.kept.pop_front() else {
            return false;
        };
        #[cfg(test)]
        {
            self.visited += 1;
        }
        if let Some(&Entry::Done { id, cost, .. }) = self.entries.get(&*kept.key) {
            if id == kept.id {
                self.entries.remove(&*kept.key);
                self.bytes = self.bytes.saturating_sub(cost);
                self.kept_bytes = self.kept_bytes.saturating_sub(cost);
            }
        }
        true
    }

    /// Drops finished entries, oldest first, until `entries` more entries and `bytes` more
    /// bytes fit in `limits`. False, with nothing dropped, when they would not fit even with
    /// every finished entry dropped.
    fn make_room(&mut self, entries: usize, bytes: usize, limits: &Dedup) -> bool {
        let in_flight = self.entries.len().saturating_sub(self.kept.len());
        let in_flight_bytes = self.bytes.saturating_sub(self.kept_bytes);
        if in_flight.saturating_add(entries) > limits.max_entries
            || in_flight_bytes.saturating_add(bytes) > limits.max_bytes
        {
            return false;
        }
        while self.entries.len().saturating_add(entries) > limits.max_entries
            || self.bytes.saturating_add(bytes) > limits.max_bytes
        {
            if !self.pop_oldest() {
                return false;
            }
        }
        true
    }
}

// === impl LeaderGuard ===

impl LeaderGuard {
    /// Hands `outcome` to the waiting calls; keeps it for the window if it is a response
    /// below 500 that fits in the window's bytes.
    fn finish(&self, outcome: Outcome) {
        let dedup = &self.dedup;
        let mut table = dedup.table.lock();
        let now = Instant::now();
        table.expire(now);
        if !matches!(table.entries.get(&*self.key), Some(Entry::InFlight { id, .. }) if *id == self.id)
        {
            return;
        }
        let key_cost = key_cost(&self.key);
        let mut keep = match &outcome {
            Outcome::Response(s) if !s.status.is_server_error() => Some(s.cost()),
            _ => None,
        };
        if let Some(extra) = keep {
            // The entry is already counted, with its key's bytes.
            if !table.make_room(0, extra, dedup) {
                keep = None;
            }
        }
        let outcome = Arc::new(outcome);
        let previous = match keep {
            Some(extra) => {
                let cost = key_cost.saturating_add(extra);
                table.bytes = table.bytes.saturating_add(extra);
                table.kept_bytes = table.kept_bytes.saturating_add(cost);
                table.kept.push_back(Kept {
                    expires: now.checked_add(dedup.window),
                    id: self.id,
                    key: self.key.clone(),
                });
                table.entries.insert(
                    self.key.clone(),
                    Entry::Done {
                        id: self.id,
                        cost,
                        outcome: outcome.clone(),
                    },
                )
            }
            None => {
                table.bytes = table.bytes.saturating_sub(key_cost);
                table.entries.remove(&*self.key)
            }
        };
        drop(table);
        if let Some(Entry::InFlight { tx, .. }) = previous {
            tx.send_replace(Some(outcome));
        }
    }
}

impl Drop for LeaderGuard {
    fn drop(&mut self) {
        let mut table = self.dedup.table.lock();
        if matches!(table.entries.get(&*self.key), Some(Entry::InFlight { id, .. }) if *id == self.id)
        {
            table.entries.remove(&*self.key);
            table.bytes = table.bytes.saturating_sub(key_cost(&self.key));
        }
    }
}

// === impl Stored ===

impl Stored {
    /// Bytes a kept response holds: body, headers, content type and URL.
    fn cost(&self) -> usize {
        let headers = self.headers.iter().fold(0usize, |n, (k, v)| {
            n.saturating_add(k.as_str().len() + v.len())
        });
        self.body
            .len()
            .saturating_add(headers)
            .saturating_add(self.content_type.as_ref().map_or(0, String::len))
            .saturating_add(self.url.len())
    }
}

// === impl Outcome ===

impl Outcome {
    fn replay(&self) -> Result<NetResponse, NetError> {
        match self {
            Outcome::Response(s) => {
                let mut res = NetResponse::from_bytes(s.status, s.body.clone());
                res.headers = s.headers.clone();
                res.content_type = s.content_type.clone();
                res.url = s.url.clone();
                res.attempts = s.attempts;
                Ok(res)
            }
            Outcome::Error(kind, message) => {
                let err = NetError::new(*kind);
                Err(match message {
                    Some(m) => err.with_message(m.clone()),
                    None => err,
                })
            }
        }
    }
}

#[cfg(test)]
impl Dedup {
    /// Entries held, in flight or finished.
    fn len(&self) -> usize {
        self.table.lock().entries.len()
    }

    /// Records expiry and eviction have examined so far.
    fn visited(&self) -> u64 {
        self.table.lock().visited
    }

    /// Bytes held, as counted.
    fn bytes(&self) -> usize {
        self.table.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_follow_the_inputs() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let bucket = Duration::from_secs(60);
        let req = || NetRequest::post("https://h.example/o").tenant("t1");
        let k = derive(&req(), b"{}", bucket, at);
        assert_eq!(k.len(), 64);
        assert_eq!(
            k,
            derive(&req(), b"{}", bucket, at + Duration::from_secs(1))
        );
        assert_ne!(k, derive(&req(), b"{ }", bucket, at));
        assert_ne!(k, derive(&req().tenant("t2"), b"{}", bucket, at));
        assert_ne!(
            k,
            derive(&req(), b"{}", bucket, at + Duration::from_secs(60))
        );
        let patch = NetRequest::patch("https://h.example/o").tenant("t1");
        assert_ne!(k, derive(&patch, b"{}", bucket, at));
    }

    #[tokio::test]
    async fn only_idempotent_post_and_patch_get_a_key() {
        let keys = IdempotencyKey::random();
        let mut plain = NetRequest::post("https://h.example/");
        keys.before(&mut plain).await.unwrap();
        assert!(!plain.headers.contains_key("idempotency-key"));
        let mut put = NetRequest::put("https://h.example/").idempotent(true);
        keys.before(&mut put).await.unwrap();
        assert!(!put.headers.contains_key("idempotency-key"));
        let mut own = NetRequest::patch("https://h.example/")
            .idempotent(true)
            .header("idempotency-key", "mine");
        keys.before(&mut own).await.unwrap();
        assert_eq!(own.headers["idempotency-key"], "mine");
    }

    #[tokio::test]
    async fn a_leader_that_vanishes_releases_its_followers() {
        let keys = IdempotencyKey::random().dedup_window(Duration::from_secs(60));
        let mut first = NetRequest::post("https://h.example/")
            .idempotent(true)
            .header("idempotency-key", "k");
        keys.before(&mut first).await.unwrap();
        let mut second = NetRequest::post("https://h.example/")
            .idempotent(true)
            .header("idempotency-key", "k");
        keys.before(&mut second).await.unwrap();
        drop(first);
        assert!(keys.respond(&second).await.is_none());
        assert_eq!(keys.dedup_drops(), 0);
    }

    fn dedup(keys: &IdempotencyKey) -> &Dedup {
        keys.dedup.as_deref().unwrap()
    }

    /// A call with `key` (tenant `t`) through `before`.
    async fn call(keys: &IdempotencyKey, key: &str) -> NetRequest {
        let mut req = NetRequest::post("https://h.example/o")
            .idempotent(true)
            .tenant("t")
            .header("idempotency-key", key);
        keys.before(&mut req).await.unwrap();
        req
    }

    /// Whether the call is the first with its key (sent, not answered from the window).
    fn leads(req: &NetRequest) -> bool {
        matches!(req.extensions.get::<Role>(), Some(Role::Leader(_)))
    }

    /// A first call with `key` that ends with a 200 carrying `body`.
    async fn settle(keys: &IdempotencyKey, key: &str, body: &'static [u8]) {
        let req = call(keys, key).await;
        assert!(leads(&req), "{key} leads");
        let mut res = NetResponse::from_bytes(StatusCode::OK, Bytes::from_static(body));
        keys.after(&req, &mut res).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_does_not_scan_the_window() {
        let keys = IdempotencyKey::random()
            .dedup_window(Duration::from_secs(60))
            .dedup_max_entries(100_000);
        for i in 0..100_000 {
            let before = dedup(&keys).visited();
            settle(&keys, &format!("k{i}"), b"ok").await;
            let visited = dedup(&keys).visited() - before;
            assert!(visited <= 1, "call {i} examined {visited} stored entries");
        }
        assert_eq!(dedup(&keys).len(), 100_000);
        let before = dedup(&keys).visited();
        assert!(!leads(&call(&keys, "k0").await));
        assert_eq!(dedup(&keys).visited(), before, "a hit examines nothing");
        // A new key at the bound examines the one entry it evicts, the oldest.
        assert!(leads(&call(&keys, "new").await));
        assert_eq!(dedup(&keys).visited(), before + 1);
        assert!(leads(&call(&keys, "k0").await));
    }

    #[tokio::test(start_paused = true)]
    async fn the_entry_bound_evicts_the_oldest_first() {
        let keys = IdempotencyKey::random()
            .dedup_window(Duration::from_secs(60))
            .dedup_max_entries(4);
        for i in 0..6 {
            settle(&keys, &format!("k{i}"), b"ok").await;
        }
        assert_eq!(dedup(&keys).len(), 4);
        for i in (2..6).rev() {
            assert!(!leads(&call(&keys, &format!("k{i}")).await), "k{i} is kept");
        }
        for i in 0..2 {
            assert!(
                leads(&call(&keys, &format!("k{i}")).await),
                "k{i} was evicted"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_byte_bound_evicts_the_oldest_first() {
        // Each entry holds 103 bytes: tenant `t`, key `kN`, a 100-byte body.
        let keys = IdempotencyKey::random()
            .dedup_window(Duration::from_secs(60))
            .dedup_max_bytes(350);
        for i in 0..5 {
            settle(&keys, &format!("k{i}"), &[b'x'; 100]).await;
        }
        assert_eq!(dedup(&keys).len(), 3);
        assert_eq!(dedup(&keys).bytes(), 309);
        for i in (2..5).rev() {
            assert!(!leads(&call(&keys, &format!("k{i}")).await), "k{i} is kept");
        }
        for i in 0..2 {
            assert!(
                leads(&call(&keys, &format!("k{i}")).await),
                "k{i} was evicted"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_after_the_window_each_examined_once() {
        let keys = IdempotencyKey::random().dedup_window(Duration::from_secs(60));
        for i in 0..1000 {
            settle(&keys, &format!("a{i}"), b"ok").await;
        }
        tokio::time::advance(Duration::from_secs(30)).await;
        settle(&keys, "b", b"ok").await;
        tokio::time::advance(Duration::from_secs(30)).await;
        // The a* are 60 s old: gone; b is 30 s old: kept.
        assert!(!leads(&call(&keys, "b").await));
        assert_eq!(dedup(&keys).len(), 1);
        assert!(leads(&call(&keys, "a0").await));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(leads(&call(&keys, "b").await));
        assert_eq!(dedup(&keys).len(), 0);
        assert_eq!(dedup(&keys).bytes(), 0);
        // Each stored entry was examined once, when it expired.
        assert_eq!(dedup(&keys).visited(), 1001);
    }

    #[tokio::test]
    async fn a_response_too_large_to_keep_reaches_waiting_calls_and_is_forgotten() {
        let keys = IdempotencyKey::random()
            .dedup_window(Duration::from_secs(60))
            .dedup_max_bytes(50);
        settle(&keys, "s", b"ok").await;
        let first = call(&keys, "big").await;
        let waiting = call(&keys, "big").await;
        assert!(leads(&first) && !leads(&waiting));
        let mut res = NetResponse::from_bytes(StatusCode::OK, Bytes::from_static(&[b'x'; 100]));
        keys.after(&first, &mut res).await.unwrap();
        let replayed = keys.respond(&waiting).await.unwrap().unwrap();
        assert_eq!(replayed.bytes().await.unwrap().len(), 100);
        assert_eq!(keys.dedup_drops(), 1);
        // Not kept, and nothing was dropped to try to make room for it.
        assert!(leads(&call(&keys, "big").await));
        assert!(!leads(&call(&keys, "s").await));
        assert_eq!(dedup(&keys).len(), 1);
        assert_eq!(dedup(&keys).bytes(), 4);
    }

    #[tokio::test]
    async fn calls_in_flight_are_never_evicted() {
        let keys = IdempotencyKey::random()
            .dedup_window(Duration::from_secs(60))
            .dedup_max_entries(2);
        settle(&keys, "done", b"ok").await;
        let a = call(&keys, "a").await;
        let b = call(&keys, "b").await;
        assert!(leads(&a) && leads(&b), "the finished entry made room");
        // Both in flight fill the window: a third key is sent without dedup.
        let c = call(&keys, "c").await;
        assert!(c.extensions.get::<Role>().is_none());
        assert!(!leads(&call(&keys, "a").await), "a is still tracked");
        assert!(!leads(&call(&keys, "b").await), "b is still tracked");
        drop((a, b));
        assert_eq!(dedup(&keys).len(), 0);
        assert!(leads(&call(&keys, "c").await));
    }
}
