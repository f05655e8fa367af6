//! The attempt's first-byte timer, reused across attempts on a thread instead of made anew.
//!
//! A new `tokio::time::Sleep` costs, per attempt, its creation (a runtime handle), its
//! registration in the runtime's timer wheel (a lock and an insert) and, when it is dropped
//! before it fires (the answer came first, nearly always), its removal (the lock again):
//! about 600 instructions per request, measured over HTTP/1.1, where the whole request costs
//! about 27 000. A timer already registered and moved to a later deadline is cheap instead:
//! tokio records the later deadline with one atomic operation and leaves the wheel alone
//! until the earlier one comes, when it files the timer again at the later one (this is what
//! makes `Sleep::reset` to a later deadline cheap for everyone who resets a timeout).
//!
//! So a timer that is no longer needed goes back to a small per-thread stack, still
//! registered at its deadline, and the next attempt on that thread takes it and resets it.
//! - Timers belong to the runtime that made them: the stack remembers which, and an attempt
//!   of another runtime (a thread that ran a runtime, dropped it and started another) empties
//!   it and makes a new one. Runtime ids are never reused. Until then (or until the thread
//!   ends), the idle timers of a dropped runtime keep its handle's memory, one runtime's at
//!   most per thread.
//! - An idle timer still holds the waker of the last task that polled it. If its deadline
//!   comes before anyone takes it, the runtime wakes that task once for nothing (a spurious
//!   wake every future tolerates) and drops the waker; so an idle timer keeps a finished
//!   task's memory at most until its deadline.
//! - Under a paused clock (`tokio::time::pause`), an idle timer is one more timer the runtime
//!   may auto-advance to while it waits, at most until that deadline; nothing runs then.

use std::{
    cell::RefCell,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::{
    runtime::{Handle, Id},
    time::{Instant, Sleep},
};

/// How many idle timers a thread keeps: enough for the attempts one thread finishes between
/// two it starts under load; more would only hold registrations nobody takes.
const KEPT: usize = 64;

/// The idle timers of this thread, all of the runtime `runtime`.
struct Idle {
    runtime: Option<Id>,
    timers: Vec<Pin<Box<Sleep>>>,
}

thread_local! {
    static IDLE: RefCell<Idle> = const {
        RefCell::new(Idle {
            runtime: None,
            timers: Vec::new(),
        })
    };
}

/// A timer set to a deadline, polled like a `Sleep`; dropped, it goes back to its thread's
/// idle timers (see the module's docs).
pub(super) struct Timer {
    sleep: Option<Pin<Box<Sleep>>>,
    runtime: Option<Id>,
}

impl Timer {
    /// A timer that fires at `deadline`: an idle one of this thread and runtime, reset, or a
    /// new one. Like `tokio::time::sleep_until`, it needs a runtime with timers enabled.
    pub(super) fn at(deadline: Instant) -> Self {
        let runtime = Handle::try_current().ok().map(|handle| handle.id());
        let reused = runtime.and_then(|id| {
            IDLE.try_with(|idle| {
                let mut idle = idle.try_borrow_mut().ok()?;
                if idle.runtime != Some(id) {
                    // Another runtime's timers: of no use here, and their runtime may be gone.
                    idle.timers.clear();
                    idle.runtime = Some(id);
                }
                idle.timers.pop()
            })
            .ok()
            .flatten()
        });
        let sleep = match reused {
            Some(mut sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        Timer {
            sleep: Some(sleep),
            runtime,
        }
    }

    /// Moves the deadline (cheap when it is later than the one registered).
    pub(super) fn reset(&mut self, deadline: Instant) {
        if let Some(sleep) = &mut self.sleep {
            sleep.as_mut().reset(deadline);
        }
    }
}

impl Future for Timer {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut().poll(cx),
            // Only `drop` takes the timer out.
            None => Poll::Ready(()),
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        let (Some(sleep), Some(runtime)) = (self.sleep.take(), self.runtime) else {
            return;
        };
        // Not polled here: its runtime may be shutting down, and the waker it holds goes at
        // its deadline or at its next reset and poll.
        let _kept = IDLE.try_with(|idle| {
            if let Ok(mut idle) = idle.try_borrow_mut() {
                if idle.runtime == Some(runtime) && idle.timers.len() < KEPT {
                    idle.timers.push(sleep);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn idle() -> usize {
        IDLE.with(|idle| idle.borrow().timers.len())
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_timer_is_taken_again_and_fires_at_its_new_deadline() {
        let start = Instant::now();
        let first = Timer::at(start + Duration::from_secs(10));
        drop(first);
        assert_eq!(idle(), 1);
        // Taken again with an earlier deadline (the slow path) and a later one (the cheap one).
        let mut timer = Timer::at(start + Duration::from_secs(3));
        assert_eq!(idle(), 0);
        (&mut timer).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        timer.reset(Instant::now() + Duration::from_secs(20));
        (&mut timer).await;
        assert_eq!(start.elapsed(), Duration::from_secs(23));
        drop(timer);
        let timer = Timer::at(Instant::now() + Duration::from_secs(40));
        timer.await;
        assert_eq!(start.elapsed(), Duration::from_secs(63));
    }

    #[test]
    fn another_runtime_never_takes_this_ones_timers() {
        let one = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        one.block_on(async {
            drop(Timer::at(Instant::now() + Duration::from_secs(5)));
        });
        assert_eq!(idle(), 1);
        drop(one);
        let two = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        two.block_on(async {
            let start = Instant::now();
            // The first runtime's timer is dropped, not reset: a new one fires on time.
            let timer = Timer::at(start + Duration::from_secs(2));
            assert_eq!(idle(), 0);
            timer.await;
            assert_eq!(start.elapsed(), Duration::from_secs(2));
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_thread_keeps_at_most_its_share_of_idle_timers() {
        let at = Instant::now() + Duration::from_secs(1);
        let timers: Vec<Timer> = (0..KEPT + 10).map(|_| Timer::at(at)).collect();
        drop(timers);
        assert_eq!(idle(), KEPT);
    }
}
