//! The bodies of the transport layer: [`ReqBody`], what every transport sends, and
//! [`WireBody`], what every transport's response is read through.
//!
//! Why a module of its own: the pool (TCP) and HTTP/3 (QUIC) both produce response bodies the
//! attempt reads the same way, and neither should know the other. A body here knows only
//! where its bytes come from ([`Wire`]) and the [`Lease`] it holds on its connection, which
//! the transport that made it defines: the pool's gives an HTTP/1.1 connection back and
//! counts an HTTP/2 stream; a transport that keeps nothing per body uses `()`.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use soulbase_net_core::BoxError;

/// The request body every transport sends: any body of bytes, boxed (the transport layer
/// owns this type; the client builds its bodies to it).
pub(crate) type ReqBody = UnsyncBoxBody<Bytes, BoxError>;

/// What the pool asks of a request body — what hyper's HTTP/1.1 and HTTP/2 connections ask:
/// a body that can move to the connection's task. The pool never looks inside one (it asks
/// only `is_end_stream`), so it is generic over it as hyper-util's is; the client sends
/// [`ReqBody`], the pool's default.
pub(crate) trait RequestBody:
    Body<Data: Send, Error: Into<BoxError>> + Send + Unpin + 'static
{
}

impl<B> RequestBody for B where B: Body<Data: Send, Error: Into<BoxError>> + Send + Unpin + 'static {}

/// What a response body holds on its connection while it is read.
pub(crate) trait Lease: Send + Unpin + 'static {
    /// The body ended cleanly (read to its end, or dropped with hyper left to drain it): the
    /// connection may take another request. Dropping a lease without releasing it (after a
    /// broken body) says the connection must not be reused.
    fn release(self);

    /// Whether the lease is worth releasing as soon as the last frame is read, before the
    /// body reports its end or is dropped: an HTTP/1.1 connection is (the next request can
    /// take it). Asking costs a call into the connection (for HTTP/2, h2 takes its stream
    /// store's lock: 64 instructions a time), so a lease that only counts does not ask.
    fn early(&self) -> bool {
        true
    }
}

impl Lease for () {
    fn release(self) {}
}

/// A response body from a transport: releases its [`Lease`] when it ends or is dropped,
/// and drops it unreleased after an error (a broken body leaves the connection broken).
pub(crate) struct WireBody<L: Lease> {
    inner: Wire,
    lease: Option<L>,
}

/// Where a response body's bytes come from.
enum Wire {
    /// An HTTP/1.1 or HTTP/2 connection (hyper's body, unboxed: the common case).
    Hyper(Incoming),
    /// Any other transport's body (HTTP/3's stream), boxed.
    #[cfg(feature = "http3")]
    Boxed(UnsyncBoxBody<Bytes, BoxError>),
}

// === impl WireBody ===

impl<L: Lease> WireBody<L> {
    /// Wraps hyper's response, holding `lease` until its body ends; a response without a
    /// body releases it at once.
    pub(crate) fn hyper(res: Response<Incoming>, lease: Option<L>) -> Response<Self> {
        res.map(|inner| {
            let mut body = WireBody {
                inner: Wire::Hyper(inner),
                lease,
            };
            if body.releases_early() && body.is_end_stream() {
                body.release();
            }
            body
        })
    }

    /// The body of another transport's response (it keeps its own connection alive).
    #[cfg(feature = "http3")]
    pub(crate) fn boxed(body: UnsyncBoxBody<Bytes, BoxError>) -> Self {
        WireBody {
            inner: Wire::Boxed(body),
            lease: None,
        }
    }

    fn release(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.release();
        }
    }

    /// Whether its lease is to be released once the last frame is read (see
    /// [`Lease::early`]).
    fn releases_early(&self) -> bool {
        self.lease.as_ref().is_some_and(L::early)
    }
}

impl<L: Lease> Body for WireBody<L> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = match &mut self.inner {
            Wire::Hyper(inner) => Pin::new(inner).poll_frame(cx).map_err(Into::into),
            #[cfg(feature = "http3")]
            Wire::Boxed(inner) => Pin::new(inner).poll_frame(cx),
        };
        match &polled {
            Poll::Ready(None) => self.release(),
            Poll::Ready(Some(Ok(_))) if self.releases_early() && self.is_end_stream() => {
                self.release();
            }
            // A broken body leaves the connection broken: the lease goes unreleased.
            Poll::Ready(Some(Err(_))) => self.lease = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Wire::Hyper(inner) => inner.is_end_stream(),
            #[cfg(feature = "http3")]
            Wire::Boxed(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Wire::Hyper(inner) => inner.size_hint(),
            #[cfg(feature = "http3")]
            Wire::Boxed(inner) => inner.size_hint(),
        }
    }
}

impl<L: Lease> Drop for WireBody<L> {
    fn drop(&mut self) {
        self.release();
    }
}

impl<L: Lease> fmt::Debug for WireBody<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WireBody")
            .field("leased", &self.lease.is_some())
            .finish_non_exhaustive()
    }
}
