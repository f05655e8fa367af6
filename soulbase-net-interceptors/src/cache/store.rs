//! Where cached responses live: the `CacheStore` trait and the bounded in-memory store.

use std::{fmt, sync::Arc, time::Duration};

use soulbase_net_core::{
    bytes::Bytes,
    http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode},
    NetResponse,
};
use tokio::time::Instant;

use super::control::Directives;

/// The longest freshness lifetime taken from `max-age`: a year.
const MAX_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// A stored response and what decides its freshness and its key.
#[derive(Clone, Debug)]
pub struct CachedResponse {
    /// The status (200).
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// When it was stored or last revalidated.
    pub stored_at: Instant,
    /// How long it is fresh after `stored_at`; zero when it must be revalidated each time.
    pub lifetime: Duration,
    /// How long after `lifetime` it may still be served while it is revalidated in the
    /// background (`stale-while-revalidate`); zero for none.
    pub stale_while_revalidate: Duration,
    /// Its `ETag`, sent back as `If-None-Match`.
    pub etag: Option<HeaderValue>,
    /// Its `Last-Modified`, sent back as `If-Modified-Since`.
    pub last_modified: Option<HeaderValue>,
    /// The request headers named by `Vary`, with the values they had.
    pub vary: Vec<(HeaderName, Option<HeaderValue>)>,
}

impl CachedResponse {
    /// The entry for a response to a request with `req_headers`, stored at `now`; `None`
    /// when it may not be stored (`no-store`, `private`, `Vary: *`) or has neither a
    /// lifetime, a stale-while-revalidate window nor a validator.
    pub fn new(
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        req_headers: &HeaderMap,
        now: Instant,
    ) -> Option<Self> {
        let d = Directives::parse(&headers);
        if d.no_store || d.private {
            return None;
        }
        let mut vary = Vec::new();
        for value in headers.get_all(header::VARY) {
            for name in value.to_str().ok()?.split(',') {
                let name = name.trim();
                if name == "*" {
                    return None;
                }
                if name.is_empty() {
                    continue;
                }
                let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
                let seen = req_headers.get(&name).cloned();
                vary.push((name, seen));
            }
        }
        let lifetime = match (d.no_cache, d.max_age) {
            (false, Some(secs)) => Duration::from_secs(secs).min(MAX_LIFETIME),
            _ => Duration::ZERO,
        };
        let etag = headers.get(header::ETAG).cloned();
        let last_modified = headers.get(header::LAST_MODIFIED).cloned();
        let stale_while_revalidate =
            Duration::from_secs(d.stale_while_revalidate.unwrap_or(0)).min(MAX_LIFETIME);
        if lifetime.is_zero()
            && stale_while_revalidate.is_zero()
            && etag.is_none()
            && last_modified.is_none()
        {
            return None;
        }
        Some(CachedResponse {
            status,
            headers,
            body,
            stored_at: now,
            lifetime,
            stale_while_revalidate,
            etag,
            last_modified,
            vary,
        })
    }

    /// Whether it may be served without asking the server at `now`.
    pub fn is_fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.stored_at) < self.lifetime
    }

    /// Whether it is stale at `now` but may still be served while revalidated in the
    /// background.
    pub fn is_within_swr(&self, now: Instant) -> bool {
        let age = now.saturating_duration_since(self.stored_at);
        age >= self.lifetime && age < self.lifetime.saturating_add(self.stale_while_revalidate)
    }

    /// Whether a request with `req_headers` has the values this entry was stored for.
    pub fn vary_matches(&self, req_headers: &HeaderMap) -> bool {
        self.vary
            .iter()
            .all(|(name, value)| req_headers.get(name) == value.as_ref())
    }

    /// The stored response as a buffered [`NetResponse`] for `url`.
    pub(crate) fn to_response(&self, url: &str) -> NetResponse {
        let mut res = NetResponse::from_bytes(self.status, self.body.clone());
        res.headers = self.headers.clone();
        res.content_type = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        res.url = url.to_owned();
        res
    }
}

/// Storage for [`CacheHook`](super::CacheHook) entries, by key (tenant + URL).
#[async_trait::async_trait]
pub trait CacheStore: Send + Sync + fmt::Debug {
    /// The entry under `key`.
    async fn get(&self, key: &str) -> Option<Arc<CachedResponse>>;
    /// Stores `entry` under `key`, replacing any other.
    async fn put(&self, key: String, entry: CachedResponse);
    /// Forgets the entry under `key`.
    async fn remove(&self, key: &str);
}

/// A bounded in-memory [`CacheStore`] (moka): past `max_entries`, the least useful entries
/// are evicted.
#[derive(Clone)]
pub struct MemoryStore {
    cache: moka::future::Cache<String, Arc<CachedResponse>>,
}

impl MemoryStore {
    /// A store of at most `max_entries` entries.
    pub fn new(max_entries: u64) -> Self {
        MemoryStore {
            cache: moka::future::Cache::new(max_entries),
        }
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("entries", &self.cache.entry_count())
            .finish()
    }
}

#[async_trait::async_trait]
impl CacheStore for MemoryStore {
    async fn get(&self, key: &str) -> Option<Arc<CachedResponse>> {
        self.cache.get(key).await
    }

    async fn put(&self, key: String, entry: CachedResponse) {
        self.cache.insert(key, Arc::new(entry)).await;
    }

    async fn remove(&self, key: &str) {
        self.cache.invalidate(key).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    fn entry(resp: &[(&'static str, &'static str)], req: &HeaderMap) -> Option<CachedResponse> {
        CachedResponse::new(
            StatusCode::OK,
            headers(resp),
            Bytes::new(),
            req,
            Instant::now(),
        )
    }

    #[tokio::test]
    async fn what_is_stored_and_for_how_long() {
        let none = HeaderMap::new();
        assert!(entry(&[("cache-control", "no-store"), ("etag", "\"a\"")], &none).is_none());
        assert!(entry(&[("cache-control", "private, max-age=60")], &none).is_none());
        assert!(entry(&[("cache-control", "max-age=60"), ("vary", "*")], &none).is_none());
        assert!(entry(&[], &none).is_none());
        let e = entry(&[("cache-control", "max-age=60")], &none).unwrap();
        assert!(e.is_fresh(e.stored_at + Duration::from_secs(59)));
        assert!(!e.is_fresh(e.stored_at + Duration::from_secs(60)));
        let e = entry(
            &[("cache-control", "no-cache, max-age=60"), ("etag", "\"a\"")],
            &none,
        )
        .unwrap();
        assert!(!e.is_fresh(e.stored_at));
        let de = headers(&[("accept-language", "de")]);
        let e = entry(
            &[("cache-control", "max-age=60"), ("vary", "Accept-Language")],
            &de,
        )
        .unwrap();
        assert!(e.vary_matches(&de));
        assert!(!e.vary_matches(&headers(&[("accept-language", "fr")])));
        assert!(!e.vary_matches(&none));
    }
}
