//! `IdempotencyKey`: a stable `Idempotency-Key` for idempotent POST/PATCH, and a dedup window.

use std::{
    collections::HashMap,
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

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

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
/// counts as a dedup drop ([`IdempotencyKey::dedup_drops`]). Only responses below 500 are kept
/// for the window; a 5xx or an error is handed to the calls already waiting and then
/// forgotten, so a later call is sent again.
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
    dedup: Option<Arc<Dedup>>,
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Random,
    Derived { bucket: Duration },
}

/// The calls seen inside the dedup window, by (tenant, key).
struct Dedup {
    window: Duration,
    entries: Mutex<HashMap<(String, String), Entry>>,
    drops: AtomicU64,
    next_id: AtomicU64,
}

enum Entry {
    InFlight {
        id: u64,
        tx: watch::Sender<Option<Arc<Outcome>>>,
    },
    Done {
        at: Instant,
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
}

/// Removes the in-flight entry of a leader that never finished (cancelled, or answered by
/// another interceptor), so followers stop waiting.
struct LeaderGuard {
    dedup: Arc<Dedup>,
    key: (String, String),
    id: u64,
}

// === impl IdempotencyKey ===

impl IdempotencyKey {
    /// Random keys, no dedup window.
    pub fn random() -> Self {
        IdempotencyKey {
            mode: Mode::Random,
            dedup: None,
        }
    }

    /// Keys derived from the tenant, method, URL, body and the time bucket of `bucket`
    /// length (a zero bucket is taken as one second); no dedup window.
    pub fn derived(bucket: Duration) -> Self {
        IdempotencyKey {
            mode: Mode::Derived {
                bucket: bucket.max(Duration::from_secs(1)),
            },
            dedup: None,
        }
    }

    /// Answers a second call with the same tenant and key within `window` with the first
    /// call's outcome instead of sending it. Default is no window.
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup = Some(Arc::new(Dedup {
            window,
            entries: Mutex::new(HashMap::new()),
            drops: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
        }));
        self
    }

    /// Calls answered from the dedup window instead of being sent.
    pub fn dedup_drops(&self) -> u64 {
        self.dedup
            .as_ref()
            .map_or(0, |d| d.drops.load(Ordering::Relaxed))
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
            .field("dedup_window", &self.dedup.as_ref().map(|d| d.window))
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
        if !applies(req) {
            return Ok(());
        }
        if !req.headers.contains_key(&IDEMPOTENCY_KEY) {
            if let Ok(v) = HeaderValue::from_str(&self.key_for(req)?) {
                req.headers.insert(IDEMPOTENCY_KEY, v);
            }
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
        let role = dedup.claim(key);
        req.extensions.insert(role);
        Ok(())
    }

    async fn respond(&self, req: &NetRequest) -> Option<Result<NetResponse, NetError>> {
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
        let Some(Role::Leader(guard)) = req.extensions.get::<Role>() else {
            return Ok(());
        };
        let body = match std::mem::replace(&mut res.body, RespBody::Bytes(Bytes::new())) {
            RespBody::Bytes(b) => b,
            stream => match collect(stream).await {
                Ok(b) => b,
                Err(e) => {
                    guard.finish(Outcome::Error(e.kind(), e.message().map(str::to_owned)));
                    return Err(e);
                }
            },
        };
        res.body = RespBody::Bytes(body.clone());
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
        if let Some(Role::Leader(guard)) = req.extensions.get::<Role>() {
            guard.finish(Outcome::Error(err.kind(), err.message().map(str::to_owned)));
        }
    }

    fn hooks(&self) -> Hooks {
        Hooks::BEFORE | Hooks::RESPOND | Hooks::AFTER | Hooks::ON_ERROR
    }

    fn name(&self) -> &'static str {
        "idempotency_key"
    }
}

/// The whole of a response body.
async fn collect(body: RespBody) -> Result<Bytes, NetError> {
    let mut tmp = NetResponse::from_bytes(StatusCode::OK, Bytes::new());
    tmp.body = body;
    tmp.bytes().await
}

// === impl Dedup ===

impl Dedup {
    /// Registers a call with `key`: the leader if no live entry exists, else a follower.
    fn claim(self: &Arc<Self>, key: (String, String)) -> Role {
        let now = Instant::now();
        let mut entries = self.entries.lock();
        entries.retain(|_, e| match e {
            Entry::Done { at, .. } => now.saturating_duration_since(*at) < self.window,
            Entry::InFlight { .. } => true,
        });
        match entries.get(&key) {
            Some(Entry::Done { outcome, .. }) => {
                let (_tx, rx) = watch::channel(Some(outcome.clone()));
                Role::Follower(rx)
            }
            Some(Entry::InFlight { tx, .. }) => Role::Follower(tx.subscribe()),
            None => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let (tx, _rx) = watch::channel(None);
                entries.insert(key.clone(), Entry::InFlight { id, tx });
                Role::Leader(Arc::new(LeaderGuard {
                    dedup: self.clone(),
                    key,
                    id,
                }))
            }
        }
    }
}

// === impl LeaderGuard ===

impl LeaderGuard {
    /// Hands `outcome` to the waiting calls; keeps it for the window if it is a response
    /// below 500.
    fn finish(&self, outcome: Outcome) {
        let mut entries = self.dedup.entries.lock();
        let Some(Entry::InFlight { id, .. }) = entries.get(&self.key) else {
            return;
        };
        if *id != self.id {
            return;
        }
        let keep = matches!(&outcome, Outcome::Response(s) if !s.status.is_server_error());
        let outcome = Arc::new(outcome);
        let previous = if keep {
            entries.insert(
                self.key.clone(),
                Entry::Done {
                    at: Instant::now(),
                    outcome: outcome.clone(),
                },
            )
        } else {
            entries.remove(&self.key)
        };
        if let Some(Entry::InFlight { tx, .. }) = previous {
            tx.send_replace(Some(outcome));
        }
    }
}

impl Drop for LeaderGuard {
    fn drop(&mut self) {
        let mut entries = self.dedup.entries.lock();
        if matches!(entries.get(&self.key), Some(Entry::InFlight { id, .. }) if *id == self.id) {
            entries.remove(&self.key);
        }
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
}
