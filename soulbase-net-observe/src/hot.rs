//! A per-thread memo of the counters the last requests touched.
//!
//! Why: every request ends in a `net_requests_total` and two `net_bytes_total` increments,
//! and finding each counter in its family means bounding the host and tenant labels (a
//! lookup each) and hashing the whole label set under the family's lock. Calls to one
//! upstream repeat the same labels, so a thread keeps the last few counters it found, keyed
//! by the raw values, and an increment with the same labels is a few compares. A memo entry
//! never goes stale: label caps only grow and families never drop a series.

use std::{
    cell::RefCell,
    sync::atomic::{AtomicU64, Ordering},
};

use prometheus_client::metrics::counter::Counter;
use soulbase_net_core::recent::MissStreak;

/// Entries kept per thread.
const ENTRIES: usize = 8;

/// A number for each `Metrics`, so that two registries on one thread never share entries.
pub(crate) fn next_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What identifies one counter: its `Metrics`, its family and its label values as the
/// request gave them (before the caps bound them).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key<'a> {
    pub(crate) owner: u64,
    pub(crate) family: &'static str,
    pub(crate) host: &'a str,
    pub(crate) tenant: Option<&'a str>,
    /// The family's other labels, which are always static strings.
    pub(crate) rest: [&'static str; 4],
}

struct Entry {
    owner: u64,
    family: &'static str,
    host: Box<str>,
    tenant: Option<Box<str>>,
    rest: [&'static str; 4],
    counter: Counter,
}

impl Entry {
    /// The static labels are compared by address: the same label always comes from the
    /// same constant, and a label that compares unequal that way only costs a miss (the
    /// counter found is still the right one). Content is compared only for the host and
    /// tenant, last.
    fn matches(&self, key: &Key<'_>) -> bool {
        let same = |a: &'static str, b: &'static str| std::ptr::eq(a, b);
        self.owner == key.owner
            && same(self.family, key.family)
            && self.rest.iter().zip(&key.rest).all(|(a, b)| same(a, b))
            && *self.host == *key.host
            && self.tenant.as_deref() == key.tenant
    }
}

#[derive(Default)]
struct Memo {
    entries: Vec<Entry>,
    /// The slot the next miss replaces once the memo is full.
    next: usize,
    /// Once it keeps missing (thousands of hosts in turn), the memo keeps one miss in eight.
    misses: MissStreak,
}

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::new(Memo::default());
}

/// Adds `by` to the counter of `key`, found by `find` on a miss.
pub(crate) fn inc_by(key: Key<'_>, by: u64, find: impl FnOnce() -> Counter) {
    // `Some(keep)` on a miss: whether to keep the counter found.
    let missed = MEMO.with(|memo| {
        let mut memo = memo.borrow_mut();
        match memo.entries.iter().find(|e| e.matches(&key)) {
            Some(e) => {
                e.counter.inc_by(by);
                memo.misses.hit();
                None
            }
            None => Some(memo.misses.miss(ENTRIES)),
        }
    });
    let Some(keep) = missed else {
        return;
    };
    let counter = find();
    counter.inc_by(by);
    if !keep {
        return;
    }
    MEMO.with(|memo| {
        let mut memo = memo.borrow_mut();
        let entry = Entry {
            owner: key.owner,
            family: key.family,
            host: key.host.into(),
            tenant: key.tenant.map(Into::into),
            rest: key.rest,
            counter,
        };
        if memo.entries.len() < ENTRIES {
            memo.entries.push(entry);
        } else {
            let slot = memo.next;
            memo.entries[slot] = entry;
            memo.next = (slot + 1) % ENTRIES;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(owner: u64, host: &str) -> Key<'_> {
        Key {
            owner,
            family: "f",
            host,
            tenant: None,
            rest: ["GET", "", "", ""],
        }
    }

    #[test]
    fn a_hit_increments_the_counter_found_first() {
        let owner = next_owner();
        let counter = Counter::default();
        let mut finds = 0;
        for _ in 0..3 {
            inc_by(key(owner, "h"), 2, || {
                finds += 1;
                counter.clone()
            });
        }
        assert_eq!(finds, 1);
        assert_eq!(counter.get(), 6);
        // Another owner, host or tenant is another counter.
        let other = Counter::default();
        inc_by(key(next_owner(), "h"), 1, || other.clone());
        inc_by(key(owner, "g"), 1, || other.clone());
        let mut with_tenant = key(owner, "h");
        with_tenant.tenant = Some("t");
        inc_by(with_tenant, 1, || other.clone());
        assert_eq!((counter.get(), other.get()), (6, 3));
    }

    #[test]
    fn a_full_memo_replaces_entries_and_still_counts_right() {
        let owner = next_owner();
        let counters: Vec<Counter> = (0..ENTRIES * 2).map(|_| Counter::default()).collect();
        let hosts: Vec<String> = (0..ENTRIES * 2).map(|i| format!("h{i}")).collect();
        for round in 0..3 {
            for (host, counter) in hosts.iter().zip(&counters) {
                inc_by(key(owner, host), 1, || counter.clone());
            }
            assert!(counters.iter().all(|c| c.get() == round + 1));
        }
    }

    #[test]
    fn a_memo_that_keeps_missing_keeps_one_counter_in_eight_and_counts_every_increment() {
        let owner = next_owner();
        let shared = Counter::default();
        let hosts: Vec<String> = (0..1_000).map(|i| format!("m{i}")).collect();
        for host in &hosts {
            inc_by(key(owner, host), 1, || shared.clone());
        }
        assert_eq!(shared.get(), 1_000, "every increment counted");
        // Past the streak, only one miss in eight was kept: the memo holds the last of
        // those, not the last hosts seen.
        let held: Vec<String> = MEMO.with(|m| {
            m.borrow()
                .entries
                .iter()
                .map(|e| e.host.to_string())
                .collect()
        });
        let kept_late = held
            .iter()
            .filter(|h| h[1..].parse::<usize>().is_ok_and(|i| i >= 1_000 - ENTRIES))
            .count();
        assert!(kept_late <= 1, "held {held:?}");
        // A host called again settles in: the first call after the streak that is kept
        // ends it.
        let again = Counter::default();
        let mut finds = 0;
        for _ in 0..20 {
            inc_by(key(owner, "again"), 1, || {
                finds += 1;
                again.clone()
            });
        }
        assert!(finds <= 8, "{finds} lookups");
        assert_eq!(again.get(), 20);
    }
}
