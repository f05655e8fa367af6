//! [`LimitLayer`]: the client's limits in front of any HTTP service.

use std::sync::Arc;

use http::{Request, Response};
use soulbase_net_core::{BoxError, ErrorKind, NetError};
use soulbase_net_policy::LimitsPolicy;
use tower_service::Service;

use crate::resilience::Limiter;

/// A tower layer that puts the client's limits in front of an HTTP service, per host (the
/// request URI's): concurrency (`per_host_concurrency`), the GCRA rate
/// (`per_host_rate_rps`, `rate_burst`) and, when enabled, the AIMD window (`aimd`), fed by
/// each call's outcome as the client feeds it. A call with no slot is refused with a
/// [`NetError`] of kind `RateLimited`, at once or after `max_wait`, and the inner service is
/// not called.
///
/// # Examples
/// ```
/// # async fn run() -> Result<(), soulbase_net_core::BoxError> {
/// use soulbase_net_policy::LimitsPolicy;
/// use soulbase_net_runtime::layer::LimitLayer;
/// use tower::ServiceExt;
///
/// let mut limits = LimitsPolicy::default();
/// limits.per_host_rate_rps = Some(1);
/// limits.rate_burst = Some(1);
/// let ok = tower::service_fn(|_req: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(()))
/// });
/// let svc = tower::Layer::layer(&LimitLayer::new(limits), ok);
/// let req = || http::Request::get("http://api.example/v1").body(()).unwrap();
/// assert_eq!(svc.clone().oneshot(req()).await?.status(), 200);
/// let refused = svc.oneshot(req()).await.unwrap_err();
/// let refused = refused.downcast_ref::<soulbase_net_core::NetError>().unwrap();
/// assert_eq!(refused.kind(), soulbase_net_core::ErrorKind::RateLimited);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(run()).unwrap();
/// ```
#[derive(Clone)]
pub struct LimitLayer {
    limiter: Arc<Limiter>,
    policy: Arc<LimitsPolicy>,
}

impl LimitLayer {
    /// Limits under `policy`, for at most 10 000 hosts at once (idle ones are forgotten).
    pub fn new(policy: LimitsPolicy) -> Self {
        Self {
            limiter: Arc::new(Limiter::new(10_000)),
            policy: Arc::new(policy),
        }
    }
}

impl std::fmt::Debug for LimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitLayer")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<S> tower_layer::Layer<S> for LimitLayer {
    type Service = Limit<S>;

    fn layer(&self, inner: S) -> Limit<S> {
        super::Layered {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`LimitLayer`] makes.
pub type Limit<S> = super::Layered<LimitLayer, S>;

impl super::sealed::Around for LimitLayer {
    fn around<S, B, RB>(&self, mut inner: S, req: Request<B>) -> super::LayerFuture<RB>
    where
        S: Service<Request<B>, Response = Response<RB>> + Send + 'static,
        S::Future: Send,
        S::Error: Into<BoxError>,
        B: Send + 'static,
        RB: Send + 'static,
    {
        let layer = self.clone();
        let host = req.uri().host().unwrap_or_default().to_owned();
        Box::pin(async move {
            let policy = &*layer.policy;
            let acquired =
                match layer
                    .limiter
                    .acquire_now(&host, None, policy, tokio::time::Instant::now())
                {
                    Some(acquired) => acquired,
                    None => layer.limiter.acquire(&host, None, policy).await,
                };
            let permit = match acquired {
                Ok(permit) => permit,
                Err(scope) => {
                    let err = NetError::new(ErrorKind::RateLimited)
                        .with_message(format!("{scope:?} limit of {host} reached"));
                    return Err(err.into());
                }
            };
            let result = inner.call(req).await.map_err(Into::into);
            permit.record(super::outcome_of(&result));
            result
        })
    }
}
