//! The soulbase-net client runtime.
//!
//! This crate will hold the `Client` that implements
//! [`soulbase_net_core::NetClient`] on hyper-util's pooled client: the DNS cache with
//! singleflight and persistence, the address guard applied to every dialled address, TLS with
//! SPKI pinning and mTLS, proxies, the per-host connection cap, redirects, and the governance
//! layer (retries with budgets, circuit breaker, limiters with AIMD, hedging, endpoint freezing,
//! dynamic timeouts) driven by the `NetPolicy` of `soulbase-net-policy`.
//!
//! It is built by the transport and resilience issues, part by part:
//! - [`DnsResolver`]: the DNS cache with singleflight, serve-stale, persistence and refresh.

mod dns;

pub use crate::dns::{DnsResolver, Resolution};
