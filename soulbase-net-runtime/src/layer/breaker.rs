//! [`CircuitBreakerLayer`]: the client's circuit breakers in front of any HTTP service.

use std::sync::Arc;

use http::{Request, Response};
use soulbase_net_core::{BoxError, NetEvent, Observer};
use soulbase_net_policy::CircuitBreakerPolicy;
use tokio::time::Instant;
use tower_service::Service;

use crate::resilience::{breaker_key, is_failure, Breakers, Listener, Transition};

/// A tower layer that puts circuit breakers in front of an HTTP service: one per origin
/// (scheme, host and port, as the client keys them), with the policy's failure threshold,
/// failure ratio, slow-call rule, cooldown and half-open probes. While an origin's circuit
/// is open, a call is refused at once with a [`NetError`](soulbase_net_core::NetError) of kind `CircuitOpen` (its
/// retry-after is the rest of the cooldown), and the inner service is not called.
///
/// What counts as a failure is the client's rule: a 5xx (with `count_5xx`), or an error of
/// the inner service that is a connection, TLS, I/O, proxy or timeout failure — a
/// [`NetError`](soulbase_net_core::NetError) is judged by its kind, any other error counts as a failure. A 4xx, a local
/// refusal and a cancel never count.
///
/// # Examples
/// ```
/// # async fn run() -> Result<(), soulbase_net_core::BoxError> {
/// use soulbase_net_policy::CircuitBreakerPolicy;
/// use soulbase_net_runtime::layer::CircuitBreakerLayer;
/// use tower_service::Service;
///
/// let mut policy = CircuitBreakerPolicy::default();
/// policy.enabled = true;
/// policy.consecutive_failures = 1;
/// let failing = tower::service_fn(|_req: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::builder().status(503).body(()).unwrap())
/// });
/// let mut svc = tower::Layer::layer(&CircuitBreakerLayer::new(policy), failing);
/// let req = || http::Request::get("http://api.example/v1").body(()).unwrap();
/// assert_eq!(svc.call(req()).await?.status(), 503); // the failure that opens the circuit
/// let refused = svc.call(req()).await.unwrap_err();
/// let refused = refused.downcast_ref::<soulbase_net_core::NetError>().unwrap();
/// assert_eq!(refused.kind(), soulbase_net_core::ErrorKind::CircuitOpen);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(run()).unwrap();
/// ```
#[derive(Clone)]
pub struct CircuitBreakerLayer {
    breakers: Breakers,
    policy: Arc<CircuitBreakerPolicy>,
}

impl CircuitBreakerLayer {
    /// Breakers under `policy`, at most `policy.max_keys` origins of them. The policy's
    /// `enabled` decides, as for the client: a disabled policy (the default) lets every call
    /// through and keeps no state.
    pub fn new(policy: CircuitBreakerPolicy) -> Self {
        Self::with(policy, None)
    }

    /// The same, reporting every change of an origin's state to `observer` as a
    /// [`NetEvent::BreakerTransition`] (the event the client emits, so the project's
    /// metrics observer counts it).
    pub fn with_observer(policy: CircuitBreakerPolicy, observer: Arc<dyn Observer>) -> Self {
        let listener: Listener = Box::new(move |key: &str, t: Transition| {
            observer.on_event(&NetEvent::BreakerTransition {
                key,
                from: t.from,
                to: t.to,
            });
        });
        Self::with(policy, Some(listener))
    }

    fn with(policy: CircuitBreakerPolicy, listener: Option<Listener>) -> Self {
        Self {
            breakers: Breakers::new(policy.max_keys as usize, policy.idle_evict, listener),
            policy: Arc::new(policy),
        }
    }
}

impl std::fmt::Debug for CircuitBreakerLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CircuitBreakerLayer")
            .field("breakers", &self.breakers)
            .finish_non_exhaustive()
    }
}

impl<S> tower_layer::Layer<S> for CircuitBreakerLayer {
    type Service = CircuitBreaker<S>;

    fn layer(&self, inner: S) -> CircuitBreaker<S> {
        super::Layered {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`CircuitBreakerLayer`] makes.
pub type CircuitBreaker<S> = super::Layered<CircuitBreakerLayer, S>;

impl super::sealed::Around for CircuitBreakerLayer {
    fn around<S, B, RB>(&self, mut inner: S, req: Request<B>) -> super::LayerFuture<RB>
    where
        S: Service<Request<B>, Response = Response<RB>> + Send + 'static,
        S::Future: Send,
        S::Error: Into<BoxError>,
        B: Send + 'static,
        RB: Send + 'static,
    {
        let layer = self.clone();
        let origin = origin_of(req.uri());
        Box::pin(async move {
            let policy = &*layer.policy;
            let key = breaker_key(policy, &origin, None);
            let admitted = Instant::now();
            let permit = match layer.breakers.admit(&key, policy, admitted) {
                Ok(permit) => permit,
                Err(rejected) => {
                    let err = rejected
                        .into_error()
                        .with_message(format!("circuit for {key} is open"));
                    return Err(err.into());
                }
            };
            let result = inner.call(req).await.map_err(Into::into);
            let ended = Instant::now();
            let outcome = super::outcome_of(&result);
            permit.record(
                is_failure(outcome, policy.count_5xx),
                ended.saturating_duration_since(admitted),
                ended,
            );
            result
        })
    }
}

/// `scheme://authority` of `uri`: the breaker's origin (a relative URI has none and shares
/// the key `""`).
fn origin_of(uri: &http::Uri) -> String {
    match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(authority)) => format!("{scheme}://{authority}"),
        _ => String::new(),
    }
}
