//! What every protocol a [`FaultServer`](super::FaultServer) serves shares: the server's
//! state ([`Shared`]: routes, captured requests, counters), the routes themselves, and the
//! handler that answers one request ([`answer`]) — used by hyper's HTTP/1.1 + HTTP/2 server
//! (`serve`), the `h2` crate's server that refuses streams (`h2_raw`) and HTTP/3 (`h3`).

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::capture::{CapturedRequest, PathStats};
use super::conn::ConnCtl;
use super::forward::Upstream;
use super::mock::Mock;
use super::reply::{Action, RenderCtx};
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
