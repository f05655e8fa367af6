//! The client's resilience state machines as tower layers, one directory per middleware (as
//! tower's own are), for a tower user who stacks them in front of any HTTP service — another
//! client, a hyper connection, a test double — rather than calling through [`Client`](crate::Client).
//!
//! - [`CircuitBreakerLayer`]: the client's per-origin circuit breakers
//!   ([`CircuitBreakerPolicy`](soulbase_net_policy::CircuitBreakerPolicy)).
//! - [`LimitLayer`]: the client's per-host limits — concurrency, GCRA rate, AIMD window —
//!   ([`LimitsPolicy`](soulbase_net_policy::LimitsPolicy)).
//! - [`AimdLimit`]: the limiter's AIMD window alone, acquired and fed by hand (the probe
//!   agent's windows).
//!
//! The layers run the same state machines the client runs (`resilience/`), with the same
//! policy types and the same events; the client itself does not go through them (its call
//! path is one future, not a stack of services, see docs/architecture.md).

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use http::{Request, Response};
use soulbase_net_core::BoxError;
use tower_service::Service;

mod breaker;
mod limit;

pub use self::breaker::{CircuitBreaker, CircuitBreakerLayer};
pub use self::limit::{Limit, LimitLayer};
/// The AIMD window of [`LimitLayer`], on its own (seed 002's adaptive concurrency for work
/// that is not an HTTP call).
pub use crate::resilience::{AimdLimit, AimdLimitPermit};

/// The future of a service behind one of these layers.
pub type LayerFuture<RB> = Pin<Box<dyn Future<Output = Result<Response<RB>, BoxError>> + Send>>;

/// A service behind one of this module's layers `L` (see [`CircuitBreaker`], [`Limit`]): the
/// layer's work around each call of the inner service `S`. Its errors are the inner
/// service's, boxed, and the layer's refusals, [`NetError`](soulbase_net_core::NetError)s.
#[derive(Clone, Debug)]
pub struct Layered<L, S> {
    inner: S,
    layer: L,
}

mod sealed {
    use http::{Request, Response};
    use soulbase_net_core::BoxError;
    use tower_service::Service;

    /// What one of the module's layers does around a call (sealed: the layers are its own).
    pub trait Around: Clone {
        /// Calls `inner` (ready) with `req`, with the layer's work before and after.
        fn around<S, B, RB>(&self, inner: S, req: Request<B>) -> super::LayerFuture<RB>
        where
            S: Service<Request<B>, Response = Response<RB>> + Send + 'static,
            S::Future: Send,
            S::Error: Into<BoxError>,
            B: Send + 'static,
            RB: Send + 'static;
    }
}

impl<L, S, B, RB> Service<Request<B>> for Layered<L, S>
where
    L: sealed::Around,
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Send + 'static,
    RB: Send + 'static,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = LayerFuture<RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone that was made ready is the one that serves this call (tower's rule).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        self.layer.around(inner, req)
    }
}

/// The outcome of an inner service's call, as the client's state machines judge it: a
/// response by its status, a [`NetError`](soulbase_net_core::NetError) by its kind, any other
/// error as `Io` (the service failed to answer).
fn outcome_of<RB>(
    result: &Result<http::Response<RB>, soulbase_net_core::BoxError>,
) -> soulbase_net_core::Outcome {
    use soulbase_net_core::{ErrorKind, NetError, Outcome};
    match result {
        Ok(res) => Outcome::Response(res.status()),
        Err(e) => Outcome::Error(
            e.downcast_ref::<NetError>()
                .map_or(ErrorKind::Io, NetError::kind),
        ),
    }
}
