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
use soulbase_net_core::GaugeReading;
use soulbase_net_policy::RetryBudget;
use tokio::time::Instant;

use super::keymap::{scoped_key, BoundedMap, Evictable};
use super::window::{Buckets, Tally};

/// Retry budgets for many keys, bounded in number.
#[derive(Debug)]
pub(crate) struct RetryBudgets {
    map: Mutex<BoundedMap<Budget>>,
}

/// One key's budget: deposits (requests) and withdrawals (retries) in a sliding window.
#[derive(Debug)]
pub(crate) struct Budget {
    window: Buckets<Counts>,
    /// The rule of the last deposit or withdrawal (`retry_ratio`, clamped, and
    /// `min_retries_per_sec × window`), kept for the gauge, which has no policy at hand.
    ratio: f64,
    floor: f64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    deposits: u64,
    withdrawals: u64,
}

impl Tally for Counts {
    fn add(&mut self, other: &Self) {
        self.deposits = self.deposits.saturating_add(other.deposits);
        self.withdrawals = self.withdrawals.saturating_add(other.withdrawals);
    }
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
        map.visit(
            key,
            now,
            || Budget::new(cfg.window, now),
            |b| b.deposit(cfg, now),
        );
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
        map.visit(
            key,
            now,
            || Budget::new(cfg.window, now),
            |b| b.try_withdraw(cfg, now),
        )
        .unwrap_or(false)
    }

    /// Calls `visit` with the whole retries each key's budget allows at `now`.
    pub(crate) fn read_gauges(&self, now: Instant, visit: &mut dyn FnMut(GaugeReading<'_>)) {
        let map = self.map.lock();
        for (key, budget) in map.iter() {
            let (host, tenant) = match key.split_once('/') {
                Some((host, tenant)) => (host, Some(tenant)),
                None => (key, None),
            };
            visit(GaugeReading::RetryBudgetTokens {
                host,
                tenant,
                value: budget.tokens(now),
            });
        }
    }

    /// How many keys are held.
    #[cfg(test)]
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
            ratio: 0.0,
            floor: 0.0,
        }
    }

    /// Records one request.
    pub(crate) fn deposit(&mut self, cfg: &RetryBudget, now: Instant) {
        self.configure(cfg, now);
        let deposit = Counts {
            deposits: 1,
            withdrawals: 0,
        };
        self.window.add(now, deposit);
    }

    /// Takes one retry if the window allows it.
    pub(crate) fn try_withdraw(&mut self, cfg: &RetryBudget, now: Instant) -> bool {
        self.configure(cfg, now);
        let total = self.window.total(now);
        if self.allowance(total) < 1.0 {
            return false;
        }
        let withdrawal = Counts {
            deposits: 0,
            withdrawals: 1,
        };
        self.window.add(now, withdrawal);
        true
    }

    /// Whole retries the window allows at `now` (the gauge).
    pub(crate) fn tokens(&self, now: Instant) -> u64 {
        // Saturating float-to-int: negative and NaN become 0.
        self.allowance(self.window.sum(now)).floor() as u64
    }

    /// The allowance of the window's `total` less what was withdrawn: a retry needs at
    /// least 1.
    fn allowance(&self, total: Counts) -> f64 {
        self.ratio * total.deposits as f64 + self.floor - total.withdrawals as f64
    }

    fn configure(&mut self, cfg: &RetryBudget, now: Instant) {
        self.window.reconfigure(cfg.window, now);
        self.ratio = if cfg.retry_ratio.is_nan() {
            0.0
        } else {
            cfg.retry_ratio.clamp(0.0, 1.0)
        };
        self.floor = f64::from(cfg.min_retries_per_sec) * cfg.window.as_secs_f64();
    }
}

/// The budget key of a call to `host` for `tenant`: per host, or per (host, tenant) when
/// `per_tenant`.
pub(crate) fn budget_key<'a>(
    cfg: &RetryBudget,
    host: &'a str,
    tenant: Option<&str>,
) -> std::borrow::Cow<'a, str> {
    scoped_key(host, tenant, cfg.per_tenant)
}

impl Evictable for Budget {
    fn evictable(&self, _now: Instant, _idle: bool) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
