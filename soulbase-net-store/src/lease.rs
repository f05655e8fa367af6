//! The lease discipline: how every claim in the workspace is held — an outbox item a worker
//! delivers, an idempotency key a call is sending under, and any claim the systems built on
//! these stores make.
//!
//! 1. **Fenced.** A claim carries a token drawn when it was taken (the outbox's `claim_id`, the
//!    dedup marker's value). Whatever changes the claimed thing — an acknowledgement, a
//!    reschedule, a dead letter, an extension, a release — is conditional on that token, so a
//!    holder whose lease ran out and was taken over changes nothing.
//! 2. **Timed on the store's clock.** A lease's end is computed where it is kept: PostgreSQL's
//!    `clock_timestamp()` and SQLite's time in the outbox's statements, Redis's own expiry
//!    (`PX`, `PEXPIRE`) for a marker. The instances' clocks never decide who holds what.
//! 3. **Short, and extended while the work runs.** A lease lasts seconds, not minutes; a live
//!    holder extends it every half lease ([`Lease::renew_every`]) — one late or lost extension
//!    never lets it lapse — so a killed holder's claims come back within one lease.
//! 4. **Bounded by the work's deadline.** Extensions stop at the deadline of the work they
//!    cover (a call's total timeout, an outbox delivery's time limit): a holder stuck past it
//!    stops holding.
//!
//! [`Heartbeat`] runs 3 and 4 for one claim; the outbox runs one heartbeat for everything it
//! holds (one statement extends a batch).
//!
//! A *rate lease* — tokens a client takes from a shared bucket ahead of use — is a different
//! holding: spent, never extended, and never returned; its time bound is the instance's own.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::StoreError;

/// How long a claim holds without news from its holder.
///
/// ```
/// use std::time::Duration;
/// use soulbase_net_store::lease::Lease;
///
/// let lease = Lease::new(Duration::from_secs(10));
/// assert_eq!(lease.renew_every(), Duration::from_secs(5));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    ttl: Duration,
}

impl Lease {
    /// A lease of `ttl` (at least 2 ms, so that it can be renewed at half of it).
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl: ttl.max(Duration::from_millis(2)),
        }
    }

    /// How long it holds.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How often a live holder extends it: every half lease.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 2
    }
}

/// Extends a claim's lease (or a batch of claims') every half lease until it is dropped, the
/// deadline of the work passes, or the store says the claim is no longer this holder's.
///
/// `extend` is the store's fenced extension: `Ok(true)` while the claim is still this
/// holder's, `Ok(false)` once it is not (taken over, released, or expired: the heartbeat
/// stops, [`lost`](Self::lost) says so), `Err` when the store did not answer (the next beat
/// tries again; the lease is long enough for one miss).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::{sync::{Arc, atomic::{AtomicU32, Ordering}}, time::Duration};
/// use soulbase_net_store::lease::{Heartbeat, Lease};
///
/// let beats = Arc::new(AtomicU32::new(0));
/// let counted = beats.clone();
/// let deadline = Some(tokio::time::Instant::now() + Duration::from_millis(100));
/// let heartbeat = Heartbeat::start(Lease::new(Duration::from_millis(20)), deadline, move || {
///     counted.fetch_add(1, Ordering::Relaxed);
///     async { Ok(true) }
/// });
/// tokio::time::sleep(Duration::from_millis(200)).await;
/// // Every 10 ms until the deadline, then no more.
/// let n = beats.load(Ordering::Relaxed);
/// assert!((1..=10).contains(&n), "{n} beats");
/// assert!(!heartbeat.lost());
/// # }
/// ```
#[derive(Debug)]
pub struct Heartbeat {
    task: tokio::task::JoinHandle<()>,
    lost: Arc<AtomicBool>,
}

impl Heartbeat {
    /// Starts extending with `extend` every `lease.renew_every()` until `deadline` (`None`:
    /// until dropped, for a holder whose work has no deadline of its own, like an outbox's
    /// batch of claims, each bounded by its delivery's). Needs a Tokio runtime.
    pub fn start<F, Fut>(lease: Lease, deadline: Option<Instant>, mut extend: F) -> Self
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool, StoreError>> + Send + 'static,
    {
        let lost = Arc::new(AtomicBool::new(false));
        let flag = lost.clone();
        let task = tokio::spawn(async move {
            let mut next = Instant::now() + lease.renew_every();
            while deadline.is_none_or(|d| next < d) {
                tokio::time::sleep_until(next).await;
                // After a stall, one beat now and the next a half lease on: no burst.
                next = (next + lease.renew_every()).max(Instant::now());
                match extend().await {
                    Ok(true) | Err(_) => {}
                    Ok(false) => {
                        flag.store(true, Ordering::Release);
                        return;
                    }
                }
            }
        });
        Self { task, lost }
    }

    /// Whether the store said the claim was no longer this holder's.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_beats_every_half_lease_until_the_deadline() {
        let beats = Arc::new(AtomicU32::new(0));
        let counted = beats.clone();
        let lease = Lease::new(Duration::from_secs(10));
        let heartbeat = Heartbeat::start(lease, Some(Instant::now() + Duration::from_secs(60)), {
            move || {
                counted.fetch_add(1, Ordering::Relaxed);
                async { Ok(true) }
            }
        });
        tokio::time::sleep(Duration::from_secs(26)).await;
        assert_eq!(beats.load(Ordering::Relaxed), 5, "at 5, 10, 15, 20, 25 s");
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert_eq!(beats.load(Ordering::Relaxed), 11, "none at or past 60 s");
        assert!(!heartbeat.lost());
    }

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_stops_when_the_claim_is_lost_and_when_dropped() {
        let beats = Arc::new(AtomicU32::new(0));
        let counted = beats.clone();
        let lease = Lease::new(Duration::from_secs(2));
        let far = None;
        let heartbeat = Heartbeat::start(lease, far, move || {
            let n = counted.fetch_add(1, Ordering::Relaxed);
            async move {
                match n {
                    0 => Err(StoreError::new("redis did not answer", None)),
                    1 => Ok(true),
                    _ => Ok(false),
                }
            }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            beats.load(Ordering::Relaxed),
            3,
            "a failure, a hold, a loss"
        );
        assert!(heartbeat.lost());

        let beats = Arc::new(AtomicU32::new(0));
        let counted = beats.clone();
        let heartbeat = Heartbeat::start(lease, far, move || {
            counted.fetch_add(1, Ordering::Relaxed);
            async { Ok(true) }
        });
        tokio::time::sleep(Duration::from_millis(2500)).await;
        drop(heartbeat);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(beats.load(Ordering::Relaxed), 2, "none after the drop");
    }
}
