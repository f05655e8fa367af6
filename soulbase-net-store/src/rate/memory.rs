//! [`MemoryRateStore`]: GCRA buckets in this process.

use std::time::Duration;

use foldhash::{HashMap, HashMapExt};
use parking_lot::Mutex;
use tokio::time::Instant;

use super::{RateStore, TakeFuture, TakeRequest, Taken};

/// The most buckets kept; idle ones (full again) are dropped first when it is reached.
const MAX_BUCKETS: usize = 100_000;

/// Rate buckets in memory: exact for one process (what a client uses when no store is given),
/// and the fallback of `on_store_error = "local"`.
#[derive(Debug)]
pub struct MemoryRateStore {
    /// Per key: the theoretical arrival time of the next token.
    tat: Mutex<HashMap<String, Instant>>,
}

impl MemoryRateStore {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            tat: Mutex::new(HashMap::new()),
        }
    }

    /// Takes up to `req.want` tokens at `now` (what [`RateStore::take`] does at
    /// `Instant::now()`), for a caller that keeps its own clock.
    pub fn take_at(&self, req: TakeRequest<'_>, now: Instant) -> Taken {
        let mut tat = self.tat.lock();
        if tat.len() >= MAX_BUCKETS && !tat.contains_key(req.key) {
            tat.retain(|_, t| *t > now);
        }
        let entry = tat.entry(req.key.to_owned()).or_insert(now);
        let (granted, next, retry_after) = gcra(*entry, now, req);
        *entry = next;
        Taken {
            granted,
            retry_after,
        }
    }
}

impl Default for MemoryRateStore {
    fn default() -> Self {
        Self::new()
    }
}

impl RateStore for MemoryRateStore {
    fn take<'a>(&'a self, req: TakeRequest<'a>) -> TakeFuture<'a> {
        let taken = self.take_at(req, Instant::now());
        Box::pin(async move { Ok(taken) })
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

/// The GCRA step the Redis script runs too: with `tat` the theoretical arrival time, a token
/// every `interval`, and `interval × (burst − 1)` of tolerance, grants the most tokens up to
/// `want` that keep `tat − now ≤ tolerance + interval` — if that is at least `at_least`.
/// Returns (granted, the new tat, the wait until `at_least` fit when none was granted).
fn gcra(tat: Instant, now: Instant, req: TakeRequest<'_>) -> (u32, Instant, Duration) {
    let interval = Duration::from_nanos(1_000_000_000u64.div_ceil(u64::from(req.rps.max(1))));
    let tolerance = interval.saturating_mul(req.burst.max(1) - 1);
    // What was spent on credit is paid first, whatever room there is.
    let tat = tat.max(now) + interval.saturating_mul(req.owed);
    let ahead = tat - now;
    let room = (tolerance + interval).saturating_sub(ahead);
    let fits = u32::try_from(room.as_nanos() / interval.as_nanos().max(1)).unwrap_or(u32::MAX);
    let granted = fits.min(req.want);
    let at_least = req.at_least.clamp(1, req.want.max(1));
    if granted < at_least {
        // When `at_least` more tokens fit: tat + at_least × interval ≤ now + tolerance + interval.
        let need = (ahead + interval.saturating_mul(at_least)).saturating_sub(tolerance + interval);
        return (0, tat, need);
    }
    let next = tat
        .checked_add(interval.saturating_mul(granted))
        .unwrap_or(tat);
    (granted, next, Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn req(want: u32) -> TakeRequest<'static> {
        TakeRequest {
            key: "t:a",
            rps: 10,
            burst: 5,
            want,
            at_least: 1,
            owed: 0,
        }
    }

    #[test]
    fn a_burst_then_the_rate() {
        let s = MemoryRateStore::new();
        let t0 = Instant::now();
        let granted: u32 = (0..8).map(|_| s.take_at(req(1), t0).granted).sum();
        assert_eq!(granted, 5, "the burst");
        let refused = s.take_at(req(1), t0);
        assert_eq!(refused.granted, 0);
        assert_eq!(refused.retry_after, 100 * MS);
        assert_eq!(s.take_at(req(1), t0 + 100 * MS).granted, 1);
        assert_eq!(s.take_at(req(1), t0 + 150 * MS).granted, 0);
    }

    #[test]
    fn a_lease_takes_what_there_is_up_to_the_ask() {
        let s = MemoryRateStore::new();
        let t0 = Instant::now();
        assert_eq!(s.take_at(req(3), t0).granted, 3);
        assert_eq!(s.take_at(req(3), t0).granted, 2, "only two left of five");
        assert_eq!(s.take_at(req(3), t0).granted, 0);
        // Over any window: at most burst + rate × window.
        let mut total = 5;
        for ms in (10..=1000).step_by(10) {
            total += s.take_at(req(3), t0 + ms * MS).granted;
        }
        assert!(total <= 5 + 10, "{total}");
        assert!(total >= 5 + 9, "{total}");
    }

    #[test]
    fn credit_owed_is_paid_first_even_below_empty() {
        let s = MemoryRateStore::new();
        let t0 = Instant::now();
        let owing = |owed| TakeRequest { owed, ..req(1) };
        // Three spent on credit, paid with the next take: two of five left, one granted.
        assert_eq!(s.take_at(owing(3), t0).granted, 1);
        // Seven owed with one left: nothing granted, and the bucket is 6 below empty (the
        // debt is kept even though the take was refused): the next token in 700 ms.
        let none = s.take_at(owing(7), t0);
        assert_eq!((none.granted, none.retry_after), (0, 700 * MS));
        assert_eq!(s.take_at(req(1), t0 + 690 * MS).granted, 0);
        assert_eq!(s.take_at(req(1), t0 + 700 * MS).granted, 1);
    }

    #[test]
    fn a_whole_lease_or_nothing_with_the_wait_for_one() {
        let s = MemoryRateStore::new();
        let t0 = Instant::now();
        let whole = |want| TakeRequest {
            at_least: want,
            ..req(want)
        };
        assert_eq!(s.take_at(whole(4), t0).granted, 4);
        // One left: not a whole lease of 4, and three more need 300 ms.
        let none = s.take_at(whole(4), t0);
        assert_eq!((none.granted, none.retry_after), (0, 300 * MS));
        assert_eq!(s.take_at(whole(4), t0 + 300 * MS).granted, 4);
    }
}
