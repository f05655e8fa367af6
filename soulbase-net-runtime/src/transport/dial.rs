//! The one socket seam of the transport layer, [`Dialer`]: TCP connections, the UDP sockets
//! QUIC sends from and every QUIC peer; and happy eyeballs over several TCP addresses.
//!
//! Why a seam: every socket the client opens, over either transport, goes through one
//! [`Dialer`], so a test can put in a dialer that records each peer and refuses anything off
//! loopback (the runtime's `testing::LoopbackDialer`) — a broken guard then fails a test
//! instead of reaching the network.

use std::{fmt, future::Future, io, net::SocketAddr, pin::Pin, sync::Arc, time::Duration};

use tokio::{net::TcpStream, task::JoinSet};

/// A boxed future returned by a [`Dialer`].
pub type DialFuture = Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send>>;

/// Opens the client's sockets: TCP connections, and for HTTP/3 (feature `http3`) the UDP
/// sockets QUIC sends from, with a say on every QUIC peer. The default is [`TcpDialer`].
///
/// Only [`Dialer::dial`] must be written; the UDP methods default to the standard library's
/// socket and to allowing every peer (the address guard has already allowed it).
///
/// ```
/// use std::{io, net::{SocketAddr, UdpSocket}};
/// use soulbase_net_runtime::{DialFuture, Dialer, TcpDialer};
///
/// /// Reaches loopback only, over TCP and QUIC alike.
/// #[derive(Debug)]
/// struct LoopbackOnly;
///
/// impl Dialer for LoopbackOnly {
///     fn dial(&self, addr: SocketAddr) -> DialFuture {
///         match self.udp_peer(addr) {
///             Ok(()) => TcpDialer.dial(addr),
///             Err(e) => Box::pin(async move { Err(e) }),
///         }
///     }
///
///     fn udp_peer(&self, peer: SocketAddr) -> io::Result<()> {
///         if peer.ip().is_loopback() {
///             Ok(())
///         } else {
///             Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{peer} is off loopback")))
///         }
///     }
/// }
/// let _ = LoopbackOnly.bind_udp("127.0.0.1:0".parse().unwrap());
/// ```
pub trait Dialer: Send + Sync + fmt::Debug + 'static {
    /// Connects to `addr` over TCP.
    fn dial(&self, addr: SocketAddr) -> DialFuture;

    /// Binds a UDP socket at `local` for QUIC to send from: the loopback address of the
    /// family for loopback peers, the unspecified address otherwise, port 0. One socket
    /// serves every peer of its kind (a QUIC endpoint), so the peers themselves are each
    /// shown to [`Dialer::udp_peer`]. The client makes the socket non-blocking.
    ///
    /// # Errors
    /// Any error refuses HTTP/3 to the peers this socket would have served (`Connect`).
    fn bind_udp(&self, local: SocketAddr) -> io::Result<std::net::UdpSocket> {
        std::net::UdpSocket::bind(local)
    }

    /// Called with each QUIC peer, after the address guard allowed it and before the first
    /// datagram goes to it.
    ///
    /// # Errors
    /// An error refuses the peer, as a failed [`Dialer::dial`] refuses a TCP address: the
    /// next address is tried, and with none left the request fails with `Connect`.
    fn udp_peer(&self, peer: SocketAddr) -> io::Result<()> {
        let _ = peer;
        Ok(())
    }
}

/// The default dialer: `TcpStream::connect` with `TCP_NODELAY` on.
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpDialer;

impl Dialer for TcpDialer {
    fn dial(&self, addr: SocketAddr) -> DialFuture {
        Box::pin(async move {
            let stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            Ok(stream)
        })
    }
}

/// Connects to the first address that answers, RFC 8305 style: the next address is tried
/// when the previous one failed or has not connected within `delay`, without abandoning it.
/// Without a `delay` (happy eyeballs off), one address at a time, in order: the next only
/// once the previous one failed.
///
/// `addrs` must already be ordered (families interleaved) and allowed by the guard.
///
/// Every address that failed before the winner is pushed to `failed`, so the caller can
/// freeze it.
pub(crate) async fn happy_eyeballs(
    dialer: &Arc<dyn Dialer>,
    addrs: &[SocketAddr],
    delay: Option<Duration>,
    failed: &mut Vec<SocketAddr>,
) -> io::Result<(TcpStream, SocketAddr)> {
    // One address: nothing to race, so it is dialled in this task, not in one of its own
    // (a task per new connection costs its spawn, about a thousand instructions).
    if let [addr] = addrs {
        return match dialer.dial(*addr).await {
            Ok(stream) => Ok((stream, *addr)),
            Err(e) => {
                failed.push(*addr);
                Err(e)
            }
        };
    }
    let mut pending = addrs.iter().copied();
    let mut attempts: JoinSet<(SocketAddr, io::Result<TcpStream>)> = JoinSet::new();
    let mut last_err = None;
    loop {
        if let Some(addr) = pending.next() {
            let fut = dialer.dial(addr);
            attempts.spawn(async move { (addr, fut.await) });
        } else if attempts.is_empty() {
            return Err(last_err.unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::AddrNotAvailable, "no address to connect to")
            }));
        }
        let next = async {
            match attempts.join_next().await {
                Some(Ok(done)) => Some(done),
                Some(Err(join)) => Some((
                    SocketAddr::from(([0, 0, 0, 0], 0)),
                    Err(io::Error::other(join)),
                )),
                None => None,
            }
        };
        let more_to_try = pending.len() > 0;
        let race = async {
            match delay {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            done = next => match done {
                Some((addr, Ok(stream))) => return Ok((stream, addr)),
                Some((addr, Err(e))) => {
                    failed.push(addr);
                    last_err = Some(e);
                }
                None => {}
            },
            () = race, if more_to_try => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;
    use tokio::net::TcpListener;

    use super::*;

    /// Dials loopback for real; for the two "black hole" addresses it never answers.
    #[derive(Debug, Default)]
    struct Scripted {
        dialled: Mutex<Vec<SocketAddr>>,
    }

    impl Dialer for Scripted {
        fn dial(&self, addr: SocketAddr) -> DialFuture {
            self.dialled.lock().push(addr);
            Box::pin(async move {
                if addr.ip().is_loopback() && addr.port() != 9 {
                    TcpStream::connect(addr).await
                } else {
                    std::future::pending().await
                }
            })
        }
    }

    #[tokio::test]
    async fn a_silent_address_does_not_hold_up_the_next_one() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let good = listener.local_addr().unwrap();
        let silent: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let scripted = Arc::new(Scripted::default());
        let dialer: Arc<dyn Dialer> = scripted.clone();
        let (_, addr) = happy_eyeballs(
            &dialer,
            &[silent, good],
            Some(Duration::from_millis(20)),
            &mut Vec::new(),
        )
        .await
        .unwrap();
        assert_eq!(addr, good);
        assert_eq!(*scripted.dialled.lock(), vec![silent, good]);
    }

    #[tokio::test]
    async fn a_refused_address_moves_on_at_once_and_all_failing_reports_the_last_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let good = listener.local_addr().unwrap();
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap()
        };
        let dialer: Arc<dyn Dialer> = Arc::new(TcpDialer);
        let mut failed = Vec::new();
        // A long delay: the refusal, not the timer, must move on to the next address.
        let (_, addr) = tokio::time::timeout(
            Duration::from_secs(5),
            happy_eyeballs(
                &dialer,
                &[closed, good],
                Some(Duration::from_secs(30)),
                &mut failed,
            ),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(addr, good);
        assert_eq!(failed, vec![closed]);
        let err = happy_eyeballs(
            &dialer,
            &[closed],
            Some(Duration::from_secs(30)),
            &mut Vec::new(),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        let err = happy_eyeballs(&dialer, &[], Some(Duration::from_secs(30)), &mut Vec::new())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrNotAvailable);
    }
}
