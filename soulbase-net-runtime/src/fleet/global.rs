//! The client's side of a shared rate limit: leased tokens spent locally, the store's
//! timeout, and the fallback when the store is away.

use std::{sync::Arc, time::Duration};

use foldhash::{HashMap, HashMapExt};
use parking_lot::Mutex;
use soulbase_net_core::{NetEvent, Observer, RequestInfo};
use soulbase_net_policy::{GlobalLimit, GlobalScope, OnStoreError};
use tokio::time::Instant;

use super::{MemoryRateStore, RateStore, TakeRequest};

/// The most keys with a lease kept; past it the map starts afresh (leases are only a saving).
const MAX_LEASES: usize = 10_000;

/// After the store failed, how long calls skip it (straight to `on_store_error`) before one
/// asks it again: a store that is down costs one timeout per this interval, not one per call.
const STORE_BACKOFF: Duration = Duration::from_millis(250);

/// What this instance knows of a bucket: tokens taken from the store ahead of use, and
/// until when the store said none is free.
#[derive(Debug)]
struct Lease {
    tokens: u32,
    until: Instant,
    /// The store refused until then: calls are refused here without asking it again (it
    /// cannot have a token sooner; another instance may, which only means fewer admissions).
    empty_until: Option<Instant>,
}

/// Why a call was refused by the shared limit.
#[derive(Debug)]
pub(crate) struct Refused {
    /// When a token should be free again, when known.
    pub(crate) retry_after: Option<Duration>,
    /// Refused because the store was away and the policy denies then.
    pub(crate) store_down: bool,
}

/// Admits calls under `limits.global` through a [`RateStore`].
#[derive(Debug)]
pub(crate) struct GlobalLimiter {
    store: Arc<dyn RateStore>,
    leases: Mutex<HashMap<String, Lease>>,
    /// `on_store_error = "local"`: each instance's share, in memory.
    fallback: MemoryRateStore,
    /// Until when the store is skipped after a failure.
    skip_until: Mutex<Option<Instant>>,
}

impl GlobalLimiter {
    pub(crate) fn new(store: Arc<dyn RateStore>) -> Self {
        Self {
            store,
            leases: Mutex::new(HashMap::new()),
            fallback: MemoryRateStore::new(),
            skip_until: Mutex::new(None),
        }
    }

    /// The bucket a call counts against.
    pub(crate) fn key(g: &GlobalLimit, tenant: Option<&str>, host: &str) -> String {
        let tenant = tenant.unwrap_or("");
        match g.scope {
            GlobalScope::Host => format!("h:{host}"),
            GlobalScope::TenantHost => format!("th:{}:{tenant}|{host}", tenant.len()),
            _ => format!("t:{tenant}"),
        }
    }

    /// One token for a call, from a lease or the store; the store's failures handled as
    /// `on_store_error` says (and reported to `observer`).
    pub(crate) async fn admit(
        &self,
        g: &GlobalLimit,
        key: &str,
        observer: &dyn Observer,
        info: RequestInfo<'_>,
    ) -> Result<(), Refused> {
        let now = Instant::now();
        {
            let mut leases = self.leases.lock();
            if let Some(lease) = leases.get_mut(key) {
                if lease.tokens > 0 && lease.until > now {
                    lease.tokens -= 1;
                    return Ok(());
                }
                if let Some(empty_until) = lease.empty_until.filter(|t| now < *t) {
                    return Err(Refused {
                        retry_after: Some(empty_until - now),
                        store_down: false,
                    });
                }
            }
        }
        if self.skip_until.lock().is_some_and(|until| now < until) {
            observer.on_event(&NetEvent::StoreError {
                req: Some(info),
                store: "rate",
                op: "skip",
                timed_out: false,
            });
            return self.without_store(g, key, now);
        }
        // A lease is taken whole (never more than the bucket holds): a trickle of single
        // tokens would cost a store call each.
        let lease = g.lease.clamp(1, g.burst.max(1));
        let req = TakeRequest {
            key,
            rps: g.rps,
            burst: g.burst,
            want: lease,
            at_least: lease,
        };
        let answer = tokio::time::timeout(g.store_timeout, self.store.take(req)).await;
        if matches!(answer, Ok(Err(_)) | Err(_)) {
            *self.skip_until.lock() = Some(Instant::now() + STORE_BACKOFF);
        }
        match answer {
            Ok(Ok(taken)) if taken.granted > 0 => {
                if taken.granted > 1 {
                    self.add_lease(key, taken.granted - 1, g.lease_ttl);
                }
                Ok(())
            }
            Ok(Ok(taken)) => {
                if !taken.retry_after.is_zero() {
                    self.mark_empty(key, taken.retry_after);
                }
                Err(Refused {
                    retry_after: Some(taken.retry_after),
                    store_down: false,
                })
            }
            Ok(Err(_)) | Err(_) => {
                observer.on_event(&NetEvent::StoreError {
                    req: Some(info),
                    store: "rate",
                    op: "take",
                    timed_out: answer.is_err(),
                });
                self.without_store(g, key, now)
            }
        }
    }

    /// The entry of `key`, made when missing (the map starts afresh when full).
    fn with_entry<T>(&self, key: &str, f: impl FnOnce(&mut Lease, Instant) -> T) -> T {
        let now = Instant::now();
        let mut leases = self.leases.lock();
        if leases.len() >= MAX_LEASES && !leases.contains_key(key) {
            leases.clear();
        }
        let entry = leases.entry(key.to_owned()).or_insert(Lease {
            tokens: 0,
            until: now,
            empty_until: None,
        });
        f(entry, now)
    }

    /// Adds `tokens` taken from the store (valid for `ttl`) to what this instance holds:
    /// concurrent calls may each have taken a lease, and none may be lost.
    fn add_lease(&self, key: &str, tokens: u32, ttl: Duration) {
        self.with_entry(key, |lease, now| {
            let held = if lease.until > now { lease.tokens } else { 0 };
            lease.tokens = held.saturating_add(tokens);
            lease.until = now + ttl;
            lease.empty_until = None;
        });
    }

    /// Notes that the store has no token for `wait`, unless this instance still holds some
    /// (another call's lease arrived meanwhile).
    fn mark_empty(&self, key: &str, wait: Duration) {
        self.with_entry(key, |lease, now| {
            if lease.tokens == 0 || lease.until <= now {
                lease.empty_until = Some(now + wait);
            }
        });
    }

    /// What `on_store_error` gives a call while the store is away.
    fn without_store(&self, g: &GlobalLimit, key: &str, now: Instant) -> Result<(), Refused> {
        match g.on_store_error {
            OnStoreError::Allow => Ok(()),
            OnStoreError::Deny => Err(Refused {
                retry_after: None,
                store_down: true,
            }),
            _ => {
                let share = g.expected_instances.max(1);
                let taken = self.fallback.take_at(
                    TakeRequest {
                        key,
                        rps: (g.rps / share).max(1),
                        burst: (g.burst / share).max(1),
                        want: 1,
                        at_least: 1,
                    },
                    now,
                );
                if taken.granted > 0 {
                    Ok(())
                } else {
                    Err(Refused {
                        retry_after: Some(taken.retry_after),
                        store_down: false,
                    })
                }
            }
        }
    }
}
