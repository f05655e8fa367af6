//! Observability for soulbase-net: Prometheus metrics, `tracing` spans and the SLIs of the
//! timeout / retry policy, all from the runtime's [`NetEvent`](soulbase_net_core::NetEvent)s.
//!
//! - [`Metrics`]: the seed's metrics (`net_requests_total`, `net_latency_ms`, `net_bytes_total`,
//!   `net_retry_total`, `net_hedge_total`, `net_answered_total`, `net_dedup_drops_total`,
//!   `net_circuit_open_total`, `net_redirect_total`, …) with bounded labels, in the
//!   OpenMetrics text format; `net_circuit_open_ratio`, the share of each host's breakers
//!   that are open, from their transitions; gauges of the clients' limiters and retry
//!   budgets (`net_limiter_in_flight`,
//!   `net_limiter_tenant_in_flight`, `net_limiter_queued`, `net_limiter_window`,
//!   `net_retry_budget_tokens`) read from them at scrape time; and [`Slis`] (retry rate,
//!   timeout rate, error ratio, dedup drop rate, hedge rate, p50 / p99 latency) as a struct
//!   and as gauges. All of it comes from the client's events: the dedup drop rate from the
//!   `Answered` events of `IdempotencyKey`'s dedup window, with no call of its own.
//! - [`TracingObserver`]: the client's events (retries, redirects, refusals) as `tracing` events in the call's span.
//! - [`Fanout`]: both at once.
//! - `otel` (feature `otel`): the client's call and attempt spans exported as OpenTelemetry
//!   spans with the HTTP client semantic conventions, and an inbound request's W3C trace
//!   context continued by the calls it makes.
//!
//! ```
//! use std::sync::Arc;
//! use soulbase_net_core::Observer;
//! use soulbase_net_observe::{Fanout, Metrics, TracingObserver};
//!
//! let metrics = Arc::new(Metrics::new());
//! let observer: Arc<dyn Observer> =
//!     Arc::new(Fanout::new().with(metrics.clone()).with(Arc::new(TracingObserver::new())));
//! // Give `observer` to the client; serve `metrics.encode()` on the scrape endpoint.
//! assert!(metrics.encode().ends_with("# EOF\n"));
//! # drop(observer);
//! ```
//!
//! Of the workspace, this crate depends on `soulbase-net-core` only. Feature `otel` (not a
//! default) adds opentelemetry, its SDK and tracing-opentelemetry.
//!
//! The guide to wiring metrics, logs and OpenTelemetry into a service is the page [`guide`]
//! (documented with feature `otel`).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod breakers;
mod gauges;
mod hot;
mod labels;
mod latency;
mod metrics;
#[cfg(feature = "otel")]
pub mod otel;
mod sli;
mod trace;

pub use crate::latency::LATENCY_BUCKETS_MS;
pub use crate::metrics::{Metrics, MetricsBuilder};
pub use crate::sli::Slis;
pub use crate::trace::TracingObserver;
/// One observer forwarding to several; it lives in core (a client fans out to several
/// observers itself) and is re-exported here beside the observers it combines.
pub use soulbase_net_core::Fanout;

/// The guide to wiring metrics, logs and OpenTelemetry (also `docs/observability.md` in the
/// repository; its snippet is a doctest of this crate with feature `otel`, which the guide
/// needs, and the page appears when the crate is documented with that feature).
#[cfg_attr(feature = "otel", doc = include_str!("../../docs/observability.md"))]
pub mod guide {}

/// Re-exported so that users name the registry type of [`Metrics::registry`] without a
/// version mismatch.
pub use prometheus_client;
