//! The client: [`ClientBuilder`] → [`Client`], which implements `NetClient`.

mod attempt;
mod body;
mod chain;
mod follow;
mod gauges;
mod hedged;
mod in_flight;
mod intercept;
mod learn;
mod replay;
mod retries;
mod send;
mod service;
mod span;
mod timer;
mod urls;
mod watch;

pub use self::service::ResponseFuture;

use std::{
    fmt,
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    time::Duration,
};

use http::HeaderValue;
use rustls::pki_types::CertificateDer;
use soulbase_net_core::{
    Fanout, GaugeSource, Interceptor, NetClient, NetError, NetRequest, NetResponse, NoopObserver,
    Observer, Takes,
};
use soulbase_net_policy::{NetPolicy, PolicyDocument, PolicyResolver, SnapshotResolver};

pub(crate) use self::learn::Latencies;
use crate::resilience::{Breakers, Limiter, RetryBudgets, SloControllers, Transition};
use crate::transport::{self, Transports};
use crate::transport::{Dialer, TcpDialer};

/// The default `User-Agent`, sent when a request sets none.
const DEFAULT_USER_AGENT: &str = concat!("soulbase-net/", env!("CARGO_PKG_VERSION"));

/// Builds a [`Client`].
///
/// # Examples
/// ```
/// use soulbase_net_policy::NetPolicy;
/// use soulbase_net_runtime::Client;
///
/// let mut policy = NetPolicy::default();
/// policy.retry.max_attempts = 2;
/// let client = Client::builder().policy(policy).build()?;
/// # let _ = client;
/// # Ok::<(), soulbase_net_core::NetError>(())
/// ```
pub struct ClientBuilder {
    resolver: Option<Arc<dyn PolicyResolver>>,
    policy: Option<NetPolicy>,
    /// A document or a file to read at `build`, so that its errors come out of `build`.
    document: Option<DocumentSource>,
    interceptors: Vec<Arc<dyn Interceptor>>,
    observers: Vec<Arc<dyn Observer>>,
    dialer: Arc<dyn Dialer>,
    extra_roots: Vec<CertificateDer<'static>>,
    user_agent: HeaderValue,
    pool_idle_timeout: Duration,
    pool_max_idle_per_host: usize,
    /// `None`: [`crate::transport::pool::IdleBudget::default_max`].
    pool_max_idle: Option<usize>,
    pool_max_lifetime: Option<Duration>,
    pool_keep_alive: Option<Duration>,
    http2_prior_knowledge: bool,
    decompress: bool,
    max_response_headers: usize,
    max_response_head_bytes: usize,
    rate_store: Option<Arc<dyn crate::fleet::RateStore>>,
    store: Option<soulbase_net_policy::StoreConfig>,
    max_in_flight: Option<usize>,
    /// The frozen endpoints file as [`build_async`](ClientBuilder::build_async) read it, so
    /// that `build` does not read it again; `None`: `build` reads it.
    frozen: Option<Vec<(String, std::time::SystemTime)>>,
}

/// Where [`ClientBuilder::policy_document`] and [`ClientBuilder::policy_file`] take the
/// policy from.
enum DocumentSource {
    Document(PolicyDocument),
    File(PathBuf),
    Watched(PathBuf, Duration),
    /// A file already read (by [`ClientBuilder::build_async`]), watched when `watch` is set.
    Loaded {
        resolver: Arc<SnapshotResolver>,
        watch: Option<watch::Loaded>,
    },
}

/// The soulbase-net HTTP client: cheap to clone (an `Arc` inside), safe to share.
///
/// Each request is validated, resolved to its policy (by tenant and host), passed through the
/// interceptors, and sent over a pooled connection opened through the address guard, with
/// the policy's phase timeouts and limits.
///
/// Each call runs inside a `tracing` span `http.client.request` (INFO, a child of the span
/// that polls it), each attempt inside `http.client.attempt`, so whatever the call logs —
/// interceptors, observers, the connection code — is theirs. The fields are OpenTelemetry's
/// HTTP client names: `http.request.method`, `server.address`, `server.port`, `url.scheme`,
/// `url.full` (without userinfo, query or fragment), `http.response.status_code`,
/// `error.type`, `http.request.resend_count`; plus `tenant`, `request.id`, and `trace_id` /
/// `span_id` of the `traceparent` the request carries (set by `TraceUa`). Without a
/// subscriber that wants them, the spans cost a check of a static flag.
///
/// `Client` is also a `tower::Service<http::Request<B>>` (see its `Service` impl for what
/// `poll_ready` can and cannot know), so tower and tower-http layers compose in front of it
/// and tower-based clients such as tonic send through its policy.
///
/// # Examples
/// ```
/// use soulbase_net_runtime::prelude::*;
/// use soulbase_net_testkit::{FaultServer, Reply};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let upstream = FaultServer::builder()
///     .route("/u/1", Reply::json(&serde_json::json!({"id": 1})))
///     .start()
///     .await?;
/// // The default policy refuses loopback and private addresses; this example grants loopback.
/// let doc = PolicyDocument::from_toml_str(r#"
///     [default]
///     security.grants.cidrs = ["127.0.0.0/8"]
/// "#)?;
/// let client = Client::builder().policy_document(doc).build()?;
///
/// let res = client.send(NetRequest::get(upstream.url("/u/1")).tenant("t1")).await?;
/// assert_eq!(res.status, http::StatusCode::OK);
/// assert_eq!(res.attempts, 1);
/// let user: serde_json::Value = res.json().await?;
/// assert_eq!(user["id"], 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// The tower face's slot reserved by `poll_ready`; a clone starts without one.
    ready: service::Readiness,
}

struct Inner {
    resolver: Arc<dyn PolicyResolver>,
    interceptors: chain::Chain,
    observer: Arc<dyn Observer>,
    /// Whether an observer was given: without one, the response body is not wrapped to
    /// count bytes nobody would see.
    observed: bool,
    /// Which of the events an observer may go without the observers take (none without an
    /// observer): the others are not built.
    takes: Takes,
    user_agent: HeaderValue,
    decompress: bool,
    transports: Arc<Transports>,
    breakers: Breakers,
    budgets: Arc<RetryBudgets>,
    limiter: Arc<Limiter>,
    /// The SLO controllers (policy `slo`): per-host factors that slow a host down while it
    /// misses its targets.
    slo: Arc<SloControllers>,
    gauges: Arc<dyn GaugeSource>,
    latencies: learn::Latencies,
    endpoints: learn::Endpoints,
    /// Shared rate limits (`limits.global`), through the rate store.
    global: crate::fleet::GlobalLimiter,
    /// The client's cap on calls in flight (`ClientBuilder::max_in_flight`), if any.
    in_flight: Option<Arc<tokio::sync::Semaphore>>,
}

// === impl ClientBuilder ===

impl ClientBuilder {
    /// A builder with the default policy, no interceptors, no observer and the system's
    /// TCP dialer.
    pub fn new() -> Self {
        ClientBuilder {
            resolver: None,
            policy: None,
            document: None,
            interceptors: Vec::new(),
            observers: Vec::new(),
            dialer: Arc::new(TcpDialer),
            extra_roots: Vec::new(),
            user_agent: HeaderValue::from_static(DEFAULT_USER_AGENT),
            pool_idle_timeout: Duration::from_secs(90),
            pool_max_idle_per_host: 32,
            pool_max_idle: None,
            pool_max_lifetime: None,
            pool_keep_alive: None,
            http2_prior_knowledge: false,
            decompress: true,
            max_response_headers: transport::HYPER_MAX_HEADERS,
            max_response_head_bytes: 64 * 1024,
            rate_store: None,
            store: None,
            max_in_flight: None,
            frozen: None,
        }
    }

    /// Uses one policy for every request (validated by `build`). Default is
    /// `NetPolicy::default()`.
    pub fn policy(mut self, policy: NetPolicy) -> Self {
        self.policy = Some(policy);
        self.resolver = None;
        self.document = None;
        self
    }

    /// Resolves a policy per request (tenant, host), e.g. a hot-reloaded
    /// [`SnapshotResolver`]. Replaces [`ClientBuilder::policy`].
    pub fn policy_resolver(mut self, resolver: Arc<dyn PolicyResolver>) -> Self {
        self.resolver = Some(resolver);
        self.policy = None;
        self.document = None;
        self
    }

    /// Uses a policy document: its default, overrides by host and tenant, and named keys,
    /// resolved per request; its `[store]` section too, unless [`store`](Self::store) gives
    /// one. `build` validates it, and fails with every problem listed. Replaces
    /// [`policy`](Self::policy) and [`policy_resolver`](Self::policy_resolver).
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_runtime::prelude::*;
    ///
    /// let doc = PolicyDocument::from_toml_str(r#"
    ///     [overrides."*.example.com"]
    ///     retry.max_attempts = 2
    /// "#)?;
    /// let client = Client::builder().policy_document(doc).build()?;
    /// # drop(client);
    /// # Ok::<(), NetError>(())
    /// ```
    pub fn policy_document(mut self, doc: PolicyDocument) -> Self {
        self.document = Some(DocumentSource::Document(doc));
        self.resolver = None;
        self.policy = None;
        self
    }

    /// Reads the policy document from a `.toml` or `.json` file at `build` (see
    /// [`policy_document`](Self::policy_document)), so that setup is one expression with one
    /// `?`. The file is read once; [`policy_file_watched`](Self::policy_file_watched) also
    /// reloads it when it changes (or keep a [`SnapshotResolver::from_path`], call its
    /// `reload_from_file` from a signal handler, and give it to
    /// [`policy_resolver`](Self::policy_resolver)).
    ///
    /// # Errors
    /// None here; `build` fails with `InvalidRequest` (`SCHEMA.VALIDATION_FAILED`) when the
    /// file cannot be read or parsed, or the document is invalid: the message lists every
    /// problem, and the source is the policy crate's `PolicyError`.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_runtime::prelude::*;
    ///
    /// fn client(path: &std::path::Path) -> Result<Client, NetError> {
    ///     Ok(Client::builder().policy_file(path).build()?)
    /// }
    ///
    /// let dir = std::env::temp_dir().join(format!("sbn-policy-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// let path = dir.join("policy.toml");
    /// std::fs::write(&path, "[default]\nretry.max_attempts = 2\n").unwrap();
    /// assert!(client(&path).is_ok());
    ///
    /// std::fs::write(&path, "[default]\nretry.max_attempts = 0\n").unwrap();
    /// let err = client(&path).unwrap_err();
    /// assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
    /// assert!(err.message().unwrap().contains("default.retry.max_attempts"));
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// ```
    pub fn policy_file(mut self, path: impl AsRef<Path>) -> Self {
        self.document = Some(DocumentSource::File(path.as_ref().to_path_buf()));
        self.resolver = None;
        self.policy = None;
        self
    }

    /// As [`policy_file`](Self::policy_file), and reloads the file when it changes: every
    /// `every`, the file's modification time and length are compared with the last look; a
    /// changed file is validated whole and swapped in atomically (calls in flight keep the
    /// policy they started with), while an invalid one is refused with a `tracing` warning
    /// listing its problems and the policy in force stays. The watch ends with the client.
    /// [`Client::policy_version`] counts the documents taken.
    ///
    /// # Errors
    /// None here; `build` fails as for [`policy_file`](Self::policy_file), and with
    /// `InvalidRequest` outside a Tokio runtime or when `every` is zero.
    ///
    /// # Examples
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), soulbase_net_runtime::prelude::NetError> {
    /// use std::time::Duration;
    /// use soulbase_net_runtime::prelude::*;
    ///
    /// let client = Client::builder()
    ///     .policy_file_watched("/etc/orders/policy.toml", Duration::from_secs(5))
    ///     .build()?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn policy_file_watched(mut self, path: impl AsRef<Path>, every: Duration) -> Self {
        self.document = Some(DocumentSource::Watched(path.as_ref().to_path_buf(), every));
        self.resolver = None;
        self.policy = None;
        self
    }

    /// Sets the interceptors: `before` runs in this order, `after` and `on_error` in reverse.
    pub fn interceptors(mut self, interceptors: Vec<Arc<dyn Interceptor>>) -> Self {
        self.interceptors = interceptors;
        self
    }

    /// Adds one interceptor after the others.
    pub fn interceptor(mut self, interceptor: impl Interceptor + 'static) -> Self {
        self.interceptors.push(Arc::new(interceptor));
        self
    }

    /// Adds an observer: every event of the runtime (and the client's gauges) goes to each
    /// observer given, in the order given — metrics and tracing together, say. Default is
    /// none. Takes the observer itself or an `Arc` of it (an `Arc<T>` is an observer too);
    /// [`observer_arc`](Self::observer_arc) takes an `Arc<dyn Observer>` as it is.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{atomic::{AtomicU64, Ordering}, Arc};
    /// use soulbase_net_core::{NetEvent, Observer};
    /// use soulbase_net_runtime::Client;
    ///
    /// #[derive(Default)]
    /// struct Count(AtomicU64);
    /// impl Observer for Count {
    ///     fn on_event(&self, _: &NetEvent<'_>) {
    ///         self.0.fetch_add(1, Ordering::Relaxed);
    ///     }
    /// }
    ///
    /// let (a, b) = (Arc::new(Count::default()), Arc::new(Count::default()));
    /// // Both see every event: the second call adds, it does not replace.
    /// let client = Client::builder().observer(a.clone()).observer(b.clone()).build()?;
    /// # drop(client);
    /// # Ok::<(), soulbase_net_core::NetError>(())
    /// ```
    pub fn observer(self, observer: impl Observer + 'static) -> Self {
        self.observer_arc(Arc::new(observer))
    }

    /// Adds a shared observer, as it is (see [`observer`](Self::observer)).
    pub fn observer_arc(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Where shared rate limits (`limits.global`) keep their buckets: a
    /// `fleet::RedisRateStore` (feature `redis`) for limits shared
    /// by a fleet. Default is a [`MemoryRateStore`](crate::fleet::MemoryRateStore): exact for
    /// this process alone.
    pub fn rate_store(mut self, store: Arc<dyn crate::fleet::RateStore>) -> Self {
        self.rate_store = Some(store);
        self
    }

    /// Where the fleet's shared state lives, as a policy document's `[store]` section says
    /// (`PolicyDocument::store`): with a Redis server, cluster or sentinel-named master,
    /// shared rate limits go to a `fleet::RedisRateStore` — unless
    /// [`rate_store`](Self::rate_store) gave one. Needs the `redis` feature; `build` says so
    /// when it is missing.
    pub fn store(mut self, store: soulbase_net_policy::StoreConfig) -> Self {
        self.store = Some(store);
        self
    }

    /// Opens TCP connections; tests pass one that records and refuses non-loopback
    /// addresses. Default is [`TcpDialer`].
    pub fn dialer(mut self, dialer: Arc<dyn Dialer>) -> Self {
        self.dialer = dialer;
        self
    }

    /// Trusts `cert` as a root, besides the webpki roots and the policy's `extra_roots_pem`.
    pub fn add_root_certificate(mut self, cert: CertificateDer<'static>) -> Self {
        self.extra_roots.push(cert);
        self
    }

    /// The `User-Agent` sent when a request has none. Default is `soulbase-net/<version>`.
    pub fn user_agent(mut self, value: HeaderValue) -> Self {
        self.user_agent = value;
        self
    }

    /// How long an idle pooled connection is kept; a reaper closes it after that. Zero keeps
    /// no idle connections. Default is 90 seconds.
    pub fn pool_idle_timeout(mut self, idle: Duration) -> Self {
        self.pool_idle_timeout = idle;
        self
    }

    /// The most idle HTTP/1.1 connections kept per origin (scheme, host and port); one given
    /// back beyond that is closed. (An HTTP/2 connection is shared by all requests to its
    /// origin.) Default is 32.
    pub fn pool_max_idle_per_host(mut self, max: usize) -> Self {
        self.pool_max_idle_per_host = max;
        self
    }

    /// The most connections the client keeps between requests, over every origin: idle
    /// HTTP/1.1 connections and shared HTTP/2 ones. When one more would go over it, the least
    /// recently used idle connections are closed (reported as `ConnectionRetired` with
    /// reason `idle_budget`, counted in `net_pool_retired_total`), so a client that meets
    /// many hosts in turn does not keep a connection per host until the process runs out of
    /// descriptors. Default: a quarter of the process's descriptor limit (`RLIMIT_NOFILE`'s
    /// soft value), or 256 where it cannot be read.
    ///
    /// # Examples
    /// ```
    /// let client = soulbase_net_runtime::Client::builder()
    ///     .pool_max_idle(1_000)
    ///     .build()?;
    /// # let _ = client;
    /// # Ok::<(), soulbase_net_core::NetError>(())
    /// ```
    pub fn pool_max_idle(mut self, max: usize) -> Self {
        self.pool_max_idle = Some(max);
        self
    }

    /// The longest a connection is used: one opened longer ago than `max` takes no new
    /// request (one in use finishes it) and is closed, so that traffic moves to the addresses
    /// DNS gives now and spreads again over a load balancer's backends. Default: no limit.
    pub fn pool_max_lifetime(mut self, max: Duration) -> Self {
        self.pool_max_lifetime = Some(max);
        self
    }

    /// Pings every open pooled connection that can be pinged at this interval, so that it
    /// survives the idle timeouts of the peer and of middleboxes (NATs, load balancers) in
    /// between. Zero turns it off. Default is off.
    ///
    /// - HTTP/3: a QUIC PING when nothing else was sent for `every` (quinn's
    ///   `keep_alive_interval`). The QUIC idle timeout is the shorter of the
    ///   [pool's](Self::pool_idle_timeout) and the server's, so with keep-alive shorter than
    ///   both, a connection stays open until the server closes it or the client is dropped:
    ///   the pool idle timeout then no longer closes it.
    /// - HTTP/2: a PING frame every `every`, idle or not (hyper's `keep_alive_interval` with
    ///   `keep_alive_while_idle`). A PING unanswered for as long as the interval (at least
    ///   1 second) closes the connection: the next request opens a new one. The pool still
    ///   closes an HTTP/2 connection unused for longer than the pool idle timeout.
    /// - HTTP/1.1 has no ping: its idle connections are not kept alive (they close after the
    ///   pool idle timeout, or sooner when the server closes them).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    ///
    /// let client = soulbase_net_runtime::Client::builder()
    ///     .pool_keep_alive(Duration::from_secs(15))
    ///     .build()?;
    /// # let _ = client;
    /// # Ok::<(), soulbase_net_core::NetError>(())
    /// ```
    pub fn pool_keep_alive(mut self, every: Duration) -> Self {
        self.pool_keep_alive = (!every.is_zero()).then_some(every);
        self
    }

    /// Speaks HTTP/2 without negotiation on plain `http` (h2c prior knowledge), for every
    /// host whose policy does not say otherwise: a policy's `pool.http2_prior_knowledge`
    /// decides for the hosts it covers (an override `true` for a gRPC backend, the rest of
    /// the client on HTTP/1.1; or `false` for one HTTP/1.1 host of an h2c client). Default
    /// is off: HTTP/1.1 on `http`, ALPN (h2 or HTTP/1.1) on `https`.
    pub fn http2_prior_knowledge(mut self, on: bool) -> Self {
        self.http2_prior_knowledge = on;
        self
    }

    /// Offers `Accept-Encoding: gzip, br, zstd` when a request sets none, and decodes the
    /// response (at most 2 stacked encodings; `max_resp_bytes` applies to the decoded
    /// body). A request that sets its own `Accept-Encoding` gets the body as sent. Default
    /// is on.
    pub fn decompress(mut self, on: bool) -> Self {
        self.decompress = on;
        self
    }

    /// The most header fields a response may have; more fail the request with `TooLarge`.
    /// Default is 100.
    pub fn max_response_headers(mut self, max: usize) -> Self {
        self.max_response_headers = max;
        self
    }

    /// The largest response head (status line and headers) accepted, in bytes; at least
    /// 8 KiB. Default is 64 KiB.
    pub fn max_response_head_bytes(mut self, max: usize) -> Self {
        self.max_response_head_bytes = max;
        self
    }

    /// At most `max` calls of this client in flight at once, all hosts and tenants together,
    /// whichever face they come through (`NetClient::send` or `tower::Service::call`); a
    /// call holds its slot until its response head arrives (or it fails). Over the cap,
    /// `NetClient::send` fails at once with `RateLimited` (scope `ClientConcurrency`) unless
    /// the call's `limits.max_wait` allows a bounded wait, while the tower face's
    /// `poll_ready` is `Pending` until a slot is free — the backpressure tower layers expect.
    /// Default is no cap (the policy's per-host and per-tenant limits still apply).
    ///
    /// # Examples
    /// ```
    /// let client = soulbase_net_runtime::Client::builder().max_in_flight(256).build()?;
    /// # let _ = client;
    /// # Ok::<(), soulbase_net_core::NetError>(())
    /// ```
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = Some(max);
        self
    }

    /// As [`build`](Self::build), with the files a build reads — the policy file
    /// ([`policy_file`](Self::policy_file), [`policy_file_watched`](Self::policy_file_watched))
    /// and the frozen endpoints kept beside the DNS cache file (`dns.persist_file`) — read on
    /// Tokio's blocking pool, so that building a client never holds up an async worker: what
    /// a service that builds clients while serving (one per tenant, say) should call. `build`
    /// reads them on the calling thread, which is right at start-up and outside a runtime.
    ///
    /// # Errors
    /// As [`build`](Self::build); `Io` when the blocking pool is gone (the runtime is
    /// shutting down).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), soulbase_net_core::NetError> {
    /// use soulbase_net_runtime::prelude::*;
    ///
    /// let dir = std::env::temp_dir().join(format!("sbn-build-async-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// let path = dir.join("policy.toml");
    /// std::fs::write(&path, "[default]\nretry.max_attempts = 2\n").unwrap();
    /// let client = Client::builder().policy_file(&path).build_async().await?;
    /// assert_eq!(client.policy_version(), 1);
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok(()) }
    /// ```
    pub async fn build_async(mut self) -> Result<Client, NetError> {
        let loaded = match self.document.take() {
            Some(DocumentSource::File(path)) => {
                let resolver = blocking(move || {
                    SnapshotResolver::new(PolicyDocument::from_path(&path)?).map_err(NetError::from)
                })
                .await?;
                Some(DocumentSource::Loaded {
                    resolver: Arc::new(resolver),
                    watch: None,
                })
            }
            Some(DocumentSource::Watched(path, every)) => {
                let (resolver, loaded) = blocking(move || watch::load(path, every)).await?;
                Some(DocumentSource::Loaded {
                    resolver,
                    watch: Some(loaded),
                })
            }
            Some(DocumentSource::Document(doc)) => Some(DocumentSource::Loaded {
                resolver: Arc::new(SnapshotResolver::new(doc)?),
                watch: None,
            }),
            other => other,
        };
        self.document = loaded;
        // The frozen endpoints file, when the default policy keeps one.
        let persist_file = match (&self.resolver, &self.document, &self.policy) {
            (Some(r), _, _) => r.resolve(None, "").dns.persist_file.clone(),
            (None, Some(DocumentSource::Loaded { resolver, .. }), _) => {
                resolver.resolve(None, "").dns.persist_file.clone()
            }
            (None, _, policy) => policy.as_ref().and_then(|p| p.dns.persist_file.clone()),
        };
        if let Some(file) = persist_file {
            let path = crate::dns::frozen_path(&file);
            self.frozen = Some(blocking(move || crate::dns::load_frozen(&path)).await?);
        }
        self.build()
    }

    /// Builds the client.
    ///
    /// # Errors
    /// `InvalidRequest` when the policy is invalid (every problem listed), when
    /// [`max_in_flight`](Self::max_in_flight) is 0, or when the default policy asks for HTTP/3
    /// (`http.version` `h3` or `h3-or-tcp`) and this build lacks the `http3` feature (a host's
    /// override asking for it fails its requests the same way).
    pub fn build(self) -> Result<Client, NetError> {
        let in_flight = in_flight::cap(self.max_in_flight)?;
        let documented = match self.document {
            Some(DocumentSource::Document(doc)) => Some(Arc::new(SnapshotResolver::new(doc)?)),
            Some(DocumentSource::File(path)) => Some(Arc::new(SnapshotResolver::new(
                PolicyDocument::from_path(&path)?,
            )?)),
            Some(DocumentSource::Watched(path, every)) => Some(watch::watched(&path, every)?),
            Some(DocumentSource::Loaded { resolver, watch }) => {
                if let Some(loaded) = watch {
                    watch::start(&resolver, loaded)?;
                }
                Some(resolver)
            }
            None => None,
        };
        let store = self.store.or_else(|| {
            let snapshot = documented.as_ref()?.snapshot();
            snapshot.document().store().cloned()
        });
        let resolver: Arc<dyn PolicyResolver> = match (self.resolver, documented, self.policy) {
            (Some(r), _, _) => r,
            (None, Some(r), _) => r,
            (None, None, policy) => {
                Arc::new(SnapshotResolver::from_policy(policy.unwrap_or_default())?)
            }
        };
        let rate_store = match (
            self.rate_store,
            store.as_ref().and_then(|s| s.redis_target()),
        ) {
            (Some(store), _) => store,
            (None, Some(target)) => redis_rate_store(target)?,
            (None, None) => Arc::new(crate::fleet::MemoryRateStore::new()),
        };
        // Without an observer the response body is not wrapped to count bytes nobody sees.
        let observed = !self.observers.is_empty();
        let mut observers = self.observers;
        let observer: Arc<dyn Observer> = if observers.len() > 1 {
            Arc::new(observers.into_iter().collect::<Fanout>())
        } else {
            observers.pop().unwrap_or_else(|| Arc::new(NoopObserver))
        };
        let transports = Transports::new(transport::Settings {
            dialer: self.dialer,
            observer: observer.clone(),
            extra_roots: self.extra_roots,
            pool_idle_timeout: self.pool_idle_timeout,
            pool_max_idle_per_host: self.pool_max_idle_per_host,
            idle_budget: crate::transport::pool::IdleBudget::new(
                self.pool_max_idle
                    .unwrap_or_else(crate::transport::pool::IdleBudget::default_max),
            ),
            pool_max_lifetime: self.pool_max_lifetime,
            pool_keep_alive: self.pool_keep_alive,
            http2_prior_knowledge: self.http2_prior_knowledge,
            max_response_headers: self.max_response_headers,
            max_response_head_bytes: self.max_response_head_bytes,
        });
        // Seed 004: names listed in `dns.prefetch` are resolved in the background as soon as
        // the client exists (when built inside a Tokio runtime).
        let default_policy = resolver.resolve(None, "");
        transport::check_http_version(&default_policy)?;
        if !default_policy.dns.prefetch.is_empty() {
            transports.warm_dns(&default_policy)?;
        }
        // Frozen base URLs survive a restart next to the DNS cache file, when there is one.
        let endpoints = match (&default_policy.dns.persist_file, self.frozen) {
            (Some(file), Some(read)) => {
                learn::Endpoints::restored(crate::dns::frozen_path(file), read)
            }
            (Some(file), None) => learn::Endpoints::persisted(crate::dns::frozen_path(file))?,
            (None, _) => learn::Endpoints::default(),
        };
        let events = observer.clone();
        let listener: crate::resilience::Listener = Box::new(move |key: &str, t: Transition| {
            events.on_event(&soulbase_net_core::NetEvent::BreakerTransition {
                key,
                from: t.from,
                to: t.to,
            });
        });
        // Key maps are bounded: the breaker by the policy's `cbreaker.max_keys` at its
        // default, budgets and limiter entries likewise; idle entries are evicted.
        let breakers = Breakers::new(
            default_policy.cbreaker.max_keys as usize,
            default_policy.cbreaker.idle_evict,
            Some(listener),
        );
        let budgets = Arc::new(RetryBudgets::new(10_000, Duration::from_secs(600)));
        let limiter = Arc::new(Limiter::new(10_000));
        let slo = Arc::new(SloControllers::new(10_000));
        let transports = Arc::new(transports);
        let gauges: Arc<dyn GaugeSource> = Arc::new(gauges::ClientGauges {
            limiter: limiter.clone(),
            budgets: budgets.clone(),
            transports: transports.clone(),
            slo: slo.clone(),
        });
        observer.on_gauges(&gauges);
        Ok(Client {
            inner: Arc::new(Inner {
                resolver,
                interceptors: chain::Chain::new(self.interceptors),
                takes: if observed {
                    observer.takes()
                } else {
                    Takes::NONE
                },
                observer,
                observed,
                user_agent: self.user_agent,
                decompress: self.decompress,
                transports,
                breakers,
                budgets,
                limiter,
                slo,
                gauges,
                latencies: learn::Latencies::default(),
                endpoints,
                global: crate::fleet::GlobalLimiter::new(rate_store),
                in_flight,
            }),
            ready: service::Readiness::default(),
        })
    }
}

/// Runs `work` (blocking file I/O) on Tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, NetError> + Send + 'static,
) -> Result<T, NetError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        NetError::new(soulbase_net_core::ErrorKind::Io)
            .with_message("the blocking pool stopped before the client's files were read")
            .with_source(e)
    })?
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder::new()
    }
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("interceptors", &self.interceptors.len())
            .field("dialer", &self.dialer)
            .field("extra_roots", &self.extra_roots.len())
            .field("pool_idle_timeout", &self.pool_idle_timeout)
            .field("pool_max_idle_per_host", &self.pool_max_idle_per_host)
            .field("pool_max_idle", &self.pool_max_idle)
            .field("pool_max_lifetime", &self.pool_max_lifetime)
            .field("pool_keep_alive", &self.pool_keep_alive)
            .field("http2_prior_knowledge", &self.http2_prior_knowledge)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

// === impl Client ===

impl Client {
    /// A [`ClientBuilder`].
    pub fn builder() -> ClientBuilder {
        ClientBuilder::new()
    }

    /// Sends `req` under its policy: the call of [`NetClient::send`], with its future
    /// unboxed. A caller holding the `Client` itself (not a `dyn NetClient`) awaits the call in
    /// place, without the allocation the object-safe trait makes for every call (the call's
    /// future is a few kilobytes: past the allocator's per-thread cache). Method syntax picks
    /// this one over the trait's wherever the type is known to be `Client`.
    ///
    /// ```
    /// # async fn run(client: soulbase_net_runtime::Client) -> Result<(), soulbase_net_core::NetError> {
    /// use soulbase_net_core::NetRequest;
    /// let res = client.send(NetRequest::get("https://api.example.com/v1/items")).await?;
    /// println!("{}", res.status);
    /// # Ok(()) }
    /// ```
    pub fn send(
        &self,
        req: NetRequest,
    ) -> impl Future<Output = Result<NetResponse, NetError>> + Send + '_ {
        self.inner.send(req, None)
    }

    /// The version of the policy in force: 1 for the first document, +1 for each one taken
    /// since (a reload of [`ClientBuilder::policy_file_watched`], an update of the
    /// [`SnapshotResolver`] given to [`ClientBuilder::policy_resolver`]).
    pub fn policy_version(&self) -> u64 {
        self.inner.resolver.version()
    }

    /// The client's gauges (limiter in flight and queued per host, AIMD windows, retry-budget
    /// tokens per key, connection pools, the SLO controller's factors), read on demand. The
    /// observer given to the builder already received this handle through
    /// [`Observer::on_gauges`]; this is for anyone else who wants it.
    pub fn gauge_source(&self) -> Arc<dyn GaugeSource> {
        self.inner.gauges.clone()
    }

    /// The number of connections this client has opened so far (all hosts).
    pub fn connections_opened(&self) -> u64 {
        self.inner.transports.connections_opened()
    }

    /// The number of transports (connection pools, one per distinct connection policy) the
    /// client keeps. A transport lives while a current policy or a call uses it: after a
    /// reload that changed connection settings, the old one closes its connections once its
    /// last call ends.
    pub fn live_transports(&self) -> usize {
        self.inner.transports.live().len()
    }

    /// Freezes the base URL (scheme, host, port) of `url` for `duration`: while frozen, calls
    /// to it go to the policy's alternative `endpoints.urls` (when all are frozen, to the one
    /// that thaws first). For an operator draining an origin; saved like failures' freezes
    /// when the client persists them (see `endpoints` in the policy reference).
    ///
    /// The frozen set is saved in the background, never on the caller's thread; a save that
    /// fails is logged (`warn`) and the freeze holds all the same.
    ///
    /// # Errors
    /// `InvalidRequest` for a `url` that does not parse.
    pub fn freeze_endpoint(&self, url: &str, duration: Duration) -> Result<(), NetError> {
        let url = parse_endpoint(url)?;
        self.inner
            .endpoints
            .freeze(&url, duration, tokio::time::Instant::now());
        self.save_endpoints();
        Ok(())
    }

    /// Thaws the base URL of `url` at once. Returns whether it was frozen.
    ///
    /// # Errors
    /// As [`freeze_endpoint`](Self::freeze_endpoint).
    pub fn unfreeze_endpoint(&self, url: &str) -> Result<bool, NetError> {
        let url = parse_endpoint(url)?;
        let was = self.inner.endpoints.unfreeze(&url);
        self.save_endpoints();
        Ok(was)
    }

    /// The frozen base URLs (`scheme://host:port` as origins serialise) and how long each
    /// stays frozen, sorted.
    pub fn frozen_endpoints(&self) -> Vec<(String, Duration)> {
        self.inner.endpoints.frozen(tokio::time::Instant::now())
    }

    /// Saves the frozen set, when the client persists it: handed to the persistence writer's
    /// thread (the caller may be an async worker, which must not wait for a disk), in order
    /// with the other saves; a failed save is logged.
    fn save_endpoints(&self) {
        if let Some(save) = self.inner.endpoints.save() {
            crate::dns::write_behind("the frozen endpoints file", save);
        }
    }

    /// The number of DNS resolvers (caches, with their background tasks) the client keeps:
    /// one per distinct DNS policy in use, plus the one warmed when the client was built.
    pub fn live_dns_resolvers(&self) -> usize {
        self.inner.transports.live_resolvers()
    }
}

/// The rate store of a `[store]` section naming Redis (a server, a cluster or a sentinel).
#[cfg(feature = "redis")]
fn redis_rate_store(
    target: &soulbase_net_policy::RedisTarget,
) -> Result<Arc<dyn crate::fleet::RateStore>, NetError> {
    Ok(Arc::new(
        <crate::fleet::RedisRateStore as crate::fleet::RedisStore>::from_target(target)?,
    ))
}

/// Without the `redis` feature, a `[store]` naming Redis cannot be honoured: said at build.
#[cfg(not(feature = "redis"))]
fn redis_rate_store(
    _target: &soulbase_net_policy::RedisTarget,
) -> Result<Arc<dyn crate::fleet::RateStore>, NetError> {
    Err(NetError::invalid_request(
        "the policy's [store] names Redis, but soulbase-net-runtime was built without its `redis` feature",
    ))
}

/// The URL whose base is frozen or thawed by hand.
fn parse_endpoint(url: &str) -> Result<url::Url, NetError> {
    url::Url::parse(url).map_err(|e| {
        NetError::invalid_request(format!("`{url}` is not an absolute URL")).with_source(e)
    })
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("resolver", &self.inner.resolver)
            .field("interceptors", &self.inner.interceptors.len())
            .finish_non_exhaustive()
    }
}

/// Written out rather than through `async_trait`: its `async` wrapper would hold the call's
/// future inside a second one and move it there on the first poll (a copy of several KB per
/// request); this boxes the call's future itself.
impl NetClient for Client {
    fn send<'life0, 'async_trait>(
        &'life0 self,
        req: NetRequest,
    ) -> Pin<Box<dyn Future<Output = Result<NetResponse, NetError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(self.inner.send(req, None))
    }
}
