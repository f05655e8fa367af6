//! Opening TCP connections: the [`Dialer`] seam and happy eyeballs over several addresses.
//!
//! Why a seam: every socket the client opens goes through one [`Dialer`], so a test can put
//! in a dialer that records each address and refuses anything off loopback — a broken guard
//! then fails a test instead of reaching the network.

use std::{fmt, future::Future, io, net::SocketAddr, pin::Pin, sync::Arc, time::Duration};

use tokio::{net::TcpStream, task::JoinSet};

/// A boxed future returned by a [`Dialer`].
pub type DialFuture = Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send>>;

/// Opens TCP connections for the client. The default is [`TcpDialer`].
pub trait Dialer: Send + Sync + fmt::Debug + 'static {
    /// Connects to `addr`.
    fn dial(&self, addr: SocketAddr) -> DialFuture;
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
