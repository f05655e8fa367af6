//! The AIMD adaptive concurrency window (seed 002): success adds `increase`, a timeout or an
//! overload multiplies by `decrease_factor`, clamped to `[min, max]`; permits return on drop.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use soulbase_net_core::{ErrorKind, Outcome, Phase};
use soulbase_net_policy::AimdPolicy;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::resilience::retry::status_of;

/// What an outcome says about the upstream's capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// It answered: grow the window.
    Success,
    /// It timed out, refused or shed load: shrink the window.
    Overload,
    /// Nothing about the upstream (a local refusal): leave the window.
    Ignore,
}

/// The signal of an attempt's outcome: any response but 429/5xx is a success; 429, 5xx,
/// timeouts (but the total deadline), connect and I/O errors are overload; the rest (local
/// refusals, DNS, TLS, invalid requests) says nothing about the upstream's capacity.
pub(crate) fn signal(outcome: Outcome) -> Signal {
    if let Some(s) = status_of(outcome) {
        return if s == 429 || (500..600).contains(&s) {
            Signal::Overload
        } else {
            Signal::Success
        };
    }
    match outcome {
        Outcome::Error(ErrorKind::Timeout(p)) if p != Phase::Total => Signal::Overload,
        Outcome::Error(ErrorKind::Connect | ErrorKind::Io) => Signal::Overload,
        _ => Signal::Ignore,
    }
}

/// The window arithmetic, alone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AimdWindow {
    window: f64,
}

impl AimdWindow {
    /// Starts at `initial`, clamped.
    pub(crate) fn new(p: &AimdPolicy) -> Self {
        let mut w = Self {
            window: f64::from(p.initial),
        };
        w.clamp(p);
        w
    }

    /// Calls allowed in flight: the window rounded down, at least `max(min, 1)`.
    pub(crate) fn limit(&self, p: &AimdPolicy) -> u32 {
        let (lo, hi) = bounds(p);
        (self.window as u32).max(lo).min(hi)
    }

    /// Additive increase.
    pub(crate) fn on_success(&mut self, p: &AimdPolicy) {
        self.window += f64::from(p.increase);
        self.clamp(p);
    }

    /// Multiplicative decrease (a factor outside `(0, 1)` counts as 0.5).
    pub(crate) fn on_overload(&mut self, p: &AimdPolicy) {
        let f = p.decrease_factor;
        let f = if f > 0.0 && f < 1.0 { f } else { 0.5 };
        self.window *= f;
        self.clamp(p);
    }

    fn clamp(&mut self, p: &AimdPolicy) {
        let (lo, hi) = bounds(p);
        self.window = self.window.max(f64::from(lo)).min(f64::from(hi));
    }
}

fn bounds(p: &AimdPolicy) -> (u32, u32) {
    let lo = p.min.max(1);
    (lo, p.max.max(lo))
}

/// A shared window with its in-flight count; waiters are woken when a slot frees or the
/// limit moves.
#[derive(Debug)]
pub(crate) struct Aimd {
    state: Mutex<State>,
    freed: Notify,
}

#[derive(Debug)]
struct State {
    window: AimdWindow,
    in_flight: u32,
    /// The limit as of the last acquire or feedback, under the policy given then (for the
    /// gauge, which is read without a policy at hand).
    limit: u32,
    /// Whether a call ever entered: a host's window exists even when AIMD is off.
    used: bool,
    /// Calls waiting for room. Counted under the lock with the check that found none, so a
    /// release that sees zero has no one to wake (and skips `Notify`'s own lock), and one
    /// that sees more wakes them.
    waiting: u32,
}

/// One AIMD concurrency window on its own (seed 002), for work that is not a call through
/// [`Client`](crate::Client) — the probe agent's global, per-kind and per-target windows.
///
/// The window is the client's (the same arithmetic and permits, under an [`AimdPolicy`] whose
/// `enabled` and `scope` are not read): it starts at `initial`, stays within `[min, max]`, a
/// timeout or an error multiplies it by `decrease_factor`, successes add `increase`. Two rules
/// make a window that many concurrent calls share settle rather than swing between its
/// bounds (TCP's congestion avoidance):
///
/// - **one decrease per window**: feedback from a permit taken before the last decrease (a
///   call already in flight when the overload was seen) is not counted, success or failure;
/// - **additive increase per window**: `increase` is added once per `limit` successes (about
///   once a round trip), not at each success.
///
/// A permit is a place in the window, given back when it is dropped or its outcome recorded.
/// Clones share the window.
///
/// # Examples
/// ```
/// use soulbase_net_policy::AimdPolicy;
/// use soulbase_net_runtime::layer::AimdLimit;
///
/// let mut policy = AimdPolicy::default();
/// policy.initial = 2;
/// let limit = AimdLimit::new(policy);
/// let a = limit.try_acquire().unwrap();
/// let b = limit.try_acquire().unwrap();
/// assert!(limit.try_acquire().is_none(), "the window is full");
/// a.record_timeout();
/// assert_eq!(limit.limit(), 1);
/// b.record_timeout(); // in flight before the decrease: not counted again
/// assert_eq!((limit.limit(), limit.in_flight()), (1, 0));
/// ```
#[derive(Clone, Debug)]
pub struct AimdLimit {
    inner: Arc<LimitInner>,
}

#[derive(Debug)]
struct LimitInner {
    aimd: Arc<Aimd>,
    policy: AimdPolicy,
    /// Decreases so far: a permit's feedback counts only if none happened since it was taken.
    epoch: AtomicU64,
    /// Successes counted toward the next increase.
    successes: AtomicU32,
}

/// A place in an [`AimdLimit`]'s window: [`record_success`](Self::record_success),
/// [`record_timeout`](Self::record_timeout) or [`record_error`](Self::record_error) feed the
/// call's outcome back and give the place back; dropped, it gives the place back and counts
/// nothing (a cancelled call).
#[derive(Debug)]
pub struct AimdLimitPermit {
    _permit: AimdPermit,
    limit: Arc<LimitInner>,
    epoch: u64,
}

impl AimdLimit {
    /// A window under `policy`, starting at `policy.initial`.
    pub fn new(policy: AimdPolicy) -> Self {
        Self {
            inner: Arc::new(LimitInner {
                aimd: Arc::new(Aimd::new(&policy)),
                policy,
                epoch: AtomicU64::new(0),
                successes: AtomicU32::new(0),
            }),
        }
    }

    /// A place in the window if there is room now.
    pub fn try_acquire(&self) -> Option<AimdLimitPermit> {
        let permit = self.inner.aimd.try_acquire(&self.inner.policy)?;
        Some(self.permit(permit))
    }

    /// A place in the window, waiting for as long as it takes (drop the future to give up).
    pub async fn acquire(&self) -> AimdLimitPermit {
        loop {
            if let Some(permit) = self.inner.aimd.wait(&self.inner.policy, None).await {
                return self.permit(permit);
            }
        }
    }

    fn permit(&self, permit: AimdPermit) -> AimdLimitPermit {
        AimdLimitPermit {
            _permit: permit,
            limit: self.inner.clone(),
            epoch: self.inner.epoch.load(Ordering::Acquire),
        }
    }

    /// Calls allowed in the window now.
    pub fn limit(&self) -> u32 {
        self.inner.aimd.limit()
    }

    /// Calls in the window now.
    pub fn in_flight(&self) -> u32 {
        self.inner.aimd.in_flight()
    }

    /// The policy the window follows.
    pub fn policy(&self) -> &AimdPolicy {
        &self.inner.policy
    }
}

impl AimdLimitPermit {
    /// The call succeeded: one more success toward the next increase.
    pub fn record_success(self) {
        let l = &self.limit;
        if l.epoch.load(Ordering::Acquire) != self.epoch {
            return;
        }
        let n = l.successes.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= l.aimd.limit() {
            l.successes.store(0, Ordering::Release);
            l.aimd.record(&l.policy, Signal::Success);
        }
    }

    /// The call timed out: the window decreases, unless it did since this permit was taken.
    pub fn record_timeout(self) {
        self.decrease();
    }

    /// The call failed: as [`record_timeout`](Self::record_timeout).
    pub fn record_error(self) {
        self.decrease();
    }

    fn decrease(&self) {
        let l = &self.limit;
        let next = self.epoch.wrapping_add(1);
        if l.epoch
            .compare_exchange(self.epoch, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            l.successes.store(0, Ordering::Release);
            l.aimd.record(&l.policy, Signal::Overload);
        }
    }
}

/// One call inside the window; leaves it on drop (also on cancellation and panic).
#[derive(Debug)]
pub(crate) struct AimdPermit {
    aimd: Arc<Aimd>,
}

impl Aimd {
    /// A window starting at `p.initial`.
    pub(crate) fn new(p: &AimdPolicy) -> Self {
        let window = AimdWindow::new(p);
        Self {
            state: Mutex::new(State {
                limit: window.limit(p),
                window,
                in_flight: 0,
                used: false,
                waiting: 0,
            }),
            freed: Notify::new(),
        }
    }

    /// Enters the window if there is room.
    pub(crate) fn try_acquire(self: &Arc<Self>, p: &AimdPolicy) -> Option<AimdPermit> {
        let mut s = self.state.lock();
        self.enter(&mut s, p)
    }

    /// Enters the window, waiting for room until `deadline` (`None`: no wait).
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        p: &AimdPolicy,
        deadline: Option<Instant>,
    ) -> Option<AimdPermit> {
        let Some(deadline) = deadline else {
            return self.try_acquire(p);
        };
        self.wait(p, Some(deadline)).await
    }

    /// Enters the window, waiting for room until `deadline`, or for as long as it takes
    /// (`None`).
    async fn wait(
        self: &Arc<Self>,
        p: &AimdPolicy,
        deadline: Option<Instant>,
    ) -> Option<AimdPermit> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a slot freed in between is not missed.
            freed.as_mut().enable();
            let waiting = {
                let mut s = self.state.lock();
                if let Some(permit) = self.enter(&mut s, p) {
                    return Some(permit);
                }
                s.waiting += 1;
                Waiting(self)
            };
            let woken = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, freed).await.is_ok(),
                None => {
                    freed.await;
                    true
                }
            };
            drop(waiting);
            if !woken {
                return None;
            }
        }
    }

    /// Takes a place under the lock held as `s`, if the limit leaves one.
    fn enter(self: &Arc<Self>, s: &mut State, p: &AimdPolicy) -> Option<AimdPermit> {
        s.limit = s.window.limit(p);
        s.used = true;
        if s.in_flight >= s.limit {
            return None;
        }
        s.in_flight += 1;
        Some(AimdPermit { aimd: self.clone() })
    }

    /// Wakes the waiters when there are any; `s` is the lock, released first.
    fn wake(&self, s: MutexGuard<'_, State>) {
        let waiting = s.waiting > 0;
        drop(s);
        if waiting {
            self.freed.notify_waiters();
        }
    }

    /// Feeds an outcome back into the window.
    pub(crate) fn record(&self, p: &AimdPolicy, signal: Signal) {
        let mut s = self.state.lock();
        match signal {
            Signal::Success => s.window.on_success(p),
            Signal::Overload => s.window.on_overload(p),
            Signal::Ignore => return,
        }
        s.limit = s.window.limit(p);
        self.wake(s);
    }

    /// The limit as last computed, once a call has entered the window (the gauge).
    pub(crate) fn gauge(&self) -> Option<u32> {
        let s = self.state.lock();
        s.used.then_some(s.limit)
    }

    /// Calls in the window now.
    pub(crate) fn in_flight(&self) -> u32 {
        self.state.lock().in_flight
    }

    /// The limit as last computed, used or not.
    fn limit(&self) -> u32 {
        self.state.lock().limit
    }
}

impl Drop for AimdPermit {
    fn drop(&mut self) {
        let mut s = self.aimd.state.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
        self.aimd.wake(s);
    }
}

/// One caller counted in `waiting` while it waits; uncounted when woken, timed out or
/// cancelled.
struct Waiting<'a>(&'a Aimd);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        s.waiting = s.waiting.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use soulbase_net_core::http::StatusCode;
    use std::time::Duration;

    fn policy() -> AimdPolicy {
        let mut p = AimdPolicy::default();
        p.enabled = true;
        p
    }

    #[test]
    fn halves_on_timeout_and_grows_back() {
        let p = policy(); // 16 in 1..=256, +1, ×0.5
        let mut w = AimdWindow::new(&p);
        assert_eq!(w.limit(&p), 16);
        w.on_overload(&p);
        assert_eq!(w.limit(&p), 8);
        w.on_overload(&p);
        assert_eq!(w.limit(&p), 4);
        for _ in 0..12 {
            w.on_success(&p);
        }
        assert_eq!(w.limit(&p), 16);
        for _ in 0..1_000 {
            w.on_success(&p);
        }
        assert_eq!(w.limit(&p), 256, "clamped to max");
        for _ in 0..100 {
            w.on_overload(&p);
        }
        assert_eq!(w.limit(&p), 1, "clamped to min");
    }

    #[test]
    fn odd_bounds_never_panic() {
        let mut p = policy();
        p.min = 0;
        p.max = 0;
        p.decrease_factor = f64::NAN;
        let mut w = AimdWindow::new(&p);
        w.on_overload(&p);
        assert_eq!(w.limit(&p), 1);
        p.min = 10;
        p.max = 5;
        assert_eq!(w.limit(&p), 10);
    }

    #[test]
    fn permits_fill_the_window_and_return_on_drop() {
        let mut p = policy();
        p.initial = 2;
        let aimd = Arc::new(Aimd::new(&p));
        let a = aimd.try_acquire(&p).unwrap();
        let _b = aimd.try_acquire(&p).unwrap();
        assert!(aimd.try_acquire(&p).is_none());
        assert_eq!(aimd.in_flight(), 2);
        drop(a);
        assert!(aimd.try_acquire(&p).is_some());
        aimd.record(&p, Signal::Success);
        assert_eq!(aimd.state.lock().window.limit(&p), 3);
        assert_eq!(aimd.gauge(), Some(3));
        aimd.record(&p, Signal::Overload);
        assert_eq!(aimd.gauge(), Some(1));
        assert_eq!(Aimd::new(&p).gauge(), None, "no call entered yet");
    }

    /// Polls `fut` once (it registers as a waiter); whether it is still pending.
    fn pending<F: std::future::Future>(fut: std::pin::Pin<&mut F>) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        fut.poll(&mut cx).is_pending()
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_woken_by_a_release_or_a_larger_limit_and_uncounted_after() {
        let mut p = policy();
        p.initial = 1;
        let aimd = Arc::new(Aimd::new(&p));
        let waiting = || aimd.state.lock().waiting;
        let held = aimd.try_acquire(&p).unwrap();
        let far = Instant::now() + Duration::from_secs(3600);
        // A release wakes the waiter, which takes the slot.
        let mut wait = Box::pin(aimd.acquire(&p, Some(far)));
        assert!(pending(wait.as_mut()));
        assert_eq!(waiting(), 1);
        drop(held);
        let held = wait.await.expect("the freed slot");
        assert_eq!(waiting(), 0);
        // A success that raises the limit wakes it too.
        let mut wait = Box::pin(aimd.acquire(&p, Some(far)));
        assert!(pending(wait.as_mut()));
        aimd.record(&p, Signal::Success);
        let _second = wait.await.expect("the room the larger limit made");
        assert_eq!(aimd.in_flight(), 2);
        // A wait that times out, and one cancelled, leave the count as it was.
        let soon = Instant::now() + Duration::from_millis(5);
        assert!(aimd.acquire(&p, Some(soon)).await.is_none());
        let mut wait = Box::pin(aimd.acquire(&p, Some(far)));
        assert!(pending(wait.as_mut()));
        assert_eq!(waiting(), 1);
        drop(wait);
        assert_eq!(waiting(), 0);
        // With nobody waiting, a release has nobody to wake: the count says so.
        drop(held);
        assert_eq!((waiting(), aimd.in_flight()), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_public_limit_decreases_once_per_window_and_grows_once_per_window() {
        let mut p = policy();
        p.initial = 4;
        p.max = 8;
        let limit = AimdLimit::new(p);
        let held: Vec<_> = (0..4).map(|_| limit.try_acquire().unwrap()).collect();
        assert!(limit.try_acquire().is_none());
        // The first timeout halves; the others in flight then do not, nor do their successes.
        let mut held = held.into_iter();
        held.next().unwrap().record_timeout();
        assert_eq!(limit.limit(), 2);
        held.next().unwrap().record_error();
        held.next().unwrap().record_success();
        assert_eq!(limit.limit(), 2);
        // A waiter gets the place the last one gives back.
        let second = limit.try_acquire().unwrap();
        let waiter = limit.acquire();
        tokio::pin!(waiter);
        assert!(pending(waiter.as_mut()));
        drop(held);
        let first = waiter.await;
        // Two successes under a window of 2 make one increase.
        first.record_success();
        assert_eq!(limit.limit(), 2);
        second.record_success();
        assert_eq!(limit.limit(), 3);
        assert_eq!(limit.in_flight(), 0);
        // A permit taken after the decrease counts: a timeout halves again.
        limit.try_acquire().unwrap().record_timeout();
        assert_eq!(limit.limit(), 1);
        assert_eq!(limit.policy().max, 8);
    }

    #[test]
    fn signals() {
        let s = |c: u16| Outcome::Response(StatusCode::from_u16(c).unwrap());
        assert_eq!(signal(s(200)), Signal::Success);
        assert_eq!(signal(s(404)), Signal::Success);
        assert_eq!(signal(s(429)), Signal::Overload);
        assert_eq!(signal(s(503)), Signal::Overload);
        let e = |k| Outcome::Error(k);
        assert_eq!(signal(e(ErrorKind::Timeout(Phase::Ttfb))), Signal::Overload);
        assert_eq!(signal(e(ErrorKind::Connect)), Signal::Overload);
        assert_eq!(signal(e(ErrorKind::Timeout(Phase::Total))), Signal::Ignore);
        assert_eq!(signal(e(ErrorKind::Blocked)), Signal::Ignore);
    }
}
