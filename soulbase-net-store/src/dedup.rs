//! [`RedisDedupStore`]: the idempotency dedup window shared by a fleet, in Redis: the first call with a key anywhere in the
//! fleet claims it (`SET NX PX` on an in-flight marker), the others wait for its stored
//! response (or, past `wait`, get a clear conflict error) instead of sending again.

use std::{sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use soulbase_net_core::{
    bytes::Bytes,
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode},
    NetEvent, NetResponse, Observer,
};

use crate::{
    lease::{Heartbeat, Lease},
    RedisConnection, RedisStore, StoreError,
};

/// Claims a key, or answers what is known of it: {2, meta, body} stored, {1} claimed now,
/// {0} in flight elsewhere. KEYS: the stored response, the in-flight marker (one hash slot);
/// ARGV: this call's token, the marker's life in ms.
const CLAIM: &str = r"
local stored = redis.call('HMGET', KEYS[1], 'meta', 'body')
if stored[1] then return {2, stored[1], stored[2]} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1} end
return {0}
";

/// Extends a claim this call still holds (a compare-and-expire: never another's marker).
/// KEYS: the marker; ARGV: this call's token, the lease in ms. Returns 1 when extended.
const EXTEND: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
";

/// Stores the first call's response and drops its claim, only while the claim is still this
/// call's (the same fence as [`EXTEND`]): a holder whose marker lapsed — expired, or taken
/// over by another call — stores nothing and deletes nothing. KEYS: the stored response, the
/// marker (one hash slot); ARGV: this call's token, the metadata, the body, the window in ms.
/// Returns 1 when stored.
const FINISH: &str = r"
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'meta', ARGV[2], 'body', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('DEL', KEYS[2])
return 1
";

/// Releases a claim this call still holds (a compare-and-delete: never another's marker).
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// Where a fleet's idempotency dedup window lives: Redis (feature `redis`), for
/// the idempotency interceptor's `IdempotencyKey::shared_dedup` (soulbase-net-interceptors).
///
/// A response is kept for the window (`IdempotencyKey::dedup_window`) when its status is
/// below 500, like the in-memory window. A claim's marker is a lease ([`crate::lease`]): it
/// holds for `in_flight` (default 5 s) and the claiming call extends it every half of that
/// while it runs ([`hold`](Self::hold)), never past the call's deadline nor `max_hold` (default
/// 60 s); so a call slower than the lease is never sent twice, and a crashed instance's claim
/// frees itself within one lease. Every change to the marker is fenced by the call's token. A
/// later call waits
/// for the stored response for at most `wait` (default 10s), polling every 20 ms, then fails
/// with a conflict error (`ErrorKind::Interceptor`, "in flight on another instance"). Every
/// Redis call is bounded by `timeout` (default 20ms); when Redis fails, the failure is
/// reported (`StoreError { store: "dedup" }`) and the call is sent without dedup — or refused,
/// with [`refuse_when_down`](Self::refuse_when_down), for calls where a duplicate is worse
/// than no call.
///
/// Redis is one server, a Redis Cluster or the master sentinels name
/// ([`RedisStore::from_target`]); a key's two entries share one hash slot, so on a
/// cluster each claim is one node's atomic script.
pub struct RedisDedupStore {
    conn: RedisConnection,
    timeout: Duration,
    in_flight: Duration,
    max_hold: Duration,
    wait: Duration,
    /// Refuse calls while Redis fails, instead of sending them without dedup.
    refuse_when_down: bool,
    observer: Option<Arc<dyn Observer>>,
    claim: redis::Script,
    extend: redis::Script,
    finish: redis::Script,
    release: redis::Script,
}

/// A response as stored.
#[derive(Serialize, Deserialize)]
struct Meta {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    content_type: Option<String>,
    url: String,
    attempts: u32,
}

/// A response as the dedup store keeps it: its metadata (status, headers, content type, URL,
/// attempts) and its whole body.
#[derive(Clone, Debug)]
pub struct StoredResponse {
    meta: String,
    body: Bytes,
}

impl StoredResponse {
    /// `res` with its whole `body` (read before: a response's body is a stream); `None` when
    /// its metadata cannot be encoded.
    pub fn new(res: &NetResponse, body: Bytes) -> Option<Self> {
        encode(res).map(|meta| Self { meta, body })
    }
}

/// What the store knows of a key.
#[derive(Debug)]
pub enum Claim {
    /// This call is the first: it sends and stores.
    Claimed,
    /// Answered before, within the window.
    Stored(Box<NetResponse>),
    /// Another call holds it.
    InFlight,
}

impl RedisStore for RedisDedupStore {
    fn from_connection(conn: RedisConnection) -> Self {
        Self {
            conn,
            timeout: Duration::from_millis(20),
            in_flight: Duration::from_secs(5),
            max_hold: Duration::from_secs(60),
            wait: Duration::from_secs(10),
            refuse_when_down: false,
            observer: None,
            claim: redis::Script::new(CLAIM),
            extend: redis::Script::new(EXTEND),
            finish: redis::Script::new(FINISH),
            release: redis::Script::new(RELEASE),
        }
    }
}

impl RedisDedupStore {
    /// Longest wait for Redis per call. Default is 20ms.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// A claim's lease: how long it holds without an extension from its call (a crashed
    /// instance's claim frees itself within it). Default is 5s.
    pub fn in_flight(mut self, ttl: Duration) -> Self {
        self.in_flight = ttl;
        self
    }

    /// Longest a call holds its claim by extending it, when the call's own deadline
    /// (`timeout.total` of the request) does not say sooner. Default is 60s.
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = max;
        self
    }

    /// Longest wait of a duplicate for the first call's response. Default is 10s.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// While Redis fails, refuse calls (`ErrorKind::Interceptor`, "dedup store unavailable")
    /// instead of sending them without dedup. Default is `false` (send).
    pub fn refuse_when_down(mut self, refuse: bool) -> Self {
        self.refuse_when_down = refuse;
        self
    }

    /// Reports failed or timed-out Redis calls to `observer` (`NetEvent::StoreError`).
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Longest wait of a duplicate for the first call's response ([`wait`](Self::wait)).
    pub fn wait_limit(&self) -> Duration {
        self.wait
    }

    /// Whether calls are refused while Redis fails
    /// ([`refuse_when_down`](Self::refuse_when_down)).
    pub fn refuses_when_down(&self) -> bool {
        self.refuse_when_down
    }

    /// Reports a failed call; `None` for the caller to carry on without the store.
    fn failed<T>(&self, op: &'static str, timed_out: bool) -> Option<T> {
        if let Some(o) = &self.observer {
            o.on_event(&NetEvent::StoreError {
                req: None,
                store: "dedup",
                op,
                timed_out,
            });
        }
        None
    }

    /// The two keys of `(tenant, key)`, in one hash slot.
    fn keys(tenant: &str, key: &str) -> (String, String) {
        let base = format!("soulbase:idem:{{{}:{tenant}|{key}}}", tenant.len());
        (format!("{base}:r"), format!("{base}:f"))
    }

    /// Claims `(tenant, key)` for `token`; `None` when Redis failed.
    pub async fn claim(&self, tenant: &str, key: &str, token: &str) -> Option<Claim> {
        let (stored, marker) = Self::keys(tenant, key);
        let in_flight = u64::try_from(self.in_flight.as_millis()).unwrap_or(u64::MAX);
        let mut invocation = self.claim.key(stored);
        invocation.key(marker).arg(token).arg(in_flight);
        let call = async {
            let mut con = self.conn.handle().await?;
            invocation.invoke_async::<redis::Value>(&mut con).await
        };
        let value = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(v)) => v,
            Ok(Err(_)) => return self.failed("claim", false),
            Err(_) => return self.failed("claim", true),
        };
        let redis::Value::Array(parts) = value else {
            return self.failed("claim", false);
        };
        match parts.as_slice() {
            [redis::Value::Int(1)] => Some(Claim::Claimed),
            [redis::Value::Int(0)] => Some(Claim::InFlight),
            [redis::Value::Int(2), redis::Value::BulkString(meta), redis::Value::BulkString(body)] => {
                match decode(meta, body) {
                    Some(res) => Some(Claim::Stored(Box::new(res))),
                    None => self.failed("claim", false),
                }
            }
            _ => self.failed("claim", false),
        }
    }

    /// Extends the claim `token` holds on `(tenant, key)` by a lease from now, on Redis's
    /// clock: `Ok(true)` while the claim is still this token's, `Ok(false)` once it is not.
    ///
    /// # Errors
    /// Redis failed or did not answer within the timeout.
    pub async fn extend(&self, tenant: &str, key: &str, token: &str) -> Result<bool, StoreError> {
        let (_, marker) = Self::keys(tenant, key);
        let lease = u64::try_from(self.in_flight.as_millis()).unwrap_or(u64::MAX);
        let mut invocation = self.extend.key(marker);
        invocation.arg(token).arg(lease);
        let call = async {
            let mut con = self.conn.handle().await?;
            invocation.invoke_async::<i64>(&mut con).await
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(n)) => Ok(n == 1),
            Ok(Err(e)) => {
                let _ = self.failed::<()>("extend", false);
                Err(StoreError::new(
                    format!("redis at {}: {:?}", self.conn.shown(), e.kind()),
                    Some(Box::new(e)),
                ))
            }
            Err(_) => {
                let _ = self.failed::<()>("extend", true);
                Err(StoreError::new(
                    format!(
                        "redis at {}: no answer within {:?}",
                        self.conn.shown(),
                        self.timeout
                    ),
                    None,
                ))
            }
        }
    }

    /// Keeps the claim `token` holds on `(tenant, key)` while the call runs: a heartbeat that
    /// extends it every half lease until it is dropped, the claim is lost, or `deadline` (the
    /// call's total timeout from now, at most `max_hold`) has passed.
    pub fn hold(
        self: &Arc<Self>,
        tenant: &str,
        key: &str,
        token: &str,
        deadline: Option<Duration>,
    ) -> Heartbeat {
        let bound = deadline.map_or(self.max_hold, |d| d.min(self.max_hold));
        let (store, tenant, key, token) = (
            self.clone(),
            Arc::<str>::from(tenant),
            Arc::<str>::from(key),
            Arc::<str>::from(token),
        );
        Heartbeat::start(
            Lease::new(self.in_flight),
            Some(tokio::time::Instant::now() + bound),
            move || {
                let (store, tenant, key, token) =
                    (store.clone(), tenant.clone(), key.clone(), token.clone());
                async move { store.extend(&tenant, &key, &token).await }
            },
        )
    }

    /// Stores the first call's response (its metadata and `body`) for `window` and drops
    /// its claim; with `None` (an error or a 5xx), drops the claim only, so a later call is
    /// sent again. Both are fenced by `token`, in one script: a call whose claim lapsed (its
    /// marker expired, or another call claimed the key since) stores nothing and leaves the
    /// other call's marker alone — a later call is then sent again, as after a crash. Redis
    /// failing is reported and otherwise ignored: the claim's marker then expires by itself.
    pub async fn finish(
        &self,
        tenant: &str,
        key: &str,
        token: &str,
        response: Option<StoredResponse>,
        window: Duration,
    ) {
        let (stored, marker) = Self::keys(tenant, key);
        let invocation = match response {
            Some(StoredResponse { meta, body }) => {
                let window = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
                let mut invocation = self.finish.key(stored);
                invocation
                    .key(marker)
                    .arg(token)
                    .arg(meta)
                    .arg(body.to_vec())
                    .arg(window);
                invocation
            }
            None => {
                let mut invocation = self.release.key(marker);
                invocation.arg(token);
                invocation
            }
        };
        let call = async {
            let mut con = self.conn.handle().await?;
            invocation.invoke_async::<()>(&mut con).await
        };
        let outcome = tokio::time::timeout(self.timeout, call).await;
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(_)) => self.failed("finish", false).unwrap_or(()),
            Err(_) => self.failed("finish", true).unwrap_or(()),
        }
    }
}

impl std::fmt::Debug for RedisDedupStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisDedupStore")
            .field("at", &self.conn.shown())
            .field("timeout", &self.timeout)
            .field("in_flight", &self.in_flight)
            .field("max_hold", &self.max_hold)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

/// A response's metadata as stored (the body is stored as it is).
fn encode(res: &NetResponse) -> Option<String> {
    serde_json::to_string(&Meta {
        status: res.status.as_u16(),
        headers: res
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect(),
        content_type: res.content_type.clone(),
        url: res.url.clone(),
        attempts: res.attempts,
    })
    .ok()
}

fn decode(meta: &[u8], body: &[u8]) -> Option<NetResponse> {
    let meta: Meta = serde_json::from_slice(meta).ok()?;
    let mut headers = HeaderMap::new();
    for (n, v) in meta.headers {
        headers.append(
            HeaderName::from_bytes(n.as_bytes()).ok()?,
            HeaderValue::from_bytes(&v).ok()?,
        );
    }
    let mut res = NetResponse::from_bytes(
        StatusCode::from_u16(meta.status).ok()?,
        Bytes::copy_from_slice(body),
    );
    res.headers = headers;
    res.content_type = meta.content_type;
    res.url = meta.url;
    res.attempts = meta.attempts;
    Some(res)
}
