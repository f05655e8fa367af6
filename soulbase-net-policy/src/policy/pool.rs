//! Connection pool settings per host: how long idle connections are kept, how many, how long
//! one is used at most, keep-alive pings, and HTTP/2 prior knowledge.
//!
//! Why optional fields: the client builder's values (`ClientBuilder::pool_idle_timeout` and
//! its siblings) stay the defaults of every host; a policy sets only what differs for the
//! hosts it covers, layered like every other section (default, host pattern, tenant) and
//! hot-reloaded with the document. A connection belongs to the pool of its policy's
//! connection settings (these among them), so a reload that changes a host's pool settings
//! gives that host a new pool — the old one finishes the requests it has and closes — and a
//! reload that changes nothing a host's connections depend on keeps its pool.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::validate::Checker;

/// A host's connection pool settings; an unset field takes the client builder's value.
///
/// Default: every field unset.
///
/// # Examples
/// ```
/// use soulbase_net_policy::PolicyDocument;
///
/// let doc = PolicyDocument::from_toml_str(
///     r#"
///     [overrides."grpc.internal"]
///     pool.http2_prior_knowledge = true
///     pool.keep_alive = "15s"
///     pool.max_lifetime = "5m"
///     "#,
/// )?;
/// # let _ = doc;
/// # Ok::<(), soulbase_net_policy::PolicyError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct PoolPolicy {
    /// How long an idle connection is kept before it is closed; `"0s"` keeps none.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
    /// The most idle HTTP/1.1 connections kept per origin (scheme, host and port).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_idle_per_host: Option<u32>,
    /// A connection opened longer ago than this takes no new request; `"0s"` means no limit.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub max_lifetime: Option<Duration>,
    /// HTTP/2 and HTTP/3 connections are pinged at this interval; `"0s"` turns pings off.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub keep_alive: Option<Duration>,
    /// Speak HTTP/2 on every connection to the hosts this policy covers, without ALPN (h2c
    /// for `http://` origins): `true` in a host's override gives that host h2c while the
    /// client's other hosts keep HTTP/1.1; `false` gives one host HTTP/1.1 on a client built
    /// with `ClientBuilder::http2_prior_knowledge`. Unset: the builder's value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http2_prior_knowledge: Option<bool>,
}

impl PoolPolicy {
    /// Every field is valid on its own (zero has a meaning for each duration); nothing to
    /// check between them.
    pub(crate) fn check(&self, _c: &mut Checker<'_>) {}
}
