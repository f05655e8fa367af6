//! [`RedisConnection`]: the connection to the Redis a `[store]` section names — one server, a
//! cluster, or the master the sentinels name — made on first use and remade after Redis went
//! away; [`RedisHandle`] is what a command runs on.
//!
//! A caller bounds each command with its own short timeout (the stores' `timeout`, the rate
//! limit's `store_timeout`); what happens here only has to end, and to heal by itself:
//! `redis`' connection manager reconnects a server, the cluster connection refreshes its slot
//! map and reconnects nodes, and a sentinel's master is looked up again after its connection
//! failed.

mod sentinel;

use std::{
    fmt,
    sync::{Arc, OnceLock},
    time::Duration,
};

use redis::{
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig},
    cluster_async::ClusterConnection,
    Cmd, Pipeline, RedisFuture, RedisResult, TlsCertificates, Value,
};
use soulbase_net_core::NetError;

use soulbase_net_policy::RedisTarget;

/// Longest wait for a connection to one node.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Reconnection back-off after Redis went away: from this, doubling...
const MIN_DELAY: Duration = Duration::from_millis(20);

/// ...up to this.
const MAX_DELAY: Duration = Duration::from_millis(500);

/// Connects one reconnection tries after the first before it fails. A command that comes
/// while the manager reconnects waits for that reconnection: with no end to it, every such
/// command would wait until Redis came back (a caller's timeout cut each one, but the
/// connection never failed, so a sentinel's master that moved was never looked up again).
/// Bounded, the commands fail (within a fraction of a second when the address refuses,
/// within a few seconds when it does not answer), and the next command starts the next
/// reconnection.
const RECONNECT_RETRIES: usize = 3;

/// Longest wait for one cluster node's answer. Callers time out far sooner; this bounds what a
/// dead node that never resets its connections keeps pending, and tells the cluster
/// connection to reconnect it and refresh its slot map.
const CLUSTER_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

/// A lazily made connection to a Redis server, cluster or sentinel-named master, shown by its
/// addresses only (never its credentials).
///
/// # Examples
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use soulbase_net_policy::RedisTarget;
/// use soulbase_net_store::RedisConnection;
///
/// let seeds = vec!["redis://10.0.0.5:7000".to_owned(), "redis://10.0.0.6:7000".to_owned()];
/// let redis = RedisConnection::new(&RedisTarget::Cluster(seeds))?;
/// let mut con = redis.handle().await?;
/// let pong: String = redis::cmd("PING").query_async(&mut con).await?;
/// # let _ = pong; Ok(()) }
/// ```
pub struct RedisConnection {
    kind: Kind,
    shown: String,
}

/// What a [`RedisConnection`] connects to, with what it made of it so far. (The clients are
/// boxed: they are large, and made once.)
enum Kind {
    Server {
        client: Box<redis::Client>,
        manager: OnceLock<ConnectionManager>,
    },
    Cluster {
        client: Box<ClusterClient>,
        connection: OnceLock<ClusterConnection>,
    },
    Sentinel(Arc<sentinel::SentinelMaster>),
}

/// A connection to run commands on (`redis::aio::ConnectionLike`): cheap to clone, one per
/// call.
#[derive(Clone)]
pub struct RedisHandle(Handle);

/// A store kept in Redis — [`RedisRateStore`](crate::rate::RedisRateStore),
/// [`RedisDedupStore`](crate::dedup::RedisDedupStore),
/// [`RedisCacheStore`](crate::cache::RedisCacheStore): made on a [`RedisConnection`], and so
/// from anything a connection is made from. One piece of code serves the three.
///
/// # Examples
/// ```
/// use soulbase_net_store::{rate::RedisRateStore, RedisStore};
///
/// // Nothing is connected until the store is first used.
/// let store = RedisRateStore::new("redis://127.0.0.1:6379/")?;
/// assert!(format!("{store:?}").contains("127.0.0.1:6379"));
/// assert!(RedisRateStore::new("http://not-redis").is_err());
/// # Ok::<(), soulbase_net_core::NetError>(())
/// ```
pub trait RedisStore: Sized {
    /// A store on `conn` (e.g. a cluster reached over TLS with a private CA:
    /// [`RedisConnection::with_root_pem`]).
    fn from_connection(conn: RedisConnection) -> Self;

    /// A store on the Redis at `url` (`redis://[user:password@]host:port[/db]`, `rediss://…`
    /// for TLS verified against the system's trust roots, `redis+unix:///path`); nothing is
    /// connected until first use.
    ///
    /// # Errors
    /// `InvalidRequest` when `url` is not a Redis URL (the message never repeats the URL's
    /// credentials).
    fn new(url: &str) -> Result<Self, NetError> {
        Self::from_target(&RedisTarget::Server(url.to_owned()))
    }

    /// A store on the Redis at the `rediss://` `url`, trusting the CA certificates of
    /// `root_pem` (PEM) instead of the system's.
    ///
    /// # Errors
    /// `InvalidRequest` when `url` is not a Redis URL or `root_pem` holds no certificate.
    fn with_root_pem(url: &str, root_pem: &[u8]) -> Result<Self, NetError> {
        let target = RedisTarget::Server(url.to_owned());
        Ok(Self::from_connection(RedisConnection::with_root_pem(
            &target, root_pem,
        )?))
    }

    /// A store on the Redis deployment `target` names — one server, a Redis Cluster, or the
    /// master sentinels name (a `[store]` section's
    /// [`redis_target`](soulbase_net_policy::StoreConfig::redis_target)); nothing is
    /// connected until first use.
    ///
    /// # Errors
    /// `InvalidRequest` when `target` is not usable.
    fn from_target(target: &RedisTarget) -> Result<Self, NetError> {
        Ok(Self::from_connection(RedisConnection::new(target)?))
    }
}

#[derive(Clone)]
enum Handle {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(sentinel::MasterHandle),
}

// === impl RedisConnection ===

impl RedisConnection {
    /// A connection to `target`; nothing is connected until [`handle`](Self::handle). A
    /// `rediss://` URL is TLS, verified against the system's trust roots.
    ///
    /// # Errors
    /// `InvalidRequest` when `target` is not usable (the problems a document would report,
    /// which never repeat credentials).
    pub fn new(target: &RedisTarget) -> Result<Self, NetError> {
        Self::build(target, None)
    }

    /// Like [`new`](Self::new), trusting the CA certificates of `root_pem` (PEM) instead of
    /// the system's for `rediss://` URLs.
    ///
    /// # Errors
    /// As [`new`](Self::new), and when `root_pem` holds no certificate.
    pub fn with_root_pem(target: &RedisTarget, root_pem: &[u8]) -> Result<Self, NetError> {
        Self::build(target, Some(root_pem))
    }

    fn build(target: &RedisTarget, root_pem: Option<&[u8]>) -> Result<Self, NetError> {
        target.check().map_err(|problems| {
            let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
            NetError::invalid_request(format!("not a usable redis store: {}", text.join("; ")))
        })?;
        let certs = root_pem.map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        });
        let kind = match target {
            RedisTarget::Server(url) => Kind::Server {
                client: Box::new(
                    match certs {
                        Some(certs) => redis::Client::build_with_tls(url.as_str(), certs),
                        None => redis::Client::open(url.as_str()),
                    }
                    .map_err(invalid)?,
                ),
                manager: OnceLock::new(),
            },
            RedisTarget::Cluster(nodes) => {
                let mut builder = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                    .connection_timeout(CONNECT_TIMEOUT)
                    .retries(3)
                    .min_retry_wait(duration_ms(MIN_DELAY))
                    .max_retry_wait(duration_ms(MAX_DELAY));
                if let Some(certs) = certs {
                    builder = builder.certs(certs);
                }
                Kind::Cluster {
                    client: Box::new(builder.build().map_err(invalid)?),
                    connection: OnceLock::new(),
                }
            }
            RedisTarget::Sentinel(s) => {
                Kind::Sentinel(Arc::new(sentinel::SentinelMaster::new(s, certs)?))
            }
            // A kind of deployment the policy crate names and this one does not know yet.
            _ => {
                return Err(NetError::invalid_request(format!(
                    "not a usable redis store: {} is not supported here",
                    target.shown()
                )))
            }
        };
        Ok(Self {
            kind,
            shown: target.shown(),
        })
    }

    /// Where it points, without credentials (see [`RedisTarget::shown`]).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// A connection to run a command on, made (lazily) on first use. For a sentinel's master,
    /// the first call (and the first after the master's connection failed) asks the
    /// sentinels where it is; that lookup goes on in a task of its own, so a caller's timeout
    /// never cuts it half-way, and after a failed lookup calls fail at once for 200 ms.
    ///
    /// # Errors
    /// The sentinels could not name a usable master (e.g.
    /// `redis::ErrorKind::MasterNameNotFoundBySentinel`), or a connection could not be set up.
    /// A server or a cluster that is down fails the commands, not this call.
    pub async fn handle(&self) -> RedisResult<RedisHandle> {
        let handle = match &self.kind {
            Kind::Server { client, manager } => match manager.get() {
                Some(m) => Handle::Server(m.clone()),
                None => {
                    let made = ConnectionManager::new_lazy_with_config(
                        (**client).clone(),
                        manager_config(),
                    )?;
                    Handle::Server(manager.get_or_init(|| made).clone())
                }
            },
            Kind::Cluster { client, connection } => Handle::Cluster(
                connection
                    .get_or_init(|| {
                        let config = ClusterConfig::new()
                            .set_connection_timeout(CONNECT_TIMEOUT)
                            .set_response_timeout(CLUSTER_RESPONSE_TIMEOUT);
                        client.get_pending_async_connection_with_config(config)
                    })
                    .clone(),
            ),
            Kind::Sentinel(master) => Handle::Sentinel(master.handle().await?),
        };
        Ok(RedisHandle(handle))
    }
}

impl fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConnection")
            .field("at", &self.shown)
            .finish_non_exhaustive()
    }
}

/// How a single server's (or a sentinel-named master's) connection is kept: reconnected with
/// back-off, a few connects per reconnection (see [`RECONNECT_RETRIES`]) and one
/// reconnection after another while commands come; no response timeout of its own (each
/// caller has one).
fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(None)
        .set_min_delay(MIN_DELAY)
        .set_max_delay(MAX_DELAY)
        .set_number_of_retries(RECONNECT_RETRIES)
}

/// A setup the `redis` crate refused, without repeating the URL.
fn invalid(e: redis::RedisError) -> NetError {
    NetError::invalid_request(format!("not a usable redis store: {:?}", e.kind()))
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// === impl RedisHandle ===

impl ConnectionLike for RedisHandle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Handle::Server(m) => m.req_packed_command(cmd),
            Handle::Cluster(c) => c.req_packed_command(cmd),
            Handle::Sentinel(s) => s.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Handle::Server(m) => m.req_packed_commands(pipeline, offset, count),
            Handle::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Handle::Sentinel(s) => s.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Handle::Server(m) => m.get_db(),
            Handle::Cluster(c) => c.get_db(),
            Handle::Sentinel(s) => s.get_db(),
        }
    }
}

impl fmt::Debug for RedisHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.0 {
            Handle::Server(_) => "server",
            Handle::Cluster(_) => "cluster",
            Handle::Sentinel(_) => "sentinel",
        };
        f.debug_tuple("RedisHandle").field(&kind).finish()
    }
}
