//! Shared and durable state for soulbase-net: where the state lives that outlasts one call or
//! is shared by a fleet of instances — one crate, so that the client's shared limits, the
//! interceptors' shared cache and dedup window, and the systems built on the workspace stand
//! on the same connection code and speak of the same things with the same words.
//!
//! - [`rate`]: **rate stores**, the buckets of shared rate limits (`limits.global`):
//!   [`RateStore`](rate::RateStore), [`MemoryRateStore`](rate::MemoryRateStore) (one process,
//!   the default) and `RedisRateStore` (a fleet; one atomic GCRA script per take, on Redis's
//!   clock).
//! - [`cache`]: **cache stores**, where an HTTP cache's entries live:
//!   [`CacheStore`](cache::CacheStore), [`CachedResponse`](cache::CachedResponse) (RFC 9111's
//!   freshness read from the headers), [`MemoryStore`](cache::MemoryStore) (moka, bounded)
//!   and `RedisCacheStore`.
//! - `dedup` (feature `redis`): the **dedup store**, the idempotency window a fleet shares —
//!   the first call with a key claims it with a marker, the others wait for its stored
//!   response.
//! - `RedisConnection` (feature `redis`): the connection to the Redis deployment a policy's
//!   `[store]` section names — one server, a Redis Cluster, or the master sentinels name —
//!   made on first use and healed by itself; `RedisStore` builds any of the Redis stores
//!   from a URL, a target or a connection.
//!
//! - `outbox` (feature `outbox`, PostgreSQL with `postgres`): the **outbox store**, where
//!   calls that must happen wait durably — `OutboxItem`, `OutboxStore`, `SqliteStore`,
//!   `PostgresStore` — under claims fenced by a token and timed by leases (the delivery
//!   engine is `soulbase-net-outbox`).
//!
//! - [`lease`]: the **lease discipline** every claim follows — fenced by a token, timed on
//!   the store's clock, short and extended by a [`Heartbeat`](lease::Heartbeat) while the
//!   work runs, never past the work's deadline.
//!
//! - `delay` (feature `outbox`, PostgreSQL with `postgres`): the **delay store**, where the
//!   delay server's tasks wait until they fire and are acknowledged — on the same engines,
//!   statements' clock and lease discipline as the outbox's items.
//!
//! - `sql` (feature `outbox`): the engines' shared pieces — the statements' clock and
//!   placeholders (`Dialect`), versioned migrations, a PostgreSQL pool — for stores kept in
//!   other crates on the same engines (the probe agent's control plane).
//!
//! Configuration stays in `soulbase-net-policy` (`StoreConfig`, `RedisTarget`): this crate
//! connects to what it names. The words used across the workspace for these things are in
//! the glossary of `docs/architecture.md`.
//!
//! # Features
//!
//! | feature | adds |
//! | --- | --- |
//! | `redis` | `RedisConnection`, `RedisStore`, `RedisRateStore`, `RedisDedupStore`, `RedisCacheStore` |
//! | `outbox` | the `outbox` module: items, `OutboxStore`, `SqliteStore` (sqlx, SQLite) |
//! | `postgres` | `outbox` and `PostgresStore` |

pub mod cache;
#[cfg(feature = "redis")]
pub mod dedup;
#[cfg(feature = "outbox")]
pub mod delay;
mod error;
pub mod lease;
#[cfg(feature = "outbox")]
pub mod outbox;
pub mod rate;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "outbox")]
pub mod sql;

pub use crate::error::StoreError;
#[cfg(feature = "redis")]
pub use crate::redis::{RedisConnection, RedisHandle, RedisStore};
