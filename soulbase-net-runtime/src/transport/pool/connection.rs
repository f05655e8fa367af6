//! hyper's connections as the pool runs them: the task that drives one, the watch an
//! HTTP/1.1 request keeps on its connection, and what a connection's errors mean for the
//! request that met them.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use hyper::client::conn::http1;
use soulbase_net_core::NetError;

use crate::transport::body::RequestBody;

/// Runs a connection until it closes, counted in `open` meanwhile; `ended` runs once it has
/// closed (its future dropped).
pub(super) fn spawn_connection<F>(
    connection: F,
    open: Arc<AtomicUsize>,
    ended: impl FnOnce() + Send + 'static,
) where
    F: std::future::Future<Output = hyper::Result<()>> + Send + 'static,
{
    open.fetch_add(1, Ordering::Relaxed);
    // Boxed before it is spawned, for the reason `BoxingExecutor` gives: a connection's
    // future is kilobytes.
    hyper::rt::Executor::execute(&super::exec::BoxingExecutor, async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
        // Before the gauge says it is closed: once it does, the pool has let it go.
        ended();
        open.fetch_sub(1, Ordering::Relaxed);
    });
}

pin_project_lite::pin_project! {
    /// Waits for the answer to a request handed to the HTTP/1.1 connection `tx`, and gives
    /// `tx` back unless the connection closed meanwhile. A request that hyper's channel caught
    /// as the connection ended (see the module docs) is handed back only when its last sender
    /// is gone, and `tx` is the only one: so when the connection says it closed, `tx` is
    /// dropped and the wait goes on for the request to come back.
    ///
    /// A future of its own rather than an `async fn`: that one's state held the sent future
    /// twice (as its argument and pinned in its body), and each request paid the moves
    /// between them.
    pub(super) struct WatchH1<F, B> {
        #[pin]
        sent: F,
        tx: Option<http1::SendRequest<B>>,
    }
}

/// Watches `sent`, the answer to a request handed to `tx` (see [`WatchH1`]).
pub(super) fn watch_h1<F: Future, B: RequestBody>(
    sent: F,
    tx: http1::SendRequest<B>,
) -> WatchH1<F, B> {
    WatchH1 { sent, tx: Some(tx) }
}

impl<F: Future, B: RequestBody> Future for WatchH1<F, B> {
    type Output = (F::Output, Option<http1::SendRequest<B>>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.sent.poll(cx) {
            return Poll::Ready((out, this.tx.take()));
        }
        // Pending until the connection wants a request again (after this one's answer) or
        // closes; ready with an error only when it closed.
        let closed =
            (this.tx.as_mut()).is_some_and(|t| matches!(t.poll_ready(cx), Poll::Ready(Err(_))));
        if closed {
            // The channel goes with `tx`, handing back a request it still held; the poll
            // above registered for its answer.
            *this.tx = None;
        }
        Poll::Pending
    }
}

/// The error of a request the connection handed back unwritten (it closed first) when it
/// cannot go on another one: the server never saw it.
pub(super) fn unwritten(e: hyper::Error) -> NetError {
    crate::classify::not_processed("the connection closed before the request was written")
        .with_source(e)
}

/// Whether `e` says the HTTP/2 connection is going away (the server sent GOAWAY).
///
/// hyper fails a request with the GOAWAY in three cases: its stream was above the frame's
/// last stream id (h2 fails those streams, which the server ignored), the frame had arrived
/// before the request was handed to h2 (nothing sent), or the frame arrived while hyper was
/// handing it over — just after the stream's HEADERS were queued, which then may reach a
/// server whose first GOAWAY did not cut them off (the two-GOAWAY shutdown of RFC 9113
/// §6.8). In that last case hyper drops the stream at once, so its body is never sent: a
/// request with content arrives incomplete and cannot be processed, but a request whose
/// head is the whole of it may be. So a GOAWAY is taken for "not processed" except for a
/// request that is complete in its head and not idempotent (a POST without a body): that
/// one fails as `Io`, and the retry rules for non-idempotent requests apply — but it is not
/// counted by the breaker nor the SLO controller (a GOAWAY is the server's routine lifecycle,
/// not a failure of the upstream; see [`crate::classify::raced_by_goaway`]).
pub(super) fn going_away(e: &hyper::Error) -> bool {
    crate::classify::remote_h2(e).is_some_and(h2::Error::is_go_away)
}
