//! The serving side of a [`FaultServer`](super::FaultServer): the accept loop, one task per
//! connection (TLS, then hyper's auto HTTP/1.1 + HTTP/2 server, or the `h2` crate's server
//! when streams are to be refused), and the request handler that captures a request, picks
//! its reply from the route's script and renders it.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::body::FaultBody;
use super::conn::{ConnCtl, CtlIo};
use super::h2_raw;
use super::handler::{answer, Kept, OpenConn, Shared};
use super::reply::{Abort, Action};
use super::retire::Retire;
use super::Protocol;
use crate::signal::Signal;

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
