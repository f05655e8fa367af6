//! The serving side of a [`FaultServer`](super::FaultServer): the accept loop, one task per
//! connection (TLS, then hyper's auto HTTP/1.1 + HTTP/2 server, or the `h2` crate's server
//! when streams are to be refused), and the request handler that captures a request, picks
//! its reply from the route's script and renders it.

use std::any::Any;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::body::FaultBody;
use super::capture::{CapturedRequest, PathStats};
use super::conn::{ConnCtl, CtlIo};
use super::forward::Upstream;
use super::h2_raw;
use super::mock::Mock;
use super::reply::{Abort, Action, RenderCtx};
use super::retire::Retire;
use super::Protocol;
use crate::signal::Signal;

/// Counts a connection as open until it ends, however its task ends (aborted included).
pub(super) struct OpenConn(pub(super) Arc<Shared>);

/// A [`Mock`] being served: what it matches and answers, and how many requests it matched.
pub(super) struct Route {
    pub(super) mock: Mock,
    /// The mock's name or description, for captured requests and verification messages.
    pub(super) label: Arc<str>,
    pub(super) hits: AtomicU64,
}

impl Route {
    pub(super) fn new(mock: Mock) -> Self {
        Self {
            label: mock.label().into(),
            mock,
            hits: AtomicU64::new(0),
        }
    }
}

pub(super) fn http_builder(protocol: Protocol, shared: Arc<Shared>) -> auto::Builder<Exec> {
    let mut b = auto::Builder::new(Exec { shared });
    b.http1().timer(TokioTimer::new());
    b.http2().timer(TokioTimer::new());
    match protocol {
        Protocol::Http1 => b.http1_only(),
        Protocol::Http2 => b.http2_only(),
        Protocol::Auto => b,
    }
}

/// State shared by the accept loop, the connections and the [`FaultServer`] handle.
pub(super) struct Shared {
    /// In the order they are tried: by priority, a route with a method before one without,
    /// then in the order added.
    pub(super) routes: Vec<Route>,
    pub(super) fallback: Route,
    /// Every request, in the order they arrived (wiremock's `received_requests`); those no
    /// route matched have no [`CapturedRequest::route`].
    pub(super) received: Mutex<Vec<CapturedRequest>>,
    pub(super) stats: Mutex<HashMap<String, PathStats>>,
    /// Woken after every request is counted, for [`FaultServer::wait_for_hits`].
    pub(super) hit: tokio::sync::Notify,
    pub(super) connections: AtomicU64,
    /// Connections accepted and not yet ended.
    pub(super) open: AtomicU64,
    /// Woken whenever a connection ends, for [`FaultServer::wait_for_open_at_most`].
    pub(super) closed: tokio::sync::Notify,
    pub(super) origin: String,
    pub(super) authority: String,
    pub(super) capture_limit: usize,
    /// The `Alt-Svc` header every response carries (unless its reply sets one), advertising
    /// the server's HTTP/3 port; `None` when not asked for.
    pub(super) alt_svc: Option<http::HeaderValue>,
    /// Where [`Reply::forward`](super::Reply::forward) sends requests, if anywhere.
    pub(super) upstream: Option<Upstream>,
    pub(super) shutdown: Signal,
    /// Bumped by [`FaultServer::retire_connections`](super::FaultServer::retire_connections).
    pub(super) retire_all: watch::Sender<u64>,
    /// Connections whose graceful shutdown began, for [`FaultServer::retired`](super::FaultServer::retired).
    pub(super) retired: AtomicU64,
    /// HTTP/2 streams refused, for [`FaultServer::refused`](super::FaultServer::refused).
    pub(super) refused: AtomicU64,
    pub(super) panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Shared {
    pub(super) fn record_panic(&self, payload: Box<dyn Any + Send>) {
        let mut slot = self.panic.lock();
        if slot.is_none() {
            *slot = Some(payload);
        }
    }

    /// The first route that matches `req`, if any.
    fn route_for(&self, req: &CapturedRequest) -> Option<&Route> {
        self.routes.iter().find(|r| r.mock.matches(req))
    }
}

/// Runs hyper's background tasks (HTTP/2 streams), catching their panics for `join()` and
/// aborting them at shutdown.
#[derive(Clone)]
pub(super) struct Exec {
    pub(super) shared: Arc<Shared>,
}

impl<F> hyper::rt::Executor<F> for Exec
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let mut task = tokio::spawn(fut);
            tokio::select! {
                res = &mut task => {
                    if let Err(e) = res {
                        if e.is_panic() {
                            shared.record_panic(e.into_panic());
                        }
                    }
                }
                _ = shared.shutdown.fired() => task.abort(),
            }
        });
    }
}

pub(super) struct ConnCfg {
    pub(super) http: auto::Builder<Exec>,
    pub(super) protocol: Protocol,
    pub(super) tls: Option<TlsAcceptor>,
    pub(super) blackhole: bool,
    /// [`retire_after`](super::FaultServerBuilder::retire_after).
    pub(super) retire_after: Option<u64>,
    /// [`refuse_streams`](super::FaultServerBuilder::refuse_streams).
    pub(super) refuse_streams: Option<u64>,
}

pub(super) async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    cfg: Arc<ConnCfg>,
    stop_accept: Signal,
) {
    let mut listener = Some(listener);
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shared.shutdown.fired() => break,
            _ = stop_accept.fired(), if listener.is_some() => listener = None,
            res = accept(listener.as_ref()) => match res {
                Ok(stream) => {
                    let id = shared.connections.fetch_add(1, Ordering::SeqCst) + 1;
                    let open = OpenConn::new(shared.clone());
                    // Subscribed now, so a retire_connections() from here on concerns it.
                    let retire_all = shared.retire_all.subscribe();
                    conns.spawn(serve_conn(stream, id, open, retire_all, cfg.clone()));
                }
                // Transient (e.g. out of file descriptors): keep serving.
                Err(e) => tracing::warn!(error = %e, "fault server accept failed"),
            },
            Some(res) = conns.join_next(), if !conns.is_empty() => {
                if let Err(e) = res {
                    if e.is_panic() {
                        shared.record_panic(e.into_panic());
                    }
                }
            }
        }
    }
    drop(listener);
    conns.abort_all();
    while let Some(res) = conns.join_next().await {
        if let Err(e) = res {
            if e.is_panic() {
                shared.record_panic(e.into_panic());
            }
        }
    }
}

async fn accept(listener: Option<&TcpListener>) -> io::Result<TcpStream> {
    match listener {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

impl OpenConn {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        shared.open.fetch_add(1, Ordering::SeqCst);
        OpenConn(shared)
    }
}

impl Drop for OpenConn {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
        self.0.closed.notify_waiters();
    }
}

async fn serve_conn(
    stream: TcpStream,
    id: u64,
    open: OpenConn,
    retire_all: watch::Receiver<u64>,
    cfg: Arc<ConnCfg>,
) {
    let shared = open.0.clone();
    if cfg.blackhole {
        let _stream = stream;
        shared.shutdown.fired().await;
        return;
    }
    let _ = stream.set_nodelay(true);
    let ctl = Arc::new(ConnCtl::new(id).with_retire_after(cfg.retire_after));
    let io = CtlIo::new(stream, ctl.clone());
    let retire = Retire::new(ctl.clone(), shared.clone(), retire_all);
    let serve = async {
        match &cfg.tls {
            None => serve_http(io, false, &cfg, &shared, &ctl, retire).await,
            Some(acceptor) => {
                let Ok(tls) = acceptor.accept(io).await else {
                    return;
                };
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                serve_http(tls, h2, &cfg, &shared, &ctl, retire).await;
            }
        }
    };
    tokio::select! {
        () = serve => {}
        () = ctl.killed() => {}
        () = shared.shutdown.fired() => {}
    }
    // The connection is over: wakes a request still waiting on it (for its retirement).
    ctl.kill_now(false);
}

/// Serves HTTP on `io` (`alpn_h2`: TLS negotiated `h2`) until the connection ends, retiring it
/// gracefully when asked. With [`refuse_streams`](super::FaultServerBuilder::refuse_streams),
/// an HTTP/2 connection is served by the `h2` crate instead of hyper.
async fn serve_http<I>(
    io: I,
    alpn_h2: bool,
    cfg: &ConnCfg,
    shared: &Arc<Shared>,
    ctl: &Arc<ConnCtl>,
    mut retire: Retire,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    if let Some(every) = cfg.refuse_streams {
        if alpn_h2 || cfg.protocol == Protocol::Http2 {
            return h2_raw::serve(io, every, shared, ctl, retire).await;
        }
    }
    let (svc_shared, svc_ctl) = (shared.clone(), ctl.clone());
    let service = hyper::service::service_fn(move |req| {
        let shared = svc_shared.clone();
        let ctl = svc_ctl.clone();
        async move { Ok::<_, Infallible>(handle(req, shared, ctl).await) }
    });
    let conn = cfg.http.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            () = retire.asked() => {
                // HTTP/2: GOAWAY, in-flight streams still answered. HTTP/1.1: the response in
                // flight gets `Connection: close`, or an idle connection closes.
                conn.as_mut().graceful_shutdown();
                retire.begin();
            }
        }
    }
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    ctl: Arc<ConnCtl>,
) -> Response<FaultBody> {
    let (parts, mut body) = req.into_parts();
    let mut kept = Kept::new(&shared);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        if let Ok(data) = frame.into_data() {
            kept.add(&data);
        }
    }
    match answer(parts, kept.bytes.freeze(), kept.len, &shared, &ctl).await {
        Action::Respond(res) => *res,
        Action::Abort(a) => {
            match a {
                Abort::Reset => ctl.kill_now(true),
                Abort::Close => ctl.kill_now(false),
                Abort::Hang => {}
            }
            // The connection is dropped (reset, close) or left hanging until shutdown.
            shared.shutdown.fired().await;
            Response::new(FaultBody::empty(ctl))
        }
    }
}

/// What is kept of a request body while it arrives: its length, and its first bytes.
pub(super) struct Kept {
    pub(super) bytes: BytesMut,
    pub(super) len: u64,
    limit: usize,
}

impl Kept {
    pub(super) fn new(shared: &Shared) -> Self {
        Self {
            bytes: BytesMut::new(),
            len: 0,
            // A forwarding server keeps the whole body for the upstream; the capture is its
            // prefix.
            limit: match shared.upstream {
                Some(_) => usize::MAX,
                None => shared.capture_limit,
            },
        }
    }

    pub(super) fn add(&mut self, data: &[u8]) {
        self.len += data.len() as u64;
        let room = self.limit.saturating_sub(self.bytes.len());
        self.bytes.extend_from_slice(&data[..data.len().min(room)]);
    }
}

/// The reply to a request whose head is `parts` and whose body was `whole` (its first
/// bytes, as many as kept) of `body_len` bytes, on the connection `ctl` controls: the request
/// is captured and counted, its route's script picks the reply, the reply's delay and gate
/// are waited out. HTTP/1.1, HTTP/2 and HTTP/3 share it; each acts on an abort its own way.
pub(super) async fn answer(
    parts: http::request::Parts,
    whole: bytes::Bytes,
    body_len: u64,
    shared: &Shared,
    ctl: &Arc<ConnCtl>,
) -> Action {
    let mut req = CapturedRequest {
        method: parts.method,
        uri: parts.uri,
        version: parts.version,
        headers: parts.headers,
        body: whole.slice(..whole.len().min(shared.capture_limit)),
        body_len,
        connection: ctl.id,
        route: None,
    };
    let path = req.uri.path().to_owned();
    let matched = shared.route_for(&req);
    req.route = matched.map(|r| r.label.clone());
    let route = matched.unwrap_or(&shared.fallback);
    let hit = route.hits.fetch_add(1, Ordering::SeqCst);
    {
        let mut stats = shared.stats.lock();
        let s = stats.entry(path).or_default();
        s.hits += 1;
    }
    shared.received.lock().push(req.clone());
    shared.hit.notify_waiters();
    ctl.took_request().await;
    let mut reply = route.mock.script.pick(hit, &req);
    if let (true, Some(upstream)) = (reply.is_forward(), &shared.upstream) {
        let answer = upstream.forward(&req, whole).await;
        reply = reply.with_forwarded(answer, upstream.origin());
    }
    if let Some(d) = reply.delay_before_head() {
        tokio::time::sleep(d).await;
    }
    if let Some(gate) = reply.gate() {
        tokio::select! {
            () = gate.passed() => {}
            () = shared.shutdown.fired() => {}
        }
    }
    let cx = RenderCtx {
        origin: &shared.origin,
        authority: &shared.authority,
    };
    let mut action = reply.render(&req, &cx, ctl.clone());
    if let (Action::Respond(res), Some(alt_svc)) = (&mut action, &shared.alt_svc) {
        res.headers_mut()
            .entry(http::header::ALT_SVC)
            .or_insert_with(|| alt_svc.clone());
    }
    action
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("mock", &self.label)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exec")
    }
}

impl std::fmt::Debug for ConnCfg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnCfg").finish_non_exhaustive()
    }
}
