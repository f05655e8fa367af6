//! Built-in interceptors for soulbase-net: implementations of
//! [`soulbase_net_core::Interceptor`] that wire a client into the rest of a service.
//!
//! Each interceptor sits behind a cargo feature of its own; the features are additive, each
//! builds alone, and the default is all of them:
//!
//! | feature       | interceptor        | what it does |
//! |---------------|--------------------|--------------|
//! | `trace`       | `TraceUa`          | W3C `traceparent` (new span id per attempt), `X-Request-Id`, one `User-Agent` |
//! | `otel`        | `TraceUa`          | the `traceparent` continues the current span's OpenTelemetry trace, the attempt's span as the parent (tracing-opentelemetry; not a default) |
//! | `bearer`      | `Bearer`           | `Authorization: Bearer` from an async provider, cached, refreshed once on a 401 |
//! | `idempotency` | `IdempotencyKey`   | `Idempotency-Key` on idempotent POST/PATCH, stable across retries; dedup window |
//! | `crypto`      | `A2aJws`           | detached JWS (EdDSA) over the canonical JSON body, and `verify` |
//! | `sandbox`     | `SandboxGuard`     | host allow-list and literal-IP checks before anything is sent |
//! | `qos`         | `QosBytes`         | bytes out/in per tenant and host; budgets per tenant and tenant + host, total or per window, with reserve/settle |
//! | `cache`       | `CacheHook`        | shared HTTP cache for GET (RFC 9111): max-age / s-maxage / Expires, Age, Vary variants, conditional revalidation, stale-while-revalidate, must-revalidate |
//! | `redis`       | `RedisCacheStore`, `RedisDedupStore` | the HTTP cache and the idempotency dedup window shared by a fleet: one Redis, a Redis Cluster or the master sentinels name (not a default) |
//!
//! Interceptors depend on `soulbase-net-core` (and `soulbase-net-policy` for the sandbox rules
//! and the connection to a `[store]`'s Redis) only; the runtime reaches them through the trait.
//!
//! ```
//! # #[cfg(feature = "trace")] {
//! use soulbase_net_core::{Interceptor, NetRequest};
//! use soulbase_net_interceptors::TraceUa;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let trace = TraceUa::new();
//! let mut req = NetRequest::get("https://api.example.com/");
//! trace.before(&mut req).await.unwrap();
//! assert!(req.headers.contains_key("traceparent"));
//! assert!(req.headers.contains_key("x-request-id"));
//! # });
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "trace")]
mod trace;
#[cfg(feature = "trace")]
pub use crate::trace::TraceUa;

#[cfg(feature = "idempotency")]
mod idempotency;
#[cfg(feature = "idempotency")]
pub use crate::idempotency::IdempotencyKey;
#[cfg(feature = "redis")]
pub use crate::idempotency::RedisDedupStore;
/// Builds the Redis stores ([`RedisCacheStore`], [`RedisDedupStore`]) from a URL, a target or
/// a connection (`soulbase_net_store::RedisStore`).
#[cfg(feature = "redis")]
pub use soulbase_net_store::RedisStore;

#[cfg(feature = "bearer")]
mod bearer;
#[cfg(feature = "bearer")]
pub use crate::bearer::{Bearer, Token, TokenProvider};

#[cfg(feature = "crypto")]
mod jws;
#[cfg(feature = "crypto")]
pub use crate::jws::{verify as jws_verify, A2aJws, JwsClaims, JwsError};

#[cfg(feature = "sandbox")]
mod sandbox;
#[cfg(feature = "sandbox")]
pub use crate::sandbox::SandboxGuard;

#[cfg(feature = "qos")]
mod qos;
#[cfg(feature = "qos")]
pub use crate::qos::{ByteBudget, ByteCount, QosBytes, Reservation};

#[cfg(feature = "cache")]
mod cache;
#[cfg(feature = "redis")]
pub use crate::cache::RedisCacheStore;
#[cfg(feature = "cache")]
pub use crate::cache::{CacheHook, CacheStore, CachedResponse, MemoryStore};

#[cfg(any(feature = "trace", feature = "idempotency"))]
mod hex;
