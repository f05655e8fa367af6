//! A bounded map from keys (hosts, host+tenant) to per-key state, with idle eviction, so that
//! a flood of distinct hosts cannot exhaust memory.
//!
//! Why not an LRU list: lookups dominate and eviction is rare, so entries carry a `last_used`
//! stamp and eviction, when the map is full, sweeps once and drops a batch of the least
//! recently used evictable entries (an eighth of the map), which keeps inserts amortised
//! `O(log n)`.
//!
//! Entries are kept in insertion order with their positions ([`IndexMap`]), so that a caller
//! that visited a key can come back to its entry by position, without hashing the key again
//! ([`BoundedMap::visit_at`], [`BoundedMap::get_mut_at`]): the breakers do, once per call. A
//! removal moves the last entry into the removed one's place, so a position only hints; the
//! caller checks that the entry there is its own and looks the key up otherwise.

use std::{borrow::Cow, time::Duration};

use indexmap::IndexMap;

use tokio::time::Instant;

/// The key of per-key state kept per host, or per (host, tenant) when `per_tenant`:
/// `host` or `host/tenant` (a host never contains `/`, so keys cannot collide).
/// Borrowed when it is the host alone (the common case costs no allocation).
pub(crate) fn scoped_key<'a>(
    host: &'a str,
    tenant: Option<&str>,
    per_tenant: bool,
) -> Cow<'a, str> {
    match tenant {
        Some(t) if per_tenant => Cow::Owned(format!("{host}/{t}")),
        _ => Cow::Borrowed(host),
    }
}

/// State kept per key that knows whether dropping it now would lose something that matters.
pub(crate) trait Evictable {
    /// Whether this entry may be dropped at `now` (an open circuit in its cooldown may not);
    /// `idle` says whether it has been unused for the map's idle period.
    fn evictable(&self, now: Instant, idle: bool) -> bool;
}

/// A map of at most `max` entries; entries idle for `idle` are replaced or dropped.
#[derive(Debug)]
pub(crate) struct BoundedMap<V> {
    entries: IndexMap<Box<str>, Slot<V>, foldhash::fast::RandomState>,
    max: usize,
    idle: Duration,
    /// Until when a full map refuses new keys without looking for room again: set when an
    /// eviction found none (every entry pinned: open circuits, calls in flight), so that a
    /// flood of new keys costs one scan per [`NO_ROOM_RECHECK`], not one per key.
    no_room_until: Option<Instant>,
    /// Entries dropped or replaced since the last [`BoundedMap::take_evicted`], kept only when
    /// the owner asked for them ([`BoundedMap::reporting_evictions`]): the breakers report a
    /// circuit that goes while not closed, so that whoever followed its transitions does not
    /// keep it open forever.
    evicted: Option<Vec<(Box<str>, V)>>,
}

/// How long a full map whose entries may not go refuses new keys before it looks for room
/// again. Short next to what pins an entry (a breaker's cooldown, a call).
pub(crate) const NO_ROOM_RECHECK: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct Slot<V> {
    value: V,
    last_used: Instant,
}

// === impl BoundedMap ===

impl<V: Evictable> BoundedMap<V> {
    /// An empty map holding at most `max` entries (at least 1).
    pub(crate) fn new(max: usize, idle: Duration) -> Self {
        Self {
            entries: IndexMap::default(),
            max: max.max(1),
            idle,
            no_room_until: None,
            evicted: None,
        }
    }

    /// Keeps the entries the map drops or replaces, for [`BoundedMap::take_evicted`].
    pub(crate) fn reporting_evictions(mut self) -> Self {
        self.evicted = Some(Vec::new());
        self
    }

    /// The entries dropped or replaced since the last call (none unless
    /// [`reporting_evictions`](Self::reporting_evictions)); no allocation when there are none.
    pub(crate) fn take_evicted(&mut self) -> Vec<(Box<str>, V)> {
        match &mut self.evicted {
            Some(evicted) if !evicted.is_empty() => std::mem::take(evicted),
            _ => Vec::new(),
        }
    }

    /// How many keys are held.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Every key and entry, in no particular order, without marking them used.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.entries.iter().map(|(k, s)| (&**k, &s.value))
    }

    /// The entry for `key`, without marking it used.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &str) -> Option<&V> {
        self.entries.get(key).map(|s| &s.value)
    }

    /// The entry for `key`, marked used at `now`, without creating it.
    #[cfg(test)]
    pub(crate) fn get_mut(&mut self, key: &str, now: Instant) -> Option<&mut V> {
        let slot = self.entries.get_mut(key)?;
        slot.last_used = slot.last_used.max(now);
        Some(&mut slot.value)
    }

    /// The entry for `key`, marked used at `now`, without creating it: first the one at
    /// `position` (where [`visit_at`](Self::visit_at) found it) when `is_it` says that entry
    /// is the one looked for, else by its key. No hashing when it is still there.
    pub(crate) fn get_mut_at(
        &mut self,
        position: usize,
        key: &str,
        now: Instant,
        is_it: impl FnOnce(&V) -> bool,
    ) -> Option<&mut V> {
        let there = self
            .entries
            .get_index(position)
            .is_some_and(|(_, slot)| is_it(&slot.value));
        let slot = if there {
            self.entries.get_index_mut(position).map(|(_, slot)| slot)?
        } else {
            self.entries.get_mut(key)?
        };
        slot.last_used = slot.last_used.max(now);
        Some(&mut slot.value)
    }

    /// Runs `visit` on the entry for `key`: created with `make` when missing, or replaced by
    /// a fresh one when it has been idle for the idle period and may be evicted. Marked used
    /// at `now`. One lookup when the key is there (a visitor rather than a returned reference,
    /// which the borrow checker would only allow after a second lookup).
    ///
    /// `None` when the map is full and no entry may be evicted: the caller then goes on without
    /// per-key state (fail open) rather than grow the map. A map found without room refuses new
    /// keys for [`NO_ROOM_RECHECK`] before it scans for room again.
    pub(crate) fn visit<R>(
        &mut self,
        key: &str,
        now: Instant,
        make: impl FnOnce() -> V,
        visit: impl FnOnce(&mut V) -> R,
    ) -> Option<R> {
        self.visit_at(key, now, make, visit).map(|(r, _)| r)
    }

    /// [`visit`](Self::visit), with the position the entry has now, for
    /// [`get_mut_at`](Self::get_mut_at).
    pub(crate) fn visit_at<R>(
        &mut self,
        key: &str,
        now: Instant,
        make: impl FnOnce() -> V,
        visit: impl FnOnce(&mut V) -> R,
    ) -> Option<(R, usize)> {
        if let Some((position, _, slot)) = self.entries.get_full_mut(key) {
            if passed(slot.last_used, self.idle, now) && slot.value.evictable(now, true) {
                let old = std::mem::replace(&mut slot.value, make());
                if let Some(evicted) = &mut self.evicted {
                    evicted.push((key.into(), old));
                }
            }
            slot.last_used = slot.last_used.max(now);
            return Some((visit(&mut slot.value), position));
        }
        if self.entries.len() >= self.max {
            if self.no_room_until.is_some_and(|until| now < until) {
                return None;
            }
            self.evict(now);
            if self.entries.len() >= self.max {
                self.no_room_until = Some(now + NO_ROOM_RECHECK);
                return None;
            }
            self.no_room_until = None;
        }
        let (position, _) = self.entries.insert_full(
            key.into(),
            Slot {
                value: make(),
                last_used: now,
            },
        );
        let slot = &mut self.entries[position];
        Some((visit(&mut slot.value), position))
    }

    /// Drops every entry idle for the idle period that may be evicted. The client may call
    /// this now and then; inserts into a full map call it anyway.
    pub(crate) fn sweep(&mut self, now: Instant) {
        let idle = self.idle;
        let goes = |s: &Slot<V>| passed(s.last_used, idle, now) && s.value.evictable(now, true);
        match &mut self.evicted {
            // From the end: a removal moves the last entry, already looked at, into its place.
            Some(evicted) => {
                for position in (0..self.entries.len()).rev() {
                    if self
                        .entries
                        .get_index(position)
                        .is_some_and(|(_, s)| goes(s))
                    {
                        if let Some((k, s)) = self.entries.swap_remove_index(position) {
                            evicted.push((k, s.value));
                        }
                    }
                }
            }
            None => self.entries.retain(|_, s| !goes(s)),
        }
    }

    /// Makes room: idle entries first, then a batch of the least recently used evictable ones.
    fn evict(&mut self, now: Instant) {
        self.sweep(now);
        if self.entries.len() < self.max {
            return;
        }
        let batch = (self.max / 8).max(1);
        let mut lru: Vec<(Instant, &str)> = self
            .entries
            .iter()
            .filter(|(_, s)| s.value.evictable(now, false))
            .map(|(k, s)| (s.last_used, &**k))
            .collect();
        let batch = batch.min(lru.len());
        if batch == 0 {
            return;
        }
        lru.select_nth_unstable_by_key(batch - 1, |(t, _)| *t);
        let victims: Vec<Box<str>> = lru[..batch].iter().map(|(_, k)| (*k).into()).collect();
        for k in victims {
            if let (Some(slot), Some(evicted)) = (self.entries.swap_remove(&k), &mut self.evicted) {
                evicted.push((k, slot.value));
            }
        }
    }
}

/// Whether `period` has passed since `since` at `now`: an entry idle for its idle period, a
/// pooled connection idle past its timeout or past its lifetime. An addition and a
/// comparison: measuring the time since `since` costs a subtraction and its normalisation on
/// every visit. A period too long for an instant never passes; a zero one always has.
pub(crate) fn passed(since: Instant, period: Duration, now: Instant) -> bool {
    period.is_zero() || since.checked_add(period).is_some_and(|at| now >= at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_has_passed_from_its_end_on() {
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        assert!(!passed(t0, second, t0 + Duration::from_millis(999)));
        assert!(passed(t0, second, t0 + second));
        assert!(passed(t0, second, t0 + Duration::from_secs(5)));
        // Zero has always passed, even for a `since` after `now`; no instant holds the end
        // of the longest period, so it never does.
        assert!(passed(t0 + second, Duration::ZERO, t0));
        assert!(!passed(t0, Duration::MAX, t0 + Duration::from_secs(3_600)));
    }

    #[derive(Debug)]
    struct Pinned(bool);

    impl Evictable for Pinned {
        fn evictable(&self, _now: Instant, _idle: bool) -> bool {
            !self.0
        }
    }

    /// An entry with an identity, pinned or not.
    #[derive(Debug)]
    struct Tagged {
        id: u32,
        pinned: bool,
    }

    impl Evictable for Tagged {
        fn evictable(&self, _now: Instant, _idle: bool) -> bool {
            !self.pinned
        }
    }

    #[test]
    fn a_position_finds_its_entry_while_it_is_there_and_the_key_after_it_moved() {
        let now = Instant::now();
        let mut m = BoundedMap::new(10, Duration::from_secs(5));
        let tagged = |id, pinned| move || Tagged { id, pinned };
        let (_, a) = m.visit_at("a", now, tagged(1, false), |_| ()).unwrap();
        let (_, b) = m.visit_at("b", now, tagged(2, true), |_| ()).unwrap();
        let (_, c) = m.visit_at("c", now, tagged(3, true), |_| ()).unwrap();
        assert_eq!((a, b, c), (0, 1, 2));
        // Still there: found by position, its key not looked at.
        let found = m.get_mut_at(b, "no such key", now, |v| v.id == 2);
        assert_eq!(found.map(|v| v.id), Some(2));
        // `a` goes idle and is swept: the others move up.
        m.sweep(now + Duration::from_secs(5));
        assert_eq!(m.len(), 2);
        // `c`'s position now holds nothing, `a`'s holds another: both found by key.
        let found = m.get_mut_at(c, "c", now, |v| v.id == 3);
        assert_eq!(found.map(|v| v.id), Some(3));
        let found = m.get_mut_at(a, "a", now, |v| v.id == 1);
        assert!(
            found.is_none(),
            "`a` is gone, and the entry at its place is not it"
        );
        // A visit tells the new position, where the entry is found again without its key.
        let (_, moved) = m.visit_at("c", now, tagged(9, true), |_| ()).unwrap();
        assert_ne!(moved, c);
        let found = m.get_mut_at(moved, "no such key", now, |v| v.id == 3);
        assert_eq!(found.map(|v| v.id), Some(3));
    }

    #[test]
    fn keys_by_host_or_host_and_tenant() {
        assert_eq!(scoped_key("a.example", Some("t1"), false), "a.example");
        assert_eq!(scoped_key("a.example", Some("t1"), true), "a.example/t1");
        assert_eq!(scoped_key("a.example", None, true), "a.example");
    }

    #[test]
    fn stays_within_max_under_many_keys() {
        let now = Instant::now();
        let mut m = BoundedMap::new(100, Duration::from_secs(60));
        for i in 0..10_000u32 {
            assert!(m
                .visit(&format!("h{i}"), now, || Pinned(false), |_| ())
                .is_some());
            assert!(m.len() <= 100);
        }
        // The most recent key survived.
        assert!(m.get_mut("h9999", now).is_some());
    }

    #[test]
    fn pinned_entries_are_never_evicted() {
        let now = Instant::now();
        let mut m = BoundedMap::new(2, Duration::from_secs(1));
        assert!(m.visit("a", now, || Pinned(true), |_| ()).is_some());
        assert!(m.visit("b", now, || Pinned(true), |_| ()).is_some());
        let later = now + Duration::from_secs(10);
        assert!(m.visit("c", later, || Pinned(false), |_| ()).is_none());
        assert_eq!(m.len(), 2);
        assert!(m.get_mut("a", later).is_some());
    }

    /// Pinned, counting how often eviction asks it.
    #[derive(Debug)]
    struct Counted<'a>(&'a std::cell::Cell<u32>);

    impl Evictable for Counted<'_> {
        fn evictable(&self, _now: Instant, _idle: bool) -> bool {
            self.0.set(self.0.get() + 1);
            false
        }
    }

    #[test]
    fn a_full_map_of_pinned_entries_is_scanned_once_per_recheck_not_per_new_key() {
        let asked = std::cell::Cell::new(0);
        let now = Instant::now();
        let mut m = BoundedMap::new(100, Duration::from_secs(1));
        for i in 0..100 {
            assert!(m
                .visit(&format!("p{i}"), now, || Counted(&asked), |_| ())
                .is_some());
        }
        let later = now + Duration::from_secs(10);
        // The first new key looks for room (a sweep and an LRU pass over every entry)...
        assert!(m.visit("n0", later, || Counted(&asked), |_| ()).is_none());
        let one_scan = asked.get();
        assert_eq!(one_scan, 200);
        // ...the next thousand, within the recheck period, do not.
        for i in 1..1_000 {
            let at = later + NO_ROOM_RECHECK / 2;
            assert!(m
                .visit(&format!("n{i}"), at, || Counted(&asked), |_| ())
                .is_none());
        }
        assert_eq!(asked.get(), one_scan);
        // Keys already there are still served.
        assert!(m.visit("p7", later, || Counted(&asked), |_| ()).is_some());
        // After the period, one more look.
        let after = later + NO_ROOM_RECHECK;
        assert!(m
            .visit("n1000", after, || Counted(&asked), |_| ())
            .is_none());
        assert_eq!(asked.get(), 2 * one_scan);
    }

    /// May go only once idle.
    #[derive(Debug)]
    struct IdleOnly;

    impl Evictable for IdleOnly {
        fn evictable(&self, _now: Instant, idle: bool) -> bool {
            idle
        }
    }

    #[test]
    fn room_a_sweep_makes_is_used_at_once() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let mut m = BoundedMap::new(2, Duration::from_secs(5));
        assert!(m.visit("a", now, || IdleOnly, |_| ()).is_some());
        assert!(m.visit("b", now + ms(4_000), || IdleOnly, |_| ()).is_some());
        // Neither is idle yet: no room, and the map stops looking for a while.
        assert!(m.visit("c", now + ms(4_950), || IdleOnly, |_| ()).is_none());
        // The client's periodic sweep drops `a` once idle; the room is used within the while.
        m.sweep(now + ms(5_000));
        assert_eq!(m.len(), 1);
        assert!(m.visit("c", now + ms(5_010), || IdleOnly, |_| ()).is_some());
    }

    #[test]
    fn idle_entries_are_swept_and_replaced() {
        let now = Instant::now();
        let mut m = BoundedMap::new(10, Duration::from_secs(5));
        assert!(m.visit("a", now, || Pinned(false), |_| ()).is_some());
        assert!(m.visit("p", now, || Pinned(true), |_| ()).is_some());
        m.sweep(now + Duration::from_secs(4));
        assert_eq!(m.len(), 2);
        m.sweep(now + Duration::from_secs(5));
        assert_eq!(
            m.len(),
            1,
            "the idle evictable entry is gone, the pinned one stays"
        );
        // An idle evictable entry is replaced by a fresh one on access.
        let later = now + Duration::from_secs(20);
        m.visit("p", later, || Pinned(false), |v| v.0 = false);
        let fresh = m.visit(
            "p",
            later + Duration::from_secs(6),
            || Pinned(true),
            |v| v.0,
        );
        assert_eq!(fresh, Some(true), "replaced by make()");
    }
}
