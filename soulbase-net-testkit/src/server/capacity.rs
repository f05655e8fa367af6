//! [`Capacity`]: an upstream that serves at most so many requests at once, queueing the rest —
//! the load-dependent server behind a retry storm.
//!
//! Why by time and not by connection: a real server keeps working on a request whose client
//! has given up, and hyper's HTTP/1.1 server does not notice a client that closed mid-request
//! either. So a request holds its slot until its service time is over — an instant reckoned
//! when it arrives — whatever happens to its connection.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::reply::Reply;

/// The most slots a capacity has (a larger request is clamped to it).
const MAX_SLOTS: usize = 100_000;

/// The longest service time counted; a longer delay holds its slot this long. A year: no test
/// waits that long, and `Instant` arithmetic stays far from overflow.
const MAX_SERVICE: Duration = Duration::from_secs(365 * 24 * 3600);

/// An upstream's capacity: `slots` workers that the requests of the routes given it
/// ([`Script::capacity`](crate::Script::capacity)) are served by, first come, first served.
///
/// A request takes the slot that frees first and holds it for its *service time* — the
/// [`delay`](Reply::delay) of the reply its inner script picked — from the moment it gets the
/// slot. While every slot is held, a request waits in the queue: its answer comes after its
/// wait plus its service time. A reply without a delay has no service time: it goes as soon
/// as it gets a slot, and frees it at once.
///
/// The slot is held by time, not by connection: a client that gives up (times out, closes,
/// resets) leaves its request holding the slot until its service time is over, as a server
/// that does not know its client left would. That is how a timeout storm becomes a retry
/// storm: the retries queue behind the abandoned originals, wait longer, time out in turn.
///
/// With [`queue_limit`](Self::queue_limit), a request that finds every slot held and the
/// queue full gets the [`overload`](Self::overload) reply at once (default `503`) and holds no
/// slot.
///
/// Clones share the slots: give one capacity to several routes for a server whose routes
/// compete for the same workers. What a reply does after its delay (a [`Gate`](crate::Gate),
/// a slow body) and the time a [forwarded](Reply::forward) request spends upstream are not
/// service time.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use http_body_util::Full;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use soulbase_net_testkit::{Capacity, FaultServer, Reply, Script};
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // One worker, 100 ms a request.
/// let cap = Capacity::new(1);
/// let srv = FaultServer::http1()
///     .route("/work", Script::capacity(&cap, Reply::ok("done").delay(Duration::from_millis(100))))
///     .start()
///     .await?;
/// let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
/// let started = Instant::now();
/// let (a, b) = tokio::join!(
///     client.get(srv.url("/work").parse()?),
///     client.get(srv.url("/work").parse()?),
/// );
/// assert_eq!((a?.status().as_u16(), b?.status().as_u16()), (200, 200));
/// // The second waited for the first: two service times in all.
/// assert!(started.elapsed() >= Duration::from_millis(200));
/// assert_eq!(cap.arrivals(), 2);
/// assert_eq!(cap.peak_queue(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Capacity {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    /// Woken on every arrival, for [`Capacity::wait_for_arrivals`].
    arrived: Notify,
}

#[derive(Debug)]
struct State {
    slots: usize,
    /// When each slot that was ever taken frees, earliest on top; fewer entries than `slots`
    /// means some slot was never taken.
    free_at: BinaryHeap<Reverse<Instant>>,
    /// When each request still waiting gets its slot, earliest first (arrival order: each
    /// takes the earliest-freeing slot, so these never decrease).
    waiting: VecDeque<Instant>,
    queue_limit: Option<usize>,
    overload: Reply,
    arrivals: u64,
    rejected: u64,
    peak_queue: usize,
    max_wait: Duration,
}

/// What the capacity decided for one request.
#[derive(Debug)]
enum Admission {
    /// Served after `wait`, then its service time.
    Served { wait: Duration },
    /// The queue was full: the overload reply instead.
    Rejected(Reply),
}

impl Capacity {
    /// `slots` workers (at least 1, at most 100 000), an unbounded queue.
    pub fn new(slots: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::new(slots)),
                arrived: Notify::new(),
            }),
        }
    }

    /// At most `n` requests wait for a slot; one that finds `n` waiting gets the
    /// [`overload`](Self::overload) reply. Default is no limit.
    pub fn queue_limit(self, n: usize) -> Self {
        self.inner.state.lock().queue_limit = Some(n);
        self
    }

    /// What a request refused by a full queue gets, at once and without a slot. Default is
    /// `503`.
    pub fn overload(self, reply: Reply) -> Self {
        self.inner.state.lock().overload = reply;
        self
    }

    /// How many slots there are.
    pub fn slots(&self) -> usize {
        self.inner.state.lock().slots
    }

    /// Slots held now (by requests being served, whether or not their clients still wait).
    pub fn busy(&self) -> usize {
        let now = Instant::now();
        let st = self.inner.state.lock();
        st.free_at.iter().filter(|Reverse(t)| *t > now).count()
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> usize {
        let now = Instant::now();
        let st = self.inner.state.lock();
        st.waiting.iter().filter(|t| **t > now).count()
    }

    /// Requests that came to this capacity, served or refused.
    pub fn arrivals(&self) -> u64 {
        self.inner.state.lock().arrivals
    }

    /// Requests refused because the queue was full.
    pub fn rejected(&self) -> u64 {
        self.inner.state.lock().rejected
    }

    /// The most requests that waited at once.
    pub fn peak_queue(&self) -> usize {
        self.inner.state.lock().peak_queue
    }

    /// The longest a request waited for its slot.
    pub fn max_wait(&self) -> Duration {
        self.inner.state.lock().max_wait
    }

    /// Waits until at least `n` requests have come to this capacity (and been given their
    /// slot, place in the queue or refusal).
    pub async fn wait_for_arrivals(&self, n: u64) {
        loop {
            let notified = self.inner.arrived.notified();
            tokio::pin!(notified);
            // Registered before the count is read, so an arrival in between still wakes it.
            notified.as_mut().enable();
            if self.arrivals() >= n {
                return;
            }
            notified.await;
        }
    }

    /// `reply` as this capacity serves it to a request arriving now: delayed by the wait for
    /// a slot, or the overload reply.
    pub(crate) fn admit(&self, reply: Reply) -> Reply {
        let service = reply.delay_before_head().unwrap_or_default();
        let decided = self.inner.state.lock().admit(service, Instant::now());
        self.inner.arrived.notify_waiters();
        match decided {
            Admission::Served { wait } if wait.is_zero() => reply,
            Admission::Served { wait } => reply.delay(wait.saturating_add(service)),
            Admission::Rejected(overload) => overload,
        }
    }
}

impl State {
    fn new(slots: usize) -> Self {
        Self {
            slots: slots.clamp(1, MAX_SLOTS),
            free_at: BinaryHeap::new(),
            waiting: VecDeque::new(),
            queue_limit: None,
            overload: Reply::status(503),
            arrivals: 0,
            rejected: 0,
            peak_queue: 0,
            max_wait: Duration::ZERO,
        }
    }

    /// Gives a request of `service` arriving at `now` the slot that frees first.
    fn admit(&mut self, service: Duration, now: Instant) -> Admission {
        self.arrivals += 1;
        while self.waiting.front().is_some_and(|t| *t <= now) {
            self.waiting.pop_front();
        }
        let full = self.free_at.len() >= self.slots;
        let start = match self.free_at.peek() {
            Some(Reverse(t)) if full => (*t).max(now),
            _ => now,
        };
        let wait = start.saturating_duration_since(now);
        if !wait.is_zero() && self.queue_limit.is_some_and(|q| self.waiting.len() >= q) {
            self.rejected += 1;
            return Admission::Rejected(self.overload.clone());
        }
        if full {
            self.free_at.pop();
        }
        self.free_at.push(Reverse(start + service.min(MAX_SERVICE)));
        if !wait.is_zero() {
            self.waiting.push_back(start);
            self.peak_queue = self.peak_queue.max(self.waiting.len());
            self.max_wait = self.max_wait.max(wait);
        }
        Admission::Served { wait }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn waits(st: &mut State, t0: Instant, arrivals: &[(u64, u64)]) -> Vec<Option<u64>> {
        arrivals
            .iter()
            .map(|&(at, service)| match st.admit(ms(service), t0 + ms(at)) {
                Admission::Served { wait } => Some(wait.as_millis() as u64),
                Admission::Rejected(_) => None,
            })
            .collect()
    }

    fn state(slots: usize, queue_limit: Option<usize>) -> State {
        let mut st = State::new(slots);
        st.queue_limit = queue_limit;
        st
    }

    #[test]
    fn first_come_first_served_on_the_slot_that_frees_first() {
        let t0 = Instant::now();
        let mut st = state(2, None);
        // Two slots: the first two go at once (freeing at 100 and 300); the third waits for
        // the one at 100 (and frees it at 200), the fourth for that one again (until 250),
        // the fifth for the fourth's (250), still before the second's (300).
        let got = waits(
            &mut st,
            t0,
            &[(0, 100), (0, 300), (10, 100), (20, 50), (30, 10)],
        );
        assert_eq!(got, [Some(0), Some(0), Some(90), Some(180), Some(220)]);
        assert_eq!((st.peak_queue, st.max_wait), (3, ms(220)));
        // Long after, all slots are free again and nobody waits.
        assert_eq!(waits(&mut st, t0, &[(1000, 10)]), [Some(0)]);
        assert!(st.waiting.is_empty());
    }

    #[test]
    fn a_slot_is_held_for_the_service_time_whoever_left() {
        let t0 = Instant::now();
        let mut st = state(1, None);
        // Nothing tells the capacity that the first client gave up at 50: the second, at 60,
        // still waits until 400.
        assert_eq!(
            waits(&mut st, t0, &[(0, 400), (60, 0)]),
            [Some(0), Some(340)]
        );
    }

    #[test]
    fn a_full_queue_refuses_without_taking_a_slot() {
        let t0 = Instant::now();
        let mut st = state(1, Some(1));
        let got = waits(&mut st, t0, &[(0, 100), (1, 100), (2, 100), (150, 10)]);
        // The third finds one waiting: refused; the fourth (at 150) waits for the second's
        // slot (free at 200), not for a third service time.
        assert_eq!(got, [Some(0), Some(99), None, Some(50)]);
        assert_eq!((st.arrivals, st.rejected), (4, 1));
    }

    #[test]
    fn no_service_time_frees_the_slot_at_once() {
        let t0 = Instant::now();
        let mut st = state(1, None);
        assert_eq!(waits(&mut st, t0, &[(0, 0), (0, 0), (0, 0)]), [Some(0); 3]);
        // A huge service time is clamped, never an overflow.
        let mut st = state(1, None);
        assert!(matches!(
            st.admit(Duration::MAX, t0),
            Admission::Served { wait } if wait.is_zero()
        ));
        assert!(matches!(
            st.admit(ms(0), t0 + ms(1)),
            Admission::Served { wait } if wait == MAX_SERVICE - ms(1)
        ));
    }
}
