//! Built-in interceptors for soulbase-net.
//!
//! This crate will hold the implementations of [`soulbase_net_core::Interceptor`] that wire a
//! client into the rest of a service: `TraceUa` (W3C trace context, request id, user agent),
//! `Bearer` (tokens from a provider), `IdempotencyKey` (stable keys and a dedup window),
//! `A2aJws` (detached JWS signatures, feature `crypto`), `SandboxGuard` (allow-list and
//! private-address checks, feature `sandbox`), `CacheHook` (ETag / Last-Modified and
//! stale-while-revalidate, feature `cache`) and `QosBytes` (byte metering and budgets,
//! feature `qos`). The rules they share with the runtime live in `soulbase-net-policy`.
//!
//! It is built by the interceptors issue; until then it exports nothing.
