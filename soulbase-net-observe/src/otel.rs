//! OpenTelemetry (feature `otel`): the client's spans exported as OpenTelemetry spans, and an
//! inbound request's trace continued by the calls it makes.
//!
//! The runtime's client already runs each call in a `tracing` span `http.client.request` and
//! each attempt in `http.client.attempt`, with the stable HTTP client semantic-convention
//! attributes as field names. [`layer`] is the tracing-opentelemetry layer that exports them
//! (and every other span of the service) through an OpenTelemetry tracer:
//!
//! | span | OpenTelemetry kind | attributes |
//! |---|---|---|
//! | `http.client.request`, named after the method | INTERNAL: the logical call | `http.request.method`, `server.address`, `server.port`, `url.scheme`, `url.full`, `http.response.status_code`, `error.type`, `http.request.resend_count` (attempts − 1, when more than one), `tenant`, `request.id` |
//! | `http.client.attempt`, named after the method | CLIENT: one request on the wire, a child of the call | `http.request.method`, `server.address`, `server.port`, `url.full` (of the URL this attempt went to), `http.response.status_code`, `error.type`, `http.request.resend_count` (from the second attempt on), `attempt`, `hedge` |
//!
//! `url.full` never holds userinfo, a query or a fragment (the runtime shows URLs as
//! [`redact_url`](soulbase_net_core::redact_url) does). A 4xx, a 5xx or an error sets the
//! span's status to error, and `error.type` holds the status code or the error kind's label
//! (`timeout`, `connect`, …).
//!
//! With `TraceUa` built with its `otel` feature (soulbase-net-interceptors), the outbound
//! `traceparent` carries the current span's trace id, and the attempt's span id as the
//! parent: the upstream's spans join the same trace, under the attempt that reached them.
//! A call made inside a span continued from an inbound request's headers
//! ([`inbound_context`]) is therefore one trace from the inbound request to the upstream.
//!
//! The versions that must match (opentelemetry, its SDK, tracing-opentelemetry) are
//! re-exported: [`opentelemetry`], [`opentelemetry_sdk`], [`tracing_opentelemetry`].
//!
//! # Examples
//! A subscriber exporting the client's spans, and an inbound request's trace continued:
//! ```
//! use soulbase_net_core::http::HeaderMap;
//! use soulbase_net_observe::otel::{
//!     self, opentelemetry::trace::TracerProvider as _,
//!     opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider},
//!     tracing_opentelemetry::OpenTelemetrySpanExt,
//! };
//! use tracing_subscriber::layer::SubscriberExt;
//!
//! // In a service: an OTLP exporter (opentelemetry-otlp) with a batch processor.
//! let exporter = InMemorySpanExporter::default();
//! let provider = SdkTracerProvider::builder()
//!     .with_simple_exporter(exporter.clone())
//!     .build();
//! let subscriber = tracing_subscriber::registry().with(otel::layer(provider.tracer("billing")));
//!
//! tracing::subscriber::with_default(subscriber, || {
//!     // Per inbound request: its span continues the caller's trace. Calls made while it is
//!     // the current span (`client.send(req).instrument(span)`) are its children.
//!     let mut headers = HeaderMap::new();
//!     headers.insert(
//!         "traceparent",
//!         "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap(),
//!     );
//!     let span = tracing::info_span!("POST /invoices", otel.kind = "server");
//!     span.set_parent(otel::inbound_context(&headers)).unwrap();
//!     span.in_scope(|| {});
//! });
//! provider.force_flush().unwrap();
//! let spans = exporter.get_finished_spans().unwrap();
//! assert_eq!(
//!     spans[0].span_context.trace_id().to_string(),
//!     "4bf92f3577b34da6a3ce929d0e0e4736"
//! );
//! ```

use opentelemetry::{
    propagation::{Extractor, TextMapPropagator},
    trace::Tracer,
    Context,
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use soulbase_net_core::http::HeaderMap;
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::registry::LookupSpan;

/// Re-exported: the OpenTelemetry API of the version [`layer`] works with.
pub use opentelemetry;
/// Re-exported: the OpenTelemetry SDK (tracer providers, processors, samplers, the in-memory
/// exporter with its `testing` feature) of the version [`layer`] works with.
pub use opentelemetry_sdk;
/// Re-exported: the tracing-opentelemetry of the version [`layer`] returns, for its
/// `OpenTelemetrySpanExt` (`set_parent`, `context`) and the layer's settings.
pub use tracing_opentelemetry;

/// The layer that exports `tracing` spans — the client's `http.client.request` and
/// `http.client.attempt` among them — as OpenTelemetry spans through `tracer`: put it on a
/// `tracing_subscriber::registry()`. The `otel.name`, `otel.kind` and `otel.status_code`
/// fields the client sets become the span's name, kind and status; every other field
/// becomes an attribute of the same name.
///
/// It is tracing-opentelemetry's layer with its defaults (entering a span makes its
/// OpenTelemetry context current, so OpenTelemetry-instrumented code inside the call nests
/// too); its builder methods change them, e.g. `.with_tracked_inactivity(false)` to leave out
/// the `busy_ns` / `idle_ns` attributes.
///
/// # Examples
/// ```
/// use soulbase_net_observe::otel::{
///     self, opentelemetry::trace::TracerProvider as _, opentelemetry_sdk::trace::SdkTracerProvider,
/// };
/// use tracing_subscriber::layer::SubscriberExt;
///
/// let provider = SdkTracerProvider::builder().build(); // add an exporter here
/// let subscriber = tracing_subscriber::registry()
///     .with(otel::layer(provider.tracer("billing")).with_tracked_inactivity(false));
/// // tracing::subscriber::set_global_default(subscriber)?;
/// # drop(subscriber);
/// ```
pub fn layer<S, T>(tracer: T) -> OpenTelemetryLayer<S, T>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    T: Tracer + 'static,
    T::Span: Send + Sync,
{
    tracing_opentelemetry::layer().with_tracer(tracer)
}

/// The trace context of an inbound request, from its W3C `traceparent` and `tracestate`
/// headers: give it to the request's span with `OpenTelemetrySpanExt::set_parent`, and the
/// span — and the client calls made in it — continue the caller's trace. Headers without a
/// valid `traceparent` give an empty context: the span then starts a new trace.
///
/// # Examples
/// ```
/// use soulbase_net_core::http::HeaderMap;
/// use soulbase_net_observe::otel::{inbound_context, opentelemetry::trace::TraceContextExt};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(
///     "traceparent",
///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap(),
/// );
/// let cx = inbound_context(&headers);
/// let remote = cx.span().span_context().clone();
/// assert!(remote.is_remote() && remote.is_sampled());
/// assert_eq!(remote.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(remote.span_id().to_string(), "00f067aa0ba902b7");
///
/// assert!(!inbound_context(&HeaderMap::new()).span().span_context().is_valid());
/// ```
pub fn inbound_context(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract_with_context(&Context::new(), &Headers(headers))
}

/// An HTTP header map as OpenTelemetry's propagators read one.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}
