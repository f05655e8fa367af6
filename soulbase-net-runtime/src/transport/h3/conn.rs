//! QUIC endpoints and connections: the UDP sockets, the QUIC client configuration from the
//! TLS policy, the handshake to one guarded peer, and a live connection's HTTP/3 state.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use parking_lot::Mutex;
use rustls::pki_types::CertificateDer;
use soulbase_net_core::{ErrorKind, NetError};
use soulbase_net_policy::{TlsPolicy, TlsVersion};

use h3::error::StreamError;

use super::error;
use crate::transport::Dialer;

/// The ALPN protocol id of HTTP/3.
const ALPN_H3: &[u8] = b"h3";

/// The shortest QUIC idle timeout: a pool idle timeout of zero (keep nothing idle) would
/// otherwise close a connection between a request's frames.
const MIN_IDLE: Duration = Duration::from_secs(1);

/// The request half of a live HTTP/3 connection.
pub(super) type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// The client's QUIC endpoints, created on first use: one per address family and scope
/// (loopback peers get a socket bound to loopback, others one bound to the unspecified
/// address), all with the same QUIC configuration.
pub(super) struct Endpoints {
    config: quinn::ClientConfig,
    /// The client's dialer: it binds the sockets and is shown every peer.
    dialer: Arc<dyn Dialer>,
    /// The most bytes of a response head.
    max_head_bytes: u64,
    /// `http.zero_rtt`: a resumed connection opened for a request that may go early
    /// (`http.zero_rtt_methods`) sends it as early data.
    zero_rtt: bool,
    /// Indexed by [`slot`].
    bound: Mutex<[Option<quinn::Endpoint>; 4]>,
}

/// One HTTP/3 connection, shared by the requests to its origin.
#[derive(Clone)]
pub(crate) struct Live {
    conn: quinn::Connection,
    sender: Sender,
    /// Set when the connection cannot take new requests (closed, or the peer sent GOAWAY).
    closing: Arc<AtomicBool>,
    /// For a connection opened with 0-RTT: `true` once the handshake is complete; until then
    /// only requests that may go early (`http.zero_rtt_methods`) are sent on it. `None` for
    /// one opened with the whole handshake, confirmed from the start: a request on it waits
    /// for nothing and takes no lock.
    confirmed: Option<tokio::sync::watch::Receiver<bool>>,
}

// === impl Endpoints ===

impl Endpoints {
    /// Endpoints speaking QUIC with the TLS of `policy` (TLS 1.3 only, ALPN `h3`), the idle
    /// timeout, keep-alive and head limit of `limits`; 0-RTT (for the requests that may go
    /// early) when `zero_rtt`.
    pub(super) fn new(
        dialer: Arc<dyn Dialer>,
        policy: &TlsPolicy,
        extra_roots: &[CertificateDer<'static>],
        limits: super::Limits,
        zero_rtt: bool,
    ) -> Result<Self, NetError> {
        let idle = limits.idle;
        let mut tls_policy = policy.clone();
        tls_policy.min_tls = TlsVersion::Tls13;
        tls_policy.max_tls = TlsVersion::Tls13;
        let mut tls = (*crate::tls::client_config(&tls_policy, extra_roots)?).clone();
        tls.alpn_protocols = vec![ALPN_H3.to_vec()];
        tls.enable_early_data = zero_rtt;
        let crypto =
            quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls)).map_err(|e| {
                NetError::invalid_request("the tls policy cannot be used for quic").with_source(e)
            })?;
        let mut transport = quinn::TransportConfig::default();
        let idle = quinn::IdleTimeout::try_from(idle.max(MIN_IDLE)).map_err(|e| {
            NetError::invalid_request("the pool idle timeout is too long for quic").with_source(e)
        })?;
        transport.max_idle_timeout(Some(idle));
        transport.keep_alive_interval(limits.keep_alive);
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        config.transport_config(Arc::new(transport));
        Ok(Endpoints {
            config,
            dialer,
            max_head_bytes: u64::try_from(limits.max_head_bytes).unwrap_or(u64::MAX),
            zero_rtt,
            bound: Mutex::new(Default::default()),
        })
    }

    /// A QUIC + HTTP/3 handshake with `peer` (already allowed by the address guard), verifying
    /// it as `host`. With 0-RTT on and `early` (the request that opens it may go early), a
    /// connection to a server with a resumable session is usable at once: its first requests
    /// go as early data, and it is [confirmed](Live::confirmed) when the handshake completes.
    pub(super) async fn connect(
        &self,
        peer: SocketAddr,
        host: &str,
        early: bool,
    ) -> Result<Live, NetError> {
        let endpoint = self.endpoint_for(peer.ip())?;
        self.dialer.udp_peer(peer).map_err(|e| {
            NetError::new(ErrorKind::Connect)
                .with_message(format!("the dialer refused the quic peer {peer} of {host}"))
                .with_source(e)
        })?;
        let connecting = endpoint
            .connect_with(self.config.clone(), peer, host)
            .map_err(|e| error::connect_error(e, host))?;
        // 0-RTT only when asked for, for a request that may go early, and possible (a session
        // to resume); otherwise the whole handshake first.
        let early = if self.zero_rtt && early {
            connecting.into_0rtt()
        } else {
            Err(connecting)
        };
        let (conn, confirmed) = match early {
            Ok((conn, accepted)) => {
                let (confirm, confirmed) = tokio::sync::watch::channel(false);
                tokio::spawn(async move {
                    let accepted = accepted.await;
                    tracing::debug!(zero_rtt = accepted, "http/3 handshake complete");
                    let _ = confirm.send(true);
                });
                (conn, Some(confirmed))
            }
            Err(connecting) => {
                let conn = connecting
                    .await
                    .map_err(|e| error::handshake_error(e, host))?;
                (conn, None)
            }
        };
        let (mut driver, sender) = h3::client::builder()
            .max_field_section_size(self.max_head_bytes)
            .build::<_, _, Bytes>(h3_quinn::Connection::new(conn.clone()))
            .await
            .map_err(error::connection_error)?;
        let closing = Arc::new(AtomicBool::new(false));
        let closed = closing.clone();
        // The connection's control streams run here until it closes; then it is replaced.
        tokio::spawn(async move {
            let why = driver.wait_idle().await;
            closed.store(true, Ordering::Release);
            tracing::debug!(error = ?why, "http/3 connection closed");
        });
        Ok(Live {
            conn,
            sender,
            closing,
            confirmed,
        })
    }

    /// The endpoint for peers like `ip`, bound on first use.
    fn endpoint_for(&self, ip: IpAddr) -> Result<quinn::Endpoint, NetError> {
        let (slot, bind) = slot(ip);
        let mut bound = self.bound.lock();
        if let Some(endpoint) = &bound[slot] {
            return Ok(endpoint.clone());
        }
        let local = SocketAddr::new(bind, 0);
        let endpoint = self
            .dialer
            .bind_udp(local)
            .and_then(|socket| {
                socket.set_nonblocking(true)?;
                quinn::Endpoint::new(
                    quinn::EndpointConfig::default(),
                    None,
                    socket,
                    Arc::new(quinn::TokioRuntime),
                )
            })
            .map_err(|e| {
                NetError::new(ErrorKind::Connect)
                    .with_message(format!("no udp socket could be bound on {bind}"))
                    .with_source(e)
            })?;
        bound[slot] = Some(endpoint.clone());
        Ok(endpoint)
    }
}

/// Where an endpoint for peers like `ip` lives in [`Endpoints::bound`], and the address its
/// socket binds: loopback for a loopback peer (its packets never leave the machine), the
/// unspecified address of the family otherwise.
fn slot(ip: IpAddr) -> (usize, IpAddr) {
    match ip {
        IpAddr::V4(v4) if v4.is_loopback() => (0, IpAddr::V4(Ipv4Addr::LOCALHOST)),
        IpAddr::V4(_) => (1, IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        IpAddr::V6(v6) if v6.is_loopback() => (2, IpAddr::V6(Ipv6Addr::LOCALHOST)),
        IpAddr::V6(_) => (3, IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
    }
}

impl fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoints").finish_non_exhaustive()
    }
}

// === impl Live ===

impl Live {
    /// Whether the connection can take new requests.
    pub(super) fn is_open(&self) -> bool {
        !self.closing.load(Ordering::Acquire) && self.conn.close_reason().is_none()
    }

    /// The handle this request sends on: each request holds a `Live` of its own (a clone,
    /// from checkout until its body ends), so it sends on its clone's handle rather than
    /// clone another (a handle's clone and drop are eight atomic operations).
    pub(super) fn sender(&mut self) -> &mut Sender {
        &mut self.sender
    }

    /// Waits until the handshake is complete (at once for a connection not opened with
    /// 0-RTT): what a request that must not be replayed waits for.
    pub(super) async fn confirmed(&self) {
        let Some(confirmed) = &self.confirmed else {
            return;
        };
        let mut confirmed = confirmed.clone();
        // An error means the task that confirms ended without confirming: the connection
        // failed, and the request's own stream will say so.
        let _ = confirmed.wait_for(|done| *done).await;
    }

    /// Whether no request is on the connection: no handle but the pool's and the driver's.
    /// (Every request holds a clone of its `Live` from checkout until its body ends, and so
    /// of `closing`; the driver task holds one until the connection closes.)
    pub(super) fn is_idle(&self) -> bool {
        Arc::strong_count(&self.closing) <= 2
    }

    /// No new request goes on this connection (the peer is going away, or it failed).
    pub(super) fn retire(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// The error of a request stream on this connection that failed; a failure of the
    /// connection, or a GOAWAY, retires it (the next request opens a new one).
    pub(super) fn stream_failed(&self, e: StreamError) -> NetError {
        if error::retires_connection(&e) {
            self.retire();
        }
        error::stream_error(e)
    }

    /// As [`Live::stream_failed`], for a stream whose response head was awaited: a head
    /// over the client's limit is `TooLarge` ([`error::head_too_big`]).
    pub(super) fn head_failed(&self, e: StreamError) -> NetError {
        match error::head_too_big(&e) {
            Some(too_big) => too_big,
            None => self.stream_failed(e),
        }
    }
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live")
            .field("remote", &self.conn.remote_address())
            .field("open", &self.is_open())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_peers_get_a_loopback_socket() {
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        let v6: IpAddr = "::1".parse().unwrap();
        assert_eq!(slot(v4), (0, v4));
        assert_eq!(slot(v6), (2, v6));
        assert_eq!(slot("192.0.2.1".parse().unwrap()).1, Ipv4Addr::UNSPECIFIED);
        assert_eq!(
            slot("2001:db8::1".parse().unwrap()).1,
            Ipv6Addr::UNSPECIFIED
        );
    }
}
