//! Cache stores: where an HTTP cache's responses live — the entry ([`CachedResponse`]: what
//! RFC 9111 says about keeping it, read from its headers), the seam ([`CacheStore`]), the
//! bounded in-memory store ([`MemoryStore`]) and, with the `redis` feature, the fleet's
//! (`RedisCacheStore`). The cache itself (what is looked up, served, revalidated) is the
//! interceptors' `CacheHook`.

pub mod control;
#[cfg(feature = "redis")]
mod redis;

use std::{
    fmt,
    sync::Arc,
    time::{Duration, SystemTime},
};

use soulbase_net_core::{
    bytes::Bytes,
    http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode},
    NetResponse,
};
use tokio::time::Instant;

use self::control::Directives;
#[cfg(feature = "redis")]
pub use self::redis::RedisCacheStore;

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
    /// How old it already was when stored (its `Age` header), counted against `lifetime`.
    pub initial_age: Duration,
    /// How long it is fresh from its origin (`s-maxage`, else `max-age`, else `Expires`
    /// minus `Date`); zero when it must be revalidated each time.
    pub lifetime: Duration,
    /// How long after `lifetime` it may still be served while it is revalidated in the
    /// background (`stale-while-revalidate`); zero for none, and always zero with
    /// `must-revalidate`.
    pub stale_while_revalidate: Duration,
    /// Its `ETag`, sent back as `If-None-Match`.
    pub etag: Option<HeaderValue>,
    /// Its `Last-Modified`, sent back as `If-Modified-Since`.
    pub last_modified: Option<HeaderValue>,
    /// The request headers named by `Vary`, with the values they had.
    pub vary: Vec<(HeaderName, Option<HeaderValue>)>,
}

/// What the response headers alone say about keeping a response.
struct Rules {
    lifetime: Duration,
    stale_while_revalidate: Duration,
    initial_age: Duration,
    vary: Vec<HeaderName>,
}

impl Rules {
    /// `None` when the response may not be stored (`no-store`, `private`, `Vary: *`, an
    /// unparsable `Vary`) or has neither a lifetime, a stale-while-revalidate window nor a
    /// validator.
    fn of(headers: &HeaderMap) -> Option<Self> {
        let d = Directives::parse(headers);
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
                if !name.is_empty() {
                    vary.push(HeaderName::from_bytes(name.as_bytes()).ok()?);
                }
            }
        }
        let lifetime = if d.no_cache {
            Duration::ZERO
        } else {
            lifetime(&d, headers).min(MAX_LIFETIME)
        };
        // `must-revalidate` (and, for this shared cache, `s-maxage`): never served stale.
        let stale_while_revalidate = if d.must_revalidate || d.s_maxage.is_some() {
            Duration::ZERO
        } else {
            Duration::from_secs(d.stale_while_revalidate.unwrap_or(0)).min(MAX_LIFETIME)
        };
        if lifetime.is_zero()
            && stale_while_revalidate.is_zero()
            && !headers.contains_key(header::ETAG)
            && !headers.contains_key(header::LAST_MODIFIED)
        {
            return None;
        }
        // The age it arrives with (RFC 9111 §4.2.3): `Age`, or how long ago its `Date` says
        // it was made, whichever is more — whole seconds, as both are written. A malformed
        // `Age` is ignored (§5.1); a `Date` in the future counts nothing.
        let age = headers
            .get(header::AGE)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .map_or(Duration::ZERO, Duration::from_secs);
        let apparent_age = headers
            .get(header::DATE)
            .and_then(|v| httpdate::parse_http_date(v.to_str().ok()?).ok())
            .and_then(|date| SystemTime::now().duration_since(date).ok())
            .map_or(Duration::ZERO, |d| Duration::from_secs(d.as_secs()));
        let initial_age = age.max(apparent_age);
        Some(Rules {
            lifetime,
            stale_while_revalidate,
            initial_age,
            vary,
        })
    }
}

/// The freshness lifetime of RFC 9111 §4.2.1 for a shared cache: `s-maxage`, else `max-age`,
/// else `Expires` − `Date` (a malformed `Expires` is in the past; no `Date`: now); zero
/// without any of them (no heuristic freshness).
fn lifetime(d: &Directives, headers: &HeaderMap) -> Duration {
    if let Some(secs) = d.s_maxage.or(d.max_age) {
        return Duration::from_secs(secs);
    }
    let Some(expires) = headers.get(header::EXPIRES) else {
        return Duration::ZERO;
    };
    let date = |v: &HeaderValue| httpdate::parse_http_date(v.to_str().ok()?).ok();
    let Some(expires) = date(expires) else {
        return Duration::ZERO;
    };
    let now = headers
        .get(header::DATE)
        .and_then(date)
        .unwrap_or_else(SystemTime::now);
    expires.duration_since(now).unwrap_or(Duration::ZERO)
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
        let rules = Rules::of(&headers)?;
        let vary = rules
            .vary
            .into_iter()
            .map(|name| {
                let seen = selecting_value(req_headers, &name);
                (name, seen)
            })
            .collect();
        Some(CachedResponse {
            status,
            etag: headers.get(header::ETAG).cloned(),
            last_modified: headers.get(header::LAST_MODIFIED).cloned(),
            headers,
            body,
            stored_at: now,
            initial_age: rules.initial_age,
            lifetime: rules.lifetime,
            stale_while_revalidate: rules.stale_while_revalidate,
            vary,
        })
    }

    /// Whether a response with `headers` would be kept at all (decided before its body is
    /// read).
    pub fn is_storable(headers: &HeaderMap) -> bool {
        Rules::of(headers).is_some()
    }

    /// Its age at `now`: the age it was stored with plus the time since.
    pub fn age(&self, now: Instant) -> Duration {
        self.initial_age
            .saturating_add(now.saturating_duration_since(self.stored_at))
    }

    /// Whether it may be served without asking the server at `now`.
    pub fn is_fresh(&self, now: Instant) -> bool {
        self.age(now) < self.lifetime
    }

    /// Whether it is stale at `now` but may still be served while revalidated in the
    /// background.
    pub fn is_within_swr(&self, now: Instant) -> bool {
        let age = self.age(now);
        age >= self.lifetime && age < self.lifetime.saturating_add(self.stale_while_revalidate)
    }

    /// Whether a request with `req_headers` has the values this entry was stored for: each
    /// header `Vary` names, all its field lines combined (RFC 9111 §4.1), compared with what
    /// the storing request had.
    pub fn vary_matches(&self, req_headers: &HeaderMap) -> bool {
        self.vary
            .iter()
            .all(|(name, value)| selecting_value(req_headers, name) == *value)
    }

    /// The stored response as a buffered [`NetResponse`] for `url`.
    pub fn to_response(&self, url: &str) -> NetResponse {
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

/// Storage for an HTTP cache's entries (the interceptors' `CacheHook`), by key (tenant +
/// URL).
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

/// The value of request header `name` as `Vary` compares it: absent, its one line, or its
/// lines combined in order with `", "` (RFC 9110 §5.3), so that two requests that differ only
/// in a second `Accept-Language` line are different variants.
pub fn selecting_value(headers: &HeaderMap, name: &HeaderName) -> Option<HeaderValue> {
    let mut lines = headers.get_all(name).iter();
    let first = lines.next()?;
    let Some(second) = lines.next() else {
        return Some(first.clone());
    };
    let mut joined = first.as_bytes().to_vec();
    for line in std::iter::once(second).chain(lines) {
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(line.as_bytes());
    }
    // Valid lines joined by ", " are a valid value; were it not, the lines could not match.
    HeaderValue::from_bytes(&joined).ok()
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

    #[test]
    fn lifetime_sources_age_and_must_revalidate() {
        let none = HeaderMap::new();
        let lifetime = |resp: &[(&'static str, &'static str)]| {
            entry(resp, &none).map(|e| (e.lifetime.as_secs(), e.initial_age.as_secs()))
        };
        let date = ("date", "Sun, 06 Nov 1994 08:49:37 GMT");
        // A `Date` decades ago: that old on arrival (its apparent age), whatever its lifetime.
        const DECADES: u64 = 30 * 365 * 24 * 3600;
        let from_1994 = lifetime(&[date, ("expires", "Sun, 06 Nov 1994 08:50:37 GMT")]);
        assert!(
            matches!(from_1994, Some((60, age)) if age > DECADES),
            "{from_1994:?}"
        );
        // max-age wins over Expires, s-maxage over both.
        let max_age = lifetime(&[
            date,
            ("expires", "Sun, 06 Nov 1994 08:50:37 GMT"),
            ("cache-control", "max-age=5"),
        ]);
        assert!(
            matches!(max_age, Some((5, age)) if age > DECADES),
            "{max_age:?}"
        );
        assert_eq!(
            lifetime(&[("cache-control", "max-age=5, s-maxage=7")]),
            Some((7, 0))
        );
        // An Expires before Date, or not a date, gives no freshness (nor an entry without a
        // validator).
        assert_eq!(
            lifetime(&[date, ("expires", "Sun, 06 Nov 1994 08:00:00 GMT")]),
            None
        );
        assert_eq!(
            lifetime(&[("expires", "0"), ("etag", "\"x\"")]),
            Some((0, 0))
        );
        assert_eq!(
            lifetime(&[("cache-control", "max-age=60"), ("age", "45")]),
            Some((60, 45))
        );
        let e = entry(&[("cache-control", "max-age=60"), ("age", "45")], &none).unwrap();
        assert!(e.is_fresh(e.stored_at + Duration::from_secs(14)));
        assert!(!e.is_fresh(e.stored_at + Duration::from_secs(15)));
        assert_eq!(e.age(e.stored_at + Duration::from_secs(5)).as_secs(), 50);
        let swr = |cc: &'static str| {
            entry(&[("cache-control", cc), ("etag", "\"x\"")], &none)
                .unwrap()
                .stale_while_revalidate
                .as_secs()
        };
        assert_eq!(swr("max-age=1, stale-while-revalidate=30"), 30);
        assert_eq!(
            swr("max-age=1, stale-while-revalidate=30, must-revalidate"),
            0
        );
        assert_eq!(swr("s-maxage=1, stale-while-revalidate=30"), 0);
        assert!(!CachedResponse::is_storable(&headers(&[
            ("cache-control", "max-age=60"),
            ("vary", "accept, *")
        ])));
    }
}
