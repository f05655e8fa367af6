//! The master the sentinels name: looked up when first needed and again after its connection
//! failed (a failover moves it), each lookup in a task of its own so that a caller's short
//! timeout never cuts one half-way.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};
use std::time::Duration;

use parking_lot::Mutex;
use redis::{
    aio::{ConnectionLike, ConnectionManager},
    sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType},
    Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, TlsCertificates, TlsMode, Value,
};
use soulbase_net_core::NetError;
use tokio::time::Instant;

use super::{invalid, manager_config};
use soulbase_net_policy::RedisSentinel;

/// After a failed lookup, how long calls fail at once with its error before one asks the
/// sentinels again: sentinels that are down cost one lookup per this interval, not one per
/// call.
const LOOKUP_BACKOFF: Duration = Duration::from_millis(200);

/// The master as last looked up.
pub(super) struct SentinelMaster {
    /// Asks the sentinels; one lookup at a time.
    client: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<Current>>,
    /// When the last lookup failed, and why.
    failed: Mutex<Option<(Instant, RedisError)>>,
    generations: AtomicU64,
}

/// The connection to the master found by one lookup.
#[derive(Clone)]
struct Current {
    /// Which lookup found it: a failure forgets this one only, never a newer one.
    generation: u64,
    manager: ConnectionManager,
}

/// A connection to the master, which reports its failures back.
#[derive(Clone)]
pub(super) struct MasterHandle {
    current: Current,
    master: Arc<SentinelMaster>,
}

// === impl SentinelMaster ===

impl SentinelMaster {
    /// The master `s` names; nothing is asked yet. The sentinels are reached with the
    /// credentials of their URLs, the master with `s`'s, both with TLS when the sentinels are.
    pub(super) fn new(s: &RedisSentinel, certs: Option<TlsCertificates>) -> Result<Self, NetError> {
        let infos = s
            .nodes()
            .iter()
            .map(|n| n.as_str().into_connection_info())
            .collect::<RedisResult<Vec<_>>>()
            .map_err(invalid)?;
        let first = infos
            .first()
            .ok_or_else(|| NetError::invalid_request("a sentinel setup needs at least one node"))?;
        let tls = matches!(first.addr(), ConnectionAddr::TcpTls { .. });
        let sentinels = infos.iter().map(|i| i.addr().clone());
        let mut builder =
            SentinelClientBuilder::new(sentinels, s.master_name(), SentinelServerType::Master)
                .map_err(invalid)?
                .set_client_to_redis_db(s.master_db());
        let to_sentinel = first.redis_settings();
        if let Some(user) = to_sentinel.username() {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = to_sentinel.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(user) = s.master_username() {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = s.master_password() {
            builder = builder.set_client_to_redis_password(password);
        }
        if tls {
            builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
            if let Some(certs) = certs {
                builder = builder
                    .set_client_to_sentinel_certificates(certs.clone())
                    .set_client_to_redis_certificates(certs);
            }
        }
        Ok(Self {
            client: tokio::sync::Mutex::new(builder.build().map_err(invalid)?),
            current: Mutex::new(None),
            failed: Mutex::new(None),
            generations: AtomicU64::new(0),
        })
    }

    /// A connection to the master, looked up first when there is none.
    pub(super) async fn handle(self: &Arc<Self>) -> RedisResult<MasterHandle> {
        let cached = self.current.lock().clone();
        let current = match cached {
            Some(current) => current,
            None => {
                let this = Arc::clone(self);
                tokio::spawn(async move { this.look_up().await })
                    .await
                    .map_err(|_| {
                        RedisError::from((ErrorKind::Client, "the sentinel lookup did not finish"))
                    })??
            }
        };
        Ok(MasterHandle {
            current,
            master: Arc::clone(self),
        })
    }

    /// Asks the sentinels where the master is, unless another lookup just found it or just
    /// failed.
    async fn look_up(&self) -> RedisResult<Current> {
        let mut client = self.client.lock().await;
        if let Some(current) = self.current.lock().clone() {
            return Ok(current);
        }
        if let Some((at, e)) = &*self.failed.lock() {
            if at.elapsed() < LOOKUP_BACKOFF {
                return Err(e.clone());
            }
        }
        let found = match client.async_get_client().await {
            Ok(master) => ConnectionManager::new_lazy_with_config(master, manager_config()),
            Err(e) => Err(e),
        };
        match found {
            Ok(manager) => {
                let current = Current {
                    generation: self.generations.fetch_add(1, Ordering::Relaxed) + 1,
                    manager,
                };
                *self.current.lock() = Some(current.clone());
                *self.failed.lock() = None;
                Ok(current)
            }
            Err(e) => {
                *self.failed.lock() = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    /// Forgets the master of `generation`: the next call looks it up again.
    fn forget(&self, generation: u64) {
        let mut current = self.current.lock();
        if current.as_ref().is_some_and(|c| c.generation == generation) {
            *current = None;
        }
    }
}

// === impl MasterHandle ===

impl MasterHandle {
    /// After a failure that says the master is gone or no longer the master (a failover made
    /// it a read-only replica), forgets it, so the next call asks the sentinels again.
    fn note<T>(&self, result: &RedisResult<T>) {
        if let Err(e) = result {
            let moved = e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
            if moved {
                self.master.forget(self.current.generation);
            }
        }
    }
}

impl ConnectionLike for MasterHandle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.current.manager.req_packed_command(cmd).await;
            self.note(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self
                .current
                .manager
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.note(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.current.manager.get_db()
    }
}
