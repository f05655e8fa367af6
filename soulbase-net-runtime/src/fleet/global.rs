//! The client's side of a shared rate limit: leased tokens spent locally, the store's
//! timeout, and what a call gets while the store is away.
//!
//! **The bound.** Fleet-wide, at most `rps × T + burst + instances × lease` calls are admitted
//! in any span `T`, whatever the store's latency and however many instances share it. Every
//! admission is a token the store granted, except `local`'s calls on credit (at most `lease`
//! owed per key and instance, paid with the next take) and `allow`'s, which trade the bound
//! for availability (at most the instance's share per second, see below). What keeps the
//! bound when the store is slow:
//!
//! - A take is never abandoned. It runs in a task of its own; a call waits for it up to
//!   `store_timeout`, and when the answer comes later, the tokens it granted go to the
//!   instance's lease instead of being lost — a timed-out take's fate is always known.
//! - A call on credit (`local`) is paid for: the next take of its key asks the store for what
//!   is owed first, unconditionally (the store moves its bucket on by that many tokens), then
//!   for a lease. So credit is a share of the quota the fleet cannot also spend.
//!
//! **When the store is skipped.** On evidence, never on one slow answer: a key's calls skip
//! the store when, over the last one to two seconds, at least [`MIN_FAILURES`] of its takes
//! failed or timed out and they were at least half of them. Then one call per
//! [`STORE_BACKOFF`] asks again (a down store costs one timeout per key and back-off, not one
//! per call), and an answer ends the skip. Kept per key: on a Redis Cluster a stalled node
//! costs only the buckets it owns, on Sentinel only while the master is away.

use std::{sync::Arc, time::Duration};

use foldhash::{HashMap, HashMapExt};
use parking_lot::Mutex;
use soulbase_net_core::{NetEvent, Observer, RequestInfo};
use soulbase_net_policy::{GlobalLimit, GlobalScope, OnStoreError};
use tokio::{sync::oneshot, time::Instant};

use super::{MemoryRateStore, RateStore, StoreError, TakeRequest, Taken};

/// The most keys with a lease kept; past it the map starts afresh (leases are only a saving;
/// credit owed is then forgotten, at most `lease` per key).
const MAX_LEASES: usize = 10_000;

/// While a key skips the store, how long before one call asks it again.
const STORE_BACKOFF: Duration = Duration::from_millis(250);

/// The fewest failed takes (over [`WINDOW`] to twice it) that make a key skip the store.
const MIN_FAILURES: u32 = 3;

/// The span over which takes are counted for the skip rule (this one and the one before).
const WINDOW: Duration = Duration::from_secs(1);

/// What this instance knows of a bucket.
#[derive(Debug)]
struct Lease {
    /// Tokens taken from the store ahead of use, usable until `until`.
    tokens: u32,
    until: Instant,
    /// The store refused until then: calls are refused here without asking it again (it
    /// cannot have a token sooner; another instance may, which only means fewer admissions).
    empty_until: Option<Instant>,
    /// Calls admitted on credit (`local`) not yet paid for.
    owed: u32,
    /// Credit being paid by a take in flight (back to `owed` if that take fails).
    paying: u32,
    health: Health,
}

/// The skip rule's counts for one key.
#[derive(Debug)]
struct Health {
    since: Instant,
    takes: u32,
    failures: u32,
    /// The window before this one.
    before: (u32, u32),
    /// Skipping the store until then.
    skip_until: Option<Instant>,
}

impl Health {
    fn new(now: Instant) -> Self {
        Self {
            since: now,
            takes: 0,
            failures: 0,
            before: (0, 0),
            skip_until: None,
        }
    }

    /// Moves the window on to `now`.
    fn roll(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.since);
        if age >= WINDOW {
            self.before = if age >= WINDOW * 2 {
                (0, 0)
            } else {
                (self.takes, self.failures)
            };
            self.takes = 0;
            self.failures = 0;
            self.since = now;
        }
    }

    /// Counts one take's outcome; a failure may start a skip, an answer ends one.
    fn record(&mut self, failed: bool, now: Instant) {
        self.roll(now);
        self.takes += 1;
        if !failed {
            self.skip_until = None;
            return;
        }
        self.failures += 1;
        let (takes, failures) = (self.takes + self.before.0, self.failures + self.before.1);
        if failures >= MIN_FAILURES && failures * 2 >= takes {
            self.skip_until = Some(now + STORE_BACKOFF);
        }
    }

    /// Whether a call now skips the store. When the back-off is over, this call asks (the
    /// next ones skip until it answers or fails).
    fn skips(&mut self, now: Instant) -> bool {
        match self.skip_until {
            Some(until) if now < until => true,
            Some(_) => {
                self.skip_until = Some(now + STORE_BACKOFF);
                false
            }
            None => false,
        }
    }
}

/// Why a call was refused by the shared limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    /// The store has no token for it.
    Spent,
    /// The store is away and the policy denies then.
    StoreDown,
    /// The store is away and this instance's credit for the key is used up (`local`).
    CreditSpent,
    /// The store is away and this instance's share is spent (`allow`).
    ShareSpent,
}

/// A call refused by the shared limit.
#[derive(Debug)]
pub(crate) struct Refused {
    /// When a token should be free again, when known.
    pub(crate) retry_after: Option<Duration>,
    pub(crate) why: Why,
}

impl Refused {
    /// What the error says, before the bucket's key.
    pub(crate) fn message(&self) -> &'static str {
        match self.why {
            Why::Spent => "the shared rate (limits.global) is spent",
            Why::StoreDown => {
                "the rate store is unavailable and limits.global.on_store_error is deny"
            }
            Why::CreditSpent => {
                "the rate store is unavailable and this instance's credit \
                 (limits.global.lease calls, on_store_error = local) is spent"
            }
            Why::ShareSpent => {
                "the rate store is unavailable and this instance's share \
                 (rps / expected_instances, on_store_error = allow) is spent"
            }
        }
    }
}

/// The leases of every key, shared with the takes in flight.
type Leases = Arc<Mutex<HashMap<String, Lease>>>;

/// Admits calls under `limits.global` through a [`RateStore`].
#[derive(Debug)]
pub(crate) struct GlobalLimiter {
    store: Arc<dyn RateStore>,
    leases: Leases,
    /// `on_store_error = "allow"`: each instance's share, in memory.
    share: MemoryRateStore,
}

impl GlobalLimiter {
    pub(crate) fn new(store: Arc<dyn RateStore>) -> Self {
        Self {
            store,
            leases: Arc::new(Mutex::new(HashMap::new())),
            share: MemoryRateStore::new(),
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
        // A lease is taken whole (never more than the bucket holds): a trickle of single
        // tokens would cost a store call each.
        let lease = g.lease.clamp(1, g.burst.max(1));
        let now = Instant::now();
        let owed = {
            let mut leases = self.leases.lock();
            let entry = entry(&mut leases, key, now);
            if entry.tokens > 0 && entry.until > now {
                entry.tokens -= 1;
                return Ok(());
            }
            if let Some(empty_until) = entry.empty_until.filter(|t| now < *t) {
                return Err(Refused {
                    retry_after: Some(empty_until - now),
                    why: Why::Spent,
                });
            }
            if entry.health.skips(now) {
                drop(leases);
                observer.on_event(&NetEvent::StoreError {
                    req: Some(info),
                    store: "rate",
                    op: "skip",
                    timed_out: false,
                });
                return self.without_store(g, key, lease, now);
            }
            let owed = std::mem::take(&mut entry.owed);
            entry.paying += owed;
            owed
        };
        let req = Take {
            key: key.to_owned(),
            rps: g.rps,
            burst: g.burst,
            lease,
            owed,
            ttl: g.lease_ttl,
        };
        let (tx, rx) = oneshot::channel();
        tokio::spawn(req.run(self.store.clone(), self.leases.clone(), tx));
        let answer = match tokio::time::timeout(g.store_timeout, rx).await {
            Ok(Ok(answer)) => answer,
            // The task ended without an answer: only when the runtime shuts down.
            Ok(Err(_)) => Err(true),
            Err(_) => {
                let mut leases = self.leases.lock();
                entry(&mut leases, key, Instant::now())
                    .health
                    .record(true, Instant::now());
                Err(true)
            }
        };
        match answer {
            Ok(taken) if taken.granted > 0 => Ok(()),
            Ok(taken) => Err(Refused {
                retry_after: Some(taken.retry_after),
                why: Why::Spent,
            }),
            Err(timed_out) => {
                observer.on_event(&NetEvent::StoreError {
                    req: Some(info),
                    store: "rate",
                    op: "take",
                    timed_out,
                });
                self.without_store(g, key, lease, now)
            }
        }
    }

    /// What `on_store_error` gives a call while the store is away.
    fn without_store(
        &self,
        g: &GlobalLimit,
        key: &str,
        lease: u32,
        now: Instant,
    ) -> Result<(), Refused> {
        match g.on_store_error {
            OnStoreError::Deny => Err(Refused {
                retry_after: None,
                why: Why::StoreDown,
            }),
            OnStoreError::Allow => {
                let share = g.expected_instances.max(1);
                let taken = self.share.take_at(
                    TakeRequest {
                        key,
                        rps: (g.rps / share).max(1),
                        burst: (g.burst / share).max(1),
                        want: 1,
                        at_least: 1,
                        owed: 0,
                    },
                    now,
                );
                if taken.granted > 0 {
                    Ok(())
                } else {
                    Err(Refused {
                        retry_after: Some(taken.retry_after),
                        why: Why::ShareSpent,
                    })
                }
            }
            _ => {
                let mut leases = self.leases.lock();
                let entry = entry(&mut leases, key, now);
                if entry.owed + entry.paying < lease {
                    entry.owed += 1;
                    Ok(())
                } else {
                    Err(Refused {
                        retry_after: None,
                        why: Why::CreditSpent,
                    })
                }
            }
        }
    }
}

/// The entry of `key`, made when missing (the map starts afresh when full).
fn entry<'m>(leases: &'m mut HashMap<String, Lease>, key: &str, now: Instant) -> &'m mut Lease {
    if leases.len() >= MAX_LEASES && !leases.contains_key(key) {
        leases.clear();
    }
    leases.entry(key.to_owned()).or_insert_with(|| Lease {
        tokens: 0,
        until: now,
        empty_until: None,
        owed: 0,
        paying: 0,
        health: Health::new(now),
    })
}

/// One take from the store, run in a task of its own so that a late answer is never lost.
struct Take {
    key: String,
    rps: u32,
    burst: u32,
    lease: u32,
    owed: u32,
    ttl: Duration,
}

impl Take {
    /// Asks the store and books the answer: the tokens granted go to the lease (but one, for
    /// the call still waiting on `tx`, if it is), the credit paid is cleared — or, when the
    /// take failed, owed again.
    async fn run(
        self,
        store: Arc<dyn RateStore>,
        leases: Leases,
        tx: oneshot::Sender<Result<Taken, bool>>,
    ) {
        let answer: Result<Taken, StoreError> = store
            .take(TakeRequest {
                key: &self.key,
                rps: self.rps,
                burst: self.burst,
                want: self.lease,
                at_least: self.lease,
                owed: self.owed,
            })
            .await;
        let now = Instant::now();
        // Whether the waiting call takes one of the tokens: decided under the lock, so that
        // a token is either the call's or the lease's, never both nor neither.
        let mut leases = leases.lock();
        let entry = entry(&mut leases, &self.key, now);
        entry.paying = entry.paying.saturating_sub(self.owed);
        entry.health.record(answer.is_err(), now);
        let Ok(taken) = answer else {
            entry.owed += self.owed;
            drop(leases);
            let _ = tx.send(Err(false));
            return;
        };
        if taken.granted == 0 {
            if !taken.retry_after.is_zero() && (entry.tokens == 0 || entry.until <= now) {
                entry.empty_until = Some(now + taken.retry_after);
            }
            drop(leases);
            let _ = tx.send(Ok(taken));
            return;
        }
        // The call takes one if it still waits; the rest (all, if it gave up) are leased.
        let for_call = tx.send(Ok(taken)).is_ok();
        let spare = taken.granted - u32::from(for_call);
        if spare > 0 {
            let held = if entry.until > now { entry.tokens } else { 0 };
            entry.tokens = held.saturating_add(spare);
            entry.until = now + self.ttl;
            entry.empty_until = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use soulbase_net_core::NoopObserver;
    use tokio::sync::Semaphore;

    use super::*;
    use crate::fleet::TakeFuture;

    /// A store that answers each take only once the test lets it (one permit per answer),
    /// from a memory bucket, noting what each take owed; or fails while `failing`.
    #[derive(Debug)]
    struct Gated {
        inner: MemoryRateStore,
        gate: Semaphore,
        owed: Mutex<Vec<u32>>,
        failing: std::sync::atomic::AtomicBool,
        takes: AtomicU32,
    }

    impl Gated {
        fn new() -> Arc<Self> {
            Arc::new(Self {
                inner: MemoryRateStore::new(),
                gate: Semaphore::new(0),
                owed: Mutex::new(Vec::new()),
                failing: false.into(),
                takes: AtomicU32::new(0),
            })
        }
    }

    impl RateStore for Gated {
        fn take<'a>(&'a self, req: TakeRequest<'a>) -> TakeFuture<'a> {
            Box::pin(async move {
                self.takes.fetch_add(1, Ordering::SeqCst);
                if self.failing.load(Ordering::SeqCst) {
                    return Err(StoreError::new("down", None));
                }
                self.gate.acquire().await.expect("open").forget();
                self.owed.lock().push(req.owed);
                self.inner.take(req).await
            })
        }
    }

    fn limit(mode: OnStoreError) -> GlobalLimit {
        let mut g = GlobalLimit::default();
        g.rps = 100;
        g.burst = 100;
        g.lease = 10;
        g.store_timeout = Duration::from_millis(5);
        g.on_store_error = mode;
        g
    }

    fn info() -> RequestInfo<'static> {
        RequestInfo {
            id: 1,
            method: &http::Method::GET,
            scheme: "http",
            host: "h",
            tenant: None,
            url: "http://h/",
        }
    }

    async fn admit(l: &GlobalLimiter, g: &GlobalLimit) -> Result<(), Why> {
        l.admit(g, "t:a", &NoopObserver, info())
            .await
            .map_err(|r| r.why)
    }

    fn held(l: &GlobalLimiter) -> u32 {
        l.leases.lock().get("t:a").map_or(0, |e| e.tokens)
    }

    #[tokio::test]
    async fn a_late_answer_is_leased_and_credit_is_paid_with_the_next_take() {
        let store = Gated::new();
        let l = GlobalLimiter::new(store.clone());
        let g = limit(OnStoreError::Local);
        // The store is late: the call goes on credit (one of `lease`).
        assert_eq!(admit(&l, &g).await, Ok(()));
        assert_eq!(held(&l), 0);
        // The answer comes: the whole lease is kept (the call no longer waits for it).
        store.gate.add_permits(1);
        for _ in 0..1000 {
            if held(&l) == 10 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(held(&l), 10, "the late lease was kept");
        for _ in 0..10 {
            assert_eq!(admit(&l, &g).await, Ok(()));
        }
        assert_eq!(
            store.takes.load(Ordering::SeqCst),
            1,
            "spent from the lease"
        );
        // The next take pays the call made on credit first.
        store.gate.add_permits(1);
        assert_eq!(admit(&l, &g).await, Ok(()));
        assert_eq!(*store.owed.lock(), vec![0, 1]);
    }

    #[tokio::test]
    async fn credit_is_one_lease_and_then_calls_are_refused() {
        let store = Gated::new();
        store.failing.store(true, Ordering::SeqCst);
        let l = GlobalLimiter::new(store.clone());
        let g = limit(OnStoreError::Local);
        let mut admitted = 0;
        for _ in 0..30 {
            match admit(&l, &g).await {
                Ok(()) => admitted += 1,
                Err(why) => assert_eq!(why, Why::CreditSpent),
            }
        }
        assert_eq!(admitted, 10, "one lease of credit");
        // Deny refuses at once; allow admits the instance's share.
        let deny = limit(OnStoreError::Deny);
        assert_eq!(admit(&l, &deny).await, Err(Why::StoreDown));
        let mut allow = limit(OnStoreError::Allow);
        allow.expected_instances = 10; // a share of 10 per second, burst 10
        let shared = GlobalLimiter::new(store.clone());
        let ok = futures_count(&shared, &allow, 30).await;
        assert_eq!(ok, 10);
    }

    async fn futures_count(l: &GlobalLimiter, g: &GlobalLimit, n: usize) -> usize {
        let mut ok = 0;
        for _ in 0..n {
            ok += usize::from(admit(l, g).await.is_ok());
        }
        ok
    }

    #[tokio::test]
    async fn one_failure_is_not_evidence_three_are_and_an_answer_ends_the_skip() {
        let store = Gated::new();
        store.failing.store(true, Ordering::SeqCst);
        let l = GlobalLimiter::new(store.clone());
        let g = limit(OnStoreError::Deny);
        let takes = || store.takes.load(Ordering::SeqCst);
        assert_eq!(admit(&l, &g).await, Err(Why::StoreDown));
        assert_eq!(admit(&l, &g).await, Err(Why::StoreDown));
        assert_eq!(takes(), 2, "two failures: the store is still asked");
        assert_eq!(admit(&l, &g).await, Err(Why::StoreDown));
        for _ in 0..20 {
            assert_eq!(admit(&l, &g).await, Err(Why::StoreDown));
        }
        assert_eq!(takes(), 3, "three of three failed: skipped");
        // Another key is not skipped.
        let other = l.admit(&g, "t:b", &NoopObserver, info()).await;
        assert_eq!(other.map_err(|r| r.why), Err(Why::StoreDown));
        assert_eq!(takes(), 4);
        // After the back-off one call asks; it is answered and the skip ends.
        store.failing.store(false, Ordering::SeqCst);
        store.gate.add_permits(2);
        tokio::time::pause();
        tokio::time::advance(STORE_BACKOFF).await;
        tokio::time::resume();
        assert_eq!(admit(&l, &g).await, Ok(()));
        assert_eq!(admit(&l, &g).await, Ok(()), "from the lease");
        assert_eq!(takes(), 5);
    }
}
