//! [`LatencyRelay`]: a TCP relay that adds latency to what a client sends, for tests of a
//! client of a shared store (Redis, PostgreSQL) whose answers come late.
//!
//! Why a relay and not a paused server: a paused Redis is late for every instance at once, so
//! every instance falls back together; a relay per instance makes each one see its own
//! latency, as instances on different hosts, behind different links, do.

use std::{
    net::SocketAddr,
    ops::RangeInclusive,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinSet,
};

use crate::server::splitmix64;

/// A TCP relay on a free loopback port in front of `upstream` (a loopback address): each
/// chunk a client sends is held for a delay drawn at random from a range before it is passed
/// on, in order; what the upstream sends back passes at once. One Redis command is one
/// chunk, so each command is late by its own draw (and a command sent behind a late one
/// waits for it, as on a slow link). Dropping the relay closes its connections.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use soulbase_net_testkit::LatencyRelay;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let relay = LatencyRelay::start(
///     upstream.local_addr()?,
///     Duration::ZERO..=Duration::from_millis(20),
///     7,
/// )
/// .await?;
/// assert!(relay.addr().ip().is_loopback());
/// assert_ne!(relay.addr(), upstream.local_addr()?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LatencyRelay {
    addr: SocketAddr,
    chunks: Arc<AtomicU64>,
    tasks: JoinSet<()>,
}

impl LatencyRelay {
    /// Starts a relay to `upstream` that delays each chunk a client sends by a duration drawn
    /// uniformly from `delay`, from a stream seeded by `seed` (a run draws the same delays in
    /// the same order).
    ///
    /// # Errors
    /// When `upstream` is not a loopback address (nothing here dials elsewhere), or the
    /// relay's listener cannot bind.
    pub async fn start(
        upstream: SocketAddr,
        delay: RangeInclusive<Duration>,
        seed: u64,
    ) -> std::io::Result<Self> {
        if !upstream.ip().is_loopback() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("the relay dials loopback only, not {upstream}"),
            ));
        }
        let listener = TcpListener::bind((upstream.ip(), 0)).await?;
        let addr = listener.local_addr()?;
        let chunks = Arc::new(AtomicU64::new(0));
        let mut tasks = JoinSet::new();
        let (low, high) = (*delay.start(), (*delay.end()).max(*delay.start()));
        let counted = chunks.clone();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            let mut n = 0u64;
            while let Ok((client, _)) = listener.accept().await {
                n += 1;
                let draws = Draws {
                    state: splitmix64(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                    low,
                    high,
                };
                conns.spawn(relay(client, upstream, draws, counted.clone()));
                // Connections that ended are reaped as new ones come.
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            chunks,
            tasks,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Chunks passed to the upstream so far (each one delayed).
    pub fn chunks(&self) -> u64 {
        self.chunks.load(Ordering::Relaxed)
    }
}

impl Drop for LatencyRelay {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// Delays drawn uniformly from `[low, high]`.
struct Draws {
    state: u64,
    low: Duration,
    high: Duration,
}

impl Draws {
    fn next(&mut self) -> Duration {
        self.state = splitmix64(self.state);
        let span = (self.high - self.low).as_micros() as u64 + 1;
        self.low + Duration::from_micros(self.state % span)
    }
}

/// Relays one connection until either side closes.
async fn relay(client: TcpStream, upstream: SocketAddr, mut draws: Draws, chunks: Arc<AtomicU64>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            tokio::time::sleep(draws.next()).await;
            if server_tx.write_all(&buf[..n]).await.is_err() {
                break;
            }
            chunks.fetch_add(1, Ordering::Relaxed);
        }
        let _ = server_tx.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
        let _ = client_tx.shutdown().await;
    };
    tokio::join!(up, down);
}
