//! HTTP/3 for a [`FaultServer`](super::FaultServer) (feature `http3`): a QUIC endpoint on the
//! UDP port of the same number as the TCP one, serving the same routes and scripts, plus the
//! faults only QUIC has.
//!
//! How the scripted faults read over HTTP/3: [`Reply::reset`](super::Reply::reset) before the
//! head resets the request's stream with `H3_REQUEST_REJECTED` (the request was not
//! processed, so a client may retry it whatever its method); [`Reply::close`] closes the QUIC
//! connection; a body cut after N bytes (reset or close) closes the connection mid-response.
//! [`FaultServer::drop_udp_for`](super::FaultServer::drop_udp_for) drops every packet that
//! arrives for a while (a client's handshake then times out);
//! [`FaultServer::h3_goaway`](super::FaultServer::h3_goaway) makes the open connections send
//! GOAWAY and end once their requests have;
//! [`FaultServerBuilder::h3_ignore_header_limit`](super::FaultServerBuilder::h3_ignore_header_limit)
//! sends response heads over the size the client announced (by default a head too large for
//! the client is not sent, and the stream ends without one).
//!
//! Never touches the TCP side: the two share only the routes, the counters and the request
//! log ([`Shared`]).

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use h3::error::Code;
use http::Response;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::body::FaultBody;
use super::conn::ConnCtl;
use super::h3_settings::Conn;
use super::handler::{answer, Kept, OpenConn, Shared};
use super::reply::{Abort, Action};

/// The QUIC application error code a fault closes a connection with (`H3_INTERNAL_ERROR`).
const CLOSE_CODE: u32 = 0x102;

/// The code of a connection closed after GOAWAY (`H3_NO_ERROR`).
const H3_NO_ERROR: u32 = 0x100;

/// The HTTP/3 side of a server: the endpoint and its packet-dropping switch.
pub(super) struct H3Side {
    pub(super) endpoint: quinn::Endpoint,
    pub(super) drop: Arc<DropSwitch>,
    /// Bumped to make every connection open at that moment send GOAWAY.
    pub(super) goaway: tokio::sync::watch::Sender<u64>,
}

impl fmt::Debug for H3Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("H3Side")
            .field("addr", &self.endpoint.local_addr().ok())
            .finish_non_exhaustive()
    }
}

/// Binds the QUIC endpoint at `addr` (UDP) with `tls` (its ALPN becomes `h3`).
pub(super) fn bind(addr: SocketAddr, tls: &rustls::ServerConfig) -> io::Result<H3Side> {
    let mut tls = tls.clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.max_early_data_size = u32::MAX;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(Arc::new(tls))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let runtime = Arc::new(quinn::TokioRuntime);
    let socket = std::net::UdpSocket::bind(addr)?;
    let drop = Arc::new(DropSwitch::default());
    let socket: Arc<dyn AsyncUdpSocket> = Arc::new(DroppingSocket {
        inner: quinn::Runtime::wrap_udp_socket(&*runtime, socket)?,
        drop: drop.clone(),
    });
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        Some(config),
        socket,
        runtime,
    )?;
    Ok(H3Side {
        endpoint,
        drop,
        goaway: tokio::sync::watch::Sender::new(0),
    })
}

/// Accepts QUIC connections until the server shuts down; one task per connection.
pub(super) async fn accept_loop(
    endpoint: quinn::Endpoint,
    shared: Arc<Shared>,
    goaway: tokio::sync::watch::Sender<u64>,
    hide_header_limit: bool,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shared.shutdown.fired() => break,
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => {
                    let open = OpenConn::new(shared.clone());
                    conns.spawn(serve_conn(incoming, open, goaway.subscribe(), hide_header_limit));
                }
                None => break,
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
    endpoint.close(quinn::VarInt::from_u32(H3_NO_ERROR), b"shutdown");
    conns.abort_all();
    while let Some(res) = conns.join_next().await {
        if let Err(e) = res {
            if e.is_panic() {
                shared.record_panic(e.into_panic());
            }
        }
    }
}

async fn serve_conn(
    incoming: quinn::Incoming,
    open: OpenConn,
    mut goaway: tokio::sync::watch::Receiver<u64>,
    hide_header_limit: bool,
) {
    // Only a GOAWAY asked for after this connection arrived concerns it.
    goaway.borrow_and_update();
    let shared = open.0.clone();
    let Ok(conn) = incoming.await else { return };
    let id = shared
        .connections
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        + 1;
    let ctl = Arc::new(ConnCtl::new(id));
    let Ok(mut h3) = h3::server::builder()
        .build::<_, Bytes>(Conn::new(conn.clone(), hide_header_limit))
        .await
    else {
        return;
    };
    let mut streams = JoinSet::new();
    let mut going_away = false;
    loop {
        if going_away && streams.is_empty() {
            // Every request taken before the GOAWAY was answered: the connection ends.
            conn.close(quinn::VarInt::from_u32(H3_NO_ERROR), b"goaway");
            break;
        }
        tokio::select! {
            _ = ctl.killed() => {
                conn.close(quinn::VarInt::from_u32(CLOSE_CODE), b"fault");
                break;
            }
            _ = shared.shutdown.fired() => break,
            Ok(()) = goaway.changed(), if !going_away => {
                // GOAWAY: no new request; the connection ends once those in flight have.
                if h3.shutdown(0).await.is_err() {
                    break;
                }
                going_away = true;
            }
            accepted = h3.accept(), if !going_away => match accepted {
                Ok(Some(resolver)) => {
                    streams.spawn(serve_stream(resolver, shared.clone(), ctl.clone()));
                }
                Ok(None) | Err(_) => break,
            },
            Some(res) = streams.join_next(), if !streams.is_empty() => {
                if let Err(e) = res {
                    if e.is_panic() {
                        shared.record_panic(e.into_panic());
                    }
                }
            }
        }
    }
    streams.abort_all();
}

type Resolver = h3::server::RequestResolver<Conn, Bytes>;
type Stream = h3::server::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;

async fn serve_stream(resolver: Resolver, shared: Arc<Shared>, ctl: Arc<ConnCtl>) {
    let Ok((req, mut stream)) = resolver.resolve_request().await else {
        return;
    };
    let (parts, ()) = req.into_parts();
    let mut kept = Kept::new(&shared);
    while let Ok(Some(mut chunk)) = stream.recv_data().await {
        while chunk.has_remaining() {
            let piece = chunk.chunk();
            let n = piece.len();
            kept.add(piece);
            chunk.advance(n);
        }
    }
    match answer(parts, kept.bytes.freeze(), kept.len, &shared, &ctl).await {
        Action::Respond(res) => {
            let _ = respond(&mut stream, *res, &ctl).await;
        }
        Action::Abort(Abort::Reset) => {
            stream.stop_stream(Code::H3_REQUEST_REJECTED);
            stream.stop_sending(Code::H3_REQUEST_REJECTED);
        }
        Action::Abort(Abort::Close) => ctl.kill_now(false),
        Action::Abort(Abort::Hang) => shared.shutdown.fired().await,
    }
}

/// Sends the head and the body of `res` on `stream`; a cut in the body fires when the bytes
/// before it were handed to QUIC.
async fn respond(
    stream: &mut Stream,
    res: Response<FaultBody>,
    ctl: &ConnCtl,
) -> Result<(), h3::error::StreamError> {
    let (parts, mut body) = res.into_parts();
    stream
        .send_response(Response::from_parts(parts, ()))
        .await?;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame;
        if let Ok(data) = frame.into_data() {
            stream.send_data(data).await?;
            ctl.flushed();
        }
    }
    stream.finish().await
}

/// Drops every packet that arrives until a moment; off by default.
#[derive(Debug, Default)]
pub(super) struct DropSwitch {
    until: Mutex<Option<Instant>>,
}

impl DropSwitch {
    /// Drops what arrives from now until `d` from now.
    pub(super) fn drop_for(&self, d: Duration) {
        *self.until.lock() = Some(Instant::now() + d);
    }

    fn dropping(&self) -> bool {
        let mut until = self.until.lock();
        match *until {
            Some(at) if Instant::now() < at => true,
            Some(_) => {
                *until = None;
                false
            }
            None => false,
        }
    }
}

/// The server's UDP socket, dropping what arrives while its [`DropSwitch`] says so.
#[derive(Debug)]
struct DroppingSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    drop: Arc<DropSwitch>,
}

impl AsyncUdpSocket for DroppingSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        loop {
            let n = ready!(self.inner.poll_recv(cx, bufs, meta))?;
            // Dropped datagrams are read and forgotten; polling again registers the waker
            // when nothing more is waiting.
            if !self.drop.dropping() {
                return Poll::Ready(Ok(n));
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}
