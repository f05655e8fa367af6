//! [`Script`]: which [`Reply`] a route gives on its n-th hit — fixed sequences, seeded random
//! faults, or a closure.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use super::capacity::Capacity;
use super::capture::CapturedRequest;
use super::reply::Reply;

type Handler = Arc<dyn Fn(&CapturedRequest) -> Reply + Send + Sync>;

#[derive(Clone)]
enum Step {
    Fixed(Reply),
    Random(RandomFaults),
    Handler(Handler),
    /// The inner script's replies, served by a capacity.
    Capacity(Capacity, Box<Script>),
}

impl fmt::Debug for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Fixed(r) => f.debug_tuple("Fixed").field(r).finish(),
            Step::Random(r) => f.debug_tuple("Random").field(r).finish(),
            Step::Handler(_) => f.write_str("Handler(..)"),
            Step::Capacity(c, s) => f.debug_tuple("Capacity").field(c).field(s).finish(),
        }
    }
}

/// The replies of one route, hit after hit: a sequence of steps, each used a number of times
/// ([`Script::times`]); the last step repeats forever.
///
/// A [`Reply`] converts into a script that always gives that reply.
///
/// # Examples
/// ```
/// use soulbase_net_testkit::{RandomFaults, Reply, Script};
///
/// // 503 twice (with Retry-After), then 200 "hi" forever.
/// let flaky = Script::reply(Reply::status(503).header("retry-after", "1"))
///     .times(2)
///     .then(Reply::ok("hi"));
/// // The same, shorter.
/// let flaky2 = Script::status(503).times(2).then(Reply::ok("hi"));
/// // 30 % of hits reset the connection, decided by a seeded generator.
/// let lossy = Script::random(RandomFaults::seeded(7).fault(0.3, Reply::reset()).otherwise(Reply::ok("ok")));
/// # let _ = (flaky, flaky2, lossy);
/// ```
#[derive(Clone, Debug)]
pub struct Script {
    steps: Vec<(Step, Option<u64>)>,
}

impl From<Reply> for Script {
    fn from(r: Reply) -> Self {
        Script::reply(r)
    }
}

impl From<RandomFaults> for Script {
    fn from(r: RandomFaults) -> Self {
        Script::random(r)
    }
}

impl Script {
    /// Always `reply` (until [`Script::times`] limits it).
    pub fn reply(reply: Reply) -> Self {
        Self {
            steps: vec![(Step::Fixed(reply), None)],
        }
    }

    /// Always [`Reply::status`]`(code)`.
    pub fn status(code: u16) -> Self {
        Self::reply(Reply::status(code))
    }

    /// Replies drawn from `faults` (a seeded generator: the same seed gives the same sequence).
    pub fn random(faults: RandomFaults) -> Self {
        Self {
            steps: vec![(Step::Random(faults), None)],
        }
    }

    /// `p_drop` of the hits reset the connection ([`Reply::reset`]); the others get `ok`.
    pub fn p_drop(seed: u64, p_drop: f64, ok: Reply) -> Self {
        Self::random(
            RandomFaults::seeded(seed)
                .fault(p_drop, Reply::reset())
                .otherwise(ok),
        )
    }

    /// Calls `f` with each request and sends what it returns. A panic in `f` is caught by the
    /// server and re-raised by [`FaultServer::join`](crate::FaultServer::join).
    pub fn respond_with<F>(f: F) -> Self
    where
        F: Fn(&CapturedRequest) -> Reply + Send + Sync + 'static,
    {
        Self {
            steps: vec![(Step::Handler(Arc::new(f)), None)],
        }
    }

    /// `inner`'s replies, served by `capacity`: each hit waits for a slot and holds it for its
    /// reply's [`delay`](Reply::delay), even after its client has gone (see [`Capacity`]).
    /// The hit index `inner` sees is the route's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use soulbase_net_testkit::{Capacity, RandomFaults, Reply, Script};
    ///
    /// // 20 workers; 30 % of the requests take them 1 s, the rest 10 ms.
    /// let cap = Capacity::new(20);
    /// let busy = Script::capacity(
    ///     &cap,
    ///     RandomFaults::seeded(7)
    ///         .fault(0.3, Reply::ok("slow").delay(Duration::from_secs(1)))
    ///         .otherwise(Reply::ok("ok").delay(Duration::from_millis(10))),
    /// );
    /// # let _ = busy;
    /// ```
    pub fn capacity(capacity: &Capacity, inner: impl Into<Script>) -> Self {
        Self {
            steps: vec![(
                Step::Capacity(capacity.clone(), Box::new(inner.into())),
                None,
            )],
        }
    }

    /// Uses the last step only `n` times before moving to the next (default: forever).
    pub fn times(mut self, n: u64) -> Self {
        if let Some(last) = self.steps.last_mut() {
            last.1 = Some(n);
        }
        self
    }

    /// Appends a step; combine with [`Script::times`] on the step before it.
    pub fn then(self, next: impl Into<Script>) -> Self {
        let mut this = self;
        this.steps.extend(next.into().steps);
        this
    }

    /// The reply for the hit with 0-based index `hit`.
    pub(crate) fn pick(&self, hit: u64, req: &CapturedRequest) -> Reply {
        let mut start = 0u64;
        let mut chosen = None;
        for (i, (step, times)) in self.steps.iter().enumerate() {
            let last = i + 1 == self.steps.len();
            match times {
                Some(n) if !last && hit >= start.saturating_add(*n) => {
                    start = start.saturating_add(*n);
                }
                _ => {
                    chosen = Some(step);
                    break;
                }
            }
        }
        match chosen {
            Some(Step::Fixed(r)) => r.clone(),
            Some(Step::Random(r)) => r.pick(hit, req),
            Some(Step::Handler(f)) => f(req),
            Some(Step::Capacity(c, inner)) => c.admit(inner.pick(hit, req)),
            None => Reply::status(404),
        }
    }
}

/// Seeded random faults: each hit draws a number in `[0, 1)` from a SplitMix64 generator keyed
/// by the seed and the hit index, so the n-th hit of a route always gets the same reply for the
/// same seed, whatever the timing. Faults are checked in the order given, each taking its
/// probability of the unit interval; the rest gets the `otherwise` reply (default `200 OK`).
///
/// With [`RandomFaults::per_request`], each logical request draws from a stream of its own
/// (keyed by a header its every copy carries), so which attempt meets which draw no longer
/// depends on how concurrent callers interleave: the k-th copy of a request always gets the
/// same reply for the same seed and header value.
#[derive(Clone, Debug)]
pub struct RandomFaults {
    seed: u64,
    faults: Vec<(f64, Reply)>,
    otherwise: Reply,
    streams: Option<Streams>,
}

/// Per-request draw streams: the header that names the stream, and how many hits each stream
/// has had (shared by the clones of one script).
#[derive(Clone, Debug)]
struct Streams {
    header: http::HeaderName,
    hits: Arc<Mutex<HashMap<Vec<u8>, u64>>>,
}

impl RandomFaults {
    /// No faults yet; `otherwise` is `200 OK`.
    pub fn seeded(seed: u64) -> Self {
        Self {
            seed,
            faults: Vec::new(),
            otherwise: Reply::default(),
            streams: None,
        }
    }

    /// With probability `p` (clamped to `[0, 1]`), send `reply`.
    pub fn fault(mut self, p: f64, reply: Reply) -> Self {
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        self.faults.push((p, reply));
        self
    }

    /// The reply when no fault is drawn. Default is `200 OK`.
    pub fn otherwise(mut self, reply: Reply) -> Self {
        self.otherwise = reply;
        self
    }

    /// Draws per request instead of per route hit: a request carrying `header` draws from the
    /// stream named by the header's value, its k-th copy (retry, hedge) taking that stream's
    /// k-th number. Requests without the header draw by route hit as before.
    ///
    /// ```
    /// use soulbase_net_testkit::{RandomFaults, Reply};
    ///
    /// // Each request sends `x-stream: <its own id>` on every attempt.
    /// let lossy = RandomFaults::seeded(7)
    ///     .per_request("x-stream")
    ///     .fault(0.3, Reply::reset())
    ///     .otherwise(Reply::ok("ok"));
    /// assert_eq!(lossy.draw_for(b"17", 0), lossy.draw_for(b"17", 0));
    /// assert_ne!(lossy.draw_for(b"17", 0), lossy.draw_for(b"18", 0));
    /// ```
    ///
    /// # Panics
    /// If `header` is not a valid header name (a test's own constant).
    #[allow(clippy::expect_used, reason = "a test's own constant header name")]
    pub fn per_request(mut self, header: &str) -> Self {
        let header = http::HeaderName::from_bytes(header.as_bytes())
            .expect("RandomFaults::per_request: not a valid header name");
        self.streams = Some(Streams {
            header,
            hits: Arc::default(),
        });
        self
    }

    /// The number in `[0, 1)` drawn for hit `hit`.
    pub fn draw(&self, hit: u64) -> f64 {
        unit(splitmix64(self.seed.wrapping_add(
            hit.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        )))
    }

    /// The number in `[0, 1)` drawn for the `k`-th (0-based) copy of the request whose stream
    /// header is `stream`.
    pub fn draw_for(&self, stream: &[u8], k: u64) -> f64 {
        // FNV-1a over the stream name, then mixed with the seed and the copy index.
        let name = stream.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01B3)
        });
        let key = splitmix64(self.seed ^ splitmix64(name));
        unit(splitmix64(key.wrapping_add(
            k.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        )))
    }

    fn pick(&self, hit: u64, req: &CapturedRequest) -> Reply {
        let keyed = self.streams.as_ref().and_then(|s| {
            let stream = req.headers.get(&s.header)?.as_bytes();
            let mut hits = s.hits.lock();
            let k = hits.entry(stream.to_vec()).or_insert(0);
            let this = *k;
            *k += 1;
            Some(self.draw_for(stream, this))
        });
        let u = keyed.unwrap_or_else(|| self.draw(hit));
        let mut acc = 0.0;
        for (p, reply) in &self.faults {
            acc += p;
            if u < acc {
                return reply.clone();
            }
        }
        self.otherwise.clone()
    }
}

/// The top 53 bits of `x` as a number in `[0, 1)`.
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// The SplitMix64 finaliser (Steele, Lea, Flood 2014).
pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_uniform_enough() {
        let r = RandomFaults::seeded(1);
        let n = 100_000;
        let below: usize = (0..n).filter(|i| r.draw(*i) < 0.3).count();
        let rate = below as f64 / n as f64;
        assert!((rate - 0.3).abs() < 0.01, "{rate}");
        assert!((0..n).all(|i| (0.0..1.0).contains(&r.draw(i))));
        let streams = (0..n).filter(|i| r.draw_for(i.to_string().as_bytes(), 1) < 0.3);
        let rate = streams.count() as f64 / n as f64;
        assert!((rate - 0.3).abs() < 0.01, "{rate}");
    }
}
