//! The retry budget (DESIGN §4, seed 001 §VIII): retries may add at most `retry_ratio` of the
//! requests seen over `window`, plus `min_retries_per_sec`, per host or per (host, tenant).
//!
//! Why a budget and not only `max_attempts`: with 3 attempts, a failing upstream sees three
//! times its normal load exactly when it can least take it. Finagle's `RetryBudget` and gRPC's
//! retry throttling cap retries as a share of recent traffic instead; this is the same rule
//! over a sliding window of ten buckets: a retry is allowed while
//! `retries_in_window + 1 ≤ retry_ratio × requests_in_window + min_retries_per_sec × window`.
//! Requests deposit once (not once per attempt); retries and hedges withdraw.

use std::time::Duration;

use parking_lot::Mutex;
use soulbase_net_policy::RetryBudget;
use tokio::time::Instant;

use super::keymap::{scoped_key, BoundedMap, Evictable};
use super::window::Buckets;

/// Retry budgets for many keys, bounded in number.
#[derive(Debug)]
pub(crate) struct RetryBudgets {
    map: Mutex<BoundedMap<Budget>>,
}

/// One key's budget: deposits (requests) and withdrawals (retries) in a sliding window.
#[derive(Debug)]
pub(crate) struct Budget {
    window: Buckets<Counts>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    deposits: u64,
    withdrawals: u64,
}

// === impl RetryBudgets ===

impl RetryBudgets {
    /// Budgets for at most `max_keys` keys; a key unused for `idle` is dropped (a budget idle
    /// longer than its window holds nothing anyway).
    pub(crate) fn new(max_keys: usize, idle: Duration) -> Self {
        Self {
            map: Mutex::new(BoundedMap::new(max_keys, idle)),
        }
    }

    /// Records a request for `key` (once per request, before its first attempt).
    pub(crate) fn deposit(&self, key: &str, cfg: &RetryBudget, now: Instant) {
        if !cfg.enabled {
            return;
        }
        let mut map = self.map.lock();
        if let Some(b) = map.get_or_insert(key, now, || Budget::new(cfg.window, now)) {
            b.deposit(cfg, now);
        }
    }

    /// Takes one retry (or hedge) from `key`'s budget; `false` when it is spent, and the
    /// caller then stops with the last outcome and a `RetryBudgetExhausted` event.
    ///
    /// Always `true` when the budget is off. (Budgets are always evictable, so the key map
    /// always has room; were it not, the retry would be refused.)
    pub(crate) fn try_withdraw(&self, key: &str, cfg: &RetryBudget, now: Instant) -> bool {
        if !cfg.enabled {
            return true;
        }
        let mut map = self.map.lock();
        match map.get_or_insert(key, now, || Budget::new(cfg.window, now)) {
            Some(b) => b.try_withdraw(cfg, now),
            None => false,
        }
    }

    /// How many keys are held.
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }
}

// === impl Budget ===

impl Budget {
    /// An empty budget over `window`, starting at `now`.
    pub(crate) fn new(window: Duration, now: Instant) -> Self {
        Self {
            window: Buckets::new(window, now),
        }
    }

    /// Records one request.
    pub(crate) fn deposit(&mut self, cfg: &RetryBudget, now: Instant) {
        self.window.reconfigure(cfg.window, now);
        self.window.current(now).deposits += 1;
    }

    /// Takes one retry if the window allows it.
    pub(crate) fn try_withdraw(&mut self, cfg: &RetryBudget, now: Instant) -> bool {
        self.window.reconfigure(cfg.window, now);
        let total = self.window.sum(now, |acc: &mut Counts, c| {
            acc.deposits += c.deposits;
            acc.withdrawals += c.withdrawals;
        });
        if (total.withdrawals + 1) as f64 > allowance(cfg, total.deposits) {
            return false;
        }
        self.window.current(now).withdrawals += 1;
        true
    }
}

/// The budget key of a call to `host` for `tenant`: per host, or per (host, tenant) when
/// `per_tenant`.
pub(crate) fn budget_key(cfg: &RetryBudget, host: &str, tenant: Option<&str>) -> String {
    scoped_key(host, tenant, cfg.per_tenant)
}

/// Retries allowed in a window that saw `deposits` requests.
fn allowance(cfg: &RetryBudget, deposits: u64) -> f64 {
    let ratio = if cfg.retry_ratio.is_nan() {
        0.0
    } else {
        cfg.retry_ratio.clamp(0.0, 1.0)
    };
    ratio * deposits as f64 + f64::from(cfg.min_retries_per_sec) * cfg.window.as_secs_f64()
}

impl Evictable for Budget {
    fn evictable(&self, _now: Instant, _idle: bool) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
