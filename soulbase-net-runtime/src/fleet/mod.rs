//! State shared by a fleet of instances: the client's side of a shared rate limit
//! (`limits.global`) — leases, the store's timeout, and what happens when the store is away —
//! over the rate stores of `soulbase-net-store`, re-exported here: the seam ([`RateStore`]),
//! [`MemoryRateStore`] (the default, exact for one process) and, with the `redis` feature,
//! `RedisRateStore` (built through `RedisStore`).

mod global;

pub(crate) use self::global::GlobalLimiter;
pub use soulbase_net_store::rate::{
    Counted, MemoryRateStore, RateStore, TakeFuture, TakeRequest, Taken,
};
pub use soulbase_net_store::StoreError;
#[cfg(feature = "redis")]
pub use soulbase_net_store::{rate::RedisRateStore, RedisStore};
