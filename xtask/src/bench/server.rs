//! The bench server, in a process of its own so that the bench process's CPU time is the
//! clients' alone.
//!
//! `xtask bench-server` listens on four loopback ports — HTTP/1.1, h2c (HTTP/2 with prior
//! knowledge), TLS (ALPN `h2` or `http/1.1`, a throwaway [`CertKit`] leaf for `localhost`
//! and `127.0.0.1`) and a testkit FaultServer with the same leaf serving HTTP/2 over TLS and
//! HTTP/3 on the UDP port of the same number (`/` only) — and prints one JSON line naming them
//! and the kit's root certificate.
//! Then it answers each `stats` line on its standard input with one JSON line of counters and
//! each `settle <ms>` line, once no connection is open on its TCP listeners (or after that
//! many milliseconds), with `{"open": n}`; it exits when its standard input closes (so it
//! never outlives the bench, even one killed).
//!
//! Routes, whatever the host: `/big` answers 1 MiB, `/fail` answers 503, `/jitter` answers
//! `200 ok` after a delay drawn uniformly from 0–20 ms (an upstream of ordinary speed, for the
//! outbox bench), anything else `200 ok` at once.

use std::{
    convert::Infallible,
    net::SocketAddr,
    process::Stdio,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use soulbase_net_testkit::{CertKit, FaultServer, Reply};
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, Lines},
    net::{TcpListener, TcpSocket},
    process::{Child, ChildStdin, ChildStdout, Command},
};
use tokio_rustls::TlsAcceptor;

/// The size of `/big`'s body.
pub(crate) const BIG_BODY: usize = 1 << 20;

/// Most streams a client may open at once on one HTTP/2 connection: above every scenario's
/// callers, so the server never makes an h2 client queue.
const MAX_STREAMS: u32 = 1024;

/// Connections waiting to be accepted, per listener (the kernel caps it at `somaxconn`).
const BACKLOG: u32 = 8192;

/// Which listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Listener {
    /// HTTP/1.1, keep-alive.
    H1,
    /// HTTP/2 without TLS, prior knowledge.
    H2c,
    /// TLS, ALPN `h2` (or `http/1.1`).
    Tls,
    /// A FaultServer: TLS on TCP (ALPN `h2`) and HTTP/3 on the UDP port of the same number,
    /// so that HTTP/3 and HTTP/2 meet the same server (`bench --h3`).
    Quic,
}

impl Listener {
    const ALL: [Listener; 4] = [Listener::H1, Listener::H2c, Listener::Tls, Listener::Quic];

    fn key(self) -> &'static str {
        match self {
            Listener::H1 => "h1",
            Listener::H2c => "h2c",
            Listener::Tls => "tls",
            Listener::Quic => "quic",
        }
    }
}

/// What the server counted so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Connections accepted per listener, in [`Listener::ALL`] order.
    conns: [u64; 4],
    /// Requests answered, every route and listener.
    pub(crate) requests: u64,
    /// Requests to `/fail`.
    pub(crate) fail_hits: u64,
}

impl Stats {
    /// Connections accepted on `listener`.
    pub(crate) fn conns(&self, listener: Listener) -> u64 {
        let i = Listener::ALL.iter().position(|l| *l == listener);
        i.map_or(0, |i| self.conns[i])
    }

    fn json(&self) -> Value {
        let mut conns = serde_json::Map::new();
        for (l, n) in Listener::ALL.iter().zip(self.conns) {
            conns.insert(l.key().to_owned(), n.into());
        }
        json!({ "conns": conns, "requests": self.requests, "fail_hits": self.fail_hits })
    }

    fn from_json(v: &Value) -> Option<Self> {
        let mut conns = [0; 4];
        for (i, l) in Listener::ALL.iter().enumerate() {
            conns[i] = v["conns"][l.key()].as_u64()?;
        }
        Some(Self {
            conns,
            requests: v["requests"].as_u64()?,
            fail_hits: v["fail_hits"].as_u64()?,
        })
    }
}

#[derive(Debug, Default)]
struct Counters {
    conns: [AtomicU64; 4],
    requests: AtomicU64,
    fail_hits: AtomicU64,
    /// Connections open now on the TCP listeners (HTTP/1.1, h2c, TLS).
    open: AtomicU64,
    /// Told whenever one of those closes.
    closed: tokio::sync::Notify,
}

/// Counts one connection as open until dropped (its task ended, however it ended).
struct Open(Arc<Counters>);

impl Open {
    fn new(counters: &Arc<Counters>) -> Self {
        counters.open.fetch_add(1, Ordering::Relaxed);
        Open(counters.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        self.0.closed.notify_waiters();
    }
}

/// Waits until no connection is open on the TCP listeners, or until `limit` has passed;
/// how many are still open.
async fn settle(counters: &Counters, limit: Duration) -> u64 {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let closed = counters.closed.notified();
        tokio::pin!(closed);
        // Registered before the count is read, so a close in between is not missed.
        closed.as_mut().enable();
        let open = counters.open.load(Ordering::Relaxed);
        if open == 0 || tokio::time::timeout_at(deadline, closed).await.is_err() {
            return open;
        }
    }
}

impl Counters {
    fn snapshot(&self) -> Stats {
        Stats {
            conns: self.conns.each_ref().map(|c| c.load(Ordering::Relaxed)),
            requests: self.requests.load(Ordering::Relaxed),
            fail_hits: self.fail_hits.load(Ordering::Relaxed),
        }
    }
}

// === the child ===

/// `xtask bench-server`: serves until standard input closes.
pub(crate) fn serve() -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("bench-server: tokio runtime: {e}"))?;
    rt.block_on(serve_async())
}

async fn serve_async() -> Result<(), String> {
    let counters = Arc::new(Counters::default());
    let kit = CertKit::new().map_err(|e| format!("bench-server: certificates: {e}"))?;
    let leaf = kit
        .localhost()
        .map_err(|e| format!("bench-server: certificates: {e}"))?;
    let mut tls = (*leaf
        .server_config()
        .map_err(|e| format!("bench-server: TLS config: {e}"))?)
    .clone();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tls = TlsAcceptor::from(Arc::new(tls));
    let big = Bytes::from(vec![b'x'; BIG_BODY]);
    let mut ports = serde_json::Map::new();
    // HTTP/3 and HTTP/2 over TLS on one server: the FaultServer counts its own connections.
    let quic = FaultServer::builder()
        .tls(
            leaf.server_config()
                .map_err(|e| format!("bench-server: TLS config: {e}"))?,
        )
        .http3()
        .route("/", Reply::ok("ok"))
        .start()
        .await
        .map_err(|e| format!("bench-server: the HTTP/3 listener: {e}"))?;
    ports.insert(Listener::Quic.key().to_owned(), quic.addr().port().into());
    for (i, listener) in Listener::ALL.into_iter().enumerate() {
        if listener == Listener::Quic {
            continue;
        }
        let socket = listen()?;
        let port = socket
            .local_addr()
            .map_err(|e| format!("bench-server: no local address: {e}"))?
            .port();
        ports.insert(listener.key().to_owned(), port.into());
        let tls = (listener == Listener::Tls).then(|| tls.clone());
        tokio::spawn(accept_loop(socket, i, tls, counters.clone(), big.clone()));
    }
    let hello = json!({ "ports": ports, "root_pem": kit.root_pem() });
    let mut out = tokio::io::stdout();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    send_line(&mut out, &hello).await?;
    while let Some(line) = lines
        .next_line()
        .await
        .map_err(|e| format!("bench-server: stdin: {e}"))?
    {
        let line = line.trim();
        if line == "stats" {
            let mut stats = counters.snapshot();
            stats.conns[3] = quic.connections();
            stats.requests += quic.total_hits();
            send_line(&mut out, &stats.json()).await?;
        } else if let Some(ms) = line.strip_prefix("settle ") {
            let limit = Duration::from_millis(ms.parse().unwrap_or(0));
            let open = settle(&counters, limit).await;
            send_line(&mut out, &json!({ "open": open })).await?;
        }
    }
    Ok(())
}

/// A loopback listener with a backlog for the many-hosts scenario, where hundreds of callers
/// connect at once: at tokio's default of 1024, dropped SYNs would come back a second later
/// and the p99 would be the kernel's retransmission timer.
fn listen() -> Result<TcpListener, String> {
    let err = |e: std::io::Error| format!("bench-server: could not listen on loopback: {e}");
    let socket = TcpSocket::new_v4().map_err(err)?;
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .map_err(err)?;
    socket.listen(BACKLOG).map_err(err)
}

async fn send_line(out: &mut (impl AsyncWrite + Unpin), v: &Value) -> Result<(), String> {
    let line = format!("{v}\n");
    out.write_all(line.as_bytes())
        .await
        .and(out.flush().await)
        .map_err(|e| format!("bench: pipe to the other process: {e}"))
}

async fn accept_loop(
    socket: TcpListener,
    index: usize,
    tls: Option<TlsAcceptor>,
    counters: Arc<Counters>,
    big: Bytes,
) {
    loop {
        let stream = match socket.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors or similar: give the clients a moment to close some.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        counters.conns[index].fetch_add(1, Ordering::Relaxed);
        let open = Open::new(&counters);
        let (counters, big, tls) = (counters.clone(), big.clone(), tls.clone());
        tokio::spawn(async move {
            let _open = open;
            match tls {
                None if index == 1 => serve_conn(stream, true, counters, big).await,
                None => serve_conn(stream, false, counters, big).await,
                Some(acceptor) => {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                    serve_conn(stream, h2, counters, big).await;
                }
            }
        });
    }
}

async fn serve_conn(
    io: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
    h2: bool,
    counters: Arc<Counters>,
    big: Bytes,
) {
    let service = service_fn(move |req: Request<Incoming>| {
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let n = counters.requests.load(Ordering::Relaxed);
        let delay = (req.uri().path() == "/jitter").then(|| jitter(n));
        let res = match req.uri().path() {
            "/big" => Response::new(Full::new(big.clone())),
            "/fail" => {
                counters.fail_hits.fetch_add(1, Ordering::Relaxed);
                let mut res = Response::new(Full::new(Bytes::from_static(b"fail")));
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                res
            }
            _ => Response::new(Full::new(Bytes::from_static(b"ok"))),
        };
        async move {
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            Ok::<_, Infallible>(res)
        }
    });
    let io = TokioIo::new(io);
    let _ = if h2 {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .max_concurrent_streams(MAX_STREAMS)
            .serve_connection(io, service)
            .await
    } else {
        hyper::server::conn::http1::Builder::new()
            .keep_alive(true)
            .serve_connection(io, service)
            .await
    };
}

/// The `/jitter` route's delay for the `n`-th request: uniform in 0–20 ms, from the
/// SplitMix64 finaliser of `n` (a run draws the same delays in the same order).
fn jitter(n: u64) -> Duration {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    Duration::from_micros(z % 20_001)
}

// === the parent's handle ===

/// The server process, started by the bench; killed (by its PID) when dropped, and it exits
/// by itself when the bench's end of its standard input closes.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    ports: [u16; 4],
    root_pem: String,
}

impl ServerProcess {
    /// Starts `exe bench-server` and reads its ports.
    pub(crate) async fn start(exe: &std::path::Path) -> Result<Self, String> {
        let mut child = Command::new(exe)
            .arg("bench-server")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("bench: could not start {} bench-server: {e}", exe.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("bench: the server's pipes are missing".to_owned());
        };
        let mut lines = BufReader::new(stdout).lines();
        let hello = read_json(&mut lines).await?;
        let mut ports = [0; 4];
        for (i, l) in Listener::ALL.iter().enumerate() {
            ports[i] = hello["ports"][l.key()]
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| format!("bench: the server named no {} port: {hello}", l.key()))?;
        }
        let root_pem = hello["root_pem"]
            .as_str()
            .ok_or("bench: the server sent no root certificate")?
            .to_owned();
        Ok(Self {
            child,
            stdin,
            lines,
            ports,
            root_pem,
        })
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The port of `listener`.
    pub(crate) fn port(&self, listener: Listener) -> u16 {
        let i = Listener::ALL.iter().position(|l| *l == listener);
        i.map_or(0, |i| self.ports[i])
    }

    /// The root certificate (PEM) the TLS listener's leaf chains to.
    pub(crate) fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// Waits (at most `limit`) until the connections of the clients measured so far are all
    /// closed, so that the next client is not measured while the server (and this process)
    /// still tear down the last one's: with 10 000 hosts that is 10 000 connections, and
    /// the next client's first connects would wait behind their closing. The connections
    /// still open after `limit`.
    pub(crate) async fn settle(&mut self, limit: Duration) -> Result<u64, String> {
        let line = format!("settle {}\n", limit.as_millis());
        self.stdin
            .write_all(line.as_bytes())
            .await
            .and(self.stdin.flush().await)
            .map_err(|e| format!("bench: the server went away: {e}"))?;
        let v = read_json(&mut self.lines).await?;
        v["open"]
            .as_u64()
            .ok_or_else(|| format!("bench: bad answer to settle from the server: {v}"))
    }

    /// The counters now.
    pub(crate) async fn stats(&mut self) -> Result<Stats, String> {
        self.stdin
            .write_all(b"stats\n")
            .await
            .and(self.stdin.flush().await)
            .map_err(|e| format!("bench: the server went away: {e}"))?;
        let v = read_json(&mut self.lines).await?;
        Stats::from_json(&v).ok_or_else(|| format!("bench: bad stats from the server: {v}"))
    }
}

async fn read_json(lines: &mut Lines<BufReader<ChildStdout>>) -> Result<Value, String> {
    let line = lines
        .next_line()
        .await
        .map_err(|e| format!("bench: reading the server: {e}"))?
        .ok_or("bench: the server exited")?;
    serde_json::from_str(&line).map_err(|e| format!("bench: the server said {line:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn settle_answers_when_the_last_connection_closes_or_at_its_limit() {
        let counters = Arc::new(Counters::default());
        let (a, b) = (Open::new(&counters), Open::new(&counters));
        let start = tokio::time::Instant::now();
        assert_eq!(settle(&counters, Duration::from_millis(50)).await, 2);
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(50),
            "waited its limit"
        );
        let closer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(a);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(b);
        });
        let start = tokio::time::Instant::now();
        assert_eq!(settle(&counters, Duration::from_secs(10)).await, 0);
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(20),
            "answered at the last close"
        );
        closer.await.unwrap();
    }

    #[test]
    fn stats_survive_the_pipe() {
        let s = Stats {
            conns: [3, 1, 2, 4],
            requests: 40,
            fail_hits: 5,
        };
        assert_eq!(Stats::from_json(&s.json()), Some(s));
        assert_eq!(s.conns(Listener::H2c), 1);
        assert_eq!(s.conns(Listener::Quic), 4);
        assert_eq!(Stats::from_json(&json!({ "requests": 1 })), None);
    }
}
