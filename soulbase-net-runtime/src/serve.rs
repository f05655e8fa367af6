//! [`Http1Server`]: the one HTTP/1.1 accept-and-serve loop of the systems built on the
//! client — the delay server's HTTP face, the probe agent's control plane and metrics
//! endpoint. It serves; it never sends, and the client knows nothing of it.
//!
//! Why here: those systems all sit on this crate, which already builds on hyper, and one loop
//! means one place for what every server needs (a task per connection, finished connections
//! reaped, the rest aborted at stop, a deadline for a request head).

use std::convert::Infallible;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Serves HTTP/1.1 on a bound [`TcpListener`]: each accepted connection is served by hyper in
/// a task of its own, every request answered by a handler, until a stop signal; then the
/// listener is dropped and the connections still open are aborted.
///
/// # Examples
/// ```no_run
/// # async fn run() -> std::io::Result<()> {
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use hyper::Response;
/// use soulbase_net_runtime::serve::Http1Server;
/// use std::time::Duration;
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let server = Http1Server::new(listener)
///     .header_read_timeout(Duration::from_secs(10))
///     .admit(|peer| peer.ip().is_loopback());
/// let serving = tokio::spawn(server.serve(
///     |_req| async { Response::new(Full::new(Bytes::from_static(b"ok\n"))) },
///     async move {
///         let _ = stopped.await;
///     },
/// ));
/// // … later:
/// let _ = stop.send(());
/// let _ = serving.await;
/// # Ok(()) }
/// ```
pub struct Http1Server {
    listener: TcpListener,
    header_read_timeout: Option<Duration>,
    admit: Option<Box<dyn Fn(SocketAddr) -> bool + Send + Sync>>,
}

impl fmt::Debug for Http1Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http1Server")
            .field("listener", &self.listener.local_addr().ok())
            .field("header_read_timeout", &self.header_read_timeout)
            .field("admit", &self.admit.is_some())
            .finish()
    }
}

// === impl Http1Server ===

impl Http1Server {
    /// A server on `listener`, admitting every peer, with no deadline for request heads.
    pub fn new(listener: TcpListener) -> Self {
        Self {
            listener,
            header_read_timeout: None,
            admit: None,
        }
    }

    /// How long a client has to send a request's head before its connection is closed, so
    /// that one that never finishes it does not hold a connection for ever.
    ///
    /// Default is none (hyper's own default deadline needs a timer, which is then not set).
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = Some(timeout);
        self
    }

    /// Serves only the connections whose peer address `admit` accepts; the others are
    /// closed at once, unanswered.
    ///
    /// Default is every peer.
    pub fn admit(mut self, admit: impl Fn(SocketAddr) -> bool + Send + Sync + 'static) -> Self {
        self.admit = Some(Box::new(admit));
        self
    }

    /// Accepts and serves connections, each request answered by `handler`, until `stop`
    /// resolves; then aborts the connections still open. A failed accept (a connection reset
    /// before it was taken, no descriptor left) is skipped, and so is a connection that ends
    /// in an error: the loop goes on.
    pub async fn serve<H, F, B>(self, handler: H, stop: impl Future<Output = ()>)
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<B>> + Send + 'static,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn StdError + Send + Sync>>,
    {
        let Self {
            listener,
            header_read_timeout,
            admit,
        } = self;
        let mut conns = JoinSet::new();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                accepted = listener.accept() => {
                    let Ok((stream, peer)) = accepted else { continue };
                    if admit.as_ref().is_some_and(|admit| !admit(peer)) {
                        continue;
                    }
                    let handler = handler.clone();
                    conns.spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let answer = handler(req);
                            async move { Ok::<_, Infallible>(answer.await) }
                        });
                        let mut builder = hyper::server::conn::http1::Builder::new();
                        if let Some(timeout) = header_read_timeout {
                            builder.timer(TokioTimer::new()).header_read_timeout(timeout);
                        }
                        let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                    });
                }
                // Reap finished connections so the set does not grow.
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        conns.abort_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn get(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        // A connection closed unanswered may refuse the write: what was read is the answer.
        let _ = s
            .write_all(b"GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
            .await;
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    #[tokio::test]
    async fn answers_admitted_peers_times_out_silent_heads_and_stops() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(
            Http1Server::new(listener)
                .header_read_timeout(Duration::from_millis(200))
                .admit(|peer| peer.ip().is_loopback())
                .serve(
                    |req: Request<Incoming>| async move {
                        Response::new(Full::new(Bytes::from(req.uri().path().to_owned())))
                    },
                    async move {
                        let _ = stopped.await;
                    },
                ),
        );
        let answer = get(addr).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("/x"), "{answer}");

        // A client that never sends its head is closed after the deadline.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut buf)).await;
        assert!(
            closed.is_ok(),
            "a silent client is closed after the head deadline"
        );

        stop.send(()).unwrap();
        serving.await.unwrap();
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the listener is gone"
        );
    }

    #[tokio::test]
    async fn peers_not_admitted_are_closed_unanswered() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = tokio::spawn(Http1Server::new(listener).admit(|_| false).serve(
            |_req: Request<Incoming>| async { Response::new(Full::new(Bytes::new())) },
            std::future::pending(),
        ));
        assert_eq!(get(addr).await, "");
        serving.abort();
    }
}
