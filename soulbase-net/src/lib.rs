//! soulbase-net: the governed outbound HTTP client for Rust services — timeouts, retries,
//! circuit breaking, limits, DNS control, SSRF protection, TLS policy, signing, caching and
//! metrics, driven by one policy document — in one dependency and one import:
//!
//! ```
//! use soulbase_net::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), NetError> {
//! let client = Client::builder()
//!     .policy_document(PolicyDocument::from_toml_str("[default]\nretry.max_attempts = 2\n")?)
//!     .interceptor(TraceUa::new())
//!     .observer(std::sync::Arc::new(Metrics::new()))
//!     .build()?;
//! # drop(client);
//! # Ok(()) }
//! ```
//!
//! Why a crate of its own: the layers below keep their strict order — the runtime and the
//! interceptors sit side by side on core and policy, neither depending on the other (see
//! `docs/architecture.md`) — so only a crate above both can put the client and the
//! interceptors in one prelude. It holds no code of its own: [`prelude`] re-exports, and the
//! crates themselves are here as [`core`], [`runtime`], [`interceptors`] and (feature
//! `observe`) [`observe`] for whatever the prelude leaves out.
//!
//! Features: the interceptors', one each (`trace`, `bearer`, `idempotency`, `crypto`,
//! `sandbox`, `qos`, `cache`, all on by default), `observe` (metrics and SLIs, on by default),
//! `redis` (a fleet's shared state), `http3`, `otel` and `tonic`.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use soulbase_net_core as core;
pub use soulbase_net_interceptors as interceptors;
#[cfg(feature = "observe")]
pub use soulbase_net_observe as observe;
pub use soulbase_net_runtime as runtime;

/// One import for a service's outbound code: the runtime's prelude (the client, requests,
/// errors, policy, the `http` types) and, behind their features, the interceptors and the
/// metrics.
pub mod prelude {
    pub use soulbase_net_runtime::prelude::*;

    #[cfg(feature = "crypto")]
    pub use soulbase_net_interceptors::A2aJws;
    #[cfg(feature = "idempotency")]
    pub use soulbase_net_interceptors::IdempotencyKey;
    #[cfg(feature = "qos")]
    pub use soulbase_net_interceptors::QosBytes;
    #[cfg(feature = "sandbox")]
    pub use soulbase_net_interceptors::SandboxGuard;
    #[cfg(feature = "trace")]
    pub use soulbase_net_interceptors::TraceUa;
    #[cfg(feature = "bearer")]
    pub use soulbase_net_interceptors::{Bearer, Token, TokenProvider};
    #[cfg(feature = "cache")]
    pub use soulbase_net_interceptors::{CacheHook, MemoryStore};
    #[cfg(feature = "observe")]
    pub use soulbase_net_observe::{Metrics, TracingObserver};
}
