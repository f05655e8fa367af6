//! One import for a service that calls upstreams: `use soulbase_net_runtime::prelude::*;`.
//!
//! It names what building a client, sending requests and handling their errors takes, from
//! the three crates that define them (`soulbase-net-core`, `soulbase-net-policy` and this
//! one), so such a service depends on this crate alone. Those crates stay for whoever needs
//! only part: a library that takes an `Arc<dyn NetClient>` depends on core.
//!
//! What it holds:
//! - the client: [`Client`], [`ClientBuilder`];
//! - requests and responses: [`NetRequest`], [`NetResponse`], [`RespBody`], [`Body`];
//! - errors: [`NetError`], matched by [`ErrorKind`] or by the stable [`ErrorCode`];
//! - the client traits: [`NetClient`] (`send`) and [`NetClientExt`] (`get_json`,
//!   `post_json`, `get_bytes`, and `for_tenant`, which gives a [`ForTenant`] handle);
//! - policy: [`NetPolicy`], [`PolicyDocument`], [`SnapshotResolver`] and the
//!   [`PolicyResolver`] trait its `resolve` comes from;
//! - [`CancellationToken`], put in a request's extensions to cancel the call from elsewhere;
//! - timeouts and their phases: [`TimeoutCfg`], and [`Phase`] to match `NetError`s of kind
//!   `Timeout`;
//! - extension points: [`Interceptor`] (with its [`Hooks`]), [`Observer`] (with the
//!   events it [`Takes`]) and the [`NetEvent`]s it receives;
//! - the policy's sections a service sets in code most often: [`ProxyPolicy`],
//!   [`HttpVersionPolicy`];
//! - the `http` crate (as reqwest re-exports it): [`http`], with [`Method`], [`StatusCode`],
//!   [`HeaderMap`], [`HeaderValue`] and the [`header`] names at hand.
//!
//! The interceptors (TraceUa, Bearer, IdempotencyKey, …) are a crate of their own beside this
//! one (`soulbase_net_interceptors`), which this crate never depends on: a service that adds
//! them imports that crate too.
//!
//! # Examples
//! ```
//! use std::sync::Arc;
//! use soulbase_net_runtime::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let doc = PolicyDocument::from_toml_str(r#"
//!     [default]
//!     retry.max_attempts = 2
//! "#)?;
//! let resolver = Arc::new(SnapshotResolver::new(doc)?);
//! assert_eq!(resolver.resolve(None, "api.example.com").retry.max_attempts, 2);
//! let client: Client = ClientBuilder::new().policy_resolver(resolver).build()?;
//!
//! // Refused before anything is sent: the URL has userinfo.
//! let err: NetError = client.send(NetRequest::get("http://u:p@api.example.com/")).await.unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::InvalidRequest);
//! assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
//!
//! // The `http` types a handler matches on come with it.
//! let timeout_kind = matches!(err.kind(), ErrorKind::Timeout(Phase::Ttfb));
//! assert!(!timeout_kind);
//! assert_eq!(Method::GET, http::Method::GET);
//! assert_eq!(header::ACCEPT, "accept");
//! # let _: Option<(StatusCode, HeaderMap, HeaderValue, TimeoutCfg)> = None;
//! # Ok(()) }
//! ```

pub use crate::client::{Client, ClientBuilder};
pub use soulbase_net_core::http::{self, header, HeaderMap, HeaderValue, Method, StatusCode};
pub use soulbase_net_core::{
    Body, ErrorCode, ErrorKind, ForTenant, Hooks, Interceptor, NetClient, NetClientExt, NetError,
    NetEvent, NetRequest, NetResponse, Observer, Phase, RespBody, Takes, TimeoutCfg,
};
pub use soulbase_net_policy::{
    HttpVersionPolicy, NetPolicy, PolicyDocument, PolicyResolver, ProxyPolicy, SnapshotResolver,
};
pub use tokio_util::sync::CancellationToken;
