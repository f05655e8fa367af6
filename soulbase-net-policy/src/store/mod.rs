//! [`StoreConfig`]: the policy document's `[store]` section — where a fleet's shared state
//! (rate limits, dedup window, HTTP cache) lives: one Redis, a Redis Cluster, or the master a
//! set of sentinels names. This is configuration only: `soulbase-net-store` connects to what
//! it names (`RedisConnection`, feature `redis`).

mod check;
mod value;

use std::fmt;

use crate::validate::Problem;

/// Where a fleet's shared state lives: the document's `[store]` section, naming at most one
/// Redis deployment.
///
/// ```toml
/// [store]
/// redis = "redis://:secret@10.0.0.5:6379/0"   # or rediss://… (TLS), redis+unix:///run/redis.sock
/// # or a Redis Cluster, found from its seed nodes:
/// # redis_cluster = ["redis://10.0.0.5:7000", "redis://10.0.0.6:7000"]
/// # or the master the sentinels name:
/// # redis_sentinel = { master = "mymaster", nodes = ["redis://10.0.0.7:26379"], password = "…" }
/// ```
///
/// Everything is checked when the document is loaded: one of the three keys at most, a scheme
/// the client can speak, a host (or a socket path), and for a list of nodes one scheme and one
/// set of credentials for all. Credentials are never shown by `Debug` or in a problem — only
/// schemes, hosts and ports. `rediss://` is TLS to Redis, verified against the system's trust
/// roots (a private CA: the stores' `with_root_pem`, or `soulbase_net_store::RedisConnection::with_root_pem`).
///
/// # Examples
/// ```
/// use soulbase_net_policy::{RedisSentinel, RedisTarget, StoreConfig};
///
/// let cluster = StoreConfig::redis_cluster(["redis://10.0.0.5:7000", "redis://10.0.0.6:7000"])?;
/// assert!(matches!(cluster.redis_target(), Some(RedisTarget::Cluster(nodes)) if nodes.len() == 2));
///
/// let sentinel = StoreConfig::redis_sentinel(
///     RedisSentinel::new("mymaster", ["redis://10.0.0.7:26379"]).password("s3cret"),
/// )?;
/// assert!(!format!("{sentinel:?}").contains("s3cret"));
/// # Ok::<(), Vec<soulbase_net_policy::Problem>>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StoreConfig {
    redis: Option<RedisTarget>,
}

/// The Redis deployment a [`StoreConfig`] names.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisTarget {
    /// One server: `redis://[user:password@]host:port[/db]`, `rediss://…` (TLS) or
    /// `redis+unix:///path` (`[store] redis`).
    Server(String),
    /// A Redis Cluster, found from these seed nodes: `redis://` or `rediss://`, one scheme and
    /// one set of credentials for all, database 0 only (`[store] redis_cluster`).
    Cluster(Vec<String>),
    /// The master that sentinels name (`[store] redis_sentinel`).
    Sentinel(RedisSentinel),
}

/// A master found through Redis Sentinel: the name the sentinels know it by, the sentinels
/// to ask (`redis://` or `rediss://`, one scheme and one set of credentials for all — those
/// of the sentinels), and what the master itself is reached with.
///
/// The master is reached with TLS when the sentinels are (`rediss://`). It is looked up when
/// first needed and again after its connection failed (a failover moves it).
///
/// In a document:
/// ```toml
/// [store]
/// redis_sentinel = { master = "mymaster", nodes = ["redis://10.0.0.7:26379", "redis://10.0.0.8:26379"], username = "app", password = "…", db = 0 }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSentinel {
    master: String,
    nodes: Vec<String>,
    username: Option<String>,
    password: Option<String>,
    db: i64,
}

// === impl StoreConfig ===

impl StoreConfig {
    /// A configuration naming the Redis at `url`.
    ///
    /// # Errors
    /// The problems of `url`, at the path `store.redis`.
    pub fn redis(url: &str) -> Result<Self, Vec<Problem>> {
        Self::with_target(RedisTarget::Server(url.to_owned()))
    }

    /// A configuration naming the Redis Cluster whose seed nodes are `nodes`.
    ///
    /// # Errors
    /// The problems of `nodes`, at the paths `store.redis_cluster[i]`.
    pub fn redis_cluster<I, S>(nodes: I) -> Result<Self, Vec<Problem>>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_target(RedisTarget::Cluster(
            nodes.into_iter().map(Into::into).collect(),
        ))
    }

    /// A configuration naming the master that `sentinel`'s sentinels name.
    ///
    /// # Errors
    /// The problems of `sentinel`, at the paths `store.redis_sentinel.*`.
    pub fn redis_sentinel(sentinel: RedisSentinel) -> Result<Self, Vec<Problem>> {
        Self::with_target(RedisTarget::Sentinel(sentinel))
    }

    fn with_target(target: RedisTarget) -> Result<Self, Vec<Problem>> {
        check::target(&target)?;
        Ok(Self {
            redis: Some(target),
        })
    }

    /// The Redis deployment named, if any.
    pub fn redis_target(&self) -> Option<&RedisTarget> {
        self.redis.as_ref()
    }

    /// The URL of a single Redis server (`[store] redis`), credentials included: for
    /// connecting, never for showing. `None` for a cluster or a sentinel.
    pub fn redis_url(&self) -> Option<&str> {
        match &self.redis {
            Some(RedisTarget::Server(url)) => Some(url),
            _ => None,
        }
    }
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("redis", &self.redis)
            .finish()
    }
}

// === impl RedisTarget ===

impl RedisTarget {
    /// Every problem that makes it unusable — a scheme the client cannot speak, no host,
    /// nodes that differ in scheme or credentials — each without credentials; what loading a
    /// `[store]` section checks, for a target built in code.
    ///
    /// # Errors
    /// The problems found.
    ///
    /// ```
    /// use soulbase_net_policy::RedisTarget;
    ///
    /// assert!(RedisTarget::Server("redis://10.0.0.5:6379/0".into()).check().is_ok());
    /// assert!(RedisTarget::Server("http://10.0.0.5".into()).check().is_err());
    /// ```
    pub fn check(&self) -> Result<(), Vec<Problem>> {
        check::target(self)
    }

    /// Where it points, without credentials: `redis://10.0.0.5:6379`,
    /// `cluster redis://10.0.0.5:7000 redis://10.0.0.6:7000`, or
    /// `sentinel master mymaster via redis://10.0.0.7:26379`.
    pub fn shown(&self) -> String {
        match self {
            Self::Server(url) => check::shown(url),
            Self::Cluster(nodes) => format!("cluster {}", check::shown_all(nodes)),
            Self::Sentinel(s) => format!(
                "sentinel master {} via {}",
                s.master,
                check::shown_all(&s.nodes)
            ),
        }
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Server(url) => f.debug_tuple("Server").field(&check::shown(url)).finish(),
            Self::Cluster(nodes) => {
                let shown: Vec<String> = nodes.iter().map(|n| check::shown(n)).collect();
                f.debug_tuple("Cluster").field(&shown).finish()
            }
            Self::Sentinel(s) => f.debug_tuple("Sentinel").field(s).finish(),
        }
    }
}

// === impl RedisSentinel ===

impl RedisSentinel {
    /// The master the sentinels at `nodes` know as `master`; reached without credentials, on
    /// database 0, until [`username`](Self::username), [`password`](Self::password) and
    /// [`db`](Self::db) say otherwise.
    pub fn new<I, S>(master: impl Into<String>, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            master: master.into(),
            nodes: nodes.into_iter().map(Into::into).collect(),
            username: None,
            password: None,
            db: 0,
        }
    }

    /// The user the master is reached as (Redis 6 ACL). Default is none.
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// The master's password. Default is none.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// The master's database. Default is 0.
    pub fn db(mut self, db: i64) -> Self {
        self.db = db;
        self
    }

    /// The name the sentinels know the master by.
    pub fn master_name(&self) -> &str {
        &self.master
    }

    /// The sentinels' URLs, credentials included: for connecting, never for showing.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The user the master is reached as ([`username`](Self::username)).
    pub fn master_username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The master's password ([`password`](Self::password)): for connecting, never for
    /// showing.
    pub fn master_password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The master's database ([`db`](Self::db)).
    pub fn master_db(&self) -> i64 {
        self.db
    }
}

impl fmt::Debug for RedisSentinel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| check::shown(n)).collect();
        f.debug_struct("RedisSentinel")
            .field("master", &self.master)
            .field("nodes", &nodes)
            .field("db", &self.db)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
