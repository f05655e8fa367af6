//! [`ConnectProxy`]: an HTTP forward proxy on loopback (CONNECT tunnels and absolute-form
//! requests), plain or over TLS, with optional `Proxy-Authorization`, faults, and a log of
//! what it was asked to reach. It only ever dials loopback addresses.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use base64::Engine as _;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::signal::Signal;

/// Largest request head the proxy reads.
const MAX_HEAD: usize = 64 * 1024;

/// A fault the proxy injects into every request it receives (after logging it and checking
/// credentials).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProxyFault {
    /// No fault: tunnel or forward. The default.
    #[default]
    None,
    /// Close the connection without answering.
    Refuse,
    /// Never answer; the connection stays open until the client gives up or the proxy stops.
    Hang,
    /// Answer `502 Bad Gateway`.
    BadGateway,
}

/// What the proxy did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyOutcome {
    /// CONNECT answered `200` and the tunnel was opened.
    Tunneled,
    /// An absolute-form request was forwarded.
    Forwarded,
    /// Credentials were missing or wrong: `407`.
    AuthRequired,
    /// [`ProxyFault::Refuse`]: closed without an answer.
    Refused,
    /// [`ProxyFault::Hang`]: never answered.
    Hung,
    /// [`ProxyFault::BadGateway`]: `502`.
    BadGateway,
    /// The target is neither loopback nor mapped: `502`, and nothing was dialled.
    Blocked,
    /// Dialling the target failed: `502`.
    ConnectFailed,
    /// The request could not be parsed or has no usable target: `400`.
    BadRequest,
}

/// One request the proxy received.
#[derive(Clone, Debug)]
pub struct ProxyRequest {
    /// The method (`CONNECT`, `GET`, …).
    pub method: String,
    /// The target as asked: `host:port` for CONNECT, the absolute URI otherwise.
    pub target: String,
    /// Whether valid credentials were presented (always `true` when none are required).
    pub authorized: bool,
    /// What the proxy did.
    pub outcome: ProxyOutcome,
    /// Id of the client connection: 1 for the first, then 2, …
    pub connection: u64,
}

/// Builds a [`ConnectProxy`]; see [`ConnectProxy::builder`].
///
/// Defaults: `127.0.0.1:0`, no credentials required, no fault, no host mapping (only loopback
/// targets — IP literals and `localhost` — are reachable).
#[derive(Debug, Default)]
pub struct ConnectProxyBuilder {
    credentials: Option<String>,
    fault: ProxyFault,
    hosts: HashMap<String, SocketAddr>,
    ipv6: bool,
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl ConnectProxyBuilder {
    /// Requires `Proxy-Authorization: Basic base64(user:password)`; without it (or with other
    /// credentials) the proxy answers `407` with `Proxy-Authenticate: Basic`. Default is none.
    pub fn basic_auth(mut self, user: &str, password: &str) -> Self {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        self.credentials = Some(format!("Basic {token}"));
        self
    }

    /// Injects `fault` into every request. Default is [`ProxyFault::None`].
    pub fn fault(mut self, fault: ProxyFault) -> Self {
        self.fault = fault;
        self
    }

    /// Sends requests for `authority` (`host:port`, matched case-insensitively) to `to`,
    /// which must be a loopback address — so a client can ask for `api.example.test:443` and
    /// reach a local server. Non-loopback addresses are ignored.
    pub fn map_host(mut self, authority: &str, to: SocketAddr) -> Self {
        if to.ip().is_loopback() {
            self.hosts.insert(authority.to_ascii_lowercase(), to);
        }
        self
    }

    /// Listens on `[::1]:0` instead of `127.0.0.1:0`.
    pub fn ipv6(mut self) -> Self {
        self.ipv6 = true;
        self
    }

    /// Speaks TLS to its clients with `config` (an `https://` proxy, e.g. with a
    /// [`CertKit`](crate::CertKit) leaf's server config): the client's requests, CONNECT
    /// included, arrive inside TLS; a tunnel then carries the client's own TLS to the target
    /// inside it. A client whose TLS handshake fails is dropped and not logged.
    pub fn tls(mut self, config: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// Binds and starts serving.
    ///
    /// # Errors
    /// The loopback port cannot be bound.
    pub async fn start(self) -> io::Result<ConnectProxy> {
        let bind: SocketAddr = if self.ipv6 {
            (std::net::Ipv6Addr::LOCALHOST, 0).into()
        } else {
            (Ipv4Addr::LOCALHOST, 0).into()
        };
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(ProxyShared {
            credentials: self.credentials,
            fault: self.fault,
            hosts: self.hosts,
            log: Mutex::new(Vec::new()),
            connections: AtomicU64::new(0),
            shutdown: Signal::new(),
            tls: self.tls,
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(ConnectProxy {
            addr,
            shared,
            task: Some(task),
        })
    }
}

#[derive(Debug)]
struct ProxyShared {
    credentials: Option<String>,
    fault: ProxyFault,
    hosts: HashMap<String, SocketAddr>,
    log: Mutex<Vec<ProxyRequest>>,
    connections: AtomicU64,
    shutdown: Signal,
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// An HTTP forward proxy on loopback. Stops when dropped or [shut down](ConnectProxy::shutdown).
///
/// CONNECT requests get `200 Connection Established` and a byte tunnel to the target.
/// Absolute-form requests (`GET http://host:port/path HTTP/1.1`) are rewritten to origin-form,
/// stripped of `Proxy-Authorization` and `Proxy-Connection`, and forwarded; the connection then
/// stays piped to that target, so later requests on it go there too (clients use one
/// connection per origin). Targets are dialled only if they are loopback (`127.0.0.0/8`,
/// `::1`, `localhost`) or mapped with [`ConnectProxyBuilder::map_host`]; anything else is
/// answered `502` and logged as [`ProxyOutcome::Blocked`].
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// use soulbase_net_testkit::ConnectProxy;
///
/// let proxy = ConnectProxy::builder().basic_auth("user", "pw").start().await?;
/// assert!(proxy.url().starts_with("http://127.0.0.1:"));
/// assert!(proxy.requests().is_empty());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ConnectProxy {
    addr: SocketAddr,
    shared: Arc<ProxyShared>,
    task: Option<JoinHandle<()>>,
}

impl ConnectProxy {
    /// A builder with the defaults of [`ConnectProxyBuilder`].
    pub fn builder() -> ConnectProxyBuilder {
        ConnectProxyBuilder::default()
    }

    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy URL to give a client: `http://127.0.0.1:PORT`, or `https://…` when the proxy
    /// speaks TLS (its certificate must then name `127.0.0.1`, as CertKit's leaves do).
    pub fn url(&self) -> String {
        let scheme = if self.shared.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// Every request received, oldest first.
    pub fn requests(&self) -> Vec<ProxyRequest> {
        self.shared.log.lock().clone()
    }

    /// How many client connections were accepted.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Stops accepting and drops every connection and tunnel; waits for the proxy task.
    pub async fn shutdown(&mut self) {
        self.shared.shutdown.fire();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.shared.shutdown.fire();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<ProxyShared>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shared.shutdown.fired() => break,
            res = listener.accept() => match res {
                Ok((stream, _)) => {
                    let id = shared.connections.fetch_add(1, Ordering::SeqCst) + 1;
                    conns.spawn(accept_client(stream, id, shared.clone()));
                }
                Err(e) => tracing::warn!(error = %e, "proxy accept failed"),
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Serves one client connection, after a TLS handshake when the proxy speaks TLS.
async fn accept_client(stream: TcpStream, id: u64, shared: Arc<ProxyShared>) {
    match &shared.tls {
        None => handle(stream, id, shared).await,
        Some(config) => match tokio_rustls::TlsAcceptor::from(config.clone())
            .accept(stream)
            .await
        {
            Ok(tls) => handle(tls, id, shared).await,
            Err(e) => tracing::debug!(error = %e, "proxy tls handshake failed"),
        },
    }
}

/// A parsed request head.
#[derive(Debug)]
struct Head {
    method: String,
    target: String,
    version: u8,
    headers: Vec<(String, Vec<u8>)>,
    /// Bytes read past the head.
    rest: Vec<u8>,
}

async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<Option<Head>> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 100];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let head = Head {
                    method: req.method.unwrap_or_default().to_owned(),
                    target: req.path.unwrap_or_default().to_owned(),
                    version: req.version.unwrap_or(1),
                    headers: req
                        .headers
                        .iter()
                        .map(|h| (h.name.to_owned(), h.value.to_vec()))
                        .collect(),
                    rest: buf[len..].to_vec(),
                };
                return Ok(Some(head));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            _ => return Ok(None),
        }
    }
}

impl ProxyShared {
    fn log(&self, head: &Head, authorized: bool, outcome: ProxyOutcome, connection: u64) {
        self.log.lock().push(ProxyRequest {
            method: head.method.clone(),
            target: head.target.clone(),
            authorized,
            outcome,
            connection,
        });
    }

    fn authorized(&self, head: &Head) -> bool {
        let Some(expected) = &self.credentials else {
            return true;
        };
        head.headers.iter().any(|(n, v)| {
            n.eq_ignore_ascii_case("proxy-authorization") && v.as_slice() == expected.as_bytes()
        })
    }

    /// The loopback address to dial for `authority`, if it may be dialled.
    fn resolve(&self, authority: &str) -> Option<SocketAddr> {
        if let Some(addr) = self.hosts.get(&authority.to_ascii_lowercase()) {
            return Some(*addr);
        }
        let (host, port) = authority.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip: IpAddr = if host.eq_ignore_ascii_case("localhost") {
            Ipv4Addr::LOCALHOST.into()
        } else {
            host.parse().ok()?
        };
        ip.is_loopback().then_some(SocketAddr::new(ip, port))
    }
}

async fn respond<S: AsyncWrite + Unpin>(stream: &mut S, status: &str, extra: &str) {
    let msg = format!("HTTP/1.1 {status}\r\n{extra}content-length: 0\r\nconnection: close\r\n\r\n");
    let _ = stream.write_all(msg.as_bytes()).await;
    let _ = stream.shutdown().await;
}

async fn handle<S>(mut stream: S, id: u64, shared: Arc<ProxyShared>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Ok(Some(head)) = read_head(&mut stream).await else {
        respond(&mut stream, "400 Bad Request", "").await;
        return;
    };
    let authorized = shared.authorized(&head);
    if !authorized {
        shared.log(&head, false, ProxyOutcome::AuthRequired, id);
        let extra = "proxy-authenticate: Basic realm=\"soulbase-testkit\"\r\n";
        respond(&mut stream, "407 Proxy Authentication Required", extra).await;
        return;
    }
    match shared.fault {
        ProxyFault::None => {}
        ProxyFault::Refuse => {
            shared.log(&head, true, ProxyOutcome::Refused, id);
            return;
        }
        ProxyFault::Hang => {
            shared.log(&head, true, ProxyOutcome::Hung, id);
            shared.shutdown.fired().await;
            return;
        }
        ProxyFault::BadGateway => {
            shared.log(&head, true, ProxyOutcome::BadGateway, id);
            respond(&mut stream, "502 Bad Gateway", "").await;
            return;
        }
    }
    let connect = head.method.eq_ignore_ascii_case("CONNECT");
    let (authority, forward_head) = if connect {
        (Some(head.target.clone()), None)
    } else {
        match absolute_form(&head) {
            Some((authority, rewritten)) => (Some(authority), Some(rewritten)),
            None => (None, None),
        }
    };
    let Some(authority) = authority else {
        shared.log(&head, true, ProxyOutcome::BadRequest, id);
        respond(&mut stream, "400 Bad Request", "").await;
        return;
    };
    let Some(addr) = shared.resolve(&authority) else {
        shared.log(&head, true, ProxyOutcome::Blocked, id);
        respond(&mut stream, "502 Bad Gateway", "").await;
        return;
    };
    let Ok(mut upstream) = TcpStream::connect(addr).await else {
        shared.log(&head, true, ProxyOutcome::ConnectFailed, id);
        respond(&mut stream, "502 Bad Gateway", "").await;
        return;
    };
    if connect {
        shared.log(&head, true, ProxyOutcome::Tunneled, id);
        if stream
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
    } else {
        shared.log(&head, true, ProxyOutcome::Forwarded, id);
        if let Some(h) = forward_head {
            if upstream.write_all(&h).await.is_err() {
                return;
            }
        }
    }
    if !head.rest.is_empty() && upstream.write_all(&head.rest).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
}

/// For `GET http://host:port/path HTTP/1.1`: the authority and the head rewritten to
/// origin-form without the proxy's own headers.
fn absolute_form(head: &Head) -> Option<(String, Vec<u8>)> {
    let uri: http::Uri = head.target.parse().ok()?;
    if uri.scheme_str() != Some("http") {
        return None;
    }
    let host = uri.host()?;
    let port = uri.port_u16().unwrap_or(80);
    let authority = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = format!("{} {} HTTP/1.{}\r\n", head.method, path, head.version).into_bytes();
    for (name, value) in &head.headers {
        if name.eq_ignore_ascii_case("proxy-authorization")
            || name.eq_ignore_ascii_case("proxy-connection")
        {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Some((authority, out))
}
