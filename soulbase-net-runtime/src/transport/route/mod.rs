//! Which transport a request takes under the policy's `http.version`: `h3` always HTTP/3;
//! `auto` TCP until the origin advertised HTTP/3 with `Alt-Svc` (then HTTP/3 while the
//! advertisement is fresh, TCP again once HTTP/3 to it failed); `h3-or-tcp` a QUIC handshake
//! raced with a TCP connect, the winner used and remembered.
//!
//! The one module that knows both transports: the pool (TCP) and HTTP/3 know nothing of each
//! other, and it is here that an HTTP/3 response body becomes every transport's
//! [`WireBody`](super::body::WireBody).

mod alt_svc;

use std::time::Duration;

use http::{header::ALT_SVC, Request, Response, Uri};
use http_body_util::BodyExt;
use soulbase_net_core::{ErrorKind, NetError, Phase};
use soulbase_net_policy::{HttpVersionPolicy, NetPolicy};
use tokio::time::Instant;

use self::alt_svc::{Advert, Memory};
use super::body::{ReqBody, WireBody};
use super::connect::Connector;
use super::h3::{H3Body, H3Pool, Live};
use super::pool::{Pool, PoolBody};

/// How long the winner of a race is remembered for its origin.
const RACE_MEMORY: Duration = Duration::from_secs(3600);

/// The choice between TCP and HTTP/3 of one transport, and its HTTP/3 side.
pub(crate) struct Route {
    h3: H3Pool,
    /// The TCP connector, to know which requests a proxy carries.
    connector: Connector,
    /// The policy's `http.version`.
    version: HttpVersionPolicy,
    /// Same-host HTTP/3 ports origins advertised with `Alt-Svc` (`auto`).
    advertised: Memory<u16>,
    /// Which transport won an origin's race (`h3-or-tcp`).
    won: Memory<Won>,
}

/// Which way a request goes (see [`Route::way`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Way {
    /// Over the TCP pool, nothing to learn.
    Tcp,
    /// Over the TCP pool, then [`Route::learn`] from the response (`auto`, nothing advertised).
    TcpLearning,
    /// Through [`Route::h3_only`]: HTTP/3 always (`h3`).
    H3,
    /// Through [`Route::route`]: the race, or an advertised port.
    Route,
}

/// The winner of an origin's `h3-or-tcp` race.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Won {
    Quic,
    Tcp,
}

impl Route {
    /// The routing of a transport under `policy`, with `h3` its HTTP/3 side and `connector`
    /// its TCP connector.
    pub(crate) fn new(h3: H3Pool, connector: Connector, policy: &NetPolicy) -> Self {
        Route {
            h3,
            connector,
            version: policy.http.version,
            advertised: Memory::new(),
            won: Memory::new(),
        }
    }

    /// The HTTP/3 side.
    pub(crate) fn h3(&self) -> &H3Pool {
        &self.h3
    }

    /// Which way `req` goes, decided once and without copying anything: under `h3` always
    /// HTTP/3; plain `http`, or a request a proxy carries, TCP whatever was advertised;
    /// under `h3-or-tcp` the routing (the race or its remembered winner); under `auto` the
    /// routing only while the origin's advertisement is fresh, else TCP, learning from the
    /// response's `Alt-Svc` ([`Route::learn`]). The common cases never enter the routing.
    pub(crate) fn way<B>(&self, req: &Request<B>) -> Way {
        let uri = req.uri();
        if self.version == HttpVersionPolicy::H3 {
            return Way::H3;
        }
        if uri.scheme_str() != Some("https") || self.connector.proxied(uri) {
            return Way::Tcp;
        }
        if self.version == HttpVersionPolicy::H3OrTcp {
            return Way::Route;
        }
        let origin = uri.authority().map_or("", |a| a.as_str());
        match self.advertised.get(origin, Instant::now()) {
            Some(_) => Way::Route,
            None => Way::TcpLearning,
        }
    }

    /// Sends `req` over HTTP/3 or over `tcp`, as the policy's `http.version` says, for a
    /// request whose [`Route::way`] is [`Way::Route`].
    pub(crate) async fn route(
        &self,
        tcp: &Pool,
        req: Request<ReqBody>,
    ) -> Result<(Response<PoolBody>, Duration), NetError> {
        if self.version == HttpVersionPolicy::H3 {
            return self.h3_only(req).await;
        }
        let uri = req.uri().clone();
        let origin = uri.authority().map_or("", |a| a.as_str()).to_owned();
        match self.version {
            HttpVersionPolicy::H3OrTcp => self.raced(tcp, req, &uri, &origin).await,
            _ => self.advertised(tcp, req, &uri, &origin).await,
        }
    }

    /// Sends `req` over HTTP/3 to the URI's own port (443 by default): `http.version = "h3"`,
    /// for a request whose [`Route::way`] is [`Way::H3`].
    pub(crate) async fn h3_only(
        &self,
        req: Request<ReqBody>,
    ) -> Result<(Response<PoolBody>, Duration), NetError> {
        let early = self.h3.may_send_early(req.method());
        let (live, connect) = self.h3.checkout(req.uri(), None, early).await?;
        self.exchange(live, connect, req).await
    }

    /// `auto`: HTTP/3 on the advertised port while the advertisement is fresh; TCP otherwise,
    /// learning from the response's `Alt-Svc`. An advertised port that cannot be connected
    /// to is forgotten and the request goes over TCP (nothing was sent yet); one that fails
    /// later is forgotten too, so the retry goes over TCP.
    async fn advertised(
        &self,
        tcp: &Pool,
        req: Request<ReqBody>,
        uri: &Uri,
        origin: &str,
    ) -> Result<(Response<PoolBody>, Duration), NetError> {
        if let Some(port) = self.advertised.get(origin, Instant::now()) {
            match self
                .h3
                .checkout(uri, Some(port), self.h3.may_send_early(req.method()))
                .await
            {
                Ok((live, connect)) => {
                    let sent = self.exchange(live, connect, req).await;
                    if sent.is_err() {
                        self.advertised.forget(origin);
                    }
                    return sent;
                }
                Err(e) => {
                    tracing::debug!(origin, error = %e, "advertised http/3 failed; using tcp");
                    self.advertised.forget(origin);
                }
            }
        }
        let (res, connect) = tcp.send(req).await?;
        self.learn(origin, &res);
        Ok((res, connect))
    }

    /// Remembers (or forgets) what `res` advertises about HTTP/3 for `origin`.
    pub(crate) fn learn(&self, origin: &str, res: &Response<PoolBody>) {
        let Some(value) = res.headers().get(ALT_SVC).and_then(|v| v.to_str().ok()) else {
            return;
        };
        match alt_svc::parse(value) {
            Some(Advert::H3 { port, max_age }) => {
                self.advertised.put(origin, port, max_age, Instant::now());
            }
            Some(Advert::Clear) => self.advertised.forget(origin),
            None => {}
        }
    }

    /// `h3-or-tcp`: the remembered winner for the origin, or a race of a QUIC handshake with
    /// a TCP connect; the first to complete carries the request and is remembered. When the
    /// remembered transport fails to connect, it is forgotten (the next request races again).
    async fn raced(
        &self,
        tcp: &Pool,
        req: Request<ReqBody>,
        uri: &Uri,
        origin: &str,
    ) -> Result<(Response<PoolBody>, Duration), NetError> {
        let port = uri.port_u16().unwrap_or(443);
        let now = Instant::now();
        let began = now;
        let won = match self.won.get(origin, now) {
            Some(won) => won,
            None => {
                let won = self.race(tcp, uri, port).await?;
                self.won.put(origin, won, RACE_MEMORY, Instant::now());
                won
            }
        };
        let raced = began.elapsed();
        let sent = match won {
            Won::Quic => match self
                .h3
                .checkout(uri, Some(port), self.h3.may_send_early(req.method()))
                .await
            {
                Ok((live, connect)) => self.exchange(live, connect.max(raced), req).await,
                Err(e) => Err(e),
            },
            Won::Tcp => tcp
                .send(req)
                .await
                .map(|(res, connect)| (res, connect.max(raced))),
        };
        if sent.as_ref().is_err_and(failed_to_connect) {
            self.won.forget(origin);
        }
        sent
    }

    /// Races a QUIC handshake with a TCP connect to the origin of `uri`: the first to
    /// succeed wins; when one fails, the other decides; when both fail, the last error.
    /// Sends `req` over HTTP/3 on `live`, its body made every transport's.
    async fn exchange(
        &self,
        live: Live,
        connect: Duration,
        req: Request<ReqBody>,
    ) -> Result<(Response<PoolBody>, Duration), NetError> {
        let (res, connect) = self.h3.exchange(live, connect, req).await?;
        Ok((res.map(wire_body), connect))
    }

    async fn race(&self, tcp: &Pool, uri: &Uri, port: u16) -> Result<Won, NetError> {
        // Nothing goes early on a connection opened by the race.
        let quic = self.h3.checkout(uri, Some(port), false);
        let plain = tcp.warm(uri);
        tokio::pin!(quic, plain);
        tokio::select! {
            q = &mut quic => match q {
                Ok(_) => Ok(Won::Quic),
                Err(_) => plain.await.map(|()| Won::Tcp),
            },
            t = &mut plain => match t {
                Ok(()) => Ok(Won::Tcp),
                Err(_) => quic.await.map(|_| Won::Quic),
            },
        }
    }
}

/// An HTTP/3 response body as every transport's (it holds its connection itself).
fn wire_body(body: H3Body) -> PoolBody {
    WireBody::boxed(body.map_err(Into::into).boxed_unsync())
}

/// Whether `e` says no connection could be opened (rather than a failure of a request).
fn failed_to_connect(e: &NetError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Connect
            | ErrorKind::Tls
            | ErrorKind::TlsVerify
            | ErrorKind::Dns
            | ErrorKind::Timeout(Phase::Connect)
    )
}
