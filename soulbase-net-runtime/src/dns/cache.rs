//! The DNS cache: TTLs clamped by policy, serve-stale, singleflight, and a bound on names.
//!
//! Why singleflight (seed 002): when a popular name expires under load, hundreds of requests
//! would each start a lookup; here the first one looks the name up and the others wait for its
//! answer. If the first caller is cancelled, the next waiter takes over the lookup.
//!
//! Why serve-stale (seed 004, RFC 8767): a resolver outage should not become an outage of
//! every upstream whose addresses we knew a minute ago; past its TTL an answer may still be
//! used for `stale_for` when a fresh lookup fails.
//!
//! Entries carry two expiries: a monotonic one ([`Instant`]) that decides freshness, and a
//! wall-clock one ([`SystemTime`]) that is what the persistence file stores, since a monotonic
//! instant means nothing to the next process.

use foldhash::{HashMap, HashMapExt};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// How the cache treats TTLs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CacheCfg {
    /// The shortest time an answer is kept, whatever its TTL.
    pub(crate) min_ttl: Duration,
    /// The longest time an answer is kept, whatever its TTL.
    pub(crate) max_ttl: Duration,
    /// How long past its expiry an answer may be served when a lookup fails (0: never).
    pub(crate) stale_for: Duration,
    /// The most names kept; expired entries go first, then the one closest to expiry.
    pub(crate) max_entries: usize,
}

/// One answer: the addresses and the TTL the resolver gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    /// The addresses.
    pub(crate) addrs: Arc<[IpAddr]>,
    /// The TTL of the answer (before clamping).
    pub(crate) ttl: Duration,
}

/// Who asks: a request marks the name as in use, so a background refresh keeps it warm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A request.
    Request,
    /// Prefetch or refresh.
    Background,
}

/// Where an answer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The cache, within its TTL.
    Cache,
    /// A lookup made now (by this caller or one it waited for).
    Lookup,
    /// The cache past its TTL, because the lookup failed.
    Stale,
}

/// A cache entry as the persistence file stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Saved {
    /// The normalised name.
    pub(crate) name: String,
    /// The addresses.
    pub(crate) addrs: Arc<[IpAddr]>,
    /// When the answer expires, by the wall clock.
    pub(crate) expires: SystemTime,
}

#[derive(Clone, Debug)]
struct Entry {
    addrs: Arc<[IpAddr]>,
    expires: Instant,
    wall_expires: SystemTime,
    /// Served to a request since it was stored or last picked for refresh.
    used: bool,
}

type Flight<E> = Arc<OnceCell<Result<Arc<[IpAddr]>, E>>>;
type Flights<E> = Mutex<HashMap<Box<str>, Flight<E>>>;

/// A DNS cache with singleflight; `E` is the lookup's error, shared by every waiter.
#[derive(Debug)]
pub(crate) struct DnsCache<E> {
    cfg: CacheCfg,
    entries: Mutex<HashMap<Box<str>, Entry>>,
    inflight: Flights<E>,
}

// === impl DnsCache ===

impl<E: Clone> DnsCache<E> {
    /// An empty cache.
    pub(crate) fn new(cfg: CacheCfg) -> Self {
        DnsCache {
            cfg,
            entries: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
        }
    }

    /// The cached addresses of `name` if still fresh at `now`.
    pub(crate) fn get_fresh(&self, name: &str, now: Instant) -> Option<Arc<[IpAddr]>> {
        self.fresh(name, now, Caller::Background)
    }

    /// The fresh addresses of `name`, marking it used when a request asks.
    fn fresh(&self, name: &str, now: Instant, caller: Caller) -> Option<Arc<[IpAddr]>> {
        let mut entries = self.entries.lock();
        let e = entries.get_mut(name).filter(|e| now < e.expires)?;
        e.used |= caller == Caller::Request;
        Some(e.addrs.clone())
    }

    /// Marks `name` as used by a request.
    fn touch(&self, name: &str) {
        if let Some(e) = self.entries.lock().get_mut(name) {
            e.used = true;
        }
    }

    /// The cached addresses of `name` if expired at `now` but within `stale_for`.
    pub(crate) fn get_stale(&self, name: &str, now: Instant) -> Option<Arc<[IpAddr]>> {
        let entries = self.entries.lock();
        let e = entries.get(name)?;
        (now < e.expires + self.cfg.stale_for).then(|| e.addrs.clone())
    }

    /// Clamps a TTL to `[min_ttl, max_ttl]`.
    fn clamp(&self, ttl: Duration) -> Duration {
        ttl.clamp(self.cfg.min_ttl, self.cfg.max_ttl.max(self.cfg.min_ttl))
    }

    /// Stores an answer at `now` (`wall` is the same moment by the wall clock), its TTL
    /// clamped to `[min_ttl, max_ttl]`.
    pub(crate) fn insert(&self, name: &str, answer: &Answer, now: Instant, wall: SystemTime) {
        let ttl = self.clamp(answer.ttl);
        let entry = Entry {
            addrs: answer.addrs.clone(),
            expires: now + ttl,
            wall_expires: wall + ttl,
            used: false,
        };
        self.put(name, entry, now);
    }

    /// Restores a persisted entry at `now` (`wall` by the wall clock). Its remaining life is
    /// cut to `max_ttl`; an entry already expired is kept, as stale, only within `stale_for`.
    /// An entry already cached for the name (an answer resolved while the file was loading,
    /// so fresher) is kept instead. Returns whether the persisted one was kept.
    pub(crate) fn restore(&self, saved: &Saved, now: Instant, wall: SystemTime) -> bool {
        if saved.addrs.is_empty() {
            return false;
        }
        let (expires, wall_expires) = match saved.expires.duration_since(wall) {
            Ok(left) => {
                let left = left.min(self.cfg.max_ttl);
                (now + left, wall + left)
            }
            Err(past) => {
                let ago = past.duration();
                if ago >= self.cfg.stale_for {
                    return false;
                }
                // Near the start of the monotonic clock the past may not be representable:
                // then it expires now, which only lengthens its stale window by `ago`.
                (now.checked_sub(ago).unwrap_or(now), saved.expires)
            }
        };
        let entry = Entry {
            addrs: saved.addrs.clone(),
            expires,
            wall_expires,
            used: false,
        };
        let mut entries = self.entries.lock();
        if entries.contains_key(saved.name.as_str()) {
            return false;
        }
        self.put_locked(&mut entries, &saved.name, entry, now);
        true
    }

    fn put(&self, name: &str, entry: Entry, now: Instant) {
        self.put_locked(&mut self.entries.lock(), name, entry, now);
    }

    fn put_locked(
        &self,
        entries: &mut HashMap<Box<str>, Entry>,
        name: &str,
        entry: Entry,
        now: Instant,
    ) {
        if entries.len() >= self.cfg.max_entries && !entries.contains_key(name) {
            self.evict(entries, now);
        }
        if self.cfg.max_entries > 0 {
            entries.insert(name.into(), entry);
        }
    }

    /// Removes entries past their stale window, then, if still full, the entry closest to
    /// expiry.
    fn evict(&self, entries: &mut HashMap<Box<str>, Entry>, now: Instant) {
        let stale_for = self.cfg.stale_for;
        entries.retain(|_, e| now < e.expires + stale_for);
        if entries.len() >= self.cfg.max_entries {
            let victim = entries
                .iter()
                .min_by_key(|(_, e)| e.expires)
                .map(|(k, _)| k.clone());
            if let Some(victim) = victim {
                entries.remove(&victim);
            }
        }
    }

    /// Drops every entry past its stale window at `now`.
    pub(crate) fn purge(&self, now: Instant) {
        let stale_for = self.cfg.stale_for;
        self.entries
            .lock()
            .retain(|_, e| now < e.expires + stale_for);
    }

    /// The names a background refresh should look up again: expired at `now` and served to
    /// a request since they were stored or last picked. Picking clears the mark, so a name
    /// nobody asks for any more is refreshed once at most, then left to age out after
    /// `stale_for`, instead of being kept warm forever.
    pub(crate) fn take_refreshable(&self, now: Instant) -> Vec<String> {
        let mut entries = self.entries.lock();
        let mut names: Vec<String> = entries
            .iter_mut()
            .filter(|(_, e)| e.expires <= now && e.used)
            .map(|(k, e)| {
                e.used = false;
                k.to_string()
            })
            .collect();
        names.sort_unstable();
        names
    }

    /// Every entry, for the persistence file, sorted by name.
    pub(crate) fn snapshot(&self) -> Vec<Saved> {
        let entries = self.entries.lock();
        let mut out: Vec<Saved> = entries
            .iter()
            .map(|(k, e)| Saved {
                name: k.to_string(),
                addrs: e.addrs.clone(),
                expires: e.wall_expires,
            })
            .collect();
        out.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The number of names cached.
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Resolves `name`: a fresh cached answer, else one lookup shared by every concurrent
    /// caller, else (when the lookup fails) a stale answer within `stale_for`.
    ///
    /// # Errors
    /// The lookup's error, when it failed and no stale answer was available.
    pub(crate) async fn resolve<F, Fut>(
        &self,
        name: &str,
        caller: Caller,
        lookup: F,
    ) -> Result<(Arc<[IpAddr]>, Source), E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Answer, E>>,
    {
        if let Some(addrs) = self.fresh(name, Instant::now(), caller) {
            return Ok((addrs, Source::Cache));
        }
        let flight = self.inflight.lock().entry(name.into()).or_default().clone();
        let guard = FlightGuard {
            map: &self.inflight,
            name,
            flight,
        };
        let result = guard
            .flight
            .get_or_init(|| async {
                // A flight that started after another finished may find the cache filled.
                if let Some(addrs) = self.get_fresh(name, Instant::now()) {
                    return Ok(addrs);
                }
                let res = lookup().await;
                if let Ok(answer) = &res {
                    self.insert(name, answer, Instant::now(), SystemTime::now());
                }
                res.map(|a| a.addrs)
            })
            .await
            .clone();
        drop(guard);
        if caller == Caller::Request {
            self.touch(name);
        }
        match result {
            Ok(addrs) => Ok((addrs, Source::Lookup)),
            Err(err) => match self.get_stale(name, Instant::now()) {
                Some(addrs) => Ok((addrs, Source::Stale)),
                None => Err(err),
            },
        }
    }
}

/// Takes a flight out of the in-flight map when its caller is done with it: always once the
/// flight has an answer, and also when its caller was cancelled with nobody else waiting (so
/// abandoned flights do not pile up). A flight with waiters stays, and a waiter takes over.
struct FlightGuard<'a, E> {
    map: &'a Flights<E>,
    name: &'a str,
    flight: Flight<E>,
}

impl<E> Drop for FlightGuard<'_, E> {
    fn drop(&mut self) {
        let mut map = self.map.lock();
        let ours = map
            .get(self.name)
            .is_some_and(|f| Arc::ptr_eq(f, &self.flight));
        // Clones are only taken under this lock, so the count is exact here: 2 is the map's
        // and ours.
        if ours && (self.flight.initialized() || Arc::strong_count(&self.flight) <= 2) {
            map.remove(self.name);
        }
    }
}

#[cfg(test)]
mod tests;
