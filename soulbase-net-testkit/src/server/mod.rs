//! [`FaultServer`]: a scripted HTTP/1.1 + HTTP/2 server (plain or TLS) on loopback that
//! injects faults, counts hits and connections, and captures requests.

mod body;
mod capacity;
mod capture;
mod conn;
mod encode;
mod forward;
mod gate;
mod h2_raw;
#[cfg(feature = "http3")]
mod h3;
#[cfg(feature = "http3")]
mod h3_settings;
mod handler;
mod mock;
mod reply;
mod retire;
mod script;
mod serve;
mod times;
mod verify;

pub use capacity::Capacity;
pub use capture::{CapturedRequest, JsonBodyError};
pub use gate::Gate;
pub use mock::Mock;
pub use reply::Reply;
pub(crate) use script::splitmix64;
pub use script::{RandomFaults, Script};
pub use times::Times;
pub use verify::VerifyError;

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::Method;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::signal::Signal;
use handler::{Route, Shared};
use serve::{accept_loop, http_builder, ConnCfg};

/// Which HTTP versions a [`FaultServer`] speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Protocol {
    /// HTTP/1.1 only (with TLS, ALPN offers `http/1.1`).
    Http1,
    /// HTTP/2 only: prior knowledge on plain TCP, ALPN `h2` with TLS.
    Http2,
    /// Both: HTTP/1.1 or HTTP/2 prior knowledge (h2c) on plain TCP, detected from the
    /// connection preface; with TLS, ALPN offers `h2` then `http/1.1`. The default.
    #[default]
    Auto,
}

/// Default cap on the captured request body (see [`FaultServerBuilder::capture_limit`]).
const DEFAULT_CAPTURE_LIMIT: usize = 16 * 1024 * 1024;

/// Builds a [`FaultServer`]; see [`FaultServer::builder`].
///
/// Defaults: [`Protocol::Auto`], plain TCP, `127.0.0.1:0`, no routes (every path answers
/// `404`, or is forwarded with [`forward_to`](Self::forward_to)), 16 MiB captured per request
/// body.
pub struct FaultServerBuilder {
    protocol: Protocol,
    bind: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    routes: Vec<Route>,
    /// `None`: `404`, or [`Reply::forward`] when there is an upstream.
    fallback: Option<Script>,
    upstream: Option<String>,
    capture_limit: usize,
    blackhole: bool,
    retire_after: Option<u64>,
    refuse_streams: Option<u64>,
    #[cfg(feature = "http3")]
    http3: bool,
    #[cfg(feature = "http3")]
    h3_ignore_header_limit: bool,
    alt_svc: bool,
}

impl std::fmt::Debug for FaultServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultServerBuilder")
            .field("protocol", &self.protocol)
            .field("bind", &self.bind)
            .field("tls", &self.tls.is_some())
            .field("routes", &self.routes.len())
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

impl Default for FaultServerBuilder {
    fn default() -> Self {
        Self {
            protocol: Protocol::Auto,
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            tls: None,
            routes: Vec::new(),
            fallback: None,
            upstream: None,
            capture_limit: DEFAULT_CAPTURE_LIMIT,
            blackhole: false,
            retire_after: None,
            refuse_streams: None,
            #[cfg(feature = "http3")]
            http3: false,
            #[cfg(feature = "http3")]
            h3_ignore_header_limit: false,
            alt_svc: false,
        }
    }
}

impl FaultServerBuilder {
    /// Adds a route for `path` (exact match on the path, any query, any method): the same as
    /// `.mock(Mock::any(path).respond(script))`. Routes are tried by
    /// [priority](Mock::priority) (5 for this one), method-specific first, then in the order
    /// added.
    pub fn route(self, path: impl Into<String>, script: impl Into<Script>) -> Self {
        self.add(None, path.into(), script.into())
    }

    /// Adds a [`Mock`]: a route matching on method, path, query, headers or body, with a
    /// priority and an optional expectation checked by [`FaultServer::verify`] and when the
    /// server is dropped.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_testkit::{FaultServer, Mock, Reply};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let srv = FaultServer::builder()
    ///     .mock(Mock::get("/search").query("q", "red shoes").respond(Reply::ok("[]")).expect(0..=1))
    ///     .start()
    ///     .await?;
    /// srv.verify().unwrap(); // zero requests is within 0..=1
    /// # Ok(()) }
    /// ```
    pub fn mock(mut self, mock: Mock) -> Self {
        self.routes.push(Route::new(mock));
        self
    }

    /// Adds a route for `method` and `path`.
    pub fn route_method(
        self,
        method: Method,
        path: impl Into<String>,
        script: impl Into<Script>,
    ) -> Self {
        self.add(Some(method), path.into(), script.into())
    }

    fn add(self, method: Option<Method>, path: String, script: Script) -> Self {
        self.mock(Mock::new(method, path).respond(script))
    }

    /// Adds `n` routes `{prefix}/0` … `{prefix}/{n-1}`, each answering `302` to the next, the
    /// last one redirecting (relative) to `target`. Following it takes `n` redirects.
    pub fn redirect_chain(
        mut self,
        prefix: impl AsRef<str>,
        n: usize,
        target: impl AsRef<str>,
    ) -> Self {
        let prefix = prefix.as_ref().trim_end_matches('/');
        for i in 0..n {
            let next = if i + 1 == n {
                target.as_ref().to_owned()
            } else {
                format!("{prefix}/{}", i + 1)
            };
            self = self.route(format!("{prefix}/{i}"), Reply::redirect(302, next));
        }
        self
    }

    /// Adds routes `{prefix}/a` and `{prefix}/b` redirecting (`302`) to each other forever.
    pub fn redirect_loop(self, prefix: impl AsRef<str>) -> Self {
        let prefix = prefix.as_ref().trim_end_matches('/');
        self.route(
            format!("{prefix}/a"),
            Reply::redirect(302, format!("{prefix}/b")),
        )
        .route(
            format!("{prefix}/b"),
            Reply::redirect(302, format!("{prefix}/a")),
        )
    }

    /// The script for requests no route matches. Default is `404`, or [`Reply::forward`] on
    /// a server with an upstream ([`forward_to`](Self::forward_to)).
    pub fn fallback(mut self, script: impl Into<Script>) -> Self {
        self.fallback = Some(script.into());
        self
    }

    /// Puts the server in front of the upstream at `url` (`http://` on a loopback address or
    /// `localhost`, for example a wiremock `MockServer`'s `uri()`; a path is a prefix added to
    /// every request path). Requests no route matches are forwarded (the [`fallback`](Self::fallback)
    /// becomes [`Reply::forward`]), and a route's script forwards a hit with
    /// [`Reply::forward`], so its faults go around the upstream's answers:
    ///
    /// - forwarded: the method, the path and query, the headers less the hop-by-hop ones
    ///   (`Connection` and those it names, `Keep-Alive`, `TE`, `Trailer`,
    ///   `Transfer-Encoding`, `Upgrade`, `Proxy-*`) and `Host` (the upstream's own is sent), and
    ///   the body; then the upstream's status, headers (less hop-by-hop) and body come back;
    /// - toward the client, everything the server does applies as usual: HTTP/1.1 or HTTP/2,
    ///   [TLS](Self::tls), resets, stalls, slow bodies, 5xx bursts. The upstream is always
    ///   spoken to in HTTP/1.1 over plain TCP;
    /// - every request still counts in [`FaultServer::hits`] and [`FaultServer::requests`],
    ///   forwarded or not.
    ///
    /// Default is no upstream.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_testkit::{FaultServer, Reply, Script};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let upstream = FaultServer::builder().route("/users/1", Reply::ok("ann")).start().await?;
    /// let front = FaultServer::builder()
    ///     .forward_to(upstream.origin())
    ///     // The first hit resets the connection, later ones reach the upstream.
    ///     .route("/users/1", Script::reply(Reply::reset()).times(1).then(Reply::forward()))
    ///     .start()
    ///     .await?;
    /// assert!(front.url("/users/1").starts_with("http://127.0.0.1:"));
    /// # Ok(()) }
    /// ```
    ///
    /// [`start`](Self::start) fails (`InvalidInput`) for an upstream that is not `http://` on
    /// loopback.
    pub fn forward_to(mut self, url: impl Into<String>) -> Self {
        self.upstream = Some(url.into());
        self
    }

    /// Speaks `protocol`. Default is [`Protocol::Auto`].
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Shorthand for [`Protocol::Http1`].
    pub fn http1(self) -> Self {
        self.protocol(Protocol::Http1)
    }

    /// Shorthand for [`Protocol::Http2`].
    pub fn http2(self) -> Self {
        self.protocol(Protocol::Http2)
    }

    /// Serves TLS with `config` (for example [`Leaf::server_config`](crate::Leaf::server_config));
    /// its ALPN list is replaced according to the protocol. Default is plain TCP.
    pub fn tls(mut self, config: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// Listens on `[::1]:0` instead of `127.0.0.1:0`.
    pub fn ipv6(mut self) -> Self {
        self.bind = SocketAddr::from((Ipv6Addr::LOCALHOST, 0));
        self
    }

    /// Listens on `addr`, which must be a loopback address (port 0 picks a free one).
    /// Default is `127.0.0.1:0`.
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// Keeps at most `limit` bytes of each request body in [`CapturedRequest::body`] (the rest
    /// is read and counted). Default is 16 MiB.
    pub fn capture_limit(mut self, limit: usize) -> Self {
        self.capture_limit = limit;
        self
    }

    /// Serves HTTP/3 too, on the UDP port of the same number as the TCP one (the same routes,
    /// scripts, counters and request log; see [`FaultServer::h3_addr`]). Needs
    /// [`tls`](Self::tls), whose configuration is used with ALPN `h3`. Over HTTP/3,
    /// [`Reply::reset`] resets the request's stream with `H3_REQUEST_REJECTED`,
    /// [`Reply::close`] closes the QUIC connection, and a body cut (`reset_after`,
    /// `close_after`) closes the connection mid-response. Default is off.
    #[cfg(feature = "http3")]
    pub fn http3(mut self) -> Self {
        self.http3 = true;
        self
    }

    /// Over HTTP/3, ignores the client's `SETTINGS_MAX_FIELD_SECTION_SIZE`: a response head
    /// over the size the client announced is sent all the same (by default it is not: h3
    /// refuses to, as RFC 9114 §4.2.2 asks, and the server ends the stream without a head),
    /// so that a test reaches the
    /// client's own check of the head's size, as against a server that does not honour the
    /// setting. Default is off.
    #[cfg(feature = "http3")]
    pub fn h3_ignore_header_limit(mut self) -> Self {
        self.h3_ignore_header_limit = true;
        self
    }

    /// Advertises the HTTP/3 port on every response with `Alt-Svc: h3=":<port>"; ma=86400`
    /// (a reply that sets its own `Alt-Svc` keeps it). Default is off.
    pub fn alt_svc(mut self) -> Self {
        self.alt_svc = true;
        self
    }

    /// Accepts connections and never reads from them or answers (not even a TLS handshake);
    /// they stay open until the client gives up or the server stops. Default is off.
    pub fn blackhole(mut self) -> Self {
        self.blackhole = true;
        self
    }

    /// Retires every connection once it has taken `n` requests, as nginx's
    /// `keepalive_requests` does: the connection shuts down gracefully. Over HTTP/2 the server
    /// sends GOAWAY: the streams already open are still answered, those the client opens after
    /// it are refused; over HTTP/1.1 the `n`-th response carries `Connection: close` and the
    /// connection closes after it. A request counts when it arrives (before its reply's delay);
    /// [`FaultServer::retired`] counts the connections retired. HTTP/1.1 and HTTP/2 over TCP
    /// only (not HTTP/3). Default is never.
    ///
    /// [`start`](Self::start) fails (`InvalidInput`) for `n == 0`.
    pub fn retire_after(mut self, n: u64) -> Self {
        self.retire_after = Some(n);
        self
    }

    /// Refuses every `every`-th stream of each HTTP/2 connection (with `every = 3`: streams 3,
    /// 6, 9, … of that connection), as a server at its concurrent-stream limit or shutting
    /// down does: the stream is reset with `RST_STREAM(REFUSED_STREAM)` before its request is
    /// read, so the request is not processed (RFC 9113 §8.7) and a client may retry it
    /// whatever its method. A refused request is not a hit, is not in
    /// [`FaultServer::received_requests`] and does not count toward
    /// [`retire_after`](Self::retire_after); [`FaultServer::refused`] counts them.
    ///
    /// HTTP/2 only: such connections are served by the `h2` crate rather than hyper, and on
    /// them [`Reply::reset`] resets the request's stream (`INTERNAL_ERROR`) instead of the TCP
    /// connection. With [`Protocol::Auto`] and [`tls`](Self::tls), connections whose ALPN picks
    /// `http/1.1` are served as usual, with no refusal. Default is off.
    ///
    /// [`start`](Self::start) fails (`InvalidInput`) for `every == 0`, with
    /// [`Protocol::Http1`], and with [`Protocol::Auto`] on plain TCP (use
    /// [`http2`](Self::http2)).
    pub fn refuse_streams(mut self, every: u64) -> Self {
        self.refuse_streams = Some(every);
        self
    }

    /// Binds and starts serving.
    ///
    /// # Errors
    /// The bind address is not loopback, the port cannot be bound, the TLS config is unusable,
    /// the upstream of [`forward_to`](Self::forward_to) is not `http://` on loopback, or
    /// [`retire_after`](Self::retire_after) or [`refuse_streams`](Self::refuse_streams) is
    /// misconfigured (see each).
    pub async fn start(self) -> io::Result<FaultServer> {
        if !self.bind.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "FaultServer only listens on loopback",
            ));
        }
        self.check_lifecycle()?;
        let upstream = self
            .upstream
            .as_deref()
            .map(forward::Upstream::new)
            .transpose()?;
        let fallback = self.fallback.unwrap_or_else(|| match upstream {
            Some(_) => Script::reply(Reply::forward()),
            None => Script::status(404),
        });
        let listener = TcpListener::bind(self.bind).await?;
        let addr = listener.local_addr()?;
        #[cfg(feature = "http3")]
        let h3 = match (&self.tls, self.http3) {
            (Some(tls), true) => Some(h3::bind(addr, tls)?),
            (None, true) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "HTTP/3 needs TLS: give the builder a tls() configuration",
                ))
            }
            (_, false) => None,
        };
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let tls = self.tls.map(|cfg| {
            let mut cfg = (*cfg).clone();
            cfg.alpn_protocols = match self.protocol {
                Protocol::Http1 => vec![b"http/1.1".to_vec()],
                Protocol::Http2 => vec![b"h2".to_vec()],
                Protocol::Auto => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            };
            TlsAcceptor::from(Arc::new(cfg))
        });
        let mut routes = self.routes;
        // Stable: at equal priority and specificity, the order added decides.
        routes.sort_by_key(|r| (r.mock.priority, r.mock.method.is_none()));
        let shared = Arc::new(Shared {
            routes,
            fallback: Route::new(Mock::any("").respond(fallback).named("fallback")),
            received: Mutex::new(Vec::new()),
            upstream,
            stats: Mutex::new(HashMap::new()),
            hit: tokio::sync::Notify::new(),
            connections: AtomicU64::new(0),
            open: AtomicU64::new(0),
            closed: tokio::sync::Notify::new(),
            origin: format!("{scheme}://{addr}"),
            authority: addr.to_string(),
            capture_limit: self.capture_limit,
            alt_svc: self
                .alt_svc
                .then(|| http::HeaderValue::from_str(&format!("h3=\":{}\"; ma=86400", addr.port())))
                .and_then(Result::ok),
            shutdown: Signal::new(),
            retire_all: tokio::sync::watch::Sender::new(0),
            retired: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            panic: Mutex::new(None),
        });
        let stop_accept = Signal::new();
        let cfg = ConnCfg {
            http: http_builder(self.protocol, shared.clone()),
            protocol: self.protocol,
            tls,
            blackhole: self.blackhole,
            retire_after: self.retire_after,
            refuse_streams: self.refuse_streams,
        };
        let tcp = accept_loop(listener, shared.clone(), Arc::new(cfg), stop_accept.clone());
        #[cfg(feature = "http3")]
        let (task, h3) = match h3 {
            Some(side) => {
                let udp = h3::accept_loop(
                    side.endpoint.clone(),
                    shared.clone(),
                    side.goaway.clone(),
                    self.h3_ignore_header_limit,
                );
                let task = tokio::spawn(async move {
                    tokio::join!(tcp, udp);
                });
                (task, Some(side))
            }
            None => (tokio::spawn(tcp), None),
        };
        #[cfg(not(feature = "http3"))]
        let task = tokio::spawn(tcp);
        Ok(FaultServer {
            addr,
            shared,
            stop_accept,
            task: Some(task),
            #[cfg(feature = "http3")]
            h3,
        })
    }
}

impl FaultServerBuilder {
    /// Validates [`retire_after`](Self::retire_after) and
    /// [`refuse_streams`](Self::refuse_streams).
    fn check_lifecycle(&self) -> io::Result<()> {
        let invalid = |msg: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        if self.retire_after == Some(0) {
            return invalid("retire_after(n) needs n >= 1");
        }
        match (self.refuse_streams, self.protocol, self.tls.is_some()) {
            (None, _, _) => Ok(()),
            (Some(0), _, _) => invalid("refuse_streams(every) needs every >= 1"),
            (Some(_), Protocol::Http1, _) => {
                invalid("refuse_streams is HTTP/2 only: the server is HTTP/1.1 only")
            }
            (Some(_), Protocol::Auto, false) => invalid(
                "refuse_streams is HTTP/2 only: call http2(), or serve TLS where ALPN picks h2",
            ),
            (Some(_), _, _) => Ok(()),
        }
    }
}

/// A scripted HTTP server on loopback. Stops when dropped or [shut down](FaultServer::shutdown).
///
/// # Examples
/// ```
/// use soulbase_net_testkit::{FaultServer, Reply, Script};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let srv = FaultServer::builder()
///     .route("/flaky", Script::status(503).times(2).then(Reply::ok("hi")))
///     .route("/echo", Reply::echo())
///     .start()
///     .await?;
/// assert!(srv.url("/flaky").starts_with("http://127.0.0.1:"));
/// assert_eq!(srv.hits("/flaky"), 0);
/// srv.join().await;
/// # Ok(())
/// # }
/// ```
pub struct FaultServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop_accept: Signal,
    task: Option<JoinHandle<()>>,
    #[cfg(feature = "http3")]
    h3: Option<h3::H3Side>,
}

impl std::fmt::Debug for FaultServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultServer")
            .field("origin", &self.shared.origin)
            .field("connections", &self.connections())
            .finish_non_exhaustive()
    }
}

impl FaultServer {
    /// A builder with the defaults of [`FaultServerBuilder`].
    pub fn builder() -> FaultServerBuilder {
        FaultServerBuilder::default()
    }

    /// A builder for an HTTP/1.1-only server.
    pub fn http1() -> FaultServerBuilder {
        Self::builder().http1()
    }

    /// A builder for an HTTP/2-only server (prior knowledge, or ALPN `h2` with TLS).
    pub fn http2() -> FaultServerBuilder {
        Self::builder().http2()
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The UDP address HTTP/3 is served on (the TCP port's number), when
    /// [`http3`](FaultServerBuilder::http3) was asked for.
    #[cfg(feature = "http3")]
    pub fn h3_addr(&self) -> Option<SocketAddr> {
        self.h3.as_ref().and_then(|h| h.endpoint.local_addr().ok())
    }

    /// Drops every UDP packet that arrives for `d` from now (HTTP/3 only; TCP is not
    /// touched): a client's QUIC handshake meanwhile gets no answer and times out.
    #[cfg(feature = "http3")]
    pub fn drop_udp_for(&self, d: std::time::Duration) {
        if let Some(h3) = &self.h3 {
            h3.drop.drop_for(d);
        }
    }

    /// Makes every HTTP/3 connection open now send GOAWAY (no request after those it has
    /// taken) and end once those have been answered; connections that arrive later are not
    /// concerned. [`wait_for_open_at_most`](Self::wait_for_open_at_most) says when they ended.
    #[cfg(feature = "http3")]
    pub fn h3_goaway(&self) {
        if let Some(h3) = &self.h3 {
            h3.goaway.send_modify(|n| *n += 1);
        }
    }

    /// `http://127.0.0.1:PORT` (or `https://…`, or `http://[::1]:PORT`).
    pub fn origin(&self) -> &str {
        &self.shared.origin
    }

    /// The origin followed by `path` (which should start with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.shared.origin, path)
    }

    /// How many requests arrived for `path` (any method, matched or not).
    pub fn hits(&self, path: &str) -> u64 {
        self.shared.stats.lock().get(path).map_or(0, |s| s.hits)
    }

    /// Waits until at least `n` requests have arrived for `path` (any method): the way to
    /// know that a call in flight has reached the server. It waits as long as it takes; wrap
    /// it in `tokio::time::timeout` to bound it.
    pub async fn wait_for_hits(&self, path: &str, n: u64) {
        loop {
            let notified = self.shared.hit.notified();
            tokio::pin!(notified);
            // Registered before the count is read, so a hit in between still wakes it.
            notified.as_mut().enable();
            if self.hits(path) >= n {
                return;
            }
            notified.await;
        }
    }

    /// How many requests arrived in total.
    pub fn total_hits(&self) -> u64 {
        self.shared.stats.lock().values().map(|s| s.hits).sum()
    }

    /// The requests that arrived for `path`, oldest first.
    pub fn requests(&self, path: &str) -> Vec<CapturedRequest> {
        self.shared
            .received
            .lock()
            .iter()
            .filter(|r| r.uri.path() == path)
            .cloned()
            .collect()
    }

    /// Every request that arrived, oldest first, whatever its path and route (wiremock's
    /// `received_requests`).
    pub fn received_requests(&self) -> Vec<CapturedRequest> {
        self.shared.received.lock().clone()
    }

    /// Checks every [`Mock::expect`]ation now, as dropping the server does (wiremock's
    /// `verify`).
    ///
    /// # Errors
    /// A mock matched a number of requests outside its expectation; the error names each such
    /// mock, what it expected and how many it got, and lists the requests no route matched.
    pub fn verify(&self) -> Result<(), VerifyError> {
        verify::verify(&self.shared)
    }

    /// How many connections were accepted.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// How many connections are open now (accepted and not yet ended, by either side).
    pub fn open_connections(&self) -> u64 {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Waits until at most `n` connections are open: the way to see a client close (or pool)
    /// its connections. It waits as long as it takes; wrap it in `tokio::time::timeout` to
    /// bound it.
    pub async fn wait_for_open_at_most(&self, n: u64) {
        loop {
            let notified = self.shared.closed.notified();
            tokio::pin!(notified);
            // Registered before the count is read, so a close in between still wakes it.
            notified.as_mut().enable();
            if self.open_connections() <= n {
                return;
            }
            notified.await;
        }
    }

    /// Retires every connection open now, as `nginx -s reload` does: each shuts down
    /// gracefully as with [`retire_after`](FaultServerBuilder::retire_after) (GOAWAY over
    /// HTTP/2, its requests in flight still answered; over HTTP/1.1 an idle connection
    /// closes, a busy one after its response, which carries `Connection: close`). The listener
    /// goes on accepting; connections accepted later are not concerned. A connection that has
    /// not taken a request yet retires at its first one, answered (hyper may still be reading
    /// its preface, and a shutdown there would close it without a GOAWAY). HTTP/1.1 and
    /// HTTP/2 over TCP only (for HTTP/3 see `h3_goaway`).
    pub fn retire_connections(&self) {
        self.shared.retire_all.send_modify(|n| *n += 1);
    }

    /// How many connections were retired so far, by
    /// [`retire_after`](FaultServerBuilder::retire_after) or
    /// [`retire_connections`](Self::retire_connections): those whose graceful shutdown began.
    pub fn retired(&self) -> u64 {
        self.shared.retired.load(Ordering::SeqCst)
    }

    /// How many HTTP/2 streams were refused (`REFUSED_STREAM`) by
    /// [`refuse_streams`](FaultServerBuilder::refuse_streams), over all connections.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Closes the listening socket: new connections are refused, existing ones go on.
    pub fn close_listener(&self) {
        self.stop_accept.fire();
    }

    /// Stops accepting and drops every connection; waits until the server task has ended.
    /// Idempotent. A panic of a route handler is kept for [`FaultServer::join`].
    pub async fn shutdown(&mut self) {
        self.shared.shutdown.fire();
        if let Some(task) = self.task.take() {
            if let Err(e) = task.await {
                if e.is_panic() {
                    self.shared.record_panic(e.into_panic());
                }
            }
        }
    }

    /// Shuts the server down, then re-raises the first panic of a server task or a route
    /// handler, if any — call it at the end of a test so such panics fail the test.
    ///
    /// # Panics
    /// With the payload of that panic.
    pub async fn join(mut self) {
        self.shutdown().await;
        let payload = self.shared.panic.lock().take();
        if let Some(payload) = payload {
            std::panic::resume_unwind(payload);
        }
    }
}

impl Drop for FaultServer {
    /// Stops the server, then checks the [expectations](Mock::expect).
    ///
    /// # Panics
    /// An expectation failed (with the message of [`FaultServer::verify`]'s error), unless the
    /// thread is already panicking.
    #[allow(
        clippy::panic,
        reason = "a failed expectation fails the test that dropped the server, as in wiremock"
    )]
    fn drop(&mut self) {
        self.shared.shutdown.fire();
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if std::thread::panicking() {
            return;
        }
        if let Err(e) = self.verify() {
            panic!("{e}");
        }
    }
}

/// A loopback address on which nothing listens: connecting to it is refused (`ECONNREFUSED`).
/// It was free a moment ago; another test could in principle bind it since.
///
/// # Errors
/// No loopback port could be bound.
pub async fn refused_addr() -> io::Result<SocketAddr> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    l.local_addr()
}
