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
//! - [`CancellationToken`], put in a request's extensions to cancel the call from elsewhere.
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
//! # Ok(()) }
//! ```

pub use crate::client::{Client, ClientBuilder};
pub use soulbase_net_core::{
    Body, ErrorCode, ErrorKind, ForTenant, NetClient, NetClientExt, NetError, NetRequest,
    NetResponse, RespBody,
};
pub use soulbase_net_policy::{NetPolicy, PolicyDocument, PolicyResolver, SnapshotResolver};
pub use tokio_util::sync::CancellationToken;
