//! The client's budget of kept connections, across every origin of every pool (one pool per
//! connection policy): a cap on the connections the pools keep between requests, so that a
//! client meeting many hosts in turn does not hold one idle connection per host until the
//! process runs out of descriptors.
//!
//! What it counts: idle HTTP/1.1 connections and the shared HTTP/2 connections the pools keep
//! (busy or not). When a pool keeps one more and the count goes over the cap, the least
//! recently used idle ones (HTTP/1.1 idle the longest, HTTP/2 unused the longest and with no
//! request on it) are closed until the count is an eighth under the cap: one scan of the
//! pools' origins serves the next cap/8 connections kept, so the cost per request stays
//! constant however many origins there are. A busy HTTP/2 connection is never evicted.
//!
//! The default cap comes from the process's descriptor limit (`RLIMIT_NOFILE`'s soft
//! value): a quarter of it, so that the client's idle connections alone never take the
//! process to `EMFILE`.

use std::{
    any::Any,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Weak,
    },
};

use parking_lot::Mutex;
use tokio::time::Instant;

/// The kept-connection budget of one client, shared by its pools.
pub(crate) struct IdleBudget {
    max: usize,
    kept: AtomicUsize,
    /// The pools, whatever request body each sends (see [`Kept`]).
    pools: Mutex<Vec<Weak<dyn Kept>>>,
    /// Held by the one eviction running (others skip theirs: it serves them too).
    evicting: Mutex<()>,
}

/// A pool whose kept connections count in the budget: the budget holds pools of any
/// request body (the pool is generic over it) behind this trait.
pub(super) trait Kept: Send + Sync + 'static {
    /// Adds the pool's connections the budget may evict to `out`.
    fn idle_candidates(self: Arc<Self>, out: &mut Vec<Candidate>);

    /// Evicts the candidate's connection, if it is still idle: `origin` is the pool's own
    /// origin that [`idle_candidates`](Kept::idle_candidates) gave.
    fn evict(&self, origin: &(dyn Any + Send + Sync), h2: Option<u64>);
}

/// An idle connection that may be evicted.
pub(super) struct Candidate {
    /// Since when it has been idle (HTTP/1.1) or unused (HTTP/2).
    pub(super) since: Instant,
    pub(super) pool: Arc<dyn Kept>,
    /// The pool's origin (an `Origin` of the pool's body type).
    pub(super) origin: Arc<dyn Any + Send + Sync>,
    /// `None`: the origin's oldest idle HTTP/1.1 connection; `Some(serial)`: its HTTP/2 one.
    pub(super) h2: Option<u64>,
}

/// The cap when the descriptor limit cannot be read.
const FALLBACK_MAX: usize = 256;

impl IdleBudget {
    /// A budget of at most `max` kept connections.
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            kept: AtomicUsize::new(0),
            pools: Mutex::new(Vec::new()),
            evicting: Mutex::new(()),
        })
    }

    /// A quarter of the process's soft descriptor limit (at least 16), or 256 when it cannot
    /// be read.
    pub(crate) fn default_max() -> usize {
        descriptor_limit().map_or(FALLBACK_MAX, |n| (n / 4).clamp(16, 1 << 20))
    }

    /// Connections kept now, over all pools.
    pub(crate) fn kept(&self) -> usize {
        self.kept.load(Ordering::Relaxed)
    }

    /// Makes `pool` one of those whose connections count and may be evicted.
    pub(super) fn register(&self, pool: Weak<dyn Kept>) {
        let mut pools = self.pools.lock();
        pools.retain(|p| p.strong_count() > 0);
        pools.push(pool);
    }

    pub(super) fn add(&self, n: usize) {
        self.kept.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn sub(&self, n: usize) {
        // Never below zero, whatever the order of updates.
        let _ = self
            .kept
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |k| {
                Some(k.saturating_sub(n))
            });
    }

    /// Whether more connections are kept than the cap allows.
    pub(super) fn over(&self) -> bool {
        self.kept() > self.max
    }

    /// Closes the least recently used idle connections until an eighth under the cap (see
    /// the module's docs); does nothing when another eviction runs.
    pub(super) fn evict(&self) {
        let Some(_running) = self.evicting.try_lock() else {
            return;
        };
        let low = self.max - self.max / 8;
        let excess = self.kept().saturating_sub(low);
        if excess == 0 {
            return;
        }
        let pools: Vec<Arc<dyn Kept>> =
            self.pools.lock().iter().filter_map(Weak::upgrade).collect();
        let mut candidates = Vec::new();
        for pool in pools {
            pool.idle_candidates(&mut candidates);
        }
        // The oldest first; only as many as needed are sorted into place.
        let n = excess.min(candidates.len());
        if n == 0 {
            return;
        }
        if n < candidates.len() {
            candidates.select_nth_unstable_by_key(n - 1, |c| c.since);
            candidates.truncate(n);
        }
        for c in candidates {
            c.pool.evict(&*c.origin, c.h2);
        }
    }
}

impl std::fmt::Debug for IdleBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleBudget")
            .field("max", &self.max)
            .field("kept", &self.kept())
            .finish_non_exhaustive()
    }
}

/// The process's soft limit on open descriptors.
#[cfg(unix)]
fn descriptor_limit() -> Option<usize> {
    use nix::sys::resource::{getrlimit, Resource};
    let (soft, _hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    usize::try_from(soft).ok()
}

#[cfg(not(unix))]
fn descriptor_limit() -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_a_quarter_of_the_descriptor_limit() {
        let limit = descriptor_limit().expect("a unix test machine has a descriptor limit");
        assert_eq!(IdleBudget::default_max(), (limit / 4).clamp(16, 1 << 20));
    }

    #[test]
    fn the_count_never_goes_below_zero() {
        let budget = IdleBudget::new(2);
        budget.add(2);
        assert!(!budget.over());
        budget.add(1);
        assert!(budget.over());
        budget.sub(5);
        assert_eq!(budget.kept(), 0);
    }
}
