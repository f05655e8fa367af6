//! The connection pool, on hyper's connection API: idle HTTP/1.1 connections and a shared
//! HTTP/2 connection per origin, the per-origin connection cap, and the request form each
//! connection needs.
//!
//! A request takes an idle connection (most recently used first) or, when there is none and
//! the cap has a slot free, opens one through the [`Connector`]. When the cap is full it waits
//! for whichever comes first: a connection another request gives back, or a slot freed by a
//! closing connection. An HTTP/1.1 connection goes back to the pool when its response body
//! ends or is dropped (hyper then drains the rest when it has arrived, or closes the
//! connection). An HTTP/2
//! connection is shared by every request to its origin. A connection idle for longer than the
//! idle timeout, or older than the maximum lifetime when one is set, takes no new request and
//! is closed by a reaper task, which runs only while connections are idle.
//!
//! Why not hyper-util's legacy client: per request, it hashes its `(Scheme, Authority)` key
//! with SipHash, boxes its request future, races its checkout against a lazy connect (which,
//! once started, finishes in a task of its own even when a pooled connection won) and spawns
//! a task that waits for the connection to be ready again; and it hides the connection from
//! the request, so the connect time had to come back through a task-local. Here a request
//! takes an idle connection under two short locks, gives it back from its response body, and
//! starts a connect only when it will use it.
//!
//! **No sender of a connection is kept while a request waits, nor once the connection
//! ended.** hyper hands a request to its connection task over a tokio channel whose receiver
//! that task drops when it ends (after a GOAWAY, say). A request sent at the moment the
//! receiver is dropped can land in the channel after the receiver emptied it; it is then
//! neither taken nor handed back until the channel itself is dropped, with its last sender. A
//! request whose future held a sender while waiting for its answer would wait for itself: a
//! stall until the first-byte timeout, with nothing sent (seen under load against a server
//! retiring its HTTP/2 connections). So an HTTP/2 request drops its clone of the shared
//! sender once the request is handed over, and the pool drops its own when the connection's
//! task ends; the channel then goes with the last short-lived clone, and the request comes
//! back unsent and goes on another connection. An HTTP/1.1 request holds its connection's
//! only sender, which it needs to give the connection back: it watches the connection while
//! it waits, and drops the sender if the connection closes first ([`watch_h1`]).

use std::{
    collections::VecDeque,
    fmt,
    future::Future,
    net::IpAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Weak,
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{
    header::HOST,
    uri::{Authority, Parts},
    HeaderValue, Request, Response, Uri,
};
use http_body::{Body, Frame, SizeHint};
use hyper::{
    body::Incoming,
    client::conn::{http1, http2},
};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use parking_lot::Mutex;
use soulbase_net_core::{GaugeReading, NetError, NetEvent, RetireReason};
use tokio::{
    sync::{oneshot, OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

use crate::connect::{Conn, Connector};
use crate::pruned::PrunedMap;

mod budget;

use self::budget::Candidate;
pub(crate) use self::budget::IdleBudget;

/// How a transport's pool behaves; from the client builder and the policy.
#[derive(Debug, Clone)]
pub(crate) struct PoolConfig {
    /// A connection idle this long is closed; zero keeps no idle connections.
    pub(crate) idle_timeout: Duration,
    /// The most idle HTTP/1.1 connections kept per origin.
    pub(crate) max_idle_per_origin: usize,
    /// A connection older than this takes no new request (`None`: no limit).
    pub(crate) max_lifetime: Option<Duration>,
    /// HTTP/2 connections are pinged at this interval, idle or not (`None`: never).
    pub(crate) keep_alive: Option<Duration>,
    /// The most connections open to one origin at once (`limits.per_host_concurrency`).
    pub(crate) per_origin_cap: usize,
    /// Speak HTTP/2 on every connection, without ALPN (`http2_prior_knowledge`).
    pub(crate) http2_only: bool,
    /// TLS offers `h2` by ALPN (`tls.http2`): an `https` origin may answer with HTTP/2.
    pub(crate) h2_alpn: bool,
    /// hyper's limit on response headers, when not its default.
    pub(crate) max_headers: Option<usize>,
    /// The most bytes of a response head (HTTP/1.1 read buffer, HTTP/2 header list).
    pub(crate) max_head_bytes: usize,
}

/// The pool of one transport.
pub(crate) struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    connector: Connector,
    cfg: PoolConfig,
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    origins: Mutex<Origins>,
    /// Whether a reaper task is running.
    reaping: AtomicBool,
    /// Dropped with the pool: a reaper asleep until its next pass ends at once instead.
    alive: tokio::sync::watch::Sender<()>,
    /// The client's budget of kept connections, which this pool's count toward.
    budget: Arc<IdleBudget>,
}

/// Origins by authority, one map per scheme (a lookup needs no key built). Origins without
/// connections are pruned in bulk (see [`PrunedMap`]): origins that keep connections stay.
struct Origins {
    http: PrunedMap<Arc<Origin>>,
    https: PrunedMap<Arc<Origin>>,
}

impl Default for Origins {
    fn default() -> Self {
        Self {
            http: PrunedMap::new(MAX_ORIGINS),
            https: PrunedMap::new(MAX_ORIGINS),
        }
    }
}

/// The request body the pool sends: any body of bytes, boxed (the pool owns this type; the
/// client builds its bodies to it).
pub(crate) type ReqBody =
    http_body_util::combinators::UnsyncBoxBody<Bytes, soulbase_net_core::BoxError>;

/// The shortest wait for the answer to an HTTP/2 keep-alive PING.
const KEEP_ALIVE_MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Origins without connections are pruned once a map holds this many.
const MAX_ORIGINS: usize = 4096;

/// How many times one request moves on after a pooled connection turned out closed before
/// it took the request (each time, that connection is discarded).
const MAX_STALE: usize = 8;

/// One origin's connections.
struct Origin {
    /// Whether it is an `https` origin (ALPN decides its protocol).
    https: bool,
    /// The `Host` header of HTTP/1.1 requests to this origin, made once.
    host: HeaderValue,
    /// Slots under the per-origin connection cap; each connection holds one for its life.
    cap: Arc<Semaphore>,
    /// Connections open now (their tasks running), for the gauge.
    open: Arc<AtomicUsize>,
    /// The host name its connections follow (see [`Follow`]); `None` for an IP literal.
    name: Option<Box<str>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Idle HTTP/1.1 connections; the most recently used last.
    idle: Vec<Idle>,
    /// The HTTP/2 connection requests share.
    h2: Option<SharedH2>,
    /// A connect that will (or, by ALPN, may) give HTTP/2 is under way; other requests wait
    /// for it rather than each opening a connection the first one would have served.
    h2_connecting: bool,
    /// What the last connect's ALPN said: HTTP/2 or not (`None` before the first).
    speaks_h2: Option<bool>,
    /// Requests waiting for a connection (given back, or a new HTTP/2 one).
    waiters: VecDeque<oneshot::Sender<Sender>>,
    /// The serial of the last HTTP/2 connection opened to this origin.
    h2_serial: u64,
    /// The origin's host name, as its connections follow it.
    dns: Follow,
}

/// Following the DNS answer of an origin's host name: every [`DNS_RECHECK`] while the origin
/// is used, the resolver is asked again (its cache answers until the record's TTL runs out,
/// then one lookup is made); a connection whose address is no longer in the answer takes no
/// new request and closes when its requests are done (as Envoy's strict DNS does). A move
/// is so followed within the record's TTL + [`DNS_RECHECK`], with no reconnection while the
/// answer stays the same.
#[derive(Default)]
struct Follow {
    /// The name's addresses at the last check (`None` before it: nothing has moved).
    answer: Option<Arc<[IpAddr]>>,
    /// When the next check is due; `None` while no connection follows the name.
    next: Option<Instant>,
    /// A check is under way.
    checking: bool,
}

impl Follow {
    /// Whether a connection to `peer` was opened to an address the name no longer has.
    fn moved(&self, peer: Option<IpAddr>) -> bool {
        match (peer, &self.answer) {
            (Some(peer), Some(answer)) => !answer.contains(&peer),
            _ => false,
        }
    }
}

/// How often an origin in use asks for its host name's answer again.
const DNS_RECHECK: Duration = Duration::from_secs(1);

struct Idle {
    tx: http1::SendRequest<ReqBody>,
    facts: Facts,
    /// When it became idle.
    since: Instant,
}

/// What the pool knows of an HTTP/1.1 connection, carried with it from use to use.
#[derive(Clone, Copy, Debug)]
struct Facts {
    /// Requests go to a proxy, in absolute form.
    proxied: bool,
    /// When it was opened.
    born: Instant,
    /// The address its host name resolved to when it was dialled (`None`: an IP literal or
    /// a proxy); the connection is retired when the name's answer no longer holds it.
    peer: Option<IpAddr>,
}

/// An origin's shared HTTP/2 connection.
struct SharedH2 {
    tx: http2::SendRequest<ReqBody>,
    /// Which of the origin's HTTP/2 connections it is, so that a request that learnt it is
    /// going away (GOAWAY) retires this one and not its successor.
    serial: u64,
    /// Requests on it now (a response body not yet ended counts): with none, it is idle.
    streams: Arc<AtomicUsize>,
    /// Whether the server has sent anything on it ([`Conn::heard`]).
    heard: Arc<AtomicBool>,
    /// As [`Facts::peer`].
    peer: Option<IpAddr>,
    /// When it was opened.
    born: Instant,
    /// When a request last took it.
    used: Instant,
}

/// A connection's sending half, as a request holds it.
enum Sender {
    H1 {
        tx: http1::SendRequest<ReqBody>,
        facts: Facts,
    },
    H2 {
        tx: http2::SendRequest<ReqBody>,
        /// The connection's [`SharedH2::serial`].
        serial: u64,
        /// This request, counted among the connection's streams until its body ends.
        stream: Stream,
        /// [`SharedH2::heard`].
        heard: Arc<AtomicBool>,
    },
}

/// One request counted among an HTTP/2 connection's [`SharedH2::streams`] while it lives.
struct Stream(Arc<AtomicUsize>);

impl Stream {
    fn new(streams: &Arc<AtomicUsize>) -> Self {
        streams.fetch_add(1, Ordering::Relaxed);
        Stream(streams.clone())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a request does after looking at its origin's state.
enum Next {
    Use(Sender),
    Connect(OwnedSemaphorePermit),
    Wait {
        rx: oneshot::Receiver<Sender>,
        /// Whether a freed slot under the cap may end the wait (not while an HTTP/2-only
        /// connect is under way: the others wait for that one).
        may_connect: bool,
    },
}

// === impl Pool ===

impl Pool {
    pub(crate) fn new(connector: Connector, cfg: PoolConfig, budget: Arc<IdleBudget>) -> Self {
        let mut h1 = http1::Builder::new();
        if let Some(max) = cfg.max_headers {
            h1.max_headers(max);
        }
        h1.max_buf_size(cfg.max_head_bytes.max(READ_BUF_MAX));
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(cfg.max_head_bytes).unwrap_or(u32::MAX));
        if let Some(every) = cfg.keep_alive {
            // A ping unanswered until the next one is due (at least a second, so that a busy
            // peer is not taken for a dead one) closes the connection.
            h2.keep_alive_interval(every)
                .keep_alive_timeout(every.max(KEEP_ALIVE_MIN_TIMEOUT))
                .keep_alive_while_idle(true);
        }
        let shared = Arc::new(Shared {
            connector,
            cfg,
            h1,
            h2,
            origins: Mutex::new(Origins::default()),
            reaping: AtomicBool::new(false),
            alive: tokio::sync::watch::Sender::new(()),
            budget,
        });
        shared.budget.register(&shared);
        Pool { shared }
    }

    /// Sends `req` (absolute URI) on a pooled or new connection. Returns the response and how
    /// long opening a connection for it took (zero when it used a pooled one).
    ///
    /// Not an `async fn`: its future would hold the request twice (as the argument and as
    /// the local it is moved into), and the request's 240 bytes would be in every caller's
    /// future too; an `async move` block uses the captured request in place.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn's future holds its arguments twice (see above)"
    )]
    pub(crate) fn send(
        &self,
        mut req: Request<ReqBody>,
    ) -> impl Future<Output = Result<(Response<PoolBody>, Duration), NetError>> + Send + '_ {
        async move {
            let shared = &self.shared;
            let origin = shared.origin(req.uri())?;
            let mut stale = 0;
            loop {
                let (sender, opened) = shared.checkout(&origin, req.uri()).await?;
                let reused = opened.is_none();
                let connect = opened.unwrap_or_default();
                let back = match sender {
                    Sender::H1 { mut tx, facts } => {
                        let proxied = facts.proxied;
                        req.headers_mut()
                            .entry(HOST)
                            .or_insert_with(|| origin.host.clone());
                        // The absolute form is not kept beside the request (this future would
                        // carry it on every request): the rare resend below builds it again.
                        if !proxied {
                            origin_form(req.uri_mut())?;
                        }
                        let sent = tx.try_send_request(req);
                        let (sent, tx) = watch_h1(sent, tx).await;
                        match sent {
                            Ok(res) if head_len(&res) > shared.cfg.max_head_bytes => {
                                // Dropped unread: hyper closes the connection.
                                return Err(NetError::new(soulbase_net_core::ErrorKind::TooLarge)
                                    .with_message("the response head is over the header limits"));
                            }
                            Ok(res) => {
                                let back = tx.map(|tx| GiveBack {
                                    shared: shared.clone(),
                                    origin: origin.clone(),
                                    tx,
                                    facts,
                                });
                                return Ok((PoolBody::wrap(res, back, None), connect));
                            }
                            Err(mut e) => match e.take_message() {
                                Some(mut unsent) if reused && stale < MAX_STALE => {
                                    if !proxied {
                                        let absolute = absolute_form(&origin, unsent.uri())?;
                                        *unsent.uri_mut() = absolute;
                                    }
                                    unsent
                                }
                                Some(_) => return Err(unwritten(e.into_error())),
                                None => return Err(crate::classify::send_error(e.into_error())),
                            },
                        }
                    }
                    Sender::H2 {
                        mut tx,
                        serial,
                        stream,
                        heard,
                    } => {
                        // Read before the request goes (see `going_away`).
                        let complete_in_head = !is_idempotent(req.method())
                            && http_body::Body::is_end_stream(req.body());
                        // Our clone of the sender goes before the wait (see the module docs).
                        let sent = tx.try_send_request(req);
                        drop(tx);
                        match sent.await {
                            Ok(res) => {
                                return Ok((PoolBody::wrap(res, None, Some(stream)), connect));
                            }
                            Err(mut e) => match e.take_message() {
                                Some(unsent) if reused && stale < MAX_STALE => unsent,
                                Some(_) => return Err(unwritten(e.into_error())),
                                None => {
                                    let e = e.into_error();
                                    if !heard.load(Ordering::Acquire)
                                        && crate::classify::connection_io(&e)
                                    {
                                        // The server sent nothing, not even its SETTINGS:
                                        // it processed no stream of this connection (an
                                        // nginx worker exiting on reload closes a fresh
                                        // connection so).
                                        shared.retire_h2(&origin, serial);
                                        return Err(crate::classify::not_processed(
                                            "the connection closed before the server sent \
                                             anything: it processed nothing",
                                        )
                                        .with_source(e));
                                    }
                                    if !going_away(&e) {
                                        return Err(crate::classify::send_error(e));
                                    }
                                    // No new stream goes on it: the next request dials a
                                    // replacement while the old one finishes what it took.
                                    shared.retire_h2(&origin, serial);
                                    if complete_in_head {
                                        return Err(NetError::new(
                                            soulbase_net_core::ErrorKind::Io,
                                        )
                                        .with_message(
                                            "the server is closing the connection (GOAWAY); \
                                             the request may have been processed",
                                        )
                                        .with_source(e));
                                    }
                                    return Err(crate::classify::send_error(e));
                                }
                            },
                        }
                    }
                };
                // A pooled connection closed before it took the request: nothing was sent, so
                // the request goes on another connection.
                tracing::trace!("pooled connection closed before it took the request");
                stale += 1;
                req = back;
            }
        }
    }
}

impl Pool {
    /// Opens (or finds) a connection to the origin of `uri` without sending anything on it;
    /// an HTTP/1.1 one goes back to the pool idle. The TCP side of an `h3-or-tcp` race.
    #[cfg(feature = "http3")]
    pub(crate) async fn warm(&self, uri: &Uri) -> Result<(), NetError> {
        let shared = &self.shared;
        let origin = shared.origin(uri)?;
        let (sender, _) = shared.checkout(&origin, uri).await?;
        if let Sender::H1 { tx, facts } = sender {
            shared.give_back(&origin, tx, facts);
        }
        Ok(())
    }

    /// Reports, per origin, the connections open (in use, idle or opening: the slots taken
    /// under the cap) and the idle ones (HTTP/1.1 ones in the idle list, and the shared
    /// HTTP/2 connection when no request is on it), labelled by host.
    pub(crate) fn read_gauges(&self, visit: &mut dyn FnMut(GaugeReading<'_>)) {
        let origins = self.shared.origins.lock();
        for (authority, origin) in origins.http.map.iter().chain(origins.https.map.iter()) {
            let host = authority_host(authority);
            let open = origin.open.load(Ordering::Relaxed);
            // A connection the server closed stays in the list until the next checkout or
            // reaper pass; it is neither open nor idle.
            let state = origin.state.lock();
            let idle = (state.idle.iter()).filter(|i| !i.tx.is_closed()).count()
                + usize::from(state.h2.as_ref().is_some_and(SharedH2::is_idle));
            drop(state);
            visit(GaugeReading::PoolOpen {
                host,
                value: open as u64,
            });
            visit(GaugeReading::PoolIdle {
                host,
                value: idle as u64,
            });
        }
    }
}

/// The host of an authority (`host`, `host:port`, `[v6]:port`), without brackets.
fn authority_host(authority: &str) -> &str {
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host)
}

impl Drop for Shared {
    /// The pool's kept connections close with it: they leave the client's budget.
    fn drop(&mut self) {
        let origins = self.origins.get_mut();
        let kept: usize = (origins.http.map.values().chain(origins.https.map.values()))
            .map(|origin| {
                let state = origin.state.lock();
                state.idle.len() + usize::from(state.h2.is_some())
            })
            .sum();
        self.budget.sub(kept);
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("cfg", &self.shared.cfg)
            .finish_non_exhaustive()
    }
}

// === impl Shared ===

impl Shared {
    /// The origin of `uri`, made on first use.
    fn origin(&self, uri: &Uri) -> Result<Arc<Origin>, NetError> {
        let https = crate::connect::is_https(uri)?;
        let authority = uri
            .authority()
            .ok_or_else(|| NetError::invalid_request("url has no host"))?;
        let mut origins = self.origins.lock();
        let origins = if https {
            &mut origins.https
        } else {
            &mut origins.http
        };
        if let Some(origin) = origins.map.get(authority.as_str()) {
            return Ok(origin.clone());
        }
        let cap = self.cfg.per_origin_cap.max(1);
        origins.make_room(|origin| !origin.is_empty(cap));
        let map = &mut origins.map;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let origin = Arc::new(Origin {
            https,
            host: host_header(authority, https)?,
            cap: Arc::new(Semaphore::new(self.cfg.per_origin_cap.max(1))),
            open: Arc::default(),
            name: host.parse::<IpAddr>().is_err().then(|| host.into()),
            state: Mutex::new(State::default()),
        });
        map.insert(authority.as_str().into(), origin.clone());
        Ok(origin)
    }

    /// A connection ready for a request, and how long opening it took when it was opened
    /// for this request.
    async fn checkout(
        self: &Arc<Self>,
        origin: &Arc<Origin>,
        uri: &Uri,
    ) -> Result<(Sender, Option<Duration>), NetError> {
        loop {
            let (next, check_dns) = self.next(origin);
            if check_dns {
                self.follow_dns(origin);
            }
            match next {
                Next::Use(mut sender) => {
                    if sender.ready().await {
                        return Ok((sender, None));
                    }
                    // Closed while idle: dropped; look again.
                }
                Next::Connect(permit) => {
                    let (sender, took) = Box::pin(self.open(origin, uri, permit)).await?;
                    return Ok((sender, Some(took)));
                }
                // Rare (the cap is full): boxed, so that the common path's future stays small.
                Next::Wait { rx, may_connect } => {
                    if let Some(found) = Box::pin(self.wait(origin, uri, rx, may_connect)).await? {
                        return Ok(found);
                    }
                }
            }
        }
    }

    /// Waits for a connection given back, or (when `may_connect`) a slot freed under the
    /// cap, then opens one; `None` when the request should look again.
    async fn wait(
        self: &Arc<Self>,
        origin: &Arc<Origin>,
        uri: &Uri,
        mut rx: oneshot::Receiver<Sender>,
        may_connect: bool,
    ) -> Result<Option<(Sender, Option<Duration>)>, NetError> {
        let acquire = origin.cap.clone().acquire_owned();
        tokio::pin!(acquire);
        let got = std::future::poll_fn(|cx| {
            if let Poll::Ready(got) = Pin::new(&mut rx).poll(cx) {
                return Poll::Ready(Ok(got));
            }
            if may_connect {
                if let Poll::Ready(Ok(permit)) = acquire.as_mut().poll(cx) {
                    return Poll::Ready(Err(permit));
                }
            }
            Poll::Pending
        })
        .await;
        match got {
            Ok(Ok(mut sender)) => Ok(sender.ready().await.then_some((sender, None))),
            // The connect this request waited for failed: look again.
            Ok(Err(_)) => Ok(None),
            Err(permit) => {
                // A connection given back meanwhile goes back to the pool.
                rx.close();
                if let Ok(Sender::H1 { tx, facts }) = rx.try_recv() {
                    self.give_back(origin, tx, facts);
                }
                {
                    // As in `next`: the others wait for this connect when it may give HTTP/2.
                    let mut state = origin.state.lock();
                    state.h2_connecting = self.expects_h2(origin, &state);
                }
                let (sender, took) = self.open(origin, uri, permit).await?;
                Ok(Some((sender, Some(took))))
            }
        }
    }

    /// Looks at the origin's state once, under its lock; and says whether the origin's host
    /// name is due to be checked (see [`Follow`]).
    fn next(&self, origin: &Origin) -> (Next, bool) {
        let mut state = origin.state.lock();
        let now = Instant::now();
        let check_dns = !state.dns.checking && state.dns.next.is_some_and(|at| now >= at);
        if check_dns {
            state.dns.checking = true;
        }
        (self.next_locked(origin, &mut state, now), check_dns)
    }

    /// [`Shared::next`] under the origin's lock. Connections whose address the name no
    /// longer has were taken out when the answer changed (see [`Shared::follow_dns`]).
    fn next_locked(&self, origin: &Origin, state: &mut State, now: Instant) -> Next {
        if let Some(h2) = &mut state.h2 {
            if !h2.tx.is_closed() && !self.too_old(h2.born, now) {
                h2.used = now;
                return Next::Use(Sender::H2 {
                    tx: h2.tx.clone(),
                    serial: h2.serial,
                    stream: Stream::new(&h2.streams),
                    heard: h2.heard.clone(),
                });
            }
            self.set_h2(state, None);
        }
        while let Some(idle) = self.pop_idle(state) {
            if idle.tx.is_closed()
                || now.saturating_duration_since(idle.since) >= self.cfg.idle_timeout
                || self.too_old(idle.facts.born, now)
            {
                continue;
            }
            return Next::Use(Sender::H1 {
                tx: idle.tx,
                facts: idle.facts,
            });
        }
        let connecting = state.h2_connecting;
        if !connecting {
            if let Ok(permit) = origin.cap.clone().try_acquire_owned() {
                state.h2_connecting = self.expects_h2(origin, state);
                return Next::Connect(permit);
            }
        }
        // Waiters that gave up (their request was dropped) go before a new one joins.
        state.waiters.retain(|w| !w.is_closed());
        let (tx, rx) = oneshot::channel();
        state.waiters.push_back(tx);
        Next::Wait {
            rx,
            may_connect: !connecting,
        }
    }

    /// Whether a connect to `origin` will or may give HTTP/2 — prior knowledge, or an `https`
    /// origin offered `h2` by ALPN that has not answered with HTTP/1.1 — so that the requests
    /// arriving meanwhile wait for it instead of each opening a connection (a burst of 256
    /// callers to a new HTTP/2 origin opened 256 connections, of which one was needed).
    fn expects_h2(&self, origin: &Origin, state: &State) -> bool {
        self.cfg.http2_only || (origin.https && self.cfg.h2_alpn && state.speaks_h2 != Some(false))
    }

    /// Opens a connection to `origin` under `permit`.
    async fn open(
        self: &Arc<Self>,
        origin: &Arc<Origin>,
        uri: &Uri,
        permit: OwnedSemaphorePermit,
    ) -> Result<(Sender, Duration), NetError> {
        // Whatever happens to this connect (failure, or the request dropped), waiters for an
        // HTTP/2-only connect are told to look again.
        let connecting = Connecting {
            origin,
            h2: self.cfg.http2_only || (origin.https && self.cfg.h2_alpn),
        };
        let started = Instant::now();
        let mut conn = self.connector.connect(uri, permit).await?;
        let peer = conn.follows();
        if peer.is_some() {
            let mut state = origin.state.lock();
            state.dns.next.get_or_insert(started + DNS_RECHECK);
        }
        if origin.https {
            // Remembered for the next connect; an HTTP/1.1 answer frees the waiters (when
            // `connecting` ends) to open connections of their own.
            origin.state.lock().speaks_h2 = Some(conn.is_h2());
        }
        if self.cfg.http2_only || conn.is_h2() {
            let heard = conn.heard();
            let (tx, connection) = self
                .h2
                .handshake::<Conn, ReqBody>(conn)
                .await
                .map_err(crate::classify::send_error)?;
            let now = Instant::now();
            let mut state = origin.state.lock();
            state.h2_serial += 1;
            let serial = state.h2_serial;
            // When its task ends, the connection leaves the pool at once, not at the next
            // checkout: the pool's sender must not outlive it (see the module docs).
            let (pool, of) = (Arc::downgrade(self), Arc::downgrade(origin));
            spawn_connection(connection, origin.open.clone(), move || {
                if let (Some(pool), Some(origin)) = (pool.upgrade(), of.upgrade()) {
                    pool.forget_h2(&origin, serial);
                }
            });
            let streams = Arc::new(AtomicUsize::new(0));
            let h2 = SharedH2 {
                tx: tx.clone(),
                serial,
                streams: streams.clone(),
                heard: heard.clone(),
                peer,
                born: now,
                used: now,
            };
            self.set_h2(&mut state, Some(h2));
            state.h2_connecting = false;
            for waiter in state.waiters.drain(..) {
                let _ = waiter.send(Sender::H2 {
                    tx: tx.clone(),
                    serial,
                    stream: Stream::new(&streams),
                    heard: heard.clone(),
                });
            }
            drop(state);
            drop(connecting);
            self.start_reaper();
            self.keep_budget();
            let stream = Stream::new(&streams);
            let sender = Sender::H2 {
                tx,
                serial,
                stream,
                heard,
            };
            Ok((sender, started.elapsed()))
        } else {
            let proxied = conn.is_proxied();
            let (tx, connection) = self
                .h1
                .handshake::<Conn, ReqBody>(conn)
                .await
                .map_err(crate::classify::send_error)?;
            spawn_connection(connection, origin.open.clone(), || {});
            drop(connecting);
            let sender = Sender::H1 {
                tx,
                facts: Facts {
                    proxied,
                    born: Instant::now(),
                    peer,
                },
            };
            Ok((sender, started.elapsed()))
        }
    }

    /// Gives a connection back: to the first request still waiting, else to the idle list.
    fn give_back(self: &Arc<Self>, origin: &Origin, tx: http1::SendRequest<ReqBody>, facts: Facts) {
        let now = Instant::now();
        if tx.is_closed() || self.too_old(facts.born, now) {
            return;
        }
        let mut sender = Sender::H1 { tx, facts };
        let mut state = origin.state.lock();
        if state.dns.moved(facts.peer) {
            drop(state);
            self.retired(origin, RetireReason::DnsMoved, 1);
            return;
        }
        while let Some(waiter) = state.waiters.pop_front() {
            match waiter.send(sender) {
                Ok(()) => return,
                Err(back) => sender = back,
            }
        }
        if self.cfg.idle_timeout.is_zero() || state.idle.len() >= self.cfg.max_idle_per_origin {
            return;
        }
        if let Sender::H1 { tx, facts } = sender {
            self.push_idle(
                &mut state,
                Idle {
                    tx,
                    facts,
                    since: now,
                },
            );
        }
        drop(state);
        self.start_reaper();
        self.keep_budget();
    }

    /// Sets the origin's shared HTTP/2 connection, counting it in the budget.
    fn set_h2(&self, state: &mut State, h2: Option<SharedH2>) {
        match (state.h2.is_some(), h2.is_some()) {
            (false, true) => self.budget.add(1),
            (true, false) => self.budget.sub(1),
            _ => {}
        }
        state.h2 = h2;
    }

    /// Takes the most recently used idle HTTP/1.1 connection of the origin.
    fn pop_idle(&self, state: &mut State) -> Option<Idle> {
        let idle = state.idle.pop();
        if idle.is_some() {
            self.budget.sub(1);
        }
        idle
    }

    /// Keeps `idle` as the origin's most recently used idle HTTP/1.1 connection.
    fn push_idle(&self, state: &mut State, idle: Idle) {
        state.idle.push(idle);
        self.budget.add(1);
    }

    /// Keeps the idle HTTP/1.1 connections of the origin for which `keep` says so; returns
    /// how many went.
    fn retain_idle(&self, state: &mut State, keep: impl FnMut(&Idle) -> bool) -> usize {
        let before = state.idle.len();
        state.idle.retain(keep);
        let gone = before - state.idle.len();
        self.budget.sub(gone);
        gone
    }

    /// Evicts the least recently used idle connections when the client keeps more than its
    /// budget allows (see [`IdleBudget`]).
    fn keep_budget(&self) {
        if self.budget.over() {
            self.budget.evict();
        }
    }

    /// The idle connections of this pool that the budget may evict: every idle HTTP/1.1
    /// connection, and each HTTP/2 one with no request on it.
    fn idle_candidates(self: &Arc<Self>, out: &mut Vec<Candidate>) {
        let origins = self.origins.lock();
        for origin in origins.http.map.values().chain(origins.https.map.values()) {
            let state = origin.state.lock();
            for idle in &state.idle {
                out.push(Candidate {
                    since: idle.since,
                    pool: self.clone(),
                    origin: origin.clone(),
                    h2: None,
                });
            }
            if let Some(h2) = state.h2.as_ref().filter(|h2| h2.is_idle()) {
                out.push(Candidate {
                    since: h2.used,
                    pool: self.clone(),
                    origin: origin.clone(),
                    h2: Some(h2.serial),
                });
            }
        }
    }

    /// Evicts the origin's oldest idle HTTP/1.1 connection (`h2` is `None`), or its HTTP/2
    /// connection `h2` if it still has no request on it.
    fn evict(&self, origin: &Origin, h2: Option<u64>) {
        let mut state = origin.state.lock();
        let evicted = match h2 {
            None if !state.idle.is_empty() => {
                state.idle.remove(0);
                self.budget.sub(1);
                true
            }
            None => false,
            Some(serial) => {
                let idle =
                    (state.h2.as_ref()).is_some_and(|h2| h2.serial == serial && h2.is_idle());
                if idle {
                    self.set_h2(&mut state, None);
                }
                idle
            }
        };
        drop(state);
        if evicted {
            self.retired(origin, RetireReason::IdleBudget, 1);
        }
    }

    /// Reports `n` connections of `origin` retired for `reason`.
    fn retired(&self, origin: &Origin, reason: RetireReason, n: usize) {
        let host = origin.host.to_str().unwrap_or("");
        for _ in 0..n {
            self.connector
                .observer()
                .on_event(&NetEvent::ConnectionRetired { host, reason });
        }
    }

    /// Asks for the origin's host name again (see [`Follow`]), in a task of its own: when the
    /// answer no longer holds the address a pooled connection went to, that connection takes
    /// no new request (idle ones close now, busy ones when given back, the HTTP/2 one when
    /// its streams are done). A failed lookup changes nothing.
    fn follow_dns(self: &Arc<Self>, origin: &Arc<Origin>) {
        let (Some(name), Ok(runtime)) = (
            origin.name.as_deref(),
            tokio::runtime::Handle::try_current(),
        ) else {
            origin.state.lock().dns.checking = false;
            return;
        };
        let name: Arc<str> = name.into();
        let (shared, origin) = (self.clone(), origin.clone());
        runtime.spawn(async move {
            let answer = shared.connector.answer(&name).await;
            let moved = {
                let mut guard = origin.state.lock();
                let state = &mut *guard;
                state.dns.checking = false;
                state.dns.next = Some(Instant::now() + DNS_RECHECK);
                let Ok(answer) = answer else { return };
                state.dns.answer = Some(answer);
                let dns = &state.dns;
                let h2_moved = state.h2.as_ref().is_some_and(|h2| dns.moved(h2.peer));
                let before = state.idle.len();
                state.idle.retain(|idle| !dns.moved(idle.facts.peer));
                let gone = before - state.idle.len();
                shared.budget.sub(gone);
                if h2_moved {
                    shared.set_h2(state, None);
                }
                gone + usize::from(h2_moved)
            };
            if moved > 0 {
                shared.retired(&origin, RetireReason::DnsMoved, moved);
            }
        });
    }

    /// Takes the origin's HTTP/2 connection `serial` out of the pool (it is going away): it
    /// finishes the streams it has, and the next request opens another.
    fn retire_h2(&self, origin: &Origin, serial: u64) {
        let mut state = origin.state.lock();
        if state.h2.as_ref().is_some_and(|h2| h2.serial == serial) {
            self.set_h2(&mut state, None);
            drop(state);
            self.retired(origin, RetireReason::GoAway, 1);
        }
    }

    /// Takes the origin's HTTP/2 connection `serial` out of the pool, without an event: its
    /// task has ended (the server closed it, or it finished draining).
    fn forget_h2(&self, origin: &Origin, serial: u64) {
        let mut state = origin.state.lock();
        if state.h2.as_ref().is_some_and(|h2| h2.serial == serial) {
            self.set_h2(&mut state, None);
        }
    }

    /// Whether a connection opened at `born` is past the maximum lifetime at `now`.
    fn too_old(&self, born: Instant, now: Instant) -> bool {
        self.cfg
            .max_lifetime
            .is_some_and(|max| now.saturating_duration_since(born) >= max)
    }

    /// Starts the reaper unless it runs: every idle timeout (or maximum lifetime, when
    /// shorter) it closes connections idle for longer or past their lifetime, and it stops
    /// when none are left idle.
    fn start_reaper(self: &Arc<Self>) {
        if self.reaping.load(Ordering::Relaxed) || self.reaping.swap(true, Ordering::AcqRel) {
            return;
        }
        // Outside a runtime (a response dropped after its runtime ended) there is nothing to
        // run it on; the connections then close when the pool is dropped.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.reaping.store(false, Ordering::Release);
            return;
        };
        let lifetime = self.cfg.max_lifetime.unwrap_or(Duration::MAX);
        let every = self
            .cfg
            .idle_timeout
            .min(lifetime)
            .max(Duration::from_millis(10));
        let pool: Weak<Shared> = Arc::downgrade(self);
        let mut alive = self.alive.subscribe();
        runtime.spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    // The pool was dropped (a reload replaced its policy): nothing to reap.
                    Err(_) = alive.changed() => return,
                }
                let Some(shared) = pool.upgrade() else { return };
                if shared.reap() {
                    continue;
                }
                shared.reaping.store(false, Ordering::Release);
                // A connection given back while this pass stopped found the flag still set.
                if !shared.reap() || shared.reaping.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
        });
    }

    /// Closes connections idle past the timeout and forgets origins with no connections.
    /// Returns whether any connection is still kept.
    fn reap(&self) -> bool {
        let now = Instant::now();
        let timeout = self.cfg.idle_timeout;
        let cap = self.cfg.per_origin_cap.max(1);
        let mut kept = false;
        let mut origins = self.origins.lock();
        let origins = &mut *origins;
        for map in [&mut origins.http.map, &mut origins.https.map] {
            map.retain(|_, origin| {
                let mut state = origin.state.lock();
                self.retain_idle(&mut state, |idle| {
                    !idle.tx.is_closed()
                        && now.saturating_duration_since(idle.since) < timeout
                        && !self.too_old(idle.facts.born, now)
                });
                if let Some(h2) = &state.h2 {
                    if h2.tx.is_closed()
                        || (h2.is_idle() && now.saturating_duration_since(h2.used) >= timeout)
                        || self.too_old(h2.born, now)
                    {
                        self.set_h2(&mut state, None);
                    }
                }
                state.waiters.retain(|w| !w.is_closed());
                kept |= !state.idle.is_empty() || state.h2.is_some();
                drop(state);
                !origin.is_empty(cap)
            });
        }
        kept
    }
}

// === impl Origin ===

impl Origin {
    /// Whether the origin has no connections, kept or in use, and nobody waiting.
    fn is_empty(&self, cap: usize) -> bool {
        let state = self.state.lock();
        state.idle.is_empty()
            && state.h2.is_none()
            && !state.h2_connecting
            && state.waiters.is_empty()
            && self.cap.available_permits() == cap
    }
}

/// Clears an HTTP/2-only connect's mark when it ends, however it ends; the requests waiting
/// for it are told to look again (a successful connect has already served them).
struct Connecting<'a> {
    origin: &'a Origin,
    h2: bool,
}

impl Drop for Connecting<'_> {
    fn drop(&mut self) {
        if !self.h2 {
            return;
        }
        let mut state = self.origin.state.lock();
        if state.h2_connecting {
            state.h2_connecting = false;
            state.waiters.clear();
        }
    }
}

// === impl SharedH2 ===

impl SharedH2 {
    /// Open with no request on it: what the idle gauge counts.
    fn is_idle(&self) -> bool {
        !self.tx.is_closed() && self.streams.load(Ordering::Relaxed) == 0
    }
}

// === impl Sender ===

impl Sender {
    /// Waits until the connection can take a request; false when it closed.
    async fn ready(&mut self) -> bool {
        match self {
            Sender::H1 { tx, .. } => tx.is_ready() || tx.ready().await.is_ok(),
            Sender::H2 { tx, .. } => tx.is_ready() || tx.ready().await.is_ok(),
        }
    }
}

/// Runs a connection until it closes, counted in `open` meanwhile; `ended` runs once it has
/// closed (its future dropped).
fn spawn_connection<F>(connection: F, open: Arc<AtomicUsize>, ended: impl FnOnce() + Send + 'static)
where
    F: std::future::Future<Output = hyper::Result<()>> + Send + 'static,
{
    open.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
        // Before the gauge says it is closed: once it does, the pool has let it go.
        ended();
        open.fetch_sub(1, Ordering::Relaxed);
    });
}

/// Waits for the answer to a request handed to the HTTP/1.1 connection `tx`, and gives `tx`
/// back unless the connection closed meanwhile. A request that hyper's channel caught as the
/// connection ended (see the module docs) is handed back only when its last sender is gone,
/// and `tx` is the only one: so when the connection says it closed, `tx` is dropped and the
/// wait goes on for the request to come back.
async fn watch_h1<F: Future>(
    sent: F,
    tx: http1::SendRequest<ReqBody>,
) -> (F::Output, Option<http1::SendRequest<ReqBody>>) {
    let mut sent = std::pin::pin!(sent);
    let mut tx = Some(tx);
    let out = std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = sent.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        // Pending until the connection wants a request again (after this one's answer) or
        // closes; ready with an error only when it closed.
        let closed = tx
            .as_mut()
            .is_some_and(|t| matches!(t.poll_ready(cx), Poll::Ready(Err(_))));
        if closed {
            // The channel goes with `tx`, handing back a request it still held; the poll
            // above registered for its answer.
            tx = None;
        }
        Poll::Pending
    })
    .await;
    (out, tx)
}

/// Whether `method` is idempotent by definition (RFC 9110 §9.2.2).
fn is_idempotent(method: &http::Method) -> bool {
    use http::Method;
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The error of a request the connection handed back unwritten (it closed first) when it
/// cannot go on another one: the server never saw it.
fn unwritten(e: hyper::Error) -> NetError {
    crate::classify::not_processed("the connection closed before the request was written")
        .with_source(e)
}

/// Whether `e` says the HTTP/2 connection is going away (the server sent GOAWAY).
///
/// hyper fails a request with the GOAWAY in three cases: its stream was above the frame's
/// last stream id (h2 fails those streams, which the server ignored), the frame had arrived
/// before the request was handed to h2 (nothing sent), or the frame arrived while hyper was
/// handing it over — just after the stream's HEADERS were queued, which then may reach a
/// server whose first GOAWAY did not cut them off (the two-GOAWAY shutdown of RFC 9113
/// §6.8). In that last case hyper drops the stream at once, so its body is never sent: a
/// request with content arrives incomplete and cannot be processed, but a request whose
/// head is the whole of it may be. So a GOAWAY is taken for "not processed" except for a
/// request that is complete in its head and not idempotent (a POST without a body): that
/// one fails as `Io`, and the retry rules for non-idempotent requests apply.
fn going_away(e: &hyper::Error) -> bool {
    crate::classify::remote_h2(e).is_some_and(h2::Error::is_go_away)
}

/// The most an HTTP/1.1 connection reads at once, and so the largest response head it can
/// parse: hyper's own default (8 KiB + 100 × 4 KiB), or the head limit when that is larger.
/// hyper grows its reads toward it, so a large body arrives in a few large frames rather than
/// many small ones (with a 64 KiB buffer a 1 MiB body took 16 reads, frames and buffer
/// splits). The head limit itself is checked on the parsed head ([`head_len`]).
const READ_BUF_MAX: usize = 8192 + 4096 * 100;

/// The size of an HTTP/1.1 response head as it came, near enough: a status line without its
/// reason phrase, each field as `name: value` and CRLF, and the blank line.
fn head_len<B>(res: &Response<B>) -> usize {
    const STATUS_LINE: usize = "HTTP/1.1 200 \r\n".len();
    let fields: usize = res
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    STATUS_LINE + fields + 2
}

/// The `Host` header for `authority`: its host, and its port unless it is the scheme's
/// default (RFC 9110 §7.2); userinfo never (the request was validated without it).
fn host_header(authority: &Authority, https: bool) -> Result<HeaderValue, NetError> {
    let default_port = if https { 443 } else { 80 };
    let host = match authority.port_u16() {
        Some(port) if port != default_port => format!("{}:{port}", authority.host()),
        _ => authority.host().to_owned(),
    };
    HeaderValue::try_from(host).map_err(|e| {
        NetError::invalid_request(format!("`{authority}` is not a valid Host header"))
            .with_source(e)
    })
}

/// The absolute form of `path` (an origin-form target) at `origin`: what [`origin_form`]
/// took away, for a request that goes again on another connection.
fn absolute_form(origin: &Origin, path: &Uri) -> Result<Uri, NetError> {
    let mut parts = Parts::default();
    parts.scheme = Some(if origin.https {
        http::uri::Scheme::HTTPS
    } else {
        http::uri::Scheme::HTTP
    });
    parts.authority =
        Some(Authority::try_from(origin.host.as_bytes()).map_err(|e| {
            NetError::invalid_request("the origin is not an authority").with_source(e)
        })?);
    parts.path_and_query = path.path_and_query().cloned();
    Uri::from_parts(parts).map_err(|e| {
        NetError::invalid_request("url path is not a valid request target").with_source(e)
    })
}

/// Puts `uri` in origin form (path and query) for a direct HTTP/1.1 connection; returns the
/// absolute form it had.
fn origin_form(uri: &mut Uri) -> Result<Uri, NetError> {
    let origin_form = match uri.path_and_query() {
        Some(path) if path.as_str() != "/" => {
            let mut parts = Parts::default();
            parts.path_and_query = Some(path.clone());
            Uri::from_parts(parts).map_err(|e| {
                NetError::invalid_request("url path is not a valid request target").with_source(e)
            })?
        }
        _ => Uri::from_static("/"),
    };
    Ok(std::mem::replace(uri, origin_form))
}

/// Gives an HTTP/1.1 connection back to the pool once its response was read to the end.
struct GiveBack {
    shared: Arc<Shared>,
    origin: Arc<Origin>,
    tx: http1::SendRequest<ReqBody>,
    facts: Facts,
}

impl GiveBack {
    fn give(self) {
        self.shared.give_back(&self.origin, self.tx, self.facts);
    }
}

/// A response body from the pool: gives its HTTP/1.1 connection back when it ends or is
/// dropped. hyper drains what is left of a dropped body when it has already arrived, and
/// closes the connection otherwise; the request that takes the connection next waits for
/// one or the other (a closed one is discarded). After an error the connection is not
/// given back.
pub(crate) struct PoolBody {
    inner: Wire,
    back: Option<GiveBack>,
    /// An HTTP/2 response's stream, counted on its connection until the body ends.
    stream: Option<Stream>,
}

/// Where a response body comes from.
enum Wire {
    /// An HTTP/1.1 or HTTP/2 connection.
    Hyper(Incoming),
    /// An HTTP/3 stream (its connection is the h3 pool's, never given back here).
    #[cfg(feature = "http3")]
    H3(Box<crate::h3::H3Body>),
}

impl PoolBody {
    fn wrap(
        res: Response<Incoming>,
        back: Option<GiveBack>,
        stream: Option<Stream>,
    ) -> Response<PoolBody> {
        res.map(|inner| {
            let mut body = PoolBody {
                inner: Wire::Hyper(inner),
                back,
                stream,
            };
            if body.is_end_stream() {
                body.give_back();
            }
            body
        })
    }

    /// The body of an HTTP/3 response.
    #[cfg(feature = "http3")]
    pub(crate) fn h3(body: crate::h3::H3Body) -> PoolBody {
        PoolBody {
            inner: Wire::H3(Box::new(body)),
            back: None,
            stream: None,
        }
    }

    fn give_back(&mut self) {
        if let Some(back) = self.back.take() {
            back.give();
        }
        self.stream = None;
    }
}

impl Body for PoolBody {
    type Data = Bytes;
    type Error = soulbase_net_core::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = match &mut self.inner {
            Wire::Hyper(inner) => Pin::new(inner).poll_frame(cx).map_err(Into::into),
            #[cfg(feature = "http3")]
            Wire::H3(inner) => inner.poll_frame(cx).map_err(Into::into),
        };
        match &polled {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Ok(_))) if self.is_end_stream() => self.give_back(),
            // A broken body leaves the connection broken.
            Poll::Ready(Some(Err(_))) => {
                self.back = None;
                self.stream = None;
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Wire::Hyper(inner) => inner.is_end_stream(),
            #[cfg(feature = "http3")]
            Wire::H3(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Wire::Hyper(inner) => inner.size_hint(),
            #[cfg(feature = "http3")]
            Wire::H3(_) => SizeHint::default(),
        }
    }
}

impl Drop for PoolBody {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl fmt::Debug for PoolBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBody")
            .field("pooled", &self.back.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_measured_as_it_came_on_the_wire() {
        let res = Response::builder()
            .header("content-length", "2")
            .header("x-a", "bc")
            .body(())
            .unwrap();
        // "HTTP/1.1 200 \r\n", "content-length: 2\r\n", "x-a: bc\r\n", "\r\n"
        assert_eq!(head_len(&res), 15 + 19 + 9 + 2);
    }

    #[test]
    fn the_host_header_carries_the_port_only_when_it_is_not_the_default() {
        let host = |authority: &str, https: bool| {
            let authority: Authority = authority.parse().unwrap();
            host_header(&authority, https).unwrap()
        };
        assert_eq!(host("api.example.com", true), "api.example.com");
        assert_eq!(host("api.example.com:443", true), "api.example.com");
        assert_eq!(host("api.example.com:80", true), "api.example.com:80");
        assert_eq!(host("api.example.com:80", false), "api.example.com");
        assert_eq!(host("127.0.0.1:8080", false), "127.0.0.1:8080");
        assert_eq!(host("[::1]:8443", true), "[::1]:8443");
        assert_eq!(host("[::1]", true), "[::1]");
    }

    #[test]
    fn hosts_of_authorities_lose_port_and_brackets() {
        assert_eq!(authority_host("api.example.com"), "api.example.com");
        assert_eq!(authority_host("api.example.com:8443"), "api.example.com");
        assert_eq!(authority_host("127.0.0.1:80"), "127.0.0.1");
        assert_eq!(authority_host("[::1]:8080"), "::1");
        assert_eq!(authority_host("[::1]"), "::1");
    }

    /// An origin with (`busy`) or without a connection: a busy one holds its only slot.
    fn origin(busy: bool) -> Arc<Origin> {
        let cap = Arc::new(Semaphore::new(1));
        if busy {
            cap.clone().try_acquire_owned().unwrap().forget();
        }
        Arc::new(Origin {
            https: false,
            host: HeaderValue::from_static("h"),
            cap,
            open: Arc::default(),
            name: None,
            state: Mutex::new(State::default()),
        })
    }

    #[test]
    fn origins_with_connections_stay_when_the_map_is_pruned() {
        let mut origins = PrunedMap::new(2);
        origins.map.insert("busy".into(), origin(true));
        origins.map.insert("idle".into(), origin(false));
        origins.make_room(|origin| !origin.is_empty(1));
        assert!(origins.map.contains_key("busy"));
        assert!(!origins.map.contains_key("idle"));
    }

    #[test]
    fn the_absolute_form_is_built_again_from_the_origin_and_the_path() {
        for (url, https) in [
            ("http://h.example:8080/a/b?x=1&y=2", false),
            ("https://h.example/a", true),
            ("http://127.0.0.1:9/", false),
            ("http://[::1]:8080/v6?q", false),
        ] {
            let mut uri: Uri = url.parse().unwrap();
            let origin = Origin {
                https,
                host: host_header(uri.authority().unwrap(), https).unwrap(),
                cap: Arc::new(Semaphore::new(1)),
                open: Arc::default(),
                name: None,
                state: Mutex::new(State::default()),
            };
            let absolute = origin_form(&mut uri).unwrap();
            assert_eq!(absolute_form(&origin, &uri).unwrap(), absolute, "{url}");
        }
    }

    #[test]
    fn origin_form_keeps_path_and_query_and_gives_back_the_absolute_form() {
        let mut uri: Uri = "http://h.example:8080/a/b?x=1&y=2".parse().unwrap();
        let absolute = origin_form(&mut uri).unwrap();
        assert_eq!(uri, "/a/b?x=1&y=2");
        assert_eq!(absolute, "http://h.example:8080/a/b?x=1&y=2");
        let mut root: Uri = "https://h.example".parse().unwrap();
        origin_form(&mut root).unwrap();
        assert_eq!(root, "/");
        let mut query: Uri = "https://h.example/?q".parse().unwrap();
        origin_form(&mut query).unwrap();
        assert_eq!(query, "/?q");
    }
}
