//! The soulbase-net client runtime.
//!
//! [`Client`] implements [`soulbase_net_core::NetClient`] on hyper's connections and a pool
//! of its own, with a connection path a security reviewer can sign off: the host allow-list, name resolution,
//! the address guard on every address actually dialled (IP literals included), a per-origin
//! connection cap, happy eyeballs through a replaceable [`Dialer`], and TLS 1.2+ on the ring
//! provider; then the policy's phase timeouts and size limits on each request.
//!
//! ```no_run
//! # async fn run() -> Result<(), soulbase_net_runtime::prelude::NetError> {
//! use soulbase_net_runtime::prelude::*;
//!
//! let client = Client::builder().build()?;
//! let user: serde_json::Value = client.get_json("https://api.example.com/u/1").await?;
//! # let _ = user; Ok(()) }
//! ```
//!
//! [`prelude`] names everything a service that calls upstreams needs, from this crate and
//! the core and policy crates, so it depends on this one crate.
//!
//! `Client` is also a `tower::Service<http::Request<B>>` answering
//! `http::Response<RespBody>` (see [`Client`]'s `Service` impl and [`ResponseFuture`]): tower
//! and tower-http layers compose in front of it, and a tonic client can use it as its
//! channel, over HTTP/2 ([`ClientBuilder::http2_prior_knowledge`] for `http` URLs) and
//! under the same policy.
//!
//! [`DnsResolver`] (the cache with singleflight, serve-stale, persistence and refresh) and
//! [`tls`] are public for services that need the same TLS configuration, pinning or error
//! classification outside the client.

#[doc(hidden)]
pub mod bench_hooks;
mod body;
mod classify;
mod client;
mod connect;
mod dns;
pub mod fleet;
mod pool;
pub mod prelude;
mod redirect;
mod resilience;
pub mod tls;

pub use crate::body::{check_content_length, collect, decode, LimitedBody};
pub use crate::client::{Client, ClientBuilder, ResponseFuture};
pub use crate::connect::{DialFuture, Dialer, TcpDialer};
pub use crate::dns::{DnsResolver, Resolution};
/// Put one in `NetRequest::extensions` to cancel the call from elsewhere: the call stops at
/// once, no further attempt starts, and it ends with `ErrorKind::Cancelled`.
pub use tokio_util::sync::CancellationToken;

/// The README's quick start, compiled and run as a doctest so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeQuickStart;

/// `docs/testing.md`, the guide to testing a service with the testkit, compiled and run as
/// doctests so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../docs/testing.md")]
struct TestingGuide;

/// `docs/from-reqwest.md`, the migration guide from reqwest, compiled and run as doctests so
/// that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../docs/from-reqwest.md")]
struct FromReqwestGuide;
