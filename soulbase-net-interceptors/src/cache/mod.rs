//! `CacheHook`: an HTTP cache for GET — fresh hits without a request, conditional
//! revalidation of stale entries.

use std::{
    collections::HashSet,
    fmt,
    sync::{Arc, OnceLock, Weak},
};

use soulbase_net_core::{
    bytes::Bytes,
    http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode},
    Hooks, Interceptor, NetClient, NetError, NetRequest, NetResponse, RespBody,
};
use tokio::time::Instant;

#[cfg(feature = "redis")]
pub use soulbase_net_store::cache::RedisCacheStore;
use soulbase_net_store::cache::{control::Directives, selecting_value};
pub use soulbase_net_store::cache::{CacheStore, CachedResponse, MemoryStore};

/// Caches the responses to GET requests, as a shared cache (RFC 9111) keyed by tenant + URL
/// (+ the request headers the response `Vary`s on).
///
/// Why shared: one cache serves every caller of the service within a tenant, so it follows
/// the rules for shared caches — `private` responses are not stored, and `s-maxage` counts.
///
/// - Stored: `200` responses (buffered) with a freshness lifetime or a validator (`ETag`,
///   `Last-Modified`), unless `no-store`, `private`, `Vary: *`, or the request carries
///   `Authorization` or `Cache-Control: no-store`.
/// - Freshness lifetime: `s-maxage`, else `max-age`, else `Expires` − `Date` (an invalid
///   `Expires` is in the past); none otherwise (no heuristic freshness). `no-cache` makes it
///   zero. The age it arrives with counts against it — its `Age`, or how long ago its `Date`
///   says it was made, whichever is more (RFC 9111 §4.2.3) — and responses served from the
///   cache carry their current `Age`.
/// - Fresh (younger than its lifetime): answered by [`respond`](Interceptor::respond) without
///   a request (`attempts` is 0). The client reports the hit as `NetEvent::Answered` with
///   `by: "cache_hook"` (`net_answered_total{by="cache_hook"}` in `soulbase-net-observe`).
/// - `Vary`: each combination of the named request headers is its own variant, kept beside
///   the others; a response with `Vary: *` is never stored nor served.
/// - Stale with a validator: `before` adds `If-None-Match` / `If-Modified-Since`, and a `304`
///   is replaced in `after` by the stored response (status 200, the 304's headers merged), which
///   is then fresh again.
/// - Stale within its `stale-while-revalidate` window, once a client is given with
///   [`CacheHook::revalidate_with`]: served as it is, while one background request through
///   that client revalidates it (at most one per entry at a time). Never with
///   `must-revalidate`, `proxy-revalidate` or `s-maxage`: such an entry is not served stale.
/// - A request that sets its own conditional headers bypasses the cache.
///
/// Entries live in a [`CacheStore`]; the default is a bounded in-memory [`MemoryStore`].
///
/// # Examples
/// ```
/// use soulbase_net_interceptors::{CacheHook, MemoryStore};
///
/// let cache = CacheHook::new(); // 10 000 entries in memory
/// let bigger = CacheHook::with_store(MemoryStore::new(100_000));
/// # let _ = (cache, bigger);
/// ```
pub struct CacheHook {
    store: Arc<dyn CacheStore>,
    revalidator: OnceLock<Weak<dyn NetClient>>,
    revalidating: Arc<parking_lot::Mutex<HashSet<String>>>,
}

/// Marks the background request that revalidates an entry served stale.
#[derive(Clone, Copy, Debug)]
struct Revalidation;

/// What `before` found, for `respond` and `after`.
#[derive(Clone)]
struct Lookup {
    key: String,
    entry: Option<Arc<CachedResponse>>,
    fresh: bool,
    serve_stale: bool,
}

// === impl CacheHook ===

impl Default for CacheHook {
    fn default() -> Self {
        Self::with_store(MemoryStore::new(10_000))
    }
}

impl CacheHook {
    /// A cache in a [`MemoryStore`] of 10 000 entries.
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache in `store`.
    pub fn with_store(store: impl CacheStore + 'static) -> Self {
        CacheHook {
            store: Arc::new(store),
            revalidator: OnceLock::new(),
            revalidating: Arc::new(parking_lot::Mutex::new(HashSet::new())),
        }
    }

    /// Turns stale-while-revalidate on: background revalidations are sent through `client`
    /// (normally the client this hook is installed in; held weakly, so no cycle). Set once;
    /// later calls are ignored. Default is off: stale entries are revalidated in line.
    pub fn revalidate_with(&self, client: Weak<dyn NetClient>) {
        let _ = self.revalidator.set(client);
    }

    /// Starts one background revalidation of `key` with a copy of `req`, unless one is
    /// running; false when none could be started.
    fn spawn_revalidation(&self, key: &str, req: &NetRequest) -> bool {
        let (Some(client), Some(mut copy), Ok(rt)) = (
            self.revalidator.get().and_then(Weak::upgrade),
            req.try_clone(),
            tokio::runtime::Handle::try_current(),
        ) else {
            return false;
        };
        if !self.revalidating.lock().insert(key.to_owned()) {
            return true;
        }
        // A fresh call: nothing another interceptor noted for the original is carried over.
        copy.extensions = Default::default();
        copy.extensions.insert(Revalidation);
        let running = self.revalidating.clone();
        let key = key.to_owned();
        rt.spawn(async move {
            // The outcome lands in the store through this hook's `after`.
            let _ = client.send(copy).await;
            running.lock().remove(&key);
        });
        true
    }

    /// The entry that answers a request with `req_headers` under `key`. The entry under `key`
    /// is the variant stored last; when it varies on other values, their own variant is
    /// looked up under its [`variant_key`].
    async fn lookup(&self, key: &str, req_headers: &HeaderMap) -> Option<Arc<CachedResponse>> {
        let last = self.store.get(key).await?;
        if last.vary_matches(req_headers) {
            return Some(last);
        }
        let values: Vec<(&HeaderName, Option<HeaderValue>)> = last
            .vary
            .iter()
            .map(|(name, _)| (name, selecting_value(req_headers, name)))
            .collect();
        let names = values.iter().map(|(name, value)| (*name, value.as_ref()));
        self.store
            .get(&variant_key(key, names))
            .await
            .filter(|e| e.vary_matches(req_headers))
    }

    /// Stores `entry` under `key` (the last variant, which indexes the others) and, when it
    /// varies, under its own variant key too.
    async fn put(&self, key: &str, entry: CachedResponse) {
        if !entry.vary.is_empty() {
            let variant = variant_key(key, entry.vary.iter().map(|(n, v)| (n, v.as_ref())));
            self.store.put(variant, entry.clone()).await;
        }
        self.store.put(key.to_owned(), entry).await;
    }
}

impl fmt::Debug for CacheHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheHook")
            .field("store", &self.store)
            .field("stale_while_revalidate", &self.revalidator.get().is_some())
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Interceptor for CacheHook {
    async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
        if req.method != Method::GET
            || req.headers.contains_key(header::AUTHORIZATION)
            || req.headers.contains_key(header::IF_NONE_MATCH)
            || req.headers.contains_key(header::IF_MODIFIED_SINCE)
            || Directives::parse(&req.headers).no_store
        {
            return Ok(());
        }
        // An invalid URL is left for the client to report.
        let Ok(url) = req.validate(u64::MAX) else {
            return Ok(());
        };
        let key = format!("{}\n{url}", req.tenant.as_deref().unwrap_or(""));
        let entry = self.lookup(&key, &req.headers).await;
        let now = Instant::now();
        let fresh = entry.as_ref().is_some_and(|e| e.is_fresh(now));
        let serve_stale = !fresh
            && self.revalidator.get().is_some()
            && req.extensions.get::<Revalidation>().is_none()
            && entry.as_ref().is_some_and(|e| e.is_within_swr(now));
        if let (Some(e), false, false) = (&entry, fresh, serve_stale) {
            if let Some(etag) = &e.etag {
                req.headers.insert(header::IF_NONE_MATCH, etag.clone());
            }
            if let Some(lm) = &e.last_modified {
                req.headers.insert(header::IF_MODIFIED_SINCE, lm.clone());
            }
        }
        req.extensions.insert(Lookup {
            key,
            entry,
            fresh,
            serve_stale,
        });
        Ok(())
    }

    async fn respond(&self, req: &NetRequest) -> Option<Result<NetResponse, NetError>> {
        let lookup = req.extensions.get::<Lookup>()?;
        let entry = lookup.entry.as_ref()?;
        // A stale entry is served only when its background revalidation could start;
        // otherwise the request goes out (unconditionally) and refreshes the entry.
        let serve =
            lookup.fresh || (lookup.serve_stale && self.spawn_revalidation(&lookup.key, req));
        if !serve {
            return None;
        }
        let mut res = entry.to_response(&req.url);
        res.attempts = 0;
        res.headers.insert(
            header::AGE,
            HeaderValue::from(entry.age(Instant::now()).as_secs()),
        );
        Some(Ok(res))
    }

    async fn after(&self, req: &NetRequest, res: &mut NetResponse) -> Result<(), NetError> {
        let Some(lookup) = req.extensions.get::<Lookup>() else {
            return Ok(());
        };
        let now = Instant::now();
        match (res.status, &lookup.entry) {
            (StatusCode::NOT_MODIFIED, Some(entry)) => {
                let mut headers = entry.headers.clone();
                // The stored age is replaced by the 304's (none: it comes from the origin).
                headers.remove(header::AGE);
                for (name, value) in &res.headers {
                    if name != header::CONTENT_LENGTH {
                        headers.insert(name.clone(), value.clone());
                    }
                }
                let mut served = entry.to_response(&res.url);
                served.headers = headers.clone();
                served.elapsed = res.elapsed;
                served.attempts = res.attempts;
                *res = served;
                let body = entry.body.clone();
                match CachedResponse::new(StatusCode::OK, headers, body, &req.headers, now) {
                    Some(fresh) => self.put(&lookup.key, fresh).await,
                    None => self.store.remove(&lookup.key).await,
                }
            }
            (StatusCode::OK, _) => {
                if !CachedResponse::is_storable(&res.headers) {
                    if varies_on_everything(&res.headers) {
                        // The resource now varies on everything: no variant may be served.
                        self.store.remove(&lookup.key).await;
                    }
                    return Ok(());
                }
                let body = buffer(res).await?;
                let headers = res.headers.clone();
                if let Some(e) = CachedResponse::new(res.status, headers, body, &req.headers, now) {
                    self.put(&lookup.key, e).await;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn hooks(&self) -> Hooks {
        Hooks::BEFORE | Hooks::RESPOND | Hooks::AFTER
    }

    fn name(&self) -> &'static str {
        "cache_hook"
    }
}

/// Whether a `Vary` header says `*`.
fn varies_on_everything(headers: &HeaderMap) -> bool {
    headers.get_all(header::VARY).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|n| n.trim() == "*"))
    })
}

/// The store key of one variant of `key`: the request header values the response varied on.
///
/// Values that are not text are written lossily; two that collide share a slot, and
/// [`CachedResponse::vary_matches`] keeps either from being served for the other.
fn variant_key<'a>(
    key: &str,
    vary: impl Iterator<Item = (&'a HeaderName, Option<&'a HeaderValue>)>,
) -> String {
    let mut k = format!("{key}\nvary");
    for (name, value) in vary {
        k.push('\n');
        k.push_str(name.as_str());
        if let Some(v) = value {
            k.push(':');
            k.push_str(&String::from_utf8_lossy(v.as_bytes()));
        }
    }
    k
}

/// Buffers the response body (if still streaming) and returns a copy.
async fn buffer(res: &mut NetResponse) -> Result<Bytes, NetError> {
    let body = match std::mem::replace(&mut res.body, RespBody::Bytes(Bytes::new())) {
        RespBody::Bytes(b) => b,
        stream => {
            let mut tmp = NetResponse::from_bytes(StatusCode::OK, Bytes::new());
            tmp.body = stream;
            tmp.bytes().await?
        }
    };
    res.body = RespBody::Bytes(body.clone());
    Ok(body)
}
