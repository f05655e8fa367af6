//! The tower face: [`Client`] as a `tower::Service<http::Request<B>>`, so tower and
//! tower-http layers compose in front of it and tower-based clients (tonic) send through
//! its policy. What makes its requests replayable is in `replay.rs`.
//!
//! Why `poll_ready` knows so little: every limit of the policy — host and tenant
//! concurrency, the host rate, the AIMD window, the fleet's shared rate — is keyed by the
//! request's host or tenant, and which policy applies is itself decided by them. A
//! `poll_ready` has no request, so it cannot honestly say whether the next call will find
//! room under those; reserving a slot "somewhere" would be a guess. The one limit that does
//! not depend on the request is the client's own cap on calls in flight
//! ([`ClientBuilder::max_in_flight`](super::ClientBuilder::max_in_flight)): `poll_ready`
//! reserves a slot under it, and is `Pending` while the cap is full.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use soulbase_net_core::{BoxError, NetError, NetRequest, RespBody};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::PollSemaphore;

use super::Client;

/// What one handle of the client reserved through `poll_ready` for its next `call`.
///
/// A clone starts with nothing reserved (as tower's `ConcurrencyLimit` does): a slot belongs
/// to the handle that reserved it.
#[derive(Default)]
pub(super) struct Readiness {
    /// Polls the in-flight cap; made on the first `poll_ready` of a capped client.
    poll: Option<PollSemaphore>,
    /// The slot reserved for the next `call`, given back if the handle is dropped first.
    permit: Option<OwnedSemaphorePermit>,
}

/// The future of [`Client`]'s `tower::Service::call`: the call's response as an
/// `http::Response`, or its [`NetError`].
pub struct ResponseFuture {
    inner: Pin<Box<dyn Future<Output = Result<http::Response<RespBody>, NetError>> + Send>>,
}

// === impl Client ===

/// Sends an `http::Request` through the client: the same pipeline as
/// [`NetClient::send`](soulbase_net_core::NetClient::send) — policy, address guard,
/// interceptors, limits, breaker, retries, timeouts, observer — with the request converted
/// by `NetRequest::try_from` and the answer by `http::Response::from` (see those in
/// `soulbase-net-core` for what moves over).
///
/// **Bodies and retries.** A body whose frames are all at hand when the call starts and
/// that ends within the policy's `retry.replay_buffer` (default 64 KiB) is kept whole, so
/// it can be sent again: a gRPC unary request's is. A larger body, one with trailers, or one
/// still being produced (a client or bidirectional stream: its next message may wait for
/// the answer) is sent once, never retried, hedged or resent. With its body kept, a request
/// goes again:
/// - when the server provably did not process it (`REFUSED_STREAM`, above a GOAWAY's last
///   stream, a connection that closed before the server sent anything) — whatever its
///   method, outside the retry accounting, as for `NetClient::send`;
/// - when an attempt never left the client (`Dns`, `Connect`, or a timeout while
///   connecting) — whatever its method, under `retry.max_attempts`, `retry.retry_on`, the
///   budget and the breaker;
/// - after any outcome `retry.retry_on` lists, when it is idempotent: GET, HEAD, OPTIONS, or
///   a request carrying an `Idempotency-Key` header (the caller's word that the server drops
///   repeats, as `NetRequest::idempotency_key` gives it).
///
/// A gRPC call is a POST: without an `Idempotency-Key` its 5xx, resets and timeouts after it
/// was sent are not retried, since the server may have acted on it. gRPC statuses
/// (`grpc-status`) are the caller's to act on; the client sees HTTP.
///
/// **Readiness.** `poll_ready` reserves a slot under the client's cap on calls in flight
/// ([`ClientBuilder::max_in_flight`](super::ClientBuilder::max_in_flight)) and is `Pending`
/// while the cap is full, woken when a call ends; the slot is held by this handle until its
/// next `call`, which uses it (a handle that reserved and is dropped gives it back). Without
/// a cap, `poll_ready` is always ready. The policy's limits (host and tenant concurrency,
/// rates, the AIMD window) depend on the request's host and tenant, which `poll_ready` does
/// not have: `call` applies them as `NetClient::send` does, failing at once with
/// `RateLimited` unless `limits.max_wait` allows a bounded wait. `poll_ready` never fails.
///
/// An error status (4xx, 5xx) is a response, not an error, as in `NetClient::send`.
///
/// # Examples
/// ```no_run
/// # async fn run() -> Result<(), soulbase_net_core::NetError> {
/// use http_body_util::{BodyExt, Empty};
/// use tower::ServiceExt;
/// use soulbase_net_runtime::prelude::*;
///
/// let client = Client::builder().max_in_flight(64).build()?;
/// let req = http::Request::get("https://api.example.com/u/1").body(Empty::<bytes::Bytes>::new()).unwrap();
/// // `oneshot` waits for `poll_ready` (a slot under the cap), then calls.
/// let res = client.clone().oneshot(req).await?;
/// let body = res.into_body().collect().await?.to_bytes();
/// # let _ = body; Ok(()) }
/// ```
impl<B> tower_service::Service<http::Request<B>> for Client
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<RespBody>;
    type Error = NetError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), NetError>> {
        let Some(cap) = &self.inner.in_flight else {
            return Poll::Ready(Ok(()));
        };
        let ready = &mut self.ready;
        if ready.permit.is_some() {
            return Poll::Ready(Ok(()));
        }
        let poll = ready
            .poll
            .get_or_insert_with(|| PollSemaphore::new(cap.clone()));
        match poll.poll_acquire(cx) {
            Poll::Pending => Poll::Pending,
            // The semaphore is never closed; were it, `call` would try on its own.
            Poll::Ready(permit) => {
                ready.permit = permit;
                Poll::Ready(Ok(()))
            }
        }
    }

    fn call(&mut self, req: http::Request<B>) -> ResponseFuture {
        let reserved = self.ready.permit.take();
        let inner = self.inner.clone();
        ResponseFuture {
            inner: Box::pin(async move {
                let mut req = NetRequest::try_from(req)?;
                inner.prepare_tower_call(&mut req).await;
                let res = inner.send(req, reserved).await?;
                Ok(http::Response::from(res))
            }),
        }
    }
}

// === impl Readiness ===

impl Clone for Readiness {
    fn clone(&self) -> Self {
        Readiness::default()
    }
}

impl fmt::Debug for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readiness")
            .field("reserved", &self.permit.is_some())
            .finish()
    }
}

// === impl ResponseFuture ===

impl Future for ResponseFuture {
    type Output = Result<http::Response<RespBody>, NetError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
