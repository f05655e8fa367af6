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
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use http::{header::HOST, HeaderValue, Request, Response};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::TokioTimer;
use parking_lot::Mutex;
use soulbase_net_core::{GaugeReading, NetError};
use tokio::{
    sync::{oneshot, OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

use super::body::{ReqBody, RequestBody, WireBody};
use super::connect::Connector;
use crate::pruned::PrunedMap;

mod budget;
mod checkout;
mod connection;
mod exec;
mod forms;
mod lifecycle;

pub(crate) use self::budget::IdleBudget;
use self::connection::{going_away, unwritten, watch_h1};
use self::exec::BoxingExecutor;
use self::forms::{absolute_form, head_len, is_idempotent, origin_form, READ_BUF_MAX};
use self::lifecycle::GiveBack;
pub(crate) use self::lifecycle::{Lease, PoolBody};

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

impl PoolConfig {
    /// Whether a connection to an origin of `https` (else `http`) may speak HTTP/2 as the pool
    /// is configured, before any connection says more: prior knowledge, or `h2` offered by
    /// ALPN.
    pub(crate) fn offers_h2(&self, https: bool) -> bool {
        self.http2_only || (https && self.h2_alpn)
    }
}

/// The pool of one transport.
pub(crate) struct Pool<B = ReqBody> {
    shared: Arc<Shared<B>>,
}

struct Shared<B> {
    connector: Connector,
    cfg: PoolConfig,
    h1: http1::Builder,
    h2: http2::Builder<BoxingExecutor>,
    origins: Mutex<Origins<B>>,
    /// Whether a reaper task is running.
    reaping: AtomicBool,
    /// Dropped with the pool: a reaper asleep until its next pass ends at once instead.
    alive: tokio::sync::watch::Sender<()>,
    /// The client's budget of kept connections, which this pool's count toward.
    budget: Arc<IdleBudget>,
}

/// Origins by authority, one map per scheme (a lookup needs no key built). Origins without
/// connections are pruned in bulk (see [`PrunedMap`]): origins that keep connections stay.
struct Origins<B> {
    http: PrunedMap<Arc<Origin<B>>>,
    https: PrunedMap<Arc<Origin<B>>>,
}

impl<B> Default for Origins<B> {
    fn default() -> Self {
        Self {
            http: PrunedMap::new(MAX_ORIGINS),
            https: PrunedMap::new(MAX_ORIGINS),
        }
    }
}

/// The shortest wait for the answer to an HTTP/2 keep-alive PING.
const KEEP_ALIVE_MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Origins without connections are pruned once a map holds this many.
const MAX_ORIGINS: usize = 4096;

/// How many times one request moves on after a pooled connection turned out closed before
/// it took the request (each time, that connection is discarded).
const MAX_STALE: usize = 8;

/// One origin's connections.
struct Origin<B> {
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
    state: Mutex<State<B>>,
}

struct State<B> {
    /// Idle HTTP/1.1 connections; the most recently used last.
    idle: Vec<Idle<B>>,
    /// The HTTP/2 connection requests share.
    h2: Option<SharedH2<B>>,
    /// A connect that will (or, by ALPN, may) give HTTP/2 is under way; other requests wait
    /// for it rather than each opening a connection the first one would have served.
    h2_connecting: bool,
    /// What the last connect's ALPN said: HTTP/2 or not (`None` before the first).
    speaks_h2: Option<bool>,
    /// Requests waiting for a connection (given back, or a new HTTP/2 one).
    waiters: VecDeque<oneshot::Sender<Sender<B>>>,
    /// The serial of the last HTTP/2 connection opened to this origin.
    h2_serial: u64,
    /// The origin's host name, as its connections follow it.
    dns: Follow,
}

impl<B> Default for State<B> {
    fn default() -> Self {
        Self {
            idle: Vec::new(),
            h2: None,
            h2_connecting: false,
            speaks_h2: None,
            waiters: VecDeque::new(),
            h2_serial: 0,
            dns: Follow::default(),
        }
    }
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

struct Idle<B> {
    tx: http1::SendRequest<B>,
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
struct SharedH2<B> {
    tx: http2::SendRequest<B>,
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
enum Sender<B> {
    H1 {
        tx: http1::SendRequest<B>,
        facts: Facts,
    },
    H2 {
        tx: http2::SendRequest<B>,
        /// The connection's [`SharedH2::serial`].
        serial: u64,
        /// This request, counted among the connection's streams until its body ends.
        stream: Stream,
        /// [`SharedH2::heard`].
        heard: Arc<AtomicBool>,
    },
}

/// One request counted among an HTTP/2 connection's [`SharedH2::streams`] while it lives.
pub(crate) struct Stream(Arc<AtomicUsize>);

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
enum Next<B> {
    Use(Sender<B>),
    Connect(OwnedSemaphorePermit),
    Wait {
        rx: oneshot::Receiver<Sender<B>>,
        /// Whether a freed slot under the cap may end the wait (not while an HTTP/2-only
        /// connect is under way: the others wait for that one).
        may_connect: bool,
    },
}

// === impl Pool ===

impl<B: RequestBody> Pool<B> {
    pub(crate) fn new(connector: Connector, cfg: PoolConfig, budget: Arc<IdleBudget>) -> Self {
        let mut h1 = http1::Builder::new();
        if let Some(max) = cfg.max_headers {
            h1.max_headers(max);
        }
        h1.max_buf_size(cfg.max_head_bytes.max(READ_BUF_MAX));
        let mut h2 = http2::Builder::new(BoxingExecutor);
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
        let kept: std::sync::Weak<dyn budget::Kept> = Arc::downgrade(&shared) as _;
        shared.budget.register(kept);
        Pool { shared }
    }

    /// Whether a request to an origin of `https` (else `http`) goes on HTTP/2 as this pool is
    /// configured — prior knowledge, or `h2` offered by ALPN — before any connection says
    /// more: a hint for how its headers are built (see `attempt_headers`), never a choice.
    pub(crate) fn expects_h2(&self, https: bool) -> bool {
        self.shared.cfg.offers_h2(https)
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
        mut req: Request<B>,
    ) -> impl Future<Output = Result<(Response<PoolBody<B>>, Duration), NetError>> + Send + '_ {
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
                                return Ok((WireBody::hyper(res, back.map(Lease::H1)), connect));
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
                                return Ok((
                                    WireBody::hyper(res, Some(Lease::H2(stream))),
                                    connect,
                                ));
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
                                        // `Io` for the caller; not a failure of the upstream
                                        // for the breaker (see `raced_by_goaway`).
                                        return Err(crate::classify::raced_by_goaway(e));
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

impl<B: RequestBody> Pool<B> {
    /// Opens (or finds) a connection to the origin of `uri` without sending anything on it;
    /// an HTTP/1.1 one goes back to the pool idle. The TCP side of an `h3-or-tcp` race.
    #[cfg(feature = "http3")]
    pub(crate) async fn warm(&self, uri: &http::Uri) -> Result<(), NetError> {
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
            let host = crate::transport::authority::host_of(authority);
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

impl<B> Drop for Shared<B> {
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

impl<B> fmt::Debug for Pool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("cfg", &self.shared.cfg)
            .finish_non_exhaustive()
    }
}

// === impl Origin ===

impl<B> Origin<B> {
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

// === impl SharedH2 ===

impl<B> SharedH2<B> {
    /// Open with no request on it: what the idle gauge counts.
    fn is_idle(&self) -> bool {
        !self.tx.is_closed() && self.streams.load(Ordering::Relaxed) == 0
    }
}

// === impl Sender ===

impl<B: RequestBody> Sender<B> {
    /// Waits until the connection can take a request; false when it closed.
    async fn ready(&mut self) -> bool {
        match self {
            Sender::H1 { tx, .. } => tx.is_ready() || tx.ready().await.is_ok(),
            Sender::H2 { tx, .. } => tx.is_ready() || tx.ready().await.is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use http::uri::Authority;

    use super::forms::host_header;
    use super::*;

    /// The `Host` header the pool makes for `authority`.
    fn header_of(authority: &Authority, https: bool) -> HeaderValue {
        let (host, port) = crate::transport::authority::host_port(authority.as_str());
        host_header(authority, host, port, https).unwrap()
    }

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
            header_of(&authority, https)
        };
        assert_eq!(host("api.example.com", true), "api.example.com");
        assert_eq!(host("api.example.com:443", true), "api.example.com");
        assert_eq!(host("api.example.com:80", true), "api.example.com:80");
        assert_eq!(host("api.example.com:80", false), "api.example.com");
        assert_eq!(host("127.0.0.1:8080", false), "127.0.0.1:8080");
        assert_eq!(host("[::1]:8443", true), "[::1]:8443");
        assert_eq!(host("[::1]", true), "[::1]");
    }

    /// An origin with (`busy`) or without a connection: a busy one holds its only slot.
    fn origin(busy: bool) -> Arc<Origin<ReqBody>> {
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
            let mut uri: http::Uri = url.parse().unwrap();
            let origin: Origin<ReqBody> = Origin {
                https,
                host: header_of(uri.authority().unwrap(), https),
                cap: Arc::new(Semaphore::new(1)),
                open: Arc::default(),
                name: None,
                state: Mutex::new(State::default()),
            };
            let absolute = origin_form(&mut uri).unwrap();
            assert_eq!(absolute_form(&origin, &uri).unwrap(), absolute, "{url}");
        }
    }

    /// A pool of its own for request bodies of type `B`, to loopback, with nothing but the
    /// defaults (`http2_only` for prior-knowledge h2c).
    fn pool_of<B: RequestBody>(http2_only: bool) -> (Pool<B>, Arc<std::sync::atomic::AtomicU64>) {
        let mut security = soulbase_net_policy::SecurityPolicy::default();
        security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
        let mut dns = soulbase_net_policy::DnsPolicy::default();
        // IP literals only: the resolver is never asked (and never the system's).
        dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
        let opened = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let connector = Connector::new(crate::transport::connect::ConnectorConfig {
            guard: soulbase_net_policy::AddressGuard::new(&security).unwrap(),
            tls: crate::tls::client_config(&soulbase_net_policy::TlsPolicy::default(), &[])
                .unwrap(),
            proxy_tls: None,
            dialer: Arc::new(crate::testing::LoopbackDialer::default()),
            resolver: Arc::new(crate::dns::DnsResolver::new(&dns).unwrap()),
            observer: Arc::new(soulbase_net_core::NoopObserver),
            connect_timeout: Duration::from_secs(5),
            happy_eyeballs_delay: None,
            freeze_addresses: None,
            proxy: None,
            proxy_resolves_locally: false,
            opened: opened.clone(),
        });
        let cfg = PoolConfig {
            idle_timeout: Duration::from_secs(30),
            max_idle_per_origin: 8,
            max_lifetime: None,
            keep_alive: None,
            per_origin_cap: 8,
            http2_only,
            h2_alpn: false,
            max_headers: None,
            max_head_bytes: 64 * 1024,
        };
        (Pool::new(connector, cfg, IdleBudget::new(64)), opened)
    }

    /// The pool takes any request body hyper's connections take, as hyper-util's does: here
    /// `Full` and `Empty` bodies, not the client's boxed `ReqBody`, over HTTP/1.1 (the
    /// connection given back and reused) and over h2c (one shared connection).
    #[tokio::test]
    async fn the_pool_sends_bodies_of_any_type() {
        use http_body_util::{BodyExt, Empty, Full};
        let srv = soulbase_net_testkit::FaultServer::http1()
            .route("/echo", soulbase_net_testkit::Reply::ok("ok"))
            .start()
            .await
            .unwrap();
        let url = srv.url("/echo");
        let (pool, opened) = pool_of::<Full<bytes::Bytes>>(false);
        for i in 0..3 {
            let req = Request::post(url.as_str())
                .body(Full::new(bytes::Bytes::from(format!("body {i}"))))
                .unwrap();
            let (res, _) = pool.send(req).await.unwrap();
            assert_eq!(res.status(), 200);
            // Read to its end: the connection goes back to the pool.
            assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "ok");
        }
        assert_eq!(
            opened.load(Ordering::Relaxed),
            1,
            "one HTTP/1.1 connection, reused"
        );
        let bodies: Vec<String> = srv.requests("/echo").iter().map(|r| r.text()).collect();
        assert_eq!(bodies, ["body 0", "body 1", "body 2"]);

        let h2c = soulbase_net_testkit::FaultServer::http2()
            .route("/echo", soulbase_net_testkit::Reply::ok("ok"))
            .start()
            .await
            .unwrap();
        let (pool, opened) = pool_of::<Empty<bytes::Bytes>>(true);
        let pool = Arc::new(pool);
        let mut sent = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let (pool, url) = (pool.clone(), h2c.url("/echo"));
            sent.spawn(async move {
                let req = Request::get(url.as_str()).body(Empty::new()).unwrap();
                pool.send(req).await
            });
        }
        while let Some(sent) = sent.join_next().await {
            let sent = sent.unwrap();
            let (res, _) = sent.unwrap();
            assert_eq!(res.version(), http::Version::HTTP_2);
            assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "ok");
        }
        assert_eq!(
            opened.load(Ordering::Relaxed),
            1,
            "one shared HTTP/2 connection"
        );
    }

    #[test]
    fn origin_form_keeps_path_and_query_and_gives_back_the_absolute_form() {
        let mut uri: http::Uri = "http://h.example:8080/a/b?x=1&y=2".parse().unwrap();
        let absolute = origin_form(&mut uri).unwrap();
        assert_eq!(uri, "/a/b?x=1&y=2");
        assert_eq!(absolute, "http://h.example:8080/a/b?x=1&y=2");
        let mut root: http::Uri = "https://h.example".parse().unwrap();
        origin_form(&mut root).unwrap();
        assert_eq!(root, "/");
        let mut query: http::Uri = "https://h.example/?q".parse().unwrap();
        origin_form(&mut query).unwrap();
        assert_eq!(query, "/?q");
    }
}
