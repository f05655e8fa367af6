//! The connector: from a URI to a connected, guarded, TLS-wrapped socket.
//!
//! One connect, in order: the host allow-list; name resolution (IP literals included, which
//! hyper-util's own resolver never sees); the address guard on every address; the per-host
//! connection cap; happy eyeballs through the [`Dialer`]; TLS. The whole of it is bounded by
//! the connect timeout. A denied address is never handed to the dialer.

mod dial;
mod io;
mod proxy;

use std::{
    fmt,
    future::Future,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{atomic::Ordering, Arc},
    task::{Context, Poll},
    time::Duration,
};

use foldhash::{HashMap, HashMapExt};

use http::Uri;
use hyper_util::client::{
    legacy::connect::{Connected, Connection},
    proxy::matcher::{Intercept, Matcher},
};
use parking_lot::Mutex;
use soulbase_net_core::{DnsSource, ErrorKind, NetError, NetEvent, Observer, Phase};
use soulbase_net_policy::AddressGuard;
use tokio::{sync::Semaphore, time::Instant};

pub use self::dial::{DialFuture, Dialer, TcpDialer};
pub(crate) use self::io::Conn;
use self::io::MaybeTls;
pub(crate) use self::proxy::matcher as proxy_matcher;

/// Resolves host names for the connector.
#[async_trait::async_trait]
pub(crate) trait Resolve: Send + Sync + fmt::Debug {
    /// The addresses of `host` and where they came from.
    async fn resolve(&self, host: &str) -> Result<(Arc<[IpAddr]>, DnsSource), NetError>;
}

#[async_trait::async_trait]
impl Resolve for crate::dns::DnsResolver {
    async fn resolve(&self, host: &str) -> Result<(Arc<[IpAddr]>, DnsSource), NetError> {
        let answer = crate::dns::DnsResolver::resolve(self, host).await?;
        Ok((answer.addrs, answer.source))
    }
}

/// What a transport's connector needs; one per distinct connection policy.
#[derive(Clone)]
pub(crate) struct ConnectorConfig {
    pub(crate) guard: AddressGuard,
    pub(crate) tls: Arc<rustls::ClientConfig>,
    pub(crate) dialer: Arc<dyn Dialer>,
    pub(crate) resolver: Arc<dyn Resolve>,
    pub(crate) observer: Arc<dyn Observer>,
    pub(crate) connect_timeout: Duration,
    pub(crate) happy_eyeballs_delay: Duration,
    pub(crate) per_host_cap: usize,
    /// How long an address that refused a connection is skipped (`endpoints.freeze`);
    /// `None` when the policy does not freeze.
    pub(crate) freeze_addresses: Option<Duration>,
    /// Which requests go through a proxy; `None` when the policy has no proxy.
    pub(crate) proxy: Option<Arc<Matcher>>,
    /// Counts connections opened.
    pub(crate) opened: Arc<std::sync::atomic::AtomicU64>,
}

/// Hears how long opening a connection took, when the connection was opened for it.
pub(crate) trait ConnectWitness: Send + Sync {
    /// A connection was opened for the attempt in `connect` (DNS, TCP, proxy tunnel, TLS).
    fn opened(&self, connect: Duration);
}

tokio::task_local! {
    /// The attempt whose task is polling the connector. hyper-util opens a connection inside
    /// the request's own future, so a connection opened there was opened for that attempt;
    /// one whose request took a pooled connection first finishes in a background task, where
    /// no witness is set, and reports to nobody (that attempt's connect time is zero).
    ///
    /// Why not `Connected::extra`: hyper-util copies the extra into every response's
    /// extensions, which costs an extension map (three allocations) per response.
    pub(crate) static CONNECT_WITNESS: Arc<dyn ConnectWitness>;
}

/// A `tower_service::Service<Uri>` for hyper-util's pooled client.
#[derive(Clone)]
pub(crate) struct Connector {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: ConnectorConfig,
    caps: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// Addresses that failed to connect, skipped while frozen (seed 004).
    frozen: crate::resilience::Freezer<SocketAddr>,
}

/// Idle per-host cap entries are pruned once the map grows past this many hosts.
const MAX_CAP_ENTRIES: usize = 4096;

// === impl Connector ===

impl Connector {
    pub(crate) fn new(cfg: ConnectorConfig) -> Self {
        Connector {
            inner: Arc::new(Inner {
                cfg,
                caps: Mutex::new(HashMap::new()),
                frozen: crate::resilience::Freezer::new(MAX_CAP_ENTRIES),
            }),
        }
    }
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("connect_timeout", &self.inner.cfg.connect_timeout)
            .field("per_host_cap", &self.inner.cfg.per_host_cap)
            .finish_non_exhaustive()
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = Conn;
    type Error = NetError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, NetError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), NetError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            let limit = inner.cfg.connect_timeout;
            match tokio::time::timeout(limit, inner.connect(uri)).await {
                Ok(res) => res,
                Err(_) => Err(NetError::timeout(Phase::Connect)
                    .with_message(format!("no connection within {limit:?}"))),
            }
        })
    }
}

// === impl Inner ===

impl Inner {
    async fn connect(&self, uri: Uri) -> Result<Conn, NetError> {
        let started = Instant::now();
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            other => {
                return Err(NetError::invalid_request(format!(
                    "scheme {other:?} is not http or https"
                )))
            }
        };
        let host = uri
            .host()
            .ok_or_else(|| NetError::invalid_request("url has no host"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        self.cfg.guard.check_host(host)?;
        if let Some(intercept) = self.cfg.proxy.as_ref().and_then(|m| m.intercept(&uri)) {
            return self
                .connect_via_proxy(&intercept, https, host, port, started)
                .await;
        }

        let addrs = self.addresses(host).await?;
        let allowed = self.cfg.guard.filter_addrs(host, &addrs)?;
        let targets: Vec<SocketAddr> = allowed
            .iter()
            .map(|ip| SocketAddr::new(*ip, port))
            .collect();
        let targets = match self.cfg.freeze_addresses {
            Some(_) => self.frozen.choose(&targets, Instant::now()),
            None => targets,
        };

        let permit = self.permit(host, port).await?;
        let mut failed = Vec::new();
        let dialled = dial::happy_eyeballs(
            &self.cfg.dialer,
            &targets,
            self.cfg.happy_eyeballs_delay,
            &mut failed,
        )
        .await;
        if let Some(duration) = self.cfg.freeze_addresses {
            for addr in &failed {
                self.frozen.freeze(addr, duration, Instant::now());
            }
        }
        let (tcp, remote) = dialled.map_err(|e| {
            NetError::new(ErrorKind::Connect)
                .with_message(format!("could not connect to {host}:{port}"))
                .with_source(e)
        })?;
        let stream = self.secure(tcp, https, host).await?;
        Ok(self.finish(stream, remote, started, permit, false))
    }

    /// Connects through the proxy chosen for this target: a CONNECT tunnel for `https`, a
    /// plain connection to the proxy (absolute-form requests) for `http`.
    async fn connect_via_proxy(
        &self,
        intercept: &Intercept,
        https: bool,
        host: &str,
        port: u16,
        started: Instant,
    ) -> Result<Conn, NetError> {
        // The proxy resolves names; literal targets are still checked here.
        if let Ok(ip) = host.parse::<IpAddr>() {
            self.cfg.guard.check_addr(host, ip)?;
        }
        let proxy_uri = intercept.uri();
        if proxy_uri.scheme_str() != Some("http") {
            return Err(NetError::invalid_request(format!(
                "proxy {proxy_uri} is not an http:// proxy; only http proxies are supported"
            )));
        }
        let proxy_host = proxy_uri
            .host()
            .ok_or_else(|| NetError::invalid_request("the proxy url has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']');
        let proxy_port = proxy_uri.port_u16().unwrap_or(80);
        let addrs = self.addresses(proxy_host).await?;
        let targets: Vec<SocketAddr> = addrs
            .iter()
            .map(|ip| SocketAddr::new(*ip, proxy_port))
            .collect();
        let permit = self.permit(host, port).await?;
        let (mut tcp, remote) = dial::happy_eyeballs(
            &self.cfg.dialer,
            &targets,
            self.cfg.happy_eyeballs_delay,
            &mut Vec::new(),
        )
        .await
        .map_err(|e| {
            NetError::new(ErrorKind::Proxy)
                .with_message(format!(
                    "could not connect to the proxy {proxy_host}:{proxy_port}"
                ))
                .with_source(e)
        })?;
        if !https {
            return Ok(self.finish(MaybeTls::Plain(tcp), remote, started, permit, true));
        }
        proxy::tunnel(&mut tcp, host, port, intercept.basic_auth()).await?;
        let stream = self.secure(tcp, true, host).await?;
        Ok(self.finish(stream, remote, started, permit, false))
    }

    /// TLS on top of `tcp` for `https`, nothing for `http`.
    async fn secure(
        &self,
        tcp: tokio::net::TcpStream,
        https: bool,
        host: &str,
    ) -> Result<MaybeTls, NetError> {
        if !https {
            return Ok(MaybeTls::Plain(tcp));
        }
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| {
            NetError::invalid_request(format!("`{host}` is not a valid TLS server name"))
                .with_source(e)
        })?;
        let tls = tokio_rustls::TlsConnector::from(self.cfg.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| crate::classify::tls_handshake_error(e, host))?;
        Ok(MaybeTls::Tls(Box::new(tls)))
    }

    fn finish(
        &self,
        stream: MaybeTls,
        remote: SocketAddr,
        started: Instant,
        permit: tokio::sync::OwnedSemaphorePermit,
        proxied: bool,
    ) -> Conn {
        let connect = started.elapsed();
        tracing::trace!(%remote, ?connect, proxied, "connected");
        // Outside an attempt's task (a background connect) there is no witness: ignored.
        let _ = CONNECT_WITNESS.try_with(|witness| witness.opened(connect));
        self.cfg.opened.fetch_add(1, Ordering::Relaxed);
        Conn::new(stream, permit, proxied)
    }

    /// The addresses to try for `host`: an IP literal as it is, else the resolver's answer.
    async fn addresses(&self, host: &str) -> Result<Arc<[IpAddr]>, NetError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Arc::from([ip]));
        }
        let started = Instant::now();
        let (addrs, source) = self.cfg.resolver.resolve(host).await?;
        self.cfg.observer.on_event(&NetEvent::DnsResolved {
            host,
            addrs: &addrs,
            source,
            elapsed: started.elapsed(),
        });
        Ok(addrs)
    }

    /// A slot under the per-host connection cap, held for the connection's life.
    async fn permit(
        &self,
        host: &str,
        port: u16,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, NetError> {
        let cap = self.cfg.per_host_cap.max(1);
        let semaphore = {
            let mut caps = self.caps.lock();
            if caps.len() >= MAX_CAP_ENTRIES {
                caps.retain(|_, s| s.available_permits() < cap);
            }
            caps.entry(format!("{host}:{port}"))
                .or_insert_with(|| Arc::new(Semaphore::new(cap)))
                .clone()
        };
        semaphore.acquire_owned().await.map_err(|e| {
            NetError::new(ErrorKind::Connect)
                .with_message("connection cap closed")
                .with_source(e)
        })
    }
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        let connected = Connected::new().proxy(self.is_proxied());
        if self.is_h2() {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}
