//! The AIMD adaptive concurrency window (seed 002): success adds `increase`, a timeout or an
//! overload multiplies by `decrease_factor`, clamped to `[min, max]`; permits return on drop.

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
            let woken = tokio::time::timeout_at(deadline, freed).await.is_ok();
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
