//! The transport layer: from a request on the wire to a response body, over TCP (HTTP/1.1
//! and HTTP/2, [`pool`] over [`connect`]) and over QUIC (HTTP/3, `h3`, feature `http3`).
//!
//! What lives where, lowest first:
//! - [`dial`]: the one socket seam. Every socket the client opens — a TCP connection or the
//!   UDP socket QUIC sends from, and every QUIC peer before its first datagram — goes through
//!   the client's [`Dialer`], so a test dialer sees (and may refuse) every peer of both
//!   transports.
//! - [`body`]: the request body every transport sends and the response body every transport
//!   produces ([`body::WireBody`]); it knows no transport's internals.
//! - [`connect`]: the TCP connector (names, guard, happy eyeballs, proxy tunnel, TLS).
//! - [`pool`]: TCP connections per origin, HTTP/1.1 and HTTP/2.
//! - `h3`: QUIC endpoints and one HTTP/3 connection per origin.
//! - `route`: which of the two a request takes under `http.version` (Alt-Svc, the race);
//!   the only module that knows both.
//! - this module: one [`Transport`] per distinct connection policy.
//!
//! Why one transport per policy: TLS settings (pins, client certificates, versions), the
//! address guard, DNS and the per-host connection cap are properties of a connection, so
//! requests under different policies must not share pooled connections. Most clients have
//! one transport.

pub(crate) mod authority;
pub(crate) mod body;
pub(crate) mod connect;
mod dial;
#[cfg(feature = "http3")]
pub(crate) mod h3;
pub(crate) mod pool;
#[cfg(feature = "http3")]
mod route;

pub use self::dial::{DialFuture, Dialer, TcpDialer};

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Weak,
    },
    task::{ready, Context, Poll},
    time::Duration,
};

use foldhash::{HashMap, HashMapExt};

use parking_lot::Mutex;
use rustls::pki_types::CertificateDer;
use soulbase_net_core::{NetError, Observer};
use soulbase_net_policy::{AddressGuard, NetPolicy};

use hyper_util::client::proxy::matcher::Matcher;

use self::{
    connect::{proxy_matcher, Connector, ConnectorConfig},
    pool::{Pool, PoolConfig},
};
use crate::dns::DnsResolver;

/// What every transport of a client shares.
pub(crate) struct Settings {
    pub(crate) dialer: Arc<dyn Dialer>,
    pub(crate) observer: Arc<dyn Observer>,
    pub(crate) extra_roots: Vec<CertificateDer<'static>>,
    pub(crate) pool_idle_timeout: Duration,
    pub(crate) pool_max_idle_per_host: usize,
    /// The client's budget of kept connections, shared by every transport's pool.
    pub(crate) idle_budget: Arc<crate::transport::pool::IdleBudget>,
    pub(crate) pool_max_lifetime: Option<Duration>,
    /// Pings pooled HTTP/2 and HTTP/3 connections at this interval (`None`: off).
    pub(crate) pool_keep_alive: Option<Duration>,
    pub(crate) http2_prior_knowledge: bool,
    pub(crate) max_response_headers: usize,
    pub(crate) max_response_head_bytes: usize,
}

/// The connection pool of one connection policy.
pub(crate) struct Transport {
    pub(crate) pool: Pool,
    /// The proxy rules, to add proxy credentials to absolute-form requests; `None` when no
    /// request goes in absolute form (no proxy, or names resolved locally: every proxied
    /// request then goes through a CONNECT tunnel, whose credentials the CONNECT carried).
    pub(crate) proxy: Option<Arc<Matcher>>,
    /// HTTP/3 beside the pool, choosing per request under `http.version`.
    #[cfg(feature = "http3")]
    route: route::Route,
}

impl Transport {
    /// Sends `req` on a connection of this transport: over TCP by the pool, or over HTTP/3
    /// when the policy's `http.version` says so (feature `http3`). Returns the response and
    /// how long opening a connection took (zero when one was reused).
    ///
    /// Not an `async fn`: the future is the pool's own on the TCP ways (see [`Sending`]), so
    /// an attempt's future does not carry the request a second time.
    pub(crate) fn send(
        &self,
        req: http::Request<body::ReqBody>,
    ) -> Sending<'_, impl Future<Output = Sent> + Send + '_> {
        #[cfg(feature = "http3")]
        match self.route.way(&req) {
            // Boxed: the routing holds QUIC's handshake and streams, and every TCP request
            // would otherwise carry their size in its future. Under `h3` the future is the
            // HTTP/3 exchange alone: the routing's, with its TCP ways and races, is several
            // times its size, and boxing it copies all of it.
            route::Way::H3 => {
                return Sending::Routed {
                    routed: Box::pin(self.route.h3_only(req)),
                };
            }
            route::Way::Route => {
                return Sending::Routed {
                    routed: Box::pin(self.route.route(&self.pool, req)),
                };
            }
            route::Way::TcpLearning => {
                let origin = req.uri().authority().cloned();
                return Sending::Learning {
                    pool: self.pool.send(req),
                    h3: &self.route,
                    origin,
                };
            }
            route::Way::Tcp => {}
        }
        Sending::Tcp {
            pool: self.pool.send(req),
        }
    }
}

/// What a transport's send ends with: the response and how long opening a connection took.
pub(crate) type Sent = Result<(http::Response<pool::PoolBody>, Duration), NetError>;

/// The HTTP/3 side a response is learnt from (nothing without the `http3` feature).
#[cfg(feature = "http3")]
type H3Side<'a> = &'a route::Route;
#[cfg(not(feature = "http3"))]
type H3Side<'a> = std::marker::PhantomData<&'a ()>;

pin_project_lite::pin_project! {
    /// The future of [`Transport::send`]: the pool's future itself on the TCP ways (no box,
    /// no copy of the request beside it), the HTTP/3 routing boxed.
    #[project = SendingProj]
    #[cfg_attr(not(feature = "http3"), allow(dead_code, reason = "HTTP/3 ways need `http3`"))]
    pub(crate) enum Sending<'a, F> {
        /// Over the TCP pool.
        Tcp { #[pin] pool: F },
        /// Over the TCP pool, then what the response's `Alt-Svc` says is remembered for its
        /// origin (`http.version = "auto"` with nothing advertised yet).
        Learning {
            #[pin]
            pool: F,
            h3: H3Side<'a>,
            origin: Option<http::uri::Authority>,
        },
        /// Through the HTTP/3 routing.
        Routed { routed: Pin<Box<dyn Future<Output = Sent> + Send + 'a>> },
    }
}

impl<F: Future<Output = Sent>> Future for Sending<'_, F> {
    type Output = Sent;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Sent> {
        match self.project() {
            SendingProj::Tcp { pool } => pool.poll(cx),
            SendingProj::Learning { pool, h3, origin } => {
                let sent = ready!(pool.poll(cx));
                #[cfg(feature = "http3")]
                if let Ok((res, _)) = &sent {
                    let origin = origin.as_ref().map_or("", |a| a.as_str());
                    h3.learn(origin, res);
                }
                #[cfg(not(feature = "http3"))]
                let _ = (h3, origin);
                Poll::Ready(sent)
            }
            SendingProj::Routed { routed } => routed.as_mut().poll(cx),
        }
    }
}

/// A policy a resolver handed out (held weakly) and its transport.
type PolicyEntry = (Weak<NetPolicy>, Arc<Transport>);

/// The transports of a client, found by policy.
///
/// Lifetimes: a transport lives while a live policy uses it (the entries of `by_policy`
/// hold it) or a call is using it. When a reload replaces the policies and their last calls
/// end, their entries are pruned, the transport is dropped, its pool with it (idle
/// connections close, its reaper stops), and a DNS resolver no transport uses any more goes
/// too (its background tasks end with it). A reload that changes nothing a connection
/// depends on finds the same transport by its connection key.
pub(crate) struct Transports {
    settings: Settings,
    opened: Arc<AtomicU64>,
    /// Fast path: the policy `Arc` a resolver handed out → its transport.
    by_policy: Mutex<HashMap<usize, PolicyEntry>>,
    /// Slow path: the connection-relevant parts of a policy, serialised → its transport, while
    /// anything still holds it.
    by_key: Mutex<HashMap<String, Weak<Transport>>>,
    /// One resolver (and DNS cache) per distinct DNS policy, shared by transports; kept while
    /// a transport uses it.
    resolvers: Mutex<HashMap<String, DnsResolver>>,
    /// The resolver warmed when the client was built (its prefetched names), kept for the
    /// client's life.
    warmed: Mutex<Option<DnsResolver>>,
}

impl Transports {
    pub(crate) fn new(settings: Settings) -> Self {
        Transports {
            settings,
            opened: Arc::new(AtomicU64::new(0)),
            by_policy: Mutex::new(HashMap::new()),
            by_key: Mutex::new(HashMap::new()),
            resolvers: Mutex::new(HashMap::new()),
            warmed: Mutex::new(None),
        }
    }

    pub(crate) fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Reports every transport's pool gauges (pruning first: a scrape is a good moment).
    pub(crate) fn read_gauges(&self, visit: &mut dyn FnMut(soulbase_net_core::GaugeReading<'_>)) {
        for transport in self.live() {
            transport.pool.read_gauges(visit);
            #[cfg(feature = "http3")]
            transport.route.h3().read_gauges(visit);
        }
    }

    /// The transports in use, after pruning those of policies that are gone.
    pub(crate) fn live(&self) -> Vec<Arc<Transport>> {
        self.prune();
        self.by_key
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// How many DNS resolvers are kept, after pruning.
    pub(crate) fn live_resolvers(&self) -> usize {
        self.prune();
        self.resolvers.lock().len()
    }

    /// Forgets policies no one holds any more, then transports and resolvers nothing uses.
    fn prune(&self) {
        // Dropped outside the locks: dropping a pool closes its connections.
        let dead: Vec<PolicyEntry> = {
            let mut by_policy = self.by_policy.lock();
            let dead: Vec<usize> = by_policy
                .iter()
                .filter(|(_, (weak, _))| weak.strong_count() == 0)
                .map(|(ptr, _)| *ptr)
                .collect();
            dead.iter()
                .filter_map(|ptr| by_policy.remove(ptr))
                .collect()
        };
        drop(dead);
        self.by_key.lock().retain(|_, t| t.strong_count() > 0);
        self.resolvers.lock().retain(|_, r| r.in_use());
    }

    /// Called when a call under `policy` ends: when it was the last holder of the policy (a
    /// reload replaced it), the policy's transport is let go at once instead of at the next
    /// prune.
    pub(crate) fn release(&self, policy: Arc<NetPolicy>) {
        if Arc::strong_count(&policy) == 1 {
            drop(policy);
            self.prune();
        }
    }

    /// The transport for `policy`, built on first use.
    pub(crate) fn get(&self, policy: &Arc<NetPolicy>) -> Result<Arc<Transport>, NetError> {
        let ptr = Arc::as_ptr(policy) as usize;
        if let Some((weak, t)) = self.by_policy.lock().get(&ptr) {
            // The same allocation, so the same policy: a weak reference keeps its memory
            // from being reused, so no other policy can be at this address. (No upgrade:
            // that would write to the policy's shared counts on every request.)
            if std::ptr::eq(weak.as_ptr(), Arc::as_ptr(policy)) {
                return Ok(t.clone());
            }
        }
        // A policy not seen before: often the first call after a reload, the moment the
        // policies it replaced may have gone.
        self.prune();
        let key = connection_key(policy)?;
        let transport = {
            let mut by_key = self.by_key.lock();
            match by_key.get(&key).and_then(Weak::upgrade) {
                Some(t) => t,
                None => {
                    let t = Arc::new(self.build(policy)?);
                    by_key.insert(key, Arc::downgrade(&t));
                    t
                }
            }
        };
        self.by_policy
            .lock()
            .insert(ptr, (Arc::downgrade(policy), transport.clone()));
        Ok(transport)
    }

    /// Creates the resolver of `policy` now, so that its prefetch list is resolved before the
    /// first request.
    pub(crate) fn warm_dns(&self, policy: &NetPolicy) -> Result<(), NetError> {
        *self.warmed.lock() = Some(self.resolver(policy)?);
        Ok(())
    }

    /// The resolver for `policy.dns`, created on first use.
    fn resolver(&self, policy: &NetPolicy) -> Result<DnsResolver, NetError> {
        let key = serde_json::to_string(&policy.dns).map_err(|e| {
            NetError::invalid_request("dns policy could not be keyed").with_source(e)
        })?;
        let mut resolvers = self.resolvers.lock();
        if let Some(r) = resolvers.get(&key) {
            return Ok(r.clone());
        }
        let r = DnsResolver::new(&policy.dns)?;
        resolvers.insert(key, r.clone());
        Ok(r)
    }

    fn build(&self, policy: &NetPolicy) -> Result<Transport, NetError> {
        check_http_version(policy)?;
        let s = &self.settings;
        let guard = AddressGuard::new(&policy.security).map_err(|e| {
            NetError::invalid_request(format!("invalid security policy: {e}")).with_source(e)
        })?;
        let proxy = policy.proxy.as_ref().map(|p| Arc::new(proxy_matcher(p)));
        let resolves_locally = policy
            .proxy
            .as_ref()
            .is_some_and(|p| p.resolve == soulbase_net_policy::ProxyResolve::Local);
        let connector = Connector::new(ConnectorConfig {
            guard,
            tls: crate::tls::client_config(&policy.tls, &s.extra_roots)?,
            proxy_tls: match &policy.proxy {
                Some(_) => Some(crate::tls::proxy_client_config(
                    &policy.tls,
                    &s.extra_roots,
                )?),
                None => None,
            },
            dialer: s.dialer.clone(),
            resolver: Arc::new(self.resolver(policy)?),
            observer: s.observer.clone(),
            connect_timeout: policy.timeout.connect,
            happy_eyeballs_delay: policy
                .dns
                .happy_eyeballs
                .then_some(policy.dns.happy_eyeballs_delay),
            opened: self.opened.clone(),
            proxy: proxy.clone(),
            proxy_resolves_locally: resolves_locally,
            freeze_addresses: (policy.endpoints.freeze && policy.endpoints.freeze_addresses)
                .then_some(policy.endpoints.frozen_duration),
        });
        // The policy's pool settings, the builder's where it sets none.
        let pool = &policy.pool;
        let idle_timeout = pool.idle_timeout.unwrap_or(s.pool_idle_timeout);
        let keep_alive = match pool.keep_alive {
            Some(every) => (!every.is_zero()).then_some(every),
            None => s.pool_keep_alive,
        };
        let max_lifetime = match pool.max_lifetime {
            Some(max) => (!max.is_zero()).then_some(max),
            None => s.pool_max_lifetime,
        };
        let max_idle_per_origin = pool
            .max_idle_per_host
            .map_or(s.pool_max_idle_per_host, |n| n as usize);
        let http2_only = pool
            .http2_prior_knowledge
            .unwrap_or(s.http2_prior_knowledge);
        #[cfg(feature = "http3")]
        let h3 = h3::H3Pool::new(
            connector.clone(),
            policy,
            &s.extra_roots,
            h3::Limits {
                idle: idle_timeout,
                keep_alive,
                max_head_bytes: s.max_response_head_bytes,
            },
        )?;
        #[cfg(feature = "http3")]
        let connector_for_route = connector.clone();
        let pool = Pool::new(
            connector,
            PoolConfig {
                idle_timeout,
                max_idle_per_origin,
                max_lifetime,
                keep_alive,
                per_origin_cap: policy.limits.per_host_concurrency as usize,
                http2_only,
                h2_alpn: policy.tls.http2,
                // hyper's own limit is the same 100 headers, parsed into an array on the
                // stack; a limit set explicitly, even to 100, makes it fill a vector for every
                // response.
                max_headers: (s.max_response_headers != HYPER_MAX_HEADERS)
                    .then_some(s.max_response_headers),
                max_head_bytes: s.max_response_head_bytes,
            },
            s.idle_budget.clone(),
        );
        let absolute_form = !resolves_locally;
        Ok(Transport {
            pool,
            proxy: proxy.filter(|_| absolute_form),
            #[cfg(feature = "http3")]
            route: route::Route::new(h3, connector_for_route, policy),
        })
    }
}

impl fmt::Debug for Transports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transports")
            .field("transports", &self.by_key.lock().len())
            .field("resolvers", &self.resolvers.lock().len())
            .field("opened", &self.connections_opened())
            .finish()
    }
}

/// The most response headers hyper parses when no limit is set (`DEFAULT_MAX_HEADERS` in
/// its h1 role); also the client's default `max_response_headers`.
pub(crate) const HYPER_MAX_HEADERS: usize = 100;

/// Refuses a policy that asks for HTTP/3 (`http.version` `h3` or `h3-or-tcp`) from a runtime
/// built without the `http3` feature: sending it over TCP instead would silently ignore the
/// policy.
pub(crate) fn check_http_version(policy: &NetPolicy) -> Result<(), NetError> {
    if policy.http.wants_h3() && !cfg!(feature = "http3") {
        return Err(NetError::invalid_request(format!(
            "http.version = \"{}\" needs HTTP/3, and this build of soulbase-net-runtime lacks its `http3` feature",
            policy.http.version.as_str()
        )));
    }
    Ok(())
}

/// The parts of a policy that shape a connection, as one string.
fn connection_key(policy: &NetPolicy) -> Result<String, NetError> {
    serde_json::to_string(&(
        &policy.tls,
        &policy.security,
        &policy.dns,
        &policy.proxy,
        &policy.http,
        &policy.pool,
        policy.limits.per_host_concurrency,
        policy.timeout.connect,
    ))
    .map_err(|e| NetError::invalid_request("policy could not be keyed").with_source(e))
}
