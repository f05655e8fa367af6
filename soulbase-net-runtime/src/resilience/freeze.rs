//! Endpoint freezing (seed 004 DomainsManager, DESIGN §4 step 5): a base URL — or an IP
//! address — that failed is skipped for a while; when every candidate is frozen, the one that
//! thaws first is tried.

use foldhash::{HashMap, HashMapExt};
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Frozen endpoints (base URLs as `String`, or `IpAddr`s) and when each thaws.
///
/// Holds at most `max` frozen entries: thawed ones are dropped first, then those that thaw
/// soonest, so a flood of failing addresses cannot exhaust memory.
#[derive(Debug)]
pub(crate) struct Freezer<K> {
    frozen: Mutex<HashMap<K, Instant>>,
    max: usize,
}

impl<K: Eq + Hash + Clone> Freezer<K> {
    /// Room for `max` frozen entries (at least 1).
    pub(crate) fn new(max: usize) -> Self {
        Self {
            frozen: Mutex::new(HashMap::new()),
            max: max.max(1),
        }
    }

    /// Freezes `key` for `duration` from `now` (the policy's `frozen_duration`). Freezing a
    /// frozen key again keeps the later thaw time.
    pub(crate) fn freeze(&self, key: &K, duration: Duration, now: Instant) {
        let Some(until) = now.checked_add(duration) else {
            return;
        };
        let mut frozen = self.frozen.lock();
        if !frozen.contains_key(key) && frozen.len() >= self.max {
            frozen.retain(|_, t| *t > now);
            if frozen.len() >= self.max {
                let soonest = frozen
                    .iter()
                    .min_by_key(|(_, t)| **t)
                    .map(|(k, _)| k.clone());
                if let Some(k) = soonest {
                    frozen.remove(&k);
                }
            }
        }
        let t = frozen.entry(key.clone()).or_insert(until);
        *t = (*t).max(until);
    }

    /// Thaws `key` at once. Returns whether it was frozen.
    pub(crate) fn unfreeze(&self, key: &K) -> bool {
        self.frozen.lock().remove(key).is_some()
    }

    /// The entries still frozen at `now`, with when each thaws.
    pub(crate) fn entries(&self, now: Instant) -> Vec<(K, Instant)> {
        let mut frozen = self.frozen.lock();
        frozen.retain(|_, t| *t > now);
        frozen.iter().map(|(k, t)| (k.clone(), *t)).collect()
    }

    /// Whether `key` is frozen at `now`; a thawed entry is dropped.
    #[cfg(test)]
    pub(crate) fn is_frozen(&self, key: &K, now: Instant) -> bool {
        let mut frozen = self.frozen.lock();
        match frozen.get(key) {
            Some(until) if now < *until => true,
            Some(_) => {
                frozen.remove(key);
                false
            }
            None => false,
        }
    }

    /// The candidates to try at `now`, in their given order: the unfrozen ones, or — when all
    /// are frozen — only the one that thaws first. Empty only for no candidates.
    pub(crate) fn choose(&self, candidates: &[K], now: Instant) -> Vec<K> {
        let mut frozen = self.frozen.lock();
        frozen.retain(|_, t| *t > now);
        let open: Vec<K> = candidates
            .iter()
            .filter(|k| !frozen.contains_key(*k))
            .cloned()
            .collect();
        if !open.is_empty() {
            return open;
        }
        candidates
            .iter()
            .min_by_key(|k| frozen.get(*k).copied())
            .cloned()
            .into_iter()
            .collect()
    }

    /// How many entries are frozen or not yet dropped.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.frozen.lock().len()
    }
}

#[cfg(test)]
mod tests;
