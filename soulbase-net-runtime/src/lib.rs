//! The soulbase-net client: one HTTP client for every outbound call of a service, with its
//! timeouts, retries, circuit breaker, limits, address guard (SSRF protection) and TLS set by
//! a policy document rather than by code.
//!
//! What a caller needs first:
//! - [`Client`], made by [`ClientBuilder`] (`Client::builder()`): cheap to clone, safe to
//!   share. `send` takes a `NetRequest` and answers a `NetResponse` whatever its status;
//!   `get_json`, `post_json` and `get_bytes` (the `NetClientExt` shortcuts) treat an error
//!   status as an error; `for_tenant("t1")` sends on behalf of a tenant.
//! - [`prelude`]: one import (`use soulbase_net_runtime::prelude::*;`) for the client, its
//!   requests, responses and errors, and the policy types, from this crate and the core and
//!   policy crates, so a service depends on this crate alone.
//! - [`CancellationToken`]: put one in a request's extensions to cancel the call from
//!   elsewhere.
//! - [`guides`]: the guides — [the policy reference](guides::policy), [testing a service
//!   with the testkit](guides::testing), [coming from reqwest](guides::from_reqwest); the
//!   fleet guide is `soulbase_net_outbox::guide`, the observability guide
//!   `soulbase_net_observe::guide`.
//!
//! ```no_run
//! # async fn run() -> Result<(), soulbase_net_runtime::prelude::NetError> {
//! use soulbase_net_runtime::prelude::*;
//!
//! // The policy file is read and validated here: every problem listed, one `?`.
//! let client = Client::builder().policy_file("policy.toml").build()?;
//!
//! let res = client
//!     .send(NetRequest::get("https://api.example.com/u/1").tenant("t1"))
//!     .await?;
//! let user: serde_json::Value = res.error_for_status()?.json().await?;
//!
//! // The same, shorter.
//! let user: serde_json::Value = client.for_tenant("t1").get_json("https://api.example.com/u/1").await?;
//! # let _ = user; Ok(()) }
//! ```
//!
//! Underneath, [`Client`] runs on hyper's connections and a pool of its own, with a
//! connection path a security reviewer can sign off: the host allow-list, name resolution,
//! the address guard on every address actually dialled (IP literals included), a per-origin
//! connection cap, happy eyeballs through a replaceable [`Dialer`], and TLS 1.2+ on the ring
//! provider; then the policy's phase timeouts and size limits on each request.
//!
//! `Client` is also a `tower::Service<http::Request<B>>` answering
//! `http::Response<RespBody>` (see [`Client`]'s `Service` impl and [`ResponseFuture`]): tower
//! and tower-http layers compose in front of it, and a tonic client can use it as its
//! channel, over HTTP/2 (h2c for `http` URLs: the policy's `pool.http2_prior_knowledge`,
//! per host, or [`ClientBuilder::http2_prior_knowledge`] for every host) and under the same
//! policy; a body it can replay (whole, within `retry.replay_buffer`) is retried as the
//! policy allows.
//!
//! Features: `redis` (rate limits shared on Redis, [`fleet`]); `http3` (off by default):
//! HTTP/3 over QUIC (quinn + h3, rustls on ring) as the policy's `http.version` asks — `auto`
//! after an origin's `Alt-Svc`, `h3` always, `h3-or-tcp` raced with TCP — with the same
//! trust roots, pins, client certificates, address guard, timeouts, limits and retries as
//! TCP. Without `http3`, a policy asking for `h3` or `h3-or-tcp` is refused
//! (`SCHEMA.VALIDATION_FAILED`) rather than sent over TCP.
//!
//! For more specialised needs: [`DnsResolver`] (the cache with singleflight, serve-stale,
//! persistence and refresh), [`hickory_resolver()`] (a hickory resolver set up as the runtime's
//! own, for other record types or uncached answers), [`serve`] (the HTTP/1.1 server loop of
//! the systems built on the client) and [`tls`] for services that need the same TLS configuration,
//! pinning or error classification outside the client; [`body`] for the response-body
//! building blocks (size cap, read timeout, decoding) on bodies of their own; [`fleet`] for
//! rate limits shared by several instances.

#[doc(hidden)]
pub mod bench_hooks;
pub mod body;
mod classify;
mod client;
mod dns;
pub mod fleet;
pub mod layer;
pub mod prelude;
mod pruned;
mod redirect;
mod resilience;
pub mod serve;
pub mod testing;
pub mod tls;
mod transport;

pub use crate::client::{Client, ClientBuilder, ResponseFuture};
pub use crate::dns::{hickory_resolver, DnsResolver, HickoryOptions, Resolution};
pub use crate::transport::{DialFuture, Dialer, TcpDialer};
/// Put one in `NetRequest::extensions` to cancel the call from elsewhere: the call stops at
/// once, no further attempt starts, and it ends with `ErrorKind::Cancelled`.
pub use tokio_util::sync::CancellationToken;

/// The README's quick start, compiled and run as a doctest so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeQuickStart;

/// The guides, as pages of this documentation (each is also a file in the repository's
/// `docs/`, and every Rust snippet in them is a doctest of this crate, so they stay true).
pub mod guides {
    #[doc = include_str!("../../docs/policy.md")]
    pub mod policy {}

    #[doc = include_str!("../../docs/testing.md")]
    pub mod testing {}

    #[doc = include_str!("../../docs/from-reqwest.md")]
    pub mod from_reqwest {}
}
