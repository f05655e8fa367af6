//! [`RedisRateStore`]: GCRA buckets in Redis, one Lua script per take.

use std::{fmt, time::Duration};

use super::{RateStore, TakeFuture, TakeRequest, Taken};
use crate::{RedisConnection, RedisStore, StoreError};

/// The GCRA step, atomic in Redis: the same arithmetic as the in-memory store, in
/// microseconds, on the Redis server's clock (`TIME`), so instances' clocks never matter.
/// KEYS[1] the bucket; ARGV: the interval between tokens (µs), the tolerance
/// (interval × (burst − 1), µs), the tokens wanted, the fewest worth granting, the tokens
/// owed (spent on credit, paid first whatever the bucket holds). Returns {granted, wait µs
/// until the fewest would fit}.
const GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local at_least = tonumber(ARGV[4])
local owed = tonumber(ARGV[5])
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat < now then tat = now end
tat = tat + owed * interval
local fits = math.floor((tolerance + interval - (tat - now)) / interval)
if fits > want then fits = want end
if fits < at_least then
  local wait = (tat - now) + at_least * interval - tolerance - interval
  if wait < 0 then wait = 0 end
  if owed > 0 then
    redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.floor((tat - now) / 1000) + 1)
  end
  return {0, wait}
end
tat = tat + fits * interval
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.floor((tat - now) / 1000) + 1)
return {fits, 0}
";

/// The prefix of every bucket's key. A bucket is one key, so on a Redis Cluster each take is
/// one node's business (no cross-slot script).
const PREFIX: &str = "soulbase:gcra:";

/// Shared rate buckets in Redis (feature `redis`): each take is one `EVALSHA` of a GCRA
/// script, atomic and exact however many instances ask at once; keys expire when their
/// bucket is full again. The connection is made on first use and remade by itself after
/// Redis went away.
///
/// Redis is one server (`redis://[user:password@]host:port[/db]`, `rediss://…` for TLS,
/// `redis+unix:///path`), a Redis Cluster or the master sentinels name
/// ([`RedisStore::from_target`]); its URLs are never shown by `Debug` or in errors (only
/// hosts and ports are).
///
/// # Examples
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use soulbase_net_store::{
///     rate::{RateStore, RedisRateStore, TakeRequest},
///     RedisStore,
/// };
///
/// let store = RedisRateStore::new("redis://127.0.0.1:6379/")?;
/// let req = TakeRequest { key: "t:acme", rps: 200, burst: 10, want: 1, at_least: 1, owed: 0 };
/// let taken = store.take(req).await?;
/// // The runtime's client takes it as `Client::builder().rate_store(Arc::new(store))`.
/// # let _ = taken; Ok(()) }
/// ```
pub struct RedisRateStore {
    conn: RedisConnection,
    script: redis::Script,
}

impl RedisStore for RedisRateStore {
    fn from_connection(conn: RedisConnection) -> Self {
        Self {
            conn,
            script: redis::Script::new(GCRA),
        }
    }
}

impl RedisRateStore {
    /// A store error for `e`, naming where Redis is and what kind of failure it was.
    fn failed(&self, e: redis::RedisError) -> StoreError {
        StoreError::new(
            format!("redis at {}: {:?}", self.conn.shown(), e.kind()),
            Some(Box::new(e)),
        )
    }
}

impl fmt::Debug for RedisRateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateStore")
            .field("at", &self.conn.shown())
            .finish_non_exhaustive()
    }
}

impl RateStore for RedisRateStore {
    fn take<'a>(&'a self, req: TakeRequest<'a>) -> TakeFuture<'a> {
        Box::pin(async move {
            let mut con = self.conn.handle().await.map_err(|e| self.failed(e))?;
            let interval = 1_000_000u64.div_ceil(u64::from(req.rps.max(1)));
            let tolerance = interval * u64::from(req.burst.max(1) - 1);
            let (granted, wait_us): (i64, i64) = self
                .script
                .key(format!("{PREFIX}{}", req.key))
                .arg(interval)
                .arg(tolerance)
                .arg(req.want)
                .arg(req.at_least.clamp(1, req.want.max(1)))
                .arg(req.owed)
                .invoke_async(&mut con)
                .await
                .map_err(|e| self.failed(e))?;
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
