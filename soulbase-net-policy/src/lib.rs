//! Policy documents of soulbase-net: every knob of the governed HTTP client with its default,
//! TOML/JSON configuration with overrides by host pattern, tenant and tenant + host, validation
//! that reports every problem at once, and a lock-free resolver with atomic hot reload.
//!
//! ```
//! use soulbase_net_policy::{PolicyDocument, PolicyResolver, SnapshotResolver};
//! use std::time::Duration;
//!
//! let doc = PolicyDocument::from_toml_str(r#"
//!     [default]
//!     timeout.total = "60s"
//!
//!     [overrides."*.example.com"]
//!     retry.backoff.cap = "2s"
//!
//!     [tenants.t1]
//!     limits.per_tenant_concurrency = 32
//!
//!     [tenants.t1.overrides."api.example.com"]
//!     retry.max_attempts = 2
//! "#)?;
//! let resolver = SnapshotResolver::new(doc)?;
//!
//! let p = resolver.resolve(Some("t1"), "API.Example.com.");
//! assert_eq!(p.timeout.total, Duration::from_secs(60));          // default
//! assert_eq!(p.retry.backoff.cap, Duration::from_secs(2));       // host pattern
//! assert_eq!(p.limits.per_tenant_concurrency, 32);               // tenant
//! assert_eq!(p.retry.max_attempts, 2);                           // tenant + host
//! assert_eq!(resolver.resolve(None, "other.org").retry.max_attempts, 3); // built-in default
//!
//! // Mistakes are reported all at once, each with its path.
//! let err = PolicyDocument::from_toml_str(r#"
//!     [default]
//!     retry.max_attempts = 0
//!     [overrides."*.example.com"]
//!     tls.verify_cert = false
//! "#).unwrap_err();
//! assert_eq!(err.problems().len(), 2);
//! assert_eq!(err.problems()[1].path, r#"overrides."*.example.com".tls.verify_cert"#);
//! # Ok::<(), soulbase_net_policy::PolicyError>(())
//! ```
//!
//! The defaults: TLS 1.2+, private addresses denied, 3 attempts for idempotent requests
//! within a 20 % retry budget, breaker off, ≤ 5 redirects, 32MiB bodies, 64 calls in flight
//! per host, a policy refused when it cannot keep its own deadline; endpoints frozen for 10m
//! after a failure; DNS answers cached for at most 1h and refreshed every 30m. Where a choice
//! follows Envoy, Finagle, gRPC or resilience4j, the field's documentation says so.
//!
//! [`Snapshot::explain`] says which layer each field of an effective policy comes from (what
//! `cargo xtask policy explain` prints).
//!
//! A document's `[store]` section ([`StoreConfig`]) names where a fleet's shared state lives;
//! this crate only describes and checks it — `soulbase-net-store` connects to it.
//!
//! Credentials a policy holds — the passwords of proxy URLs (`proxy.http_proxy`,
//! `proxy.https_proxy`) and of alternate endpoint URLs (`endpoints.urls`), the mTLS private key
//! (`tls.mtls.client_key_pem`), the `[store]`'s URLs and passwords — are never shown: `Debug`,
//! [`Snapshot::explain`] and validation problems mask them (`http://user:***@proxy:3128/`,
//! `<redacted>`), while the fields keep them for the client and the documents' TOML and JSON
//! forms keep them as written.

mod document;
mod explain;
mod guard;
mod host;
mod policy;
mod redact;
mod resolver;
mod serde_opt;
mod size;
mod store;
mod validate;

pub use crate::document::PolicyDocument;
pub use crate::explain::{ExplainedField, Explanation, PolicyLayer};
pub use crate::guard::{canonical, classify, AddressGuard, Denied, DenyRule, SpecialRange};
pub use crate::host::{normalize_host, HostPattern, HostPatternError, HostPatternSet};
pub use crate::policy::breaker::{CbKey, CircuitBreakerPolicy, SlowCallCfg};
pub use crate::policy::cache::CacheHookPolicy;
pub use crate::policy::delivery::{DeliveryPolicy, Semantics};
pub use crate::policy::dns::DnsPolicy;
pub use crate::policy::endpoints::{EndpointPolicy, FreezeOn};
pub use crate::policy::hedge::HedgePolicy;
pub use crate::policy::http::{HttpPolicy, HttpVersionPolicy};
pub use crate::policy::limits::{
    AimdPolicy, AimdScope, GlobalLimit, GlobalScope, LimitsPolicy, OnStoreError,
};
pub use crate::policy::pool::PoolPolicy;
pub use crate::policy::proxy::{ProxyPolicy, ProxyResolve};
pub use crate::policy::redirect::RedirectPolicy;
pub use crate::policy::retry::{BackoffCfg, JitterMode, RetryBudget, RetryOn, RetryPolicy};
pub use crate::policy::security::{SandboxGrants, SecurityPolicy};
pub use crate::policy::slo::{SloPolicy, MAX_BACKOFF_FACTOR};
pub use crate::policy::timeout::{DynamicTimeout, TimeoutPolicy};
pub use crate::policy::tls::{MtlsCfg, TlsPolicy, TlsVersion};
pub use crate::policy::NetPolicy;
pub use crate::resolver::{PolicyResolver, PolicyView, Snapshot, SnapshotResolver};
pub use crate::size::{ByteSize, ParseByteSizeError};
pub use crate::store::{RedisSentinel, RedisTarget, StoreConfig};
pub use crate::validate::{PolicyError, Problem};
