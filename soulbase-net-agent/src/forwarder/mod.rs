//! [`Forwarder`]: the seed's UDP DNS forwarder. Each query goes to the upstream unchanged on a
//! socket of its own, and the upstream's answer comes back to the client unchanged (the
//! original message id included); at most `max_inflight` queries are out at once, and a query
//! the upstream leaves unanswered past the upstream timeout gets no answer and a warning.
//!
//! Why a socket per query: its answer then arrives on a port only that query uses, connected
//! to the upstream (nothing else can answer on it), so the forwarder never has to rewrite
//! message ids to tell answers apart, and hands every byte back as the upstream sent it.
//!
//! Why the permit is taken before reading: while `max_inflight` queries are out, the loop
//! reads nothing, so further queries wait in the socket's receive buffer (and past it are
//! dropped by the kernel, as for any UDP server under load) instead of piling up in memory.
//!
//! It owns its sockets and counters only; it never touches the agent's leases or probes.

mod config;
mod stats;

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use soulbase_net_core::{ErrorKind, NetError};
use tokio::net::UdpSocket;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use self::config::ForwarderConfig;
use self::stats::{Counters, InFlight};
pub use self::stats::{ForwarderStats, LatencyHistogram};

/// The largest UDP datagram: queries and answers are read whole, EDNS answers past 512 bytes
/// included.
const MAX_DATAGRAM: usize = 65_535;

/// A DNS header's length: a datagram shorter than this has no message to forward.
const HEADER_LEN: usize = 12;

/// A running forwarder: reads queries on [`local_addr`](Self::local_addr) and forwards them
/// to its upstream until [`shutdown`](Self::shutdown) (or until dropped, which stops it at
/// once).
///
/// Per query, in a task of its own holding one of `max_inflight` permits: a new UDP socket
/// connected to the upstream sends the query's bytes as read; packets on it that are not a
/// response with the query's id are ignored (counted in
/// [`mismatched`](ForwarderStats::mismatched)); the first that is goes back to the client as
/// read. Past the upstream timeout the client gets nothing, and a `WARN` line names the id,
/// the client and the upstream. Each answer's latency (query read to answer sent) is in
/// [`stats`](Self::stats) and in a `DEBUG` line.
///
/// # Examples
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use soulbase_net_agent::forwarder::{Forwarder, ForwarderConfig};
///
/// let config = ForwarderConfig::new("127.0.0.1:5300".parse()?, "127.0.0.1:53".parse()?)
///     .max_inflight(64)
///     .upstream_timeout(Duration::from_secs(2));
/// let forwarder = Forwarder::start(config).await?;
/// // … clients query forwarder.local_addr() …
/// let stats = forwarder.shutdown().await;
/// println!("{} answered, p99 {:?}", stats.forwarded, stats.latency.quantile(0.99));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Forwarder {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    /// Tells the loop to stop reading; taken by `shutdown`.
    stop: Option<oneshot::Sender<()>>,
    /// The loop; aborted when the forwarder is dropped without `shutdown`.
    serving: Option<JoinHandle<()>>,
}

/// What the loop and every query share.
#[derive(Debug)]
struct Shared {
    /// Queries arrive here, answers leave from here (the address clients asked).
    listener: UdpSocket,
    upstream: SocketAddr,
    upstream_timeout: Duration,
    /// `max_inflight` permits: one per query out.
    permits: Arc<Semaphore>,
    max_inflight: u32,
    counters: Arc<Counters>,
}

// === impl Forwarder ===

impl Forwarder {
    /// Validates `config`, binds its listening address and starts forwarding.
    ///
    /// # Errors
    /// `InvalidRequest` as [`ForwarderConfig::validate`]; `Io` when the address cannot be
    /// bound.
    pub async fn start(config: ForwarderConfig) -> Result<Self, NetError> {
        config.validate()?;
        let listener = UdpSocket::bind(config.listen).await.map_err(|e| {
            NetError::new(ErrorKind::Io)
                .with_message(format!("dns forwarder: cannot listen on {}", config.listen))
                .with_source(e)
        })?;
        let local_addr = listener.local_addr().map_err(|e| {
            NetError::new(ErrorKind::Io)
                .with_message("dns forwarder: no local address")
                .with_source(e)
        })?;
        let shared = Arc::new(Shared {
            listener,
            upstream: config.upstream,
            upstream_timeout: config.upstream_timeout,
            permits: Arc::new(Semaphore::new(config.max_inflight as usize)),
            max_inflight: config.max_inflight,
            counters: Arc::new(Counters::default()),
        });
        let (stop, stopped) = oneshot::channel();
        let serving = tokio::spawn(serve(Arc::clone(&shared), stopped));
        tracing::info!(listen = %local_addr, upstream = %config.upstream,
            max_inflight = config.max_inflight, "dns forwarder started");
        Ok(Self {
            local_addr,
            shared,
            stop: Some(stop),
            serving: Some(serving),
        })
    }

    /// The address queries are read on (with the port chosen when `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The counters now (see [`ForwarderStats`]).
    pub fn stats(&self) -> ForwarderStats {
        self.shared.counters.snapshot()
    }

    /// The live counters, for the agent's metrics: they stay readable (final) after the
    /// forwarder stops.
    pub(crate) fn counters(&self) -> LiveStats {
        LiveStats(Arc::clone(&self.shared.counters))
    }

    /// Stops reading queries, waits for the ones in flight to end (each within the upstream
    /// timeout) and returns the final counters.
    pub async fn shutdown(mut self) -> ForwarderStats {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(serving) = self.serving.take() {
            let _ = serving.await;
        }
        // Every query task holds a permit until it ends: having them all means none is left.
        let _all = self
            .shared
            .permits
            .acquire_many(self.shared.max_inflight)
            .await;
        tracing::info!(listen = %self.local_addr, "dns forwarder stopped");
        self.stats()
    }
}

/// A forwarder's live counters, held by whoever reports them (the agent's `/metrics`).
#[derive(Clone, Debug)]
pub(crate) struct LiveStats(Arc<Counters>);

impl LiveStats {
    /// The counters now.
    pub(crate) fn snapshot(&self) -> ForwarderStats {
        self.0.snapshot()
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some(serving) = self.serving.take() {
            serving.abort();
        }
    }
}

/// The loop: a permit, then a datagram, then a task forwarding it.
async fn serve(shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let permit = tokio::select! {
            _ = &mut stop => return,
            permit = Arc::clone(&shared.permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let (n, client) = tokio::select! {
            _ = &mut stop => return,
            received = shared.listener.recv_from(&mut buf) => match received {
                Ok(received) => received,
                Err(e) => {
                    receive_failed(&e).await;
                    continue;
                }
            },
        };
        let read_at = Instant::now();
        let counters = &shared.counters;
        Counters::bump(&counters.received);
        let datagram = &buf[..n];
        let Some(id) = query_id(datagram) else {
            Counters::bump(&counters.dropped);
            tracing::debug!(%client, len = n, "dns forwarder: not a query; dropped");
            continue;
        };
        let query = Query {
            bytes: datagram.to_vec(),
            id,
            client,
            read_at,
        };
        let inflight = counters.enter();
        tokio::spawn(forward(Arc::clone(&shared), query, permit, inflight));
    }
}

/// A failed read on the listening socket: an ICMP error left by an earlier answer to a client
/// that had gone (Linux reports it on the next read) is skipped; anything else is logged, and
/// the loop pauses a moment so that a socket failing on every read does not spin.
async fn receive_failed(e: &io::Error) {
    match e.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => {
            tracing::debug!(error = %e, "dns forwarder: an earlier answer was refused");
        }
        _ => {
            tracing::warn!(error = %e, "dns forwarder: reading a query failed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A query read, as it goes upstream.
#[derive(Debug)]
struct Query {
    /// The datagram as read: forwarded unchanged.
    bytes: Vec<u8>,
    /// Its message id: the answer must carry it.
    id: u16,
    /// Where the answer goes.
    client: SocketAddr,
    /// When it was read: the start of its latency and of its timeout.
    read_at: Instant,
}

/// One query, from its own socket to the client's answer (or to the timeout's warning).
async fn forward(
    shared: Arc<Shared>,
    query: Query,
    _permit: OwnedSemaphorePermit,
    _inflight: InFlight,
) {
    let Query {
        bytes,
        id,
        client,
        read_at,
    } = query;
    let upstream = shared.upstream;
    let counters = &shared.counters;
    let exchanged = tokio::time::timeout_at(
        read_at + shared.upstream_timeout,
        exchange(upstream, &bytes, id, counters),
    )
    .await;
    let answer = match exchanged {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => {
            Counters::bump(&counters.failed);
            tracing::warn!(id, %client, %upstream, error = %e,
                "dns forwarder: the upstream exchange failed; no answer sent");
            return;
        }
        Err(_) => {
            Counters::bump(&counters.timed_out);
            let timeout_ms = u64::try_from(shared.upstream_timeout.as_millis()).unwrap_or(u64::MAX);
            tracing::warn!(id, %client, %upstream, timeout_ms,
                "dns forwarder: no answer from the upstream in time; no answer sent");
            return;
        }
    };
    if let Err(e) = shared.listener.send_to(&answer, client).await {
        Counters::bump(&counters.failed);
        tracing::warn!(id, %client, error = %e, "dns forwarder: sending the answer failed");
        return;
    }
    let took = read_at.elapsed();
    counters.answered(took);
    let latency_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    tracing::debug!(id, %client, latency_us, len = answer.len(), "dns forwarder: answered");
}

/// Sends `query` to `upstream` from a socket of its own and waits for the response with its
/// `id`, skipping any other packet.
async fn exchange(
    upstream: SocketAddr,
    query: &[u8],
    id: u16,
    counters: &Counters,
) -> io::Result<Vec<u8>> {
    let any: SocketAddr = if upstream.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(any).await?;
    socket.connect(upstream).await?;
    socket.send(query).await?;
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let n = socket.recv(&mut buf).await?;
        if answer_id(&buf[..n]) == Some(id) {
            buf.truncate(n);
            return Ok(buf);
        }
        Counters::bump(&counters.mismatched);
        tracing::debug!(id, %upstream, len = n, "dns forwarder: not the awaited answer; ignored");
    }
}

/// The id of a datagram that can be a query: a whole header, the response bit clear.
fn query_id(datagram: &[u8]) -> Option<u16> {
    header_id(datagram, false)
}

/// The id of a datagram that can be an answer: a whole header, the response bit set.
fn answer_id(datagram: &[u8]) -> Option<u16> {
    header_id(datagram, true)
}

fn header_id(datagram: &[u8], response: bool) -> Option<u16> {
    match datagram {
        [hi, lo, flags, ..] if datagram.len() >= HEADER_LEN && (flags & 0x80 != 0) == response => {
            Some(u16::from_be_bytes([*hi, *lo]))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_needs_a_whole_header_and_the_response_bit_clear() {
        let mut header = [0u8; HEADER_LEN];
        header[0] = 0xbe;
        header[1] = 0xef;
        assert_eq!(query_id(&header), Some(0xbeef));
        assert_eq!(answer_id(&header), None);
        assert_eq!(query_id(&header[..HEADER_LEN - 1]), None);
        assert_eq!(query_id(&[]), None);
        header[2] = 0x81;
        assert_eq!(query_id(&header), None);
        assert_eq!(answer_id(&header), Some(0xbeef));
        let mut long = header.to_vec();
        long.resize(4000, 7);
        assert_eq!(answer_id(&long), Some(0xbeef));
    }
}
