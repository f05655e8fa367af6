//! `Bearer`: `Authorization: Bearer` from an async token provider, cached until expiry.

use std::{
    fmt,
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use soulbase_net_core::{
    http::{header, HeaderValue, StatusCode},
    Hooks, Interceptor, NetError, NetRequest, NetResponse,
};
use tokio::{sync::Mutex, time::Instant};

/// An access token and when it stops being valid.
///
/// Its `Debug` output never shows the value.
#[derive(Clone)]
pub struct Token {
    /// The secret value sent after `Bearer `.
    pub value: String,
    /// When the token expires; `None` for a token that does not expire (it is still refreshed
    /// after a 401).
    pub expires_at: Option<Instant>,
}

impl Token {
    /// A token valid for `ttl` from now (a `ttl` too large to represent never expires).
    pub fn expires_in(value: impl Into<String>, ttl: Duration) -> Self {
        Token {
            value: value.into(),
            expires_at: Instant::now().checked_add(ttl),
        }
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("value", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Where [`Bearer`] gets its tokens: an OAuth client, a secret store, a closure.
///
/// Any `Fn() -> impl Future<Output = Result<Token, NetError>>` is a provider.
#[async_trait::async_trait]
pub trait TokenProvider: Send + Sync {
    /// A fresh token.
    ///
    /// # Errors
    /// Whatever stops the provider from getting one; the request fails with it.
    async fn token(&self) -> Result<Token, NetError>;
}

#[async_trait::async_trait]
impl<F, Fut> TokenProvider for F
where
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = Result<Token, NetError>> + Send,
{
    async fn token(&self) -> Result<Token, NetError> {
        (self)().await
    }
}

/// Sets `Authorization: Bearer <token>` on every request that has no `Authorization` yet.
///
/// The token comes from a [`TokenProvider`] and is cached until `refresh_before` ahead of its
/// expiry; concurrent calls share one fetch. When the final response is a 401, the token is
/// fetched again and the request sent once more with it (only when the body can be sent again).
///
/// The header value is marked sensitive, and neither `Bearer` nor [`Token`] shows the token in
/// `Debug` output; this crate logs nothing.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use soulbase_net_core::{Interceptor, NetRequest};
/// use soulbase_net_interceptors::{Bearer, Token};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let bearer = Bearer::new(|| async { Ok(Token::expires_in("s3cr3t", Duration::from_secs(3600))) });
/// let mut req = NetRequest::get("https://api.example.com/");
/// bearer.before(&mut req).await.unwrap();
/// assert_eq!(req.headers["authorization"], "Bearer s3cr3t");
/// assert!(!format!("{bearer:?} {req:?}").contains("s3cr3t"));
/// # });
/// ```
pub struct Bearer {
    provider: Arc<dyn TokenProvider>,
    cached: Mutex<Option<Cached>>,
    refresh_before: Duration,
    fetches: AtomicU64,
}

struct Cached {
    token: Token,
    generation: u64,
}

/// The token generation a request was sent with, and whether it was resent already.
#[derive(Clone, Copy, Debug)]
struct Sent {
    generation: u64,
    resent: bool,
}

// === impl Bearer ===

impl Bearer {
    /// Tokens from `provider`.
    pub fn new(provider: impl TokenProvider + 'static) -> Self {
        Bearer {
            provider: Arc::new(provider),
            cached: Mutex::new(None),
            refresh_before: Duration::from_secs(30),
            fetches: AtomicU64::new(0),
        }
    }

    /// Fetches a new token this long before the cached one expires. Default is 30 seconds.
    pub fn refresh_before(mut self, margin: Duration) -> Self {
        self.refresh_before = margin;
        self
    }

    /// How many tokens were fetched from the provider.
    pub fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    /// The header for the cached token, or a new one when there is none, it is about to
    /// expire, or it is the generation `stale` (refused by the server).
    async fn header(&self, stale: Option<u64>) -> Result<(HeaderValue, u64), NetError> {
        let mut cached = self.cached.lock().await;
        // A margin too large to add to now makes every token due for refresh.
        let due = Instant::now().checked_add(self.refresh_before);
        let usable = cached.as_ref().filter(|c| {
            Some(c.generation) != stale
                && match (c.token.expires_at, due) {
                    (None, _) => true,
                    (Some(at), Some(due)) => due < at,
                    (Some(_), None) => false,
                }
        });
        let (value, generation) = match usable {
            Some(c) => (c.token.value.clone(), c.generation),
            None => {
                let token = self.provider.token().await?;
                self.fetches.fetch_add(1, Ordering::Relaxed);
                let generation = cached.as_ref().map_or(1, |c| c.generation + 1);
                let value = token.value.clone();
                *cached = Some(Cached { token, generation });
                (value, generation)
            }
        };
        let mut header = HeaderValue::from_str(&format!("Bearer {value}")).map_err(|_| {
            NetError::invalid_request("the bearer token is not a valid header value")
        })?;
        header.set_sensitive(true);
        Ok((header, generation))
    }
}

impl fmt::Debug for Bearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bearer")
            .field("refresh_before", &self.refresh_before)
            .field("fetches", &self.fetches())
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Interceptor for Bearer {
    async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
        if req.headers.contains_key(header::AUTHORIZATION) {
            return Ok(());
        }
        let (value, generation) = self.header(None).await?;
        req.headers.insert(header::AUTHORIZATION, value);
        req.extensions.insert(Sent {
            generation,
            resent: false,
        });
        Ok(())
    }

    async fn should_resend(&self, req: &mut NetRequest, res: &mut NetResponse) -> bool {
        let Some(sent) = req.extensions.get::<Sent>().copied() else {
            return false;
        };
        if res.status != StatusCode::UNAUTHORIZED || sent.resent || !req.is_replayable() {
            return false;
        }
        // The token is for the request's origin: a 401 from wherever a redirect led (which
        // got no token: credentials are dropped across origins) says nothing about it. A
        // response that names no URL (made by an interceptor or a test double) is the
        // request's own.
        if !res.url.is_empty() && !same_origin(&req.url, &res.url) {
            return false;
        }
        let Ok((value, generation)) = self.header(Some(sent.generation)).await else {
            return false;
        };
        req.headers.insert(header::AUTHORIZATION, value);
        req.extensions.insert(Sent {
            generation,
            resent: true,
        });
        true
    }

    fn hooks(&self) -> Hooks {
        Hooks::BEFORE | Hooks::SHOULD_RESEND
    }

    fn name(&self) -> &'static str {
        "bearer"
    }
}

/// Whether two URLs have one origin (scheme, host, port); unparsable ones never do.
fn same_origin(a: &str, b: &str) -> bool {
    use soulbase_net_core::url::Url;
    match (Url::parse(a), Url::parse(b)) {
        (Ok(a), Ok(b)) => a.origin() == b.origin(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    fn counting() -> (Bearer, Arc<AtomicU32>) {
        let n = Arc::new(AtomicU32::new(0));
        let calls = n.clone();
        let bearer = Bearer::new(move || {
            let i = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                Ok(Token::expires_in(
                    format!("tok-{i}"),
                    Duration::from_secs(60),
                ))
            }
        })
        .refresh_before(Duration::from_secs(10));
        (bearer, n)
    }

    #[tokio::test(start_paused = true)]
    async fn cached_until_shortly_before_expiry() {
        let (bearer, calls) = counting();
        for _ in 0..3 {
            let mut req = NetRequest::get("http://h.example/");
            bearer.before(&mut req).await.unwrap();
            assert_eq!(req.headers["authorization"], "Bearer tok-1");
        }
        tokio::time::advance(Duration::from_secs(51)).await;
        let mut req = NetRequest::get("http://h.example/");
        bearer.before(&mut req).await.unwrap();
        assert_eq!(req.headers["authorization"], "Bearer tok-2");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(bearer.fetches(), 2);
    }

    #[tokio::test]
    async fn huge_durations_do_not_panic() {
        assert!(Token::expires_in("x", Duration::MAX).expires_at.is_none());
        let (bearer, calls) = counting();
        let bearer = bearer.refresh_before(Duration::MAX);
        for _ in 0..2 {
            bearer
                .before(&mut NetRequest::get("http://h.example/"))
                .await
                .unwrap();
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "always due for refresh");
    }

    #[tokio::test]
    async fn a_401_refreshes_once() {
        let (bearer, _) = counting();
        let mut req = NetRequest::get("http://h.example/");
        bearer.before(&mut req).await.unwrap();
        let mut res = NetResponse::from_bytes(StatusCode::UNAUTHORIZED, "");
        assert!(bearer.should_resend(&mut req, &mut res).await);
        assert_eq!(req.headers["authorization"], "Bearer tok-2");
        assert!(!bearer.should_resend(&mut req, &mut res).await);
        let mut elsewhere = NetRequest::get("http://h.example/");
        bearer.before(&mut elsewhere).await.unwrap();
        let mut theirs = NetResponse::from_bytes(StatusCode::UNAUTHORIZED, "");
        theirs.url = "http://other.example/login".to_owned();
        assert!(!bearer.should_resend(&mut elsewhere, &mut theirs).await);
        theirs.url = "http://h.example/after-a-redirect".to_owned();
        assert!(bearer.should_resend(&mut elsewhere, &mut theirs).await);
        let mut ok = NetResponse::from_bytes(StatusCode::OK, "");
        let mut other = NetRequest::get("http://h.example/");
        bearer.before(&mut other).await.unwrap();
        assert!(!bearer.should_resend(&mut other, &mut ok).await);
    }

    #[tokio::test]
    async fn the_token_never_shows_in_debug() {
        let (bearer, _) = counting();
        let mut req = NetRequest::get("http://h.example/");
        bearer.before(&mut req).await.unwrap();
        let token = Token::expires_in("tok-1", Duration::from_secs(1));
        let all = format!("{bearer:?} {req:?} {:?} {token:?}", req.headers);
        assert!(!all.contains("tok-1"), "{all}");
        assert!(req.headers["authorization"].is_sensitive());
    }

    #[tokio::test]
    async fn a_provider_error_stops_the_request() {
        let bearer =
            Bearer::new(|| async { Err(NetError::new(soulbase_net_core::ErrorKind::Interceptor)) });
        let mut req = NetRequest::get("http://h.example/");
        let err = bearer.before(&mut req).await.unwrap_err();
        assert_eq!(err.kind(), soulbase_net_core::ErrorKind::Interceptor);
    }
}
