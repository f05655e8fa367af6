//! `Bearer`: `Authorization: Bearer` from an async token provider, cached until expiry.

use std::{
    fmt,
    future::Future,
    sync::{
        atomic::{AtomicU64, AtomicU8, Ordering},
        Arc,
    },
    time::Duration,
};

use soulbase_net_core::{
    http::{header, HeaderName, HeaderValue, Method, StatusCode},
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
    /// when a 401 refuses it; see [`Bearer`]).
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
/// expiry; concurrent calls share one fetch.
///
/// # A 401: refresh and resend
///
/// When the final response of a call (after its redirects) is a 401, the token is fetched
/// again and the request sent once more with the new one only when **all** of these hold:
///
/// - **The token was refused.** The attempt that got the 401 carried this interceptor's
///   token: what counts is the request as it was sent on that attempt (its `Authorization`
///   when the attempt started, seen in [`on_attempt`](Interceptor::on_attempt)), not what
///   `before` set. A 401 to a request without the token says nothing about the token, so it
///   is returned as it is and the provider is not asked. This covers a redirect chain that
///   comes back to the token's origin (A → B → A): the client dropped `Authorization` on the
///   hop to B and never adds it back, so A's 401 answered a request without the token. It is
///   returned, not resent: a resend would follow the same chain and lose the token again.
///   (Used without a client, when no attempt was reported, the request handed to
///   [`should_resend`](Interceptor::should_resend) is taken as the one sent.)
/// - **The 401 came from the token's origin** (scheme, host and port of the request the
///   token was set on; a response that names no URL counts as from there).
/// - **`before` set the header.** A request that came with its own `Authorization` is left
///   alone, 401 included.
/// - **The body can be sent again**: empty, bytes or JSON. A streamed body is never resent.
/// - **The request may be repeated**: a GET, HEAD or OPTIONS; or a request that carries an
///   `Idempotency-Key` header (any method, POST and PATCH included: the server drops the
///   duplicate); or a PUT, DELETE or other method marked
///   [`idempotent`](NetRequest::idempotent). A POST or PATCH **without** an
///   `Idempotency-Key` is never resent, marked idempotent or not: the 401 is returned and
///   the server has seen one request. (The client gives every POST and PATCH marked
///   idempotent a key before sending, and [`NetRequest::idempotency_key`] sets one, so
///   through a client those are resent.)
/// - **It was not resent already**: at most one refresh and one resend per call; the
///   resend's own 401 is returned.
///
/// The resend is the caller's request as `before` left it (method, body, `Idempotency-Key`
/// and other headers, not a redirect hop's version), with the new token. When the provider
/// fails during the refresh, the 401 is returned.
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

/// What `before` set on a request, kept in its extensions.
#[derive(Clone, Debug)]
struct Sent {
    /// The `Authorization` value set (marked sensitive, so `Debug` does not show it).
    header: HeaderValue,
    /// The token generation it holds.
    generation: u64,
    /// Whether the request was resent already after a 401.
    resent: bool,
    /// Whether the latest attempt carried `header`. Shared by every copy of the request
    /// (extensions are cloned with it): the client keeps a copy of the caller's request for a
    /// resend before a redirect changes it, and that copy is what `should_resend` is handed,
    /// while the attempts that follow run on the changed request.
    carried: Arc<AtomicU8>,
}

/// [`Sent::carried`] before any attempt was reported.
const NO_ATTEMPT: u8 = 0;
/// [`Sent::carried`]: the latest attempt carried the token.
const WITH_TOKEN: u8 = 1;
/// [`Sent::carried`]: the latest attempt went without the token (stripped on a redirect).
const WITHOUT_TOKEN: u8 = 2;

/// The header whose presence lets a POST or PATCH be resent (see [`Bearer`]).
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

impl Sent {
    fn new(header: HeaderValue, generation: u64, resent: bool) -> Self {
        Sent {
            header,
            generation,
            resent,
            carried: Arc::new(AtomicU8::new(NO_ATTEMPT)),
        }
    }

    /// Whether the request that got the final response carried the token: as the latest
    /// attempt reported it, or, when none was, as `req` (the request handed over) has it.
    fn token_was_sent(&self, req: &NetRequest) -> bool {
        match self.carried.load(Ordering::Acquire) {
            WITH_TOKEN => true,
            WITHOUT_TOKEN => false,
            _ => req.headers.get(header::AUTHORIZATION) == Some(&self.header),
        }
    }
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
        req.headers.insert(header::AUTHORIZATION, value.clone());
        req.extensions.insert(Sent::new(value, generation, false));
        Ok(())
    }

    fn on_attempt(&self, req: &mut NetRequest, _attempt: u32) {
        // What this attempt sends: a redirect hop to another origin has lost the header (and
        // a hop back to the token's origin does not get it again).
        if let Some(sent) = req.extensions.get::<Sent>() {
            let carried = req.headers.get(header::AUTHORIZATION) == Some(&sent.header);
            let state = if carried { WITH_TOKEN } else { WITHOUT_TOKEN };
            sent.carried.store(state, Ordering::Release);
        }
    }

    async fn should_resend(&self, req: &mut NetRequest, res: &mut NetResponse) -> bool {
        let Some(sent) = req.extensions.get::<Sent>() else {
            return false;
        };
        if res.status != StatusCode::UNAUTHORIZED || sent.resent || !may_resend(req) {
            return false;
        }
        // The token was not refused when the request that got the 401 went without it.
        if !sent.token_was_sent(req) {
            return false;
        }
        // The token is for the request's origin: a 401 from elsewhere says nothing about it.
        // A response that names no URL (made by an interceptor or a test double) is the
        // request's own.
        if !res.url.is_empty() && !same_origin(&req.url, &res.url) {
            return false;
        }
        let stale = sent.generation;
        let Ok((value, generation)) = self.header(Some(stale)).await else {
            return false;
        };
        req.headers.insert(header::AUTHORIZATION, value.clone());
        req.extensions.insert(Sent::new(value, generation, true));
        true
    }

    fn hooks(&self) -> Hooks {
        Hooks::BEFORE | Hooks::ON_ATTEMPT | Hooks::SHOULD_RESEND
    }

    fn name(&self) -> &'static str {
        "bearer"
    }
}

/// Whether `req` may be sent again after a 401 (see [`Bearer`]): its body is not a stream,
/// and it is safe to repeat, has an `Idempotency-Key`, or is a method other than POST and
/// PATCH marked idempotent.
fn may_resend(req: &NetRequest) -> bool {
    if !req.body.is_replayable() {
        return false;
    }
    let safe = matches!(req.method, Method::GET | Method::HEAD | Method::OPTIONS);
    let keyed = req
        .headers
        .get(IDEMPOTENCY_KEY)
        .is_some_and(|key| !key.is_empty());
    let marked = req.idempotent && !matches!(req.method, Method::POST | Method::PATCH);
    safe || keyed || marked
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
    async fn a_401_to_an_attempt_without_the_token_refreshes_nothing() {
        let (bearer, calls) = counting();
        let mut caller = NetRequest::get("http://h.example/start");
        bearer.before(&mut caller).await.unwrap();
        // The client keeps the caller's request and changes a copy hop by hop: the hop to
        // another origin and the one back (A → B → A) go without `Authorization`.
        let mut hop = caller.try_clone().unwrap();
        bearer.on_attempt(&mut hop, 1);
        hop.headers.remove(header::AUTHORIZATION);
        hop.url = "http://h.example/back".to_owned();
        bearer.on_attempt(&mut hop, 2);
        let mut res = NetResponse::from_bytes(StatusCode::UNAUTHORIZED, "");
        res.url = hop.url.clone();
        assert!(!bearer.should_resend(&mut caller, &mut res).await);
        assert_eq!(caller.headers["authorization"], "Bearer tok-1");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the token was not refused");
        // The same 401 to an attempt that carried the token refreshes it.
        let mut carried = caller.try_clone().unwrap();
        bearer.on_attempt(&mut carried, 3);
        assert!(bearer.should_resend(&mut caller, &mut res).await);
        assert_eq!(caller.headers["authorization"], "Bearer tok-2");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn which_requests_may_be_resent() {
        use soulbase_net_core::http;

        let key = |r: NetRequest| r.header("idempotency-key", "k-1");
        let streamed = |key: bool| {
            let mut b = http::Request::post("http://h.example/");
            if key {
                b = b.header("idempotency-key", "k-1");
            }
            let body = soulbase_net_core::RespBody::Bytes("x".into());
            NetRequest::try_from(b.body(body).unwrap()).unwrap()
        };
        let cases = [
            (NetRequest::get("http://h.example/"), true),
            (NetRequest::head("http://h.example/"), true),
            (NetRequest::options("http://h.example/"), true),
            (NetRequest::put("http://h.example/").idempotent(true), true),
            (
                NetRequest::delete("http://h.example/").idempotent(true),
                true,
            ),
            (NetRequest::put("http://h.example/"), false),
            (NetRequest::delete("http://h.example/"), false),
            (NetRequest::post("http://h.example/").body("x"), false),
            (
                NetRequest::post("http://h.example/")
                    .body("x")
                    .idempotent(true),
                false,
            ),
            (key(NetRequest::post("http://h.example/").body("x")), true),
            (key(NetRequest::patch("http://h.example/").body("x")), true),
            (key(NetRequest::delete("http://h.example/")), true),
            (
                NetRequest::post("http://h.example/").header("idempotency-key", ""),
                false,
            ),
            (streamed(true), false),
            (streamed(false), false),
        ];
        for (i, (req, want)) in cases.iter().enumerate() {
            assert_eq!(may_resend(req), *want, "case {i}: {} {req:?}", req.method);
        }
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
