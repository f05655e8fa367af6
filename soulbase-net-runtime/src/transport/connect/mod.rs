//! The connector: from a URI to a connected, guarded, TLS-wrapped socket.
//!
//! One connect, in order: the host allow-list; name resolution (IP literals included); the
//! address guard on every address; happy eyeballs through the [`Dialer`]; TLS. The whole of
//! it is bounded by the connect timeout. A denied address is never handed to the dialer. The
//! pool ([`crate::transport::pool`]) decides when to connect and holds the per-origin connection cap; a
//! connection keeps its slot under the cap for its life.

mod io;
mod proxy;

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use http::Uri;
use hyper_util::client::proxy::matcher::{Intercept, Matcher};
use soulbase_net_core::{DnsSource, ErrorKind, NetError, NetEvent, Observer, Phase};
use soulbase_net_policy::AddressGuard;
use tokio::{sync::OwnedSemaphorePermit, time::Instant};

pub(crate) use self::io::Conn;
use self::io::MaybeTls;
pub(crate) use self::proxy::matcher as proxy_matcher;
pub(crate) use super::dial::Dialer;

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
    /// TLS to an `https://` proxy (see [`crate::tls::proxy_client_config`]); `None` when the
    /// policy has no proxy.
    pub(crate) proxy_tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) dialer: Arc<dyn Dialer>,
    pub(crate) resolver: Arc<dyn Resolve>,
    pub(crate) observer: Arc<dyn Observer>,
    pub(crate) connect_timeout: Duration,
    pub(crate) happy_eyeballs_delay: Option<Duration>,
    /// How long an address that refused a connection is skipped (`endpoints.freeze`);
    /// `None` when the policy does not freeze.
    pub(crate) freeze_addresses: Option<Duration>,
    /// Which requests go through a proxy; `None` when the policy has no proxy.
    pub(crate) proxy: Option<Arc<Matcher>>,
    /// `proxy.resolve = "local"`: names are resolved and guarded here, and the proxy is sent
    /// the checked address.
    pub(crate) proxy_resolves_locally: bool,
    /// Counts connections opened.
    pub(crate) opened: Arc<std::sync::atomic::AtomicU64>,
}

/// Opens connections for the pool (see [`crate::transport::pool`]).
#[derive(Clone)]
pub(crate) struct Connector {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: ConnectorConfig,
    /// Addresses that failed to connect, skipped while frozen (seed 004).
    frozen: crate::resilience::Freezer<SocketAddr>,
}

/// The most addresses remembered as frozen.
const MAX_FROZEN: usize = 4096;

// === impl Connector ===

impl Connector {
    pub(crate) fn new(cfg: ConnectorConfig) -> Self {
        Connector {
            inner: Arc::new(Inner {
                cfg,
                frozen: crate::resilience::Freezer::new(MAX_FROZEN),
            }),
        }
    }
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("connect_timeout", &self.inner.cfg.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Opens a connection for `uri`, holding `permit` (its slot under the per-origin
    /// connection cap) for the connection's life; bounded by the connect timeout (DNS, TCP,
    /// proxy tunnel, TLS).
    pub(crate) async fn connect(
        &self,
        uri: &Uri,
        permit: OwnedSemaphorePermit,
    ) -> Result<Conn, NetError> {
        let limit = self.inner.cfg.connect_timeout;
        match tokio::time::timeout(limit, self.inner.connect(uri, permit)).await {
            Ok(conn) => conn,
            Err(_) => Err(NetError::timeout(Phase::Connect)
                .with_message(format!("no connection within {limit:?}"))),
        }
    }
}

impl Connector {
    /// The addresses `host` (a name) resolves to now, for the pool to tell whether a pooled
    /// connection's peer is still among them. The resolver's cache answers until the
    /// record's TTL runs out, then one lookup is made (singleflight); no event is reported
    /// (this is upkeep, not a request's lookup).
    pub(crate) async fn answer(&self, host: &str) -> Result<Arc<[IpAddr]>, NetError> {
        let (addrs, _) = self.inner.cfg.resolver.resolve(host).await?;
        Ok(addrs)
    }

    /// The client's observer, for the pool's own events.
    pub(crate) fn observer(&self) -> &Arc<dyn Observer> {
        &self.inner.cfg.observer
    }
}

#[cfg(feature = "http3")]
impl Connector {
    /// The UDP peers (on `port`) an HTTP/3 connection to `uri`'s host may use, checked as a TCP connection's
    /// are (the host allow-list, resolution, the address guard on every address, frozen
    /// addresses skipped), before any packet is sent; and the host, for TLS.
    ///
    /// # Errors
    /// `Blocked` for a denied host or address; `InvalidRequest` for an `http` URL (HTTP/3 is
    /// `https` only) or one a proxy would carry (QUIC cannot go through an HTTP proxy, and
    /// going around it would ignore the policy); `Dns` when the name does not resolve.
    pub(crate) async fn quic_targets(
        &self,
        uri: &Uri,
        port: u16,
    ) -> Result<(String, Vec<SocketAddr>), NetError> {
        let inner = &self.inner;
        if !is_https(uri)? {
            return Err(NetError::invalid_request("http/3 is for https urls only"));
        }
        // The port is the advertised one (`port`), not the URL's.
        let (host, _) = super::authority::host_and_port(uri, true)?;
        inner.cfg.guard.check_host(host)?;
        if self.proxied(uri) {
            return Err(NetError::invalid_request(format!(
                "{host} goes through a proxy, which http/3 cannot use"
            )));
        }
        let targets = inner.direct_targets(host, port).await?;
        Ok((host.to_owned(), targets))
    }

    /// The client's dialer, which QUIC's sockets and peers go through too.
    pub(crate) fn dialer(&self) -> &Arc<dyn Dialer> {
        &self.inner.cfg.dialer
    }

    /// The policy's connect timeout (for QUIC: the handshake).
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.inner.cfg.connect_timeout
    }

    /// Counts a connection opened (the client's `connections_opened`).
    pub(crate) fn count_opened(&self) {
        self.inner.cfg.opened.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a proxy carries requests to `uri` (then HTTP/3 is not tried for it).
    pub(crate) fn proxied(&self, uri: &Uri) -> bool {
        self.inner
            .cfg
            .proxy
            .as_ref()
            .is_some_and(|m| m.intercept(uri).is_some())
    }
}

// === impl Inner ===

impl Inner {
    async fn connect(&self, uri: &Uri, permit: OwnedSemaphorePermit) -> Result<Conn, NetError> {
        let https = is_https(uri)?;
        let (host, port) = super::authority::host_and_port(uri, https)?;
        self.cfg.guard.check_host(host)?;
        if let Some(intercept) = self.cfg.proxy.as_ref().and_then(|m| m.intercept(uri)) {
            return self
                .connect_via_proxy(&intercept, https, host, port, permit)
                .await;
        }

        let targets = self.direct_targets(host, port).await?;
        let mut failed = Vec::new();
        let dialled = super::dial::happy_eyeballs(
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
        let conn = self.finish(stream, remote, permit, false);
        // A connection to a name follows the name's answer (see `Pool`); a literal has none.
        Ok(if host.parse::<IpAddr>().is_err() {
            conn.following(remote.ip())
        } else {
            conn
        })
    }

    /// The addresses a direct connection to `host:port` may dial: name resolution (an IP
    /// literal as it is), the address guard on every address, frozen addresses skipped.
    async fn direct_targets(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, NetError> {
        let addrs = self.addresses(host).await?;
        let allowed = self.cfg.guard.filter_addrs(host, &addrs)?;
        let targets: Vec<SocketAddr> = allowed
            .iter()
            .map(|ip| SocketAddr::new(*ip, port))
            .collect();
        Ok(match self.cfg.freeze_addresses {
            Some(_) => self.frozen.choose(&targets, Instant::now()),
            None => targets,
        })
    }

    /// Connects through the proxy chosen for this target: a CONNECT tunnel for `https`, a
    /// plain connection to the proxy (absolute-form requests) for `http`.
    async fn connect_via_proxy(
        &self,
        intercept: &Intercept,
        https: bool,
        host: &str,
        port: u16,
        permit: OwnedSemaphorePermit,
    ) -> Result<Conn, NetError> {
        // Literal targets are always checked here. A name is the proxy's to resolve, unless
        // the policy resolves locally: then it is resolved and guarded here, and the proxy
        // is asked for the checked address, through a tunnel for `http` targets too.
        let target: Option<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => {
                self.cfg.guard.check_addr(host, ip)?;
                None
            }
            Err(_) if self.cfg.proxy_resolves_locally => {
                let addrs = self.addresses(host).await?;
                let allowed = self.cfg.guard.filter_addrs(host, &addrs)?;
                let first = allowed.first().copied().ok_or_else(|| {
                    NetError::new(ErrorKind::Dns).with_message(format!("{host} has no address"))
                })?;
                Some(first)
            }
            Err(_) => None,
        };
        let tunnel_to = target.map(|ip| ip.to_string());
        let tunnel_to = tunnel_to.as_deref().unwrap_or(host);
        let proxy_uri = intercept.uri();
        let proxy_tls = match proxy_uri.scheme_str() {
            Some("http") => None,
            Some("https") => Some(self.cfg.proxy_tls.clone().ok_or_else(|| {
                NetError::invalid_request("no tls configuration for an https:// proxy")
            })?),
            _ => {
                return Err(NetError::invalid_request(format!(
                    "proxy {proxy_uri} is not an http:// or https:// proxy"
                )))
            }
        };
        let (proxy_host, proxy_port) =
            super::authority::host_and_port(proxy_uri, proxy_tls.is_some())
                .map_err(|_| NetError::invalid_request("the proxy url has no host"))?;
        let addrs = self.addresses(proxy_host).await?;
        let targets: Vec<SocketAddr> = addrs
            .iter()
            .map(|ip| SocketAddr::new(*ip, proxy_port))
            .collect();
        let (mut tcp, remote) = super::dial::happy_eyeballs(
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
        let auth = intercept.basic_auth();
        // Absolute-form requests name the target; resolving locally, every target goes in a
        // tunnel (to its checked address, or its literal).
        let absolute_form = !https && !self.cfg.proxy_resolves_locally;
        let Some(proxy_tls) = proxy_tls else {
            if absolute_form {
                return Ok(self.finish(MaybeTls::Plain(tcp), remote, permit, true));
            }
            proxy::tunnel(&mut tcp, tunnel_to, port, auth).await?;
            if !https {
                return Ok(self.finish(MaybeTls::Plain(tcp), remote, permit, false));
            }
            let tls = handshake(&self.cfg.tls, tcp, host).await?;
            return Ok(self.finish(MaybeTls::Tls(Box::new(tls)), remote, permit, false));
        };
        // TLS to the proxy: requests in absolute form inside it, or a tunnel inside it that
        // carries the target's own TLS.
        let mut to_proxy = handshake(&proxy_tls, tcp, proxy_host).await.map_err(|e| {
            NetError::new(ErrorKind::Proxy)
                .with_message(format!(
                    "tls handshake with the proxy {proxy_host}:{proxy_port} failed"
                ))
                .with_source(e)
        })?;
        if absolute_form {
            return Ok(self.finish(MaybeTls::Tls(Box::new(to_proxy)), remote, permit, true));
        }
        proxy::tunnel(&mut to_proxy, tunnel_to, port, auth).await?;
        if !https {
            return Ok(self.finish(MaybeTls::Tls(Box::new(to_proxy)), remote, permit, false));
        }
        let tls = handshake(&self.cfg.tls, to_proxy, host).await?;
        Ok(self.finish(MaybeTls::TlsInTls(Box::new(tls)), remote, permit, false))
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
        let tls = handshake(&self.cfg.tls, tcp, host).await?;
        Ok(MaybeTls::Tls(Box::new(tls)))
    }

    fn finish(
        &self,
        stream: MaybeTls,
        remote: SocketAddr,
        permit: OwnedSemaphorePermit,
        proxied: bool,
    ) -> Conn {
        tracing::trace!(%remote, proxied, "connected");
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
}

/// Whether `uri` is `https` (else `http`); any other scheme is an invalid request.
pub(crate) fn is_https(uri: &Uri) -> Result<bool, NetError> {
    match uri.scheme_str() {
        Some("https") => Ok(true),
        Some("http") => Ok(false),
        other => Err(NetError::invalid_request(format!(
            "scheme {other:?} is not http or https"
        ))),
    }
}

/// A TLS handshake with `host` over `io` under `config`.
async fn handshake<S>(
    config: &Arc<rustls::ClientConfig>,
    io: S,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<S>, NetError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| {
        NetError::invalid_request(format!("`{host}` is not a valid TLS server name")).with_source(e)
    })?;
    tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, io)
        .await
        .map_err(|e| crate::classify::tls_handshake_error(e, host))
}
