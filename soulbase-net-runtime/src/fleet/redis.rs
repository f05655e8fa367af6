//! [`RedisRateStore`]: GCRA buckets in Redis, one Lua script per take.

use std::{fmt, sync::OnceLock, time::Duration};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use soulbase_net_core::NetError;

use super::{RateStore, StoreError, TakeFuture, TakeRequest, Taken};

/// The GCRA step, atomic in Redis: the same arithmetic as the in-memory store, in
/// microseconds, on the Redis server's clock (`TIME`), so instances' clocks never matter.
/// KEYS[1] the bucket; ARGV: the interval between tokens (µs), the tolerance
/// (interval × (burst − 1), µs), the tokens wanted, the fewest worth granting. Returns
/// {granted, wait µs until the fewest would fit}.
const GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local at_least = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat < now then tat = now end
local fits = math.floor((tolerance + interval - (tat - now)) / interval)
if fits > want then fits = want end
if fits < at_least then
  local wait = (tat - now) + at_least * interval - tolerance - interval
  if wait < 0 then wait = 0 end
  return {0, wait}
end
tat = tat + fits * interval
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.floor((tat - now) / 1000) + 1)
return {fits, 0}
";

/// The prefix of every bucket's key.
const PREFIX: &str = "soulbase:gcra:";

/// Shared rate buckets in Redis (feature `redis`): each take is one `EVALSHA` of a GCRA
/// script, atomic and exact however many instances ask at once; keys expire when their
/// bucket is full again. The connection is made on first use and remade by itself after
/// Redis went away (`redis`' connection manager).
///
/// The URL is `redis://[user:password@]host:port[/db]` or `redis+unix:///path`; it is never
/// shown by `Debug` or in errors (only its host part is).
///
/// # Examples
/// ```no_run
/// # fn main() -> Result<(), soulbase_net_core::NetError> {
/// use std::sync::Arc;
/// use soulbase_net_runtime::{fleet::RedisRateStore, Client};
///
/// let store = RedisRateStore::new("redis://127.0.0.1:6379/")?;
/// let client = Client::builder().rate_store(Arc::new(store)).build()?;
/// # let _ = client; Ok(()) }
/// ```
pub struct RedisRateStore {
    client: redis::Client,
    /// Made on first use, inside a runtime.
    manager: OnceLock<ConnectionManager>,
    script: redis::Script,
    /// Where it points, for `Debug` and errors: host and port only.
    shown: String,
}

impl RedisRateStore {
    /// A store on the Redis at `url`; nothing is connected yet. A `rediss://` URL is TLS to
    /// Redis, verified against the system's trust roots (rustls, ring).
    ///
    /// # Errors
    /// `InvalidRequest` when `url` is not a Redis URL (the message never repeats the URL's
    /// credentials).
    pub fn new(url: &str) -> Result<Self, NetError> {
        let client = redis::Client::open(url).map_err(|e| {
            NetError::invalid_request(format!("not a valid redis url: {:?}", e.kind()))
        })?;
        Ok(Self::with_client(client))
    }

    /// A store on the Redis at the `rediss://` `url`, trusting the CA certificates of
    /// `root_pem` (PEM) instead of the system's.
    ///
    /// # Errors
    /// `InvalidRequest` when `url` is not a Redis URL or `root_pem` holds no certificate.
    pub fn with_root_pem(url: &str, root_pem: &[u8]) -> Result<Self, NetError> {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_pem.to_vec()),
        };
        let client = redis::Client::build_with_tls(url, certs).map_err(|e| {
            NetError::invalid_request(format!("not a valid redis TLS setup: {:?}", e.kind()))
        })?;
        Ok(Self::with_client(client))
    }

    fn with_client(client: redis::Client) -> Self {
        let shown = format!("{}", client.get_connection_info().addr());
        Self {
            client,
            manager: OnceLock::new(),
            script: redis::Script::new(GCRA),
            shown,
        }
    }

    fn manager(&self) -> Result<ConnectionManager, StoreError> {
        if let Some(m) = self.manager.get() {
            return Ok(m.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(None)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(500))
            .set_number_of_retries(usize::MAX);
        let made =
            ConnectionManager::new_lazy_with_config(self.client.clone(), config).map_err(|e| {
                StoreError::new(format!("redis at {}: {:?}", self.shown, e.kind()), None)
            })?;
        Ok(self.manager.get_or_init(|| made).clone())
    }
}

impl fmt::Debug for RedisRateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateStore")
            .field("at", &self.shown)
            .finish_non_exhaustive()
    }
}

impl RateStore for RedisRateStore {
    fn take<'a>(&'a self, req: TakeRequest<'a>) -> TakeFuture<'a> {
        Box::pin(async move {
            let mut con = self.manager()?;
            let interval = 1_000_000u64.div_ceil(u64::from(req.rps.max(1)));
            let tolerance = interval * u64::from(req.burst.max(1) - 1);
            let (granted, wait_us): (i64, i64) = self
                .script
                .key(format!("{PREFIX}{}", req.key))
                .arg(interval)
                .arg(tolerance)
                .arg(req.want)
                .arg(req.at_least.clamp(1, req.want.max(1)))
                .invoke_async(&mut con)
                .await
                .map_err(|e| {
                    StoreError::new(
                        format!("redis at {}: {:?}", self.shown, e.kind()),
                        Some(Box::new(e)),
                    )
                })?;
            Ok(Taken {
                granted: u32::try_from(granted.max(0)).unwrap_or(0),
                retry_after: Duration::from_micros(u64::try_from(wait_us.max(0)).unwrap_or(0)),
            })
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}
