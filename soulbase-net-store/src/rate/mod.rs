//! Rate stores: where shared rate limits (`limits.global`) keep their buckets — the seam
//! ([`RateStore`]) and its implementations, [`MemoryRateStore`] (the default, exact for one
//! process) and, with the `redis` feature, `RedisRateStore`. The client's side of a shared
//! limit (leases, the store's timeout, what happens when the store is away) is the runtime's
//! `fleet` module.
//!
//! Why a store trait rather than Redis everywhere: one process needs nothing installed, and a
//! test double is one method. Why Redis for a fleet: a GCRA check is one atomic round trip
//! (one Lua script), exact however many instances ask at once — what Envoy's global rate limit
//! service and redis-cell do.

mod memory;
#[cfg(feature = "redis")]
mod redis;

use std::{fmt, future::Future, pin::Pin, time::Duration};

pub use self::memory::MemoryRateStore;
#[cfg(feature = "redis")]
pub use self::redis::RedisRateStore;
use crate::StoreError;

/// What a rate store is asked: between `at_least` and `want` tokens from the bucket `key`,
/// which admits `rps` per second with room for `burst` — or none, with the wait until
/// `at_least` would fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TakeRequest<'a> {
    /// The bucket (the limit's scope: tenant, host or both), e.g. `t:acme`.
    pub key: &'a str,
    /// Tokens per second.
    pub rps: u32,
    /// Tokens the bucket holds.
    pub burst: u32,
    /// Tokens wanted (1, or a lease); the store grants at most this.
    pub want: u32,
    /// Fewest tokens worth granting (1, or a whole lease): with fewer free, the store grants
    /// none and says when `at_least` would be.
    pub at_least: u32,
    /// Tokens already spent on credit while the store was away, paid first and whatever the
    /// bucket holds (it may go below empty): the store moves the bucket on by this many, then
    /// grants as usual.
    pub owed: u32,
}

/// A store's answer: tokens granted now, and when the next would be when none were.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// Tokens granted (0 ..= `want`).
    pub granted: u32,
    /// With nothing granted: how long until a token frees up.
    pub retry_after: Duration,
}

/// The future a [`RateStore`] returns.
pub type TakeFuture<'a> = Pin<Box<dyn Future<Output = Result<Taken, StoreError>> + Send + 'a>>;

/// Where shared rate limits (`limits.global`) keep their buckets: GCRA token buckets, one per
/// key, taken from atomically however many clients ask at once.
///
/// The client bounds every call with the policy's `store_timeout` and, when the store fails
/// or is too slow, does what `on_store_error` says; an implementation need not time out by
/// itself and must not retry for long.
///
/// # Examples
/// A store that grants everything (a test double is one method):
/// ```
/// use soulbase_net_store::rate::{RateStore, TakeFuture, TakeRequest, Taken};
///
/// #[derive(Debug)]
/// struct Open;
///
/// impl RateStore for Open {
///     fn take<'a>(&'a self, req: TakeRequest<'a>) -> TakeFuture<'a> {
///         Box::pin(async move {
///             Ok(Taken { granted: req.want, retry_after: std::time::Duration::ZERO })
///         })
///     }
/// }
/// ```
pub trait RateStore: Send + Sync + fmt::Debug {
    /// Takes up to `req.want` tokens from bucket `req.key`.
    fn take<'a>(&'a self, req: TakeRequest<'a>) -> TakeFuture<'a>;

    /// A name for events and metrics (`"memory"`, `"redis"`). Default is `"custom"`.
    fn name(&self) -> &'static str {
        "custom"
    }
}

/// A [`RateStore`] that counts the calls made to it (each one a round trip to a remote
/// store): what a bench or a dashboard divides by the requests to see what leases save.
///
/// ```
/// use std::sync::Arc;
/// use soulbase_net_store::rate::{Counted, MemoryRateStore};
///
/// let store = Arc::new(Counted::new(MemoryRateStore::new()));
/// assert_eq!(store.calls(), 0);
/// ```
#[derive(Debug)]
pub struct Counted<S> {
    inner: S,
    calls: std::sync::atomic::AtomicU64,
}

impl<S: RateStore> Counted<S> {
    /// Counts the calls to `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            calls: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl<S: RateStore> RateStore for Counted<S> {
    fn take<'a>(&'a self, req: TakeRequest<'a>) -> TakeFuture<'a> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.take(req)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}
