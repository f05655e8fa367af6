//! The connection type handed to hyper: plain TCP or TLS, plus its cap slot and facts.

use std::{
    io,
    net::IpAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    sync::OwnedSemaphorePermit,
};
use tokio_rustls::client::TlsStream;

/// A TCP stream, with or without TLS on top; or the target's TLS inside a tunnel through an
/// `https://` proxy (TLS inside TLS).
pub(crate) enum MaybeTls {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    TlsInTls(Box<TlsStream<TlsStream<TcpStream>>>),
}

/// A connection: the stream, how requests go over it, and its slot under the per-host cap
/// (released when hyper drops the connection).
pub(crate) struct Conn {
    io: TokioIo<Watched>,
    h2: bool,
    proxied: bool,
    /// The address dialled for a host name, directly (not through a proxy): the pool retires
    /// the connection when the name stops resolving to it.
    follows: Option<IpAddr>,
    _permit: OwnedSemaphorePermit,
}

impl Conn {
    pub(super) fn new(stream: MaybeTls, permit: OwnedSemaphorePermit, proxied: bool) -> Self {
        let h2 = match &stream {
            MaybeTls::Tls(tls) => tls.get_ref().1.alpn_protocol() == Some(b"h2"),
            MaybeTls::TlsInTls(tls) => tls.get_ref().1.alpn_protocol() == Some(b"h2"),
            MaybeTls::Plain(_) => false,
        };
        Conn {
            io: TokioIo::new(Watched {
                stream,
                heard: None,
                lost: false,
            }),
            h2,
            proxied,
            follows: None,
            _permit: permit,
        }
    }

    /// Marks the connection as dialled to `peer` for a host name (see [`Conn::follows`]).
    pub(super) fn following(mut self, peer: IpAddr) -> Self {
        self.follows = Some(peer);
        self
    }

    /// The address dialled for a host name, when the connection went there directly: what
    /// the name's answer must keep containing for the connection to stay in the pool.
    pub(crate) fn follows(&self) -> Option<IpAddr> {
        self.follows
    }

    /// Whether requests on this connection go to a proxy in absolute form.
    pub(crate) fn is_proxied(&self) -> bool {
        self.proxied
    }

    /// Whether ALPN chose HTTP/2.
    pub(crate) fn is_h2(&self) -> bool {
        self.h2
    }

    /// A flag set once the peer has sent anything on this connection (above TLS): an HTTP/2
    /// server sends its SETTINGS before anything else (RFC 9113 §3.4), so a connection that
    /// ended with the flag unset had no stream processed on it.
    ///
    /// Also turns on, for this HTTP/2 connection, reading past a lost write (see
    /// [`Watched`]).
    pub(crate) fn heard(&mut self) -> Arc<AtomicBool> {
        self.io
            .inner_mut()
            .heard
            .get_or_insert_with(|| Arc::new(AtomicBool::new(false)))
            .clone()
    }
}

/// The stream as hyper reads it, noting whether the peer has sent anything (see
/// [`Conn::heard`]).
///
/// On an HTTP/2 connection (once [`Conn::heard`] was asked), a write that fails because the
/// peer closed or reset the connection is reported as written, and so is every write after
/// it: the connection's end is left to the read side, which first delivers what the peer
/// sent before it closed and then the error or the end. That matters for a server that
/// closes gracefully: its GOAWAY names the last stream it processed (RFC 9113 §6.8), and a
/// server that closes with requests of ours unread (an nginx worker leaving on reload) makes
/// the close a reset, which fails our next write before h2 has read the GOAWAY waiting in
/// the socket. Without this, every stream in flight failed with "broken pipe", processed or
/// not; with it, the streams above the GOAWAY's last id fail as not processed and go again.
/// The read side cannot hang: a socket whose write failed so has been reset or shut down,
/// and its reads end once the data received before is consumed.
pub(crate) struct Watched {
    stream: MaybeTls,
    heard: Option<Arc<AtomicBool>>,
    /// A write failed because the peer went away: writes are dropped from now on.
    lost: bool,
}

impl Watched {
    /// The result of a write of `len` bytes: a failure for the peer going away becomes a
    /// dropped write on an HTTP/2 connection (see the type's docs).
    fn written<T>(&mut self, result: Poll<io::Result<T>>, len: T) -> Poll<io::Result<T>> {
        use io::ErrorKind as K;
        match result {
            Poll::Ready(Err(e))
                if self.heard.is_some()
                    && matches!(
                        e.kind(),
                        K::BrokenPipe | K::ConnectionReset | K::ConnectionAborted
                    ) =>
            {
                self.lost = true;
                Poll::Ready(Ok(len))
            }
            other => other,
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Some(heard) = &this.heard {
            if buf.filled().len() > before && !heard.load(Ordering::Relaxed) {
                heard.store(true, Ordering::Release);
            }
        }
        read
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.lost {
            return Poll::Ready(Ok(buf.len()));
        }
        let result = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.written(result, buf.len())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.lost {
            return Poll::Ready(Ok(()));
        }
        let result = Pin::new(&mut this.stream).poll_flush(cx);
        this.written(result, ())
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.lost {
            return Poll::Ready(Ok(()));
        }
        let result = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.written(result, ())
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let len = bufs.iter().map(|b| b.len()).sum();
        if this.lost {
            return Poll::Ready(Ok(len));
        }
        let result = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.written(result, len)
    }
}

impl hyper::rt::Read for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

impl AsyncRead for MaybeTls {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            MaybeTls::TlsInTls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for MaybeTls {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            MaybeTls::TlsInTls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            MaybeTls::TlsInTls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            MaybeTls::TlsInTls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            MaybeTls::TlsInTls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(s) => s.is_write_vectored(),
            MaybeTls::Tls(s) => s.is_write_vectored(),
            MaybeTls::TlsInTls(s) => s.is_write_vectored(),
        }
    }
}
