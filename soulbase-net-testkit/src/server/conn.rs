//! Per-connection control: a kill switch that lets a scripted reply reset (RST) or close (FIN)
//! the TCP connection it arrived on, for HTTP/1.1 and HTTP/2 alike, and the request count that
//! retires a connection after its `retire_after`-th request.
//!
//! Why a kill switch rather than writing raw bytes: hyper owns the connection once it serves it,
//! so a reply cannot reach the socket. Instead every accepted socket is wrapped in [`CtlIo`]
//! (below TLS, if any), and the connection task races the hyper connection against the
//! [`ConnCtl`] kill signal. Firing it drops the connection; if a reset was asked for, the
//! socket gets `SO_LINGER 0` first, so the kernel sends RST instead of FIN. A cut "after N body
//! bytes" arms the kill and lets it fire on the next flush, once hyper has handed those bytes to
//! the socket.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::signal::Signal;

/// Shared between a connection task, its IO wrapper and the replies served on it.
#[derive(Debug)]
pub(crate) struct ConnCtl {
    pub(crate) id: u64,
    kill: Signal,
    reset: AtomicBool,
    kill_on_flush: AtomicBool,
    /// The request after which the connection retires
    /// ([`retire_after`](super::FaultServerBuilder::retire_after)); `None`: never.
    retire_after: Option<u64>,
    /// Requests received so far.
    requests: AtomicU64,
    /// Asked to retire before it took a request (see [`ConnCtl::retire_at_first_request`]).
    retire_at_first: AtomicBool,
    /// Fired by the `retire_after`-th request: the connection task is to shut down gracefully.
    retire: Signal,
    /// Fired by the connection task once its graceful shutdown has begun.
    retiring: Signal,
}

impl ConnCtl {
    pub(crate) fn new(id: u64) -> Self {
        Self {
            id,
            kill: Signal::new(),
            reset: AtomicBool::new(false),
            kill_on_flush: AtomicBool::new(false),
            retire_after: None,
            requests: AtomicU64::new(0),
            retire_at_first: AtomicBool::new(false),
            retire: Signal::new(),
            retiring: Signal::new(),
        }
    }

    /// Retires the connection after its `n`-th request (`None`: never).
    pub(crate) fn with_retire_after(mut self, n: Option<u64>) -> Self {
        self.retire_after = n;
        self
    }

    /// Counts a request received on the connection. The `retire_after`-th asks the connection
    /// to retire and waits until its graceful shutdown has begun, so that its reply goes out
    /// after the GOAWAY (HTTP/2) or carries `Connection: close` (HTTP/1.1).
    pub(crate) async fn took_request(&self) {
        let n = self.requests.fetch_add(1, Ordering::SeqCst) + 1;
        let first = n == 1 && self.retire_at_first.load(Ordering::SeqCst);
        if self.retire_after != Some(n) && !first {
            return;
        }
        self.retire.fire();
        tokio::select! {
            () = self.retiring.fired() => {}
            () = self.kill.fired() => {}
        }
    }

    /// Whether the connection has taken no request yet.
    pub(crate) fn is_fresh(&self) -> bool {
        self.requests.load(Ordering::SeqCst) == 0
    }

    /// A connection asked to retire before its first request retires at it instead: until
    /// then hyper may still be reading the client's preface, and a graceful shutdown there
    /// closes the connection without a GOAWAY — what no server does to a client's requests
    /// (nginx sends GOAWAY on every HTTP/2 connection it retires). Returns false when a
    /// request came meanwhile (the caller retires the connection at once).
    pub(crate) fn retire_at_first_request(&self) -> bool {
        self.retire_at_first.store(true, Ordering::SeqCst);
        self.is_fresh()
    }

    /// Resolves when the connection has taken its `retire_after`-th request.
    pub(crate) async fn retire_asked(&self) {
        self.retire.fired().await;
    }

    /// The connection's graceful shutdown has begun: the reply waiting for it goes on.
    pub(crate) fn retiring(&self) {
        self.retiring.fire();
    }

    /// Drops the connection now: with RST if `reset`, else with FIN.
    pub(crate) fn kill_now(&self, reset: bool) {
        if reset {
            self.reset.store(true, Ordering::SeqCst);
        }
        self.kill.fire();
    }

    /// Drops the connection at the next flush of the socket (after the bytes already handed to
    /// hyper are written).
    pub(crate) fn kill_after_flush(&self, reset: bool) {
        if reset {
            self.reset.store(true, Ordering::SeqCst);
        }
        self.kill_on_flush.store(true, Ordering::SeqCst);
    }

    /// The bytes handed over so far were written: a kill armed by
    /// [`kill_after_flush`](Self::kill_after_flush) fires now.
    pub(crate) fn flushed(&self) {
        if self.kill_on_flush.load(Ordering::SeqCst) {
            self.kill.fire();
        }
    }

    /// Resolves when the connection must be dropped.
    pub(crate) async fn killed(&self) {
        self.kill.fired().await;
    }
}

/// The accepted socket, wrapped so a kill can be timed to a flush, a reset can set
/// `SO_LINGER 0` just before the socket closes, and any other close lingers (see
/// [`linger`]).
#[derive(Debug)]
pub(crate) struct CtlIo {
    /// `None` once dropped (taken by the lingering close).
    inner: Option<TcpStream>,
    ctl: std::sync::Arc<ConnCtl>,
}

impl CtlIo {
    pub(crate) fn new(inner: TcpStream, ctl: std::sync::Arc<ConnCtl>) -> Self {
        Self {
            inner: Some(inner),
            ctl,
        }
    }

    fn io(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        self.inner
            .as_mut()
            .map(Pin::new)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }
}

/// How long a closing connection keeps reading what the client still sends.
const LINGER: Duration = Duration::from_secs(1);

impl Drop for CtlIo {
    fn drop(&mut self) {
        let Some(stream) = self.inner.take() else {
            return;
        };
        if self.ctl.reset.load(Ordering::SeqCst) {
            // Best effort: if it fails the peer sees FIN instead of RST.
            let _ = stream.set_zero_linger();
            return;
        }
        // Without a runtime (the server's own is gone) the socket just closes.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(linger(stream));
        }
    }
}

/// A lingering close, as nginx does (`lingering_close`): the write side is shut (FIN), then
/// what the client still sends is read and dropped until it closes too, for at most
/// [`LINGER`]. Closing a socket with unread bytes in its receive buffer makes the kernel
/// answer with RST, and a client that gets RST loses the responses it had not read yet: an
/// HTTP/2 server closing after its GOAWAY while the client's last frames (a WINDOW_UPDATE, a
/// RST_STREAM) arrive would destroy its own last answers.
async fn linger(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(LINGER, async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

impl AsyncRead for CtlIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.io()?.poll_read(cx, buf)
    }
}

impl AsyncWrite for CtlIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.io()?.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.io()?.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(TcpStream::is_write_vectored)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let res = ready!(self.io()?.poll_flush(cx));
        self.ctl.flushed();
        Poll::Ready(res)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io()?.poll_shutdown(cx)
    }
}
