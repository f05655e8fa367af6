//! [`Slots`]: a concurrency limit (per host, per tenant) that a call takes and gives back
//! with one atomic operation each while nobody waits.
//!
//! Why not tokio's `Semaphore`: its release takes the waiters' lock every time, waiters or
//! not (about 100 instructions a call), and an owned permit holds a reference count of its
//! own. Here a permit holds its owner (the host's entry, which the call has already looked
//! up), and a release is an increment and a load. Waiting is rare (only with the policy's
//! `max_wait`): a waiter registers, and a release that sees one wakes it through a `Notify`.
//! A freed slot goes to whoever asks first, a new call or a woken waiter (a woken waiter that
//! lost it waits again); tokio's semaphore would hand it to the longest waiter.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::time::Instant;

/// `cap` slots, some taken.
#[derive(Debug)]
pub(crate) struct Slots {
    free: AtomicUsize,
    cap: u32,
    /// Calls waiting for a slot; a release wakes one when there are any.
    waiting: AtomicUsize,
    freed: Notify,
}

/// Whatever holds a [`Slots`]: a permit keeps its owner alive and gives the slot back to it.
pub(crate) trait HasSlots: Send + Sync + 'static {
    /// The slots a permit is taken from.
    fn slots(&self) -> &Slots;
}

/// One slot of `T`'s [`Slots`], given back when dropped.
#[derive(Debug)]
pub(crate) struct SlotPermit<T: HasSlots> {
    owner: Arc<T>,
}

// === impl Slots ===

impl Slots {
    /// `cap` free slots.
    pub(crate) fn new(cap: u32) -> Self {
        Self {
            free: AtomicUsize::new(cap as usize),
            cap,
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
        }
    }

    /// How many slots are taken.
    pub(crate) fn in_flight(&self) -> u32 {
        let free = u32::try_from(self.free.load(Ordering::Relaxed)).unwrap_or(u32::MAX);
        self.cap.saturating_sub(free)
    }

    /// Whether no slot is taken and nobody waits for one.
    pub(crate) fn is_idle(&self) -> bool {
        self.free.load(Ordering::Relaxed) >= self.cap as usize
            && self.waiting.load(Ordering::Relaxed) == 0
    }

    /// Takes a slot if one is free.
    fn try_take(&self) -> bool {
        self.free
            .fetch_update(Ordering::SeqCst, Ordering::Relaxed, |free| {
                free.checked_sub(1)
            })
            .is_ok()
    }

    /// Gives a slot back, waking a waiter if there is one. (The increment comes before the
    /// look at `waiting`, and a waiter registers before it looks at `free`: one of the two
    /// sees the other.)
    fn give_back(&self) {
        self.free.fetch_add(1, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.freed.notify_one();
        }
    }

    /// Waits for a slot until `deadline`; `false` when none came by then.
    async fn wait(&self, deadline: Instant) -> bool {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _registered = Registered(&self.waiting);
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered with the `Notify` before looking, so a release in between wakes it.
            freed.as_mut().enable();
            if self.try_take() {
                return true;
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return self.try_take();
            }
        }
    }
}

/// A waiter's registration, undone when it stops waiting (a slot, its deadline, a cancel).
struct Registered<'a>(&'a AtomicUsize);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl HasSlots for Slots {
    fn slots(&self) -> &Slots {
        self
    }
}

// === impl SlotPermit ===

impl<T: HasSlots> SlotPermit<T> {
    /// A slot of `owner`'s now, or `owner` back when none is free.
    pub(crate) fn try_take(owner: Arc<T>) -> Result<Self, Arc<T>> {
        if owner.slots().try_take() {
            Ok(Self { owner })
        } else {
            Err(owner)
        }
    }

    /// A slot of `owner`'s by `deadline` (after [`try_take`](Self::try_take) found none);
    /// `None` when none came by then.
    pub(crate) async fn wait(owner: Arc<T>, deadline: Instant) -> Option<Self> {
        owner.slots().wait(deadline).await.then_some(Self { owner })
    }

    /// The owner of the slot.
    pub(crate) fn owner(&self) -> &T {
        &self.owner
    }
}

impl<T: HasSlots> Drop for SlotPermit<T> {
    fn drop(&mut self) {
        self.owner.slots().give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn slots_are_taken_up_to_the_cap_and_given_back_on_drop() {
        let slots = Arc::new(Slots::new(2));
        let a = SlotPermit::try_take(slots.clone()).unwrap();
        let b = SlotPermit::try_take(slots.clone()).unwrap();
        assert_eq!(slots.in_flight(), 2);
        assert!(SlotPermit::try_take(slots.clone()).is_err());
        drop(a);
        assert_eq!(slots.in_flight(), 1);
        assert!(!slots.is_idle());
        let c = SlotPermit::try_take(slots.clone()).unwrap();
        drop((b, c));
        assert!(slots.is_idle());
        assert!(SlotPermit::try_take(Arc::new(Slots::new(0))).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gets_the_slot_given_back_or_gives_up_at_its_deadline() {
        let slots = Arc::new(Slots::new(1));
        let held = SlotPermit::try_take(slots.clone()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let waiter = tokio::spawn(SlotPermit::wait(slots.clone(), deadline));
        tokio::task::yield_now().await;
        assert_eq!(
            slots.waiting.load(Ordering::SeqCst),
            1,
            "a waiter is registered"
        );
        drop(held);
        let got = waiter.await.unwrap().expect("the slot given back");
        assert_eq!(slots.in_flight(), 1);

        let deadline = Instant::now() + Duration::from_secs(1);
        let started = Instant::now();
        assert!(SlotPermit::wait(slots.clone(), deadline).await.is_none());
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        drop(got);
        assert!(slots.is_idle(), "nobody waits, nothing taken");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_waiters_on_two_threads_never_exceed_the_cap_and_all_finish() {
        let slots = Arc::new(Slots::new(3));
        let peak = Arc::new(AtomicUsize::new(0));
        let deadline = Instant::now() + Duration::from_secs(30);
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (slots, peak) = (slots.clone(), peak.clone());
                tokio::spawn(async move {
                    for _ in 0..20 {
                        let permit = match SlotPermit::try_take(slots.clone()) {
                            Ok(permit) => permit,
                            Err(slots) => SlotPermit::wait(slots, deadline).await?,
                        };
                        peak.fetch_max(slots.in_flight() as usize, Ordering::Relaxed);
                        tokio::task::yield_now().await;
                        drop(permit);
                    }
                    Some(())
                })
            })
            .collect();
        for t in tasks {
            assert!(t.await.unwrap().is_some(), "every waiter got its slots");
        }
        assert!(peak.load(Ordering::Relaxed) <= 3);
        assert!(slots.is_idle());
    }
}
