//! [`RedisCacheStore`]: the HTTP cache shared by a fleet, in Redis.
//!
//! An entry is a hash of two fields: `meta` (JSON: status, headers, validators, `Vary`
//! values, freshness, and when it was stored as wall-clock milliseconds, so any instance can
//! tell its age) and `body` (the bytes as they are). It expires when it can no longer be
//! served or revalidated usefully: its freshness lifetime plus `stale-while-revalidate`, plus
//! a grace for revalidation (a stale entry with a validator still saves a body on a 304).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};
use soulbase_net_core::{
    bytes::Bytes,
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode},
    NetEvent, Observer,
};
use tokio::time::Instant;

use super::{CacheStore, CachedResponse};
use crate::{RedisConnection, RedisHandle, RedisStore};

/// The prefix of every entry's key. An entry is one key (a hash), so on a Redis Cluster each
/// call is one node's business.
const PREFIX: &str = "soulbase:cache:";

/// How long past its last usable moment an entry with a validator is kept for a 304.
const REVALIDATION_GRACE: Duration = Duration::from_secs(600);

/// An HTTP cache in Redis (feature `redis`), shared by every instance that points at it:
/// fresh hits and 304 revalidations are shared. Bodies over `max_body` (default 1 MiB) are not
/// stored; every Redis call is bounded by `timeout` (default 20ms) and a failure is a miss (a
/// get) or a skipped store (a put) — never an error for the call —, counted in
/// [`errors`](Self::errors) and reported to the observer as `StoreError { store: "cache" }`.
/// Redis is one server, a Redis Cluster or the master sentinels name
/// ([`RedisStore::from_target`]); its URLs are never shown by `Debug` or in errors
/// (only hosts and ports are).
pub struct RedisCacheStore {
    conn: RedisConnection,
    max_body: usize,
    timeout: Duration,
    errors: AtomicU64,
    observer: Option<Arc<dyn Observer>>,
}

/// An entry's metadata, as stored.
#[derive(Serialize, Deserialize)]
struct Meta {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    stored_unix_ms: u64,
    initial_age_ms: u64,
    lifetime_ms: u64,
    swr_ms: u64,
    etag: Option<Vec<u8>>,
    last_modified: Option<Vec<u8>>,
    vary: Vec<(String, Option<Vec<u8>>)>,
}

impl RedisStore for RedisCacheStore {
    fn from_connection(conn: RedisConnection) -> Self {
        Self {
            conn,
            max_body: 1 << 20,
            timeout: Duration::from_millis(20),
            errors: AtomicU64::new(0),
            observer: None,
        }
    }
}

impl RedisCacheStore {
    /// Largest body stored. Default is 1 MiB.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Longest wait for Redis per call. Default is 20ms.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Reports failed or timed-out Redis calls to `observer` (`NetEvent::StoreError`).
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Redis calls that failed or timed out so far.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Runs `op` on Redis within the timeout; a failure is counted, reported and `None`.
    async fn call<T, F>(&self, what: &'static str, op: impl FnOnce(RedisHandle) -> F) -> Option<T>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let call = async { op(self.conn.handle().await?).await };
        let outcome = tokio::time::timeout(self.timeout, call).await;
        match outcome {
            Ok(Ok(v)) => Some(v),
            other => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                if let Some(o) = &self.observer {
                    o.on_event(&NetEvent::StoreError {
                        req: None,
                        store: "cache",
                        op: what,
                        timed_out: other.is_err(),
                    });
                }
                None
            }
        }
    }
}

impl std::fmt::Debug for RedisCacheStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCacheStore")
            .field("at", &self.conn.shown())
            .field("max_body", &self.max_body)
            .field("timeout", &self.timeout)
            .field("errors", &self.errors())
            .finish_non_exhaustive()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn encode(entry: &CachedResponse) -> Option<String> {
    let now = Instant::now();
    let wall = SystemTime::now();
    let stored_wall = wall.checked_sub(now.saturating_duration_since(entry.stored_at))?;
    let meta = Meta {
        status: entry.status.as_u16(),
        headers: entry
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect(),
        stored_unix_ms: millis(stored_wall.duration_since(SystemTime::UNIX_EPOCH).ok()?),
        initial_age_ms: millis(entry.initial_age),
        lifetime_ms: millis(entry.lifetime),
        swr_ms: millis(entry.stale_while_revalidate),
        etag: entry.etag.as_ref().map(|v| v.as_bytes().to_vec()),
        last_modified: entry.last_modified.as_ref().map(|v| v.as_bytes().to_vec()),
        vary: entry
            .vary
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    v.as_ref().map(|v| v.as_bytes().to_vec()),
                )
            })
            .collect(),
    };
    serde_json::to_string(&meta).ok()
}

fn decode(meta: &str, body: Vec<u8>) -> Option<CachedResponse> {
    let meta: Meta = serde_json::from_str(meta).ok()?;
    let value = |v: Vec<u8>| HeaderValue::from_bytes(&v).ok();
    let mut headers = HeaderMap::new();
    for (n, v) in meta.headers {
        headers.append(HeaderName::from_bytes(n.as_bytes()).ok()?, value(v)?);
    }
    let stored_wall = SystemTime::UNIX_EPOCH + Duration::from_millis(meta.stored_unix_ms);
    let age = SystemTime::now()
        .duration_since(stored_wall)
        .unwrap_or(Duration::ZERO);
    let now = Instant::now();
    let mut vary = Vec::new();
    for (n, v) in meta.vary {
        let v = match v {
            Some(v) => Some(value(v)?),
            None => None,
        };
        vary.push((HeaderName::from_bytes(n.as_bytes()).ok()?, v));
    }
    Some(CachedResponse {
        status: StatusCode::from_u16(meta.status).ok()?,
        headers,
        body: Bytes::from(body),
        stored_at: now.checked_sub(age).unwrap_or(now),
        initial_age: Duration::from_millis(meta.initial_age_ms),
        lifetime: Duration::from_millis(meta.lifetime_ms),
        stale_while_revalidate: Duration::from_millis(meta.swr_ms),
        etag: meta.etag.and_then(value),
        last_modified: meta.last_modified.and_then(value),
        vary,
    })
}

/// How long Redis keeps an entry: while it can be served, and a grace for revalidation when
/// it has a validator.
fn ttl(entry: &CachedResponse) -> Duration {
    let usable = (entry.lifetime + entry.stale_while_revalidate).saturating_sub(entry.initial_age);
    let grace = if entry.etag.is_some() || entry.last_modified.is_some() {
        REVALIDATION_GRACE
    } else {
        Duration::ZERO
    };
    (usable + grace).max(Duration::from_secs(1))
}

#[async_trait::async_trait]
impl CacheStore for RedisCacheStore {
    async fn get(&self, key: &str) -> Option<Arc<CachedResponse>> {
        let redis_key = format!("{PREFIX}{key}");
        let (meta, body): (Option<String>, Option<Vec<u8>>) = self
            .call("get", |mut con| async move {
                redis::cmd("HMGET")
                    .arg(&redis_key)
                    .arg("meta")
                    .arg("body")
                    .query_async(&mut con)
                    .await
            })
            .await?;
        decode(&meta?, body?).map(Arc::new)
    }

    async fn put(&self, key: String, entry: CachedResponse) {
        if entry.body.len() > self.max_body {
            return;
        }
        let Some(meta) = encode(&entry) else {
            return;
        };
        let ttl_ms = millis(ttl(&entry));
        let redis_key = format!("{PREFIX}{key}");
        let body = entry.body.to_vec();
        let _: Option<()> = self
            .call("set", |mut con| async move {
                redis::pipe()
                    .atomic()
                    .cmd("HSET")
                    .arg(&redis_key)
                    .arg("meta")
                    .arg(meta)
                    .arg("body")
                    .arg(body)
                    .ignore()
                    .cmd("PEXPIRE")
                    .arg(&redis_key)
                    .arg(ttl_ms)
                    .ignore()
                    .query_async(&mut con)
                    .await
            })
            .await;
    }

    async fn remove(&self, key: &str) {
        let redis_key = format!("{PREFIX}{key}");
        let _: Option<()> = self
            .call("remove", |mut con| async move {
                redis::cmd("DEL")
                    .arg(&redis_key)
                    .query_async(&mut con)
                    .await
            })
            .await;
    }
}
