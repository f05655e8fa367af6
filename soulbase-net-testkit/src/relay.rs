//! [`LatencyRelay`]: a TCP relay that adds latency to what a client sends, for tests of a
//! client of a shared store (Redis, PostgreSQL) whose answers come late; or to what the
//! upstream sends back, for tests that act while an answer is on its way.
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
        Self::spawn(upstream, delay, seed, Held::Requests).await
    }

    /// Starts a relay to `upstream` that holds what the upstream sends back instead: each
    /// chunk of an answer is delayed as [`start`](Self::start) delays a request, and what a
    /// client sends passes at once. The upstream has acted on a request while its answer is
    /// still held: a test can stop a client in that window.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn answers(
        upstream: SocketAddr,
        delay: RangeInclusive<Duration>,
        seed: u64,
    ) -> std::io::Result<Self> {
        Self::spawn(upstream, delay, seed, Held::Answers).await
    }

    async fn spawn(
        upstream: SocketAddr,
        delay: RangeInclusive<Duration>,
        seed: u64,
        held: Held,
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
                conns.spawn(relay(client, upstream, draws, counted.clone(), held));
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

    /// Chunks passed on so far, each one delayed: to the upstream, or back from it for a
    /// relay started with [`answers`](Self::answers).
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

/// Which direction of a connection the relay holds.
#[derive(Clone, Copy)]
enum Held {
    Requests,
    Answers,
}

/// Relays one connection until either side closes.
async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    draws: Draws,
    chunks: Arc<AtomicU64>,
    held: Held,
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (client_rx, client_tx) = client.into_split();
    let (server_rx, server_tx) = server.into_split();
    match held {
        Held::Requests => tokio::join!(
            delayed(client_rx, server_tx, draws, &chunks),
            passed(server_rx, client_tx)
        ),
        Held::Answers => tokio::join!(
            passed(client_rx, server_tx),
            delayed(server_rx, client_tx, draws, &chunks)
        ),
    };
}

/// Copies `rx` to `tx`, each chunk held for its draw, until `rx` ends; then closes `tx`.
async fn delayed(
    mut rx: tokio::net::tcp::OwnedReadHalf,
    mut tx: tokio::net::tcp::OwnedWriteHalf,
    mut draws: Draws,
    chunks: &AtomicU64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        tokio::time::sleep(draws.next()).await;
        if tx.write_all(&buf[..n]).await.is_err() {
            break;
        }
        chunks.fetch_add(1, Ordering::Relaxed);
    }
    let _ = tx.shutdown().await;
}

/// Copies `rx` to `tx` at once until `rx` ends; then closes `tx`.
async fn passed(mut rx: tokio::net::tcp::OwnedReadHalf, mut tx: tokio::net::tcp::OwnedWriteHalf) {
    let _ = tokio::io::copy(&mut rx, &mut tx).await;
    let _ = tx.shutdown().await;
}
