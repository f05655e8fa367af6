//! The SLO controller (seed 001 §VIII and §X, policy `slo`): per host, the SLIs of the
//! attempts the client makes over a sliding window, and the factors that slow the host down
//! while an SLI is over its target.
//!
//! Why here and not in observe: the runtime never depends on a metrics crate, and what the
//! controller needs — each attempt's outcome and time — the retry loop has in hand. The
//! controller is a state machine taking `now`; the client asks it for a host's [`Factors`]
//! before waiting to retry, before hedging and before taking a limiter slot, and feeds it
//! each attempt.
//!
//! It only ever slows a host down: the backoff factor is ≥ 1, the rate factor ≤ 1, and both
//! go back to 1 — the policy's own values — once the SLIs are healthy again.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use soulbase_net_core::{ErrorKind, GaugeReading, Outcome, Phase};
use soulbase_net_policy::{LimitsPolicy, SloPolicy, MAX_BACKOFF_FACTOR};
use tokio::time::Instant;

use super::limiter::{signal, Signal};
use crate::pruned::PrunedMap;

/// Buckets of the latency histogram: bucket `i` holds times up to `2^(i/4)` ms (19 % wide),
/// the last everything above ~65 s.
const LATENCY_BUCKETS: usize = 64;

/// The per-host controllers of a client.
#[derive(Debug)]
pub(crate) struct SloControllers {
    hosts: Mutex<PrunedMap<HostSlo>>,
}

/// What the controller does to a host now: backoff × `backoff` (≥ 1), rate × `rate` (≤ 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Factors {
    /// Multiplies every wait before a retry, and the delay before each hedged copy.
    pub(crate) backoff: f64,
    /// Thins retries and hedges, and scales the AIMD ceiling and the host rate.
    pub(crate) rate: f64,
}

/// A change of a host's factors, for the `PolicyChange` event.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Change {
    /// The SLI that decided (the breached one, or the one nearest its target).
    pub(crate) sli: &'static str,
    /// Its value over the window.
    pub(crate) value: f64,
    /// Its target.
    pub(crate) target: f64,
    /// Whether it was over the target (the factors tightened).
    pub(crate) breached: bool,
    /// The new factors.
    pub(crate) factors: Factors,
}

/// One attempt, as the controller counts it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    /// Whether it was a retry (not the call's first attempt).
    pub(crate) retry: bool,
    /// How it ended.
    pub(crate) outcome: Outcome,
    /// From its start to its end (the response head, or the failure).
    pub(crate) elapsed: Duration,
}

/// One host's window and factors.
#[derive(Debug)]
struct HostSlo {
    /// The `(interval, window)` the buckets were made for; a reload that changes them
    /// starts the window afresh.
    shape: (Duration, Duration),
    /// Closed buckets, oldest first, at most a window's worth.
    closed: VecDeque<Counts>,
    /// The bucket being filled, and when it started.
    open: Counts,
    open_since: Instant,
    /// Buckets closed since the last decision: a decision needs a whole window of them.
    fresh: usize,
    factors: Factors,
    /// Credit for thinned retries and hedges: each adds the rate factor, one that goes ahead
    /// spends 1.
    credit: f64,
    /// Whether the factors ever moved (only those hosts are reported as gauges).
    moved: bool,
}

/// What one bucket counted.
#[derive(Clone, Debug)]
struct Counts {
    attempts: u32,
    firsts: u32,
    retries: u32,
    timeouts: u32,
    errors: u32,
    latency: [u32; LATENCY_BUCKETS],
}

// === impl Factors ===

impl Factors {
    /// The policy's own values.
    pub(crate) const NONE: Factors = Factors {
        backoff: 1.0,
        rate: 1.0,
    };

    /// Whether these are the policy's own values.
    pub(crate) fn is_none(&self) -> bool {
        self.backoff <= 1.0 && self.rate >= 1.0
    }

    /// `delay × backoff`, saturating; never shorter than `delay`.
    pub(crate) fn stretch(&self, delay: Duration) -> Duration {
        if self.backoff <= 1.0 || !self.backoff.is_finite() {
            return delay;
        }
        Duration::try_from_secs_f64(delay.as_secs_f64() * self.backoff)
            .unwrap_or(Duration::MAX)
            .max(delay)
    }

    /// `limits` with the AIMD ceiling and the host rate scaled by the rate factor (never
    /// below `aimd.min` and 1 request per second); borrowed when nothing changes.
    ///
    /// The limiter carries the host's rate bucket over to the scaled rate (`Gcra::retune`),
    /// so a change of factor never starts it full.
    pub(crate) fn limits<'a>(&self, limits: &'a LimitsPolicy) -> Cow<'a, LimitsPolicy> {
        if self.rate >= 1.0 || (!limits.aimd.enabled && limits.per_host_rate_rps.is_none()) {
            return Cow::Borrowed(limits);
        }
        let scale = |n: u32| (f64::from(n) * self.rate).floor() as u32;
        let mut scaled = limits.clone();
        if scaled.aimd.enabled {
            let a = &mut scaled.aimd;
            a.max = scale(a.max).max(a.min).max(1);
            a.initial = a.initial.min(a.max);
        }
        if let Some(rps) = scaled.per_host_rate_rps {
            scaled.per_host_rate_rps = Some(scale(rps).max(1));
        }
        Cow::Owned(scaled)
    }
}

// === impl SloControllers ===

impl SloControllers {
    /// Controllers for at most `max_keys` hosts at the policy's values (hosts whose factors
    /// have moved are kept beyond it: see [`PrunedMap`]).
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            hosts: Mutex::new(PrunedMap::new(max_keys.max(1))),
        }
    }

    /// The factors for `host` now; the policy's own values when the controller is off.
    pub(crate) fn factors(&self, host: &str, p: &SloPolicy) -> Factors {
        if !p.enabled {
            return Factors::NONE;
        }
        self.hosts
            .lock()
            .map
            .get(host)
            .map_or(Factors::NONE, |h| h.factors)
    }

    /// Whether a retry to `host` that everything else allows may go ahead: all of them at a
    /// rate factor of 1, one in `1 / rate` below it.
    pub(crate) fn admit_retry(&self, host: &str, p: &SloPolicy) -> bool {
        self.admit_extra(host, p)
    }

    /// Whether a hedged copy to `host` that everything else allows may start: thinned like
    /// a retry, and from the same credit, so that retries and hedges together — the attempts
    /// a call adds to the first — are one in `1 / rate` of those the policy would send.
    ///
    /// Why hedges too: a hedge is load on the host like a retry, and while the host is
    /// slowed down it fires more often (its answers are later), just when the host can take
    /// the least.
    pub(crate) fn admit_hedge(&self, host: &str, p: &SloPolicy) -> bool {
        self.admit_extra(host, p)
    }

    /// The thinning of [`admit_retry`](Self::admit_retry) and
    /// [`admit_hedge`](Self::admit_hedge): each extra attempt adds the rate factor to the
    /// host's credit, and one goes ahead when a whole 1 is there to spend.
    fn admit_extra(&self, host: &str, p: &SloPolicy) -> bool {
        if !p.enabled {
            return true;
        }
        let mut hosts = self.hosts.lock();
        let Some(h) = hosts.map.get_mut(host) else {
            return true;
        };
        if h.factors.rate >= 1.0 {
            return true;
        }
        h.credit += h.factors.rate;
        if h.credit >= 1.0 {
            h.credit -= 1.0;
            true
        } else {
            false
        }
    }

    /// Counts an attempt to `host` at `now`; the change of its factors, when the window
    /// slid far enough for a decision and the decision moved them.
    pub(crate) fn record(
        &self,
        host: &str,
        p: &SloPolicy,
        sample: Sample,
        now: Instant,
    ) -> Option<Change> {
        if !p.enabled {
            return None;
        }
        let mut hosts = self.hosts.lock();
        if !hosts.map.contains_key(host) {
            // Hosts back at the policy's values go; those still slowed down stay.
            hosts.make_room(|h| !h.factors.is_none());
        }
        let h = hosts
            .map
            .entry(host.into())
            .or_insert_with(|| HostSlo::new(p, now));
        let change = h.advance(p, now);
        h.open.add(sample);
        change
    }

    /// Calls `visit` with the factors of every host whose factors have moved.
    pub(crate) fn read_gauges(&self, visit: &mut dyn FnMut(GaugeReading<'_>)) {
        for (host, h) in self.hosts.lock().map.iter().filter(|(_, h)| h.moved) {
            visit(GaugeReading::SloFactors {
                host,
                backoff: h.factors.backoff,
                rate: h.factors.rate,
            });
        }
    }
}

// === impl HostSlo ===

impl HostSlo {
    fn new(p: &SloPolicy, now: Instant) -> Self {
        Self {
            shape: (p.interval, p.window),
            closed: VecDeque::new(),
            open: Counts::default(),
            open_since: now,
            fresh: 0,
            factors: Factors::NONE,
            credit: 0.0,
            moved: false,
        }
    }

    /// Buckets in a window.
    fn buckets(p: &SloPolicy) -> usize {
        let n = p.window.as_nanos().div_ceil(p.interval.as_nanos().max(1));
        usize::try_from(n).unwrap_or(usize::MAX).clamp(1, 100_000)
    }

    /// Closes the buckets that ended before `now`, deciding after each once a whole window
    /// has passed since the last decision; the last change made.
    fn advance(&mut self, p: &SloPolicy, now: Instant) -> Option<Change> {
        if self.shape != (p.interval, p.window) {
            let factors = self.factors;
            *self = Self::new(p, now);
            self.factors = clamp(factors, p);
            return None;
        }
        let n = Self::buckets(p);
        // A host idle for this many windows has nothing left to tell: back to the policy.
        let limit = n.saturating_mul(64);
        let mut change = None;
        let mut steps = 0;
        while now.saturating_duration_since(self.open_since) >= p.interval {
            steps += 1;
            if steps > limit {
                let (moved, before) = (self.moved, self.factors);
                *self = Self::new(p, now);
                self.moved = moved;
                if before.is_none() {
                    return change;
                }
                return Some(Change {
                    sli: "retry_rate",
                    value: 0.0,
                    target: p.retry_rate,
                    breached: false,
                    factors: Factors::NONE,
                });
            }
            self.closed.push_back(std::mem::take(&mut self.open));
            if self.closed.len() > n {
                self.closed.pop_front();
            }
            self.open_since += p.interval;
            self.fresh += 1;
            if self.fresh >= n {
                if let Some(c) = self.decide(p) {
                    change = Some(c);
                }
            }
        }
        change
    }

    /// Compares the window's SLIs with their targets and tightens or steps back.
    fn decide(&mut self, p: &SloPolicy) -> Option<Change> {
        let mut total = Counts::default();
        self.closed.iter().for_each(|c| total.merge(c));
        let slis = total.slis(p);
        let enough = total.attempts >= p.min_samples;
        if let Some(&(sli, value, target)) = slis.iter().find(|(_, v, t)| enough && v > t) {
            self.fresh = 0;
            let before = self.factors;
            let t = p.tighten_factor;
            self.factors = clamp(
                Factors {
                    backoff: before.backoff * t,
                    rate: before.rate / t,
                },
                p,
            );
            return self.changed(before, sli, value, target, true);
        }
        if self.factors.is_none() {
            return None;
        }
        self.fresh = 0;
        let before = self.factors;
        let step = p.recover_step;
        self.factors = clamp(
            Factors {
                backoff: before.backoff - step * (p.max_backoff_factor - 1.0),
                rate: before.rate + step,
            },
            p,
        );
        // The SLI nearest its target says how healthy the host is now.
        let nearest = slis
            .iter()
            .max_by(|a, b| share(a.1, a.2).total_cmp(&share(b.1, b.2)))
            .copied()
            .unwrap_or(("retry_rate", 0.0, p.retry_rate));
        self.changed(before, nearest.0, nearest.1, nearest.2, false)
    }

    fn changed(
        &mut self,
        before: Factors,
        sli: &'static str,
        value: f64,
        target: f64,
        breached: bool,
    ) -> Option<Change> {
        if self.factors == before {
            return None;
        }
        self.moved = true;
        if self.factors.rate >= 1.0 {
            self.credit = 0.0;
        }
        Some(Change {
            sli,
            value,
            target,
            breached,
            factors: self.factors,
        })
    }
}

/// The factors within the policy's bounds; within a hair of 1 is 1.
fn clamp(f: Factors, p: &SloPolicy) -> Factors {
    let max_backoff = p.max_backoff_factor.clamp(1.0, MAX_BACKOFF_FACTOR);
    let min_rate = p.min_rate_factor.clamp(f64::MIN_POSITIVE, 1.0);
    let mut backoff = f.backoff.clamp(1.0, max_backoff);
    let mut rate = f.rate.clamp(min_rate, 1.0);
    if backoff - 1.0 < 1e-9 {
        backoff = 1.0;
    }
    if 1.0 - rate < 1e-9 {
        rate = 1.0;
    }
    Factors { backoff, rate }
}

/// How close `value` is to `target` (above 1: over it).
fn share(value: f64, target: f64) -> f64 {
    if target > 0.0 {
        value / target
    } else if value > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

// === impl Counts ===

impl Default for Counts {
    fn default() -> Self {
        Self {
            attempts: 0,
            firsts: 0,
            retries: 0,
            timeouts: 0,
            errors: 0,
            latency: [0; LATENCY_BUCKETS],
        }
    }
}

impl Counts {
    fn add(&mut self, s: Sample) {
        self.attempts = self.attempts.saturating_add(1);
        if s.retry {
            self.retries = self.retries.saturating_add(1);
        } else {
            self.firsts = self.firsts.saturating_add(1);
        }
        if matches!(s.outcome, Outcome::Error(ErrorKind::Timeout(p)) if p != Phase::Total) {
            self.timeouts = self.timeouts.saturating_add(1);
        }
        if signal(s.outcome) == Signal::Overload {
            self.errors = self.errors.saturating_add(1);
        }
        let slot = &mut self.latency[latency_bucket(s.elapsed)];
        *slot = slot.saturating_add(1);
    }

    fn merge(&mut self, o: &Counts) {
        self.attempts = self.attempts.saturating_add(o.attempts);
        self.firsts = self.firsts.saturating_add(o.firsts);
        self.retries = self.retries.saturating_add(o.retries);
        self.timeouts = self.timeouts.saturating_add(o.timeouts);
        self.errors = self.errors.saturating_add(o.errors);
        for (a, b) in self.latency.iter_mut().zip(o.latency.iter()) {
            *a = a.saturating_add(*b);
        }
    }

    /// `(name, value, target)` of each SLI the policy checks, in the seed's order.
    fn slis(&self, p: &SloPolicy) -> Vec<(&'static str, f64, f64)> {
        let per = |n: u32, of: u32| f64::from(n) / f64::from(of.max(1));
        let mut out = vec![
            ("retry_rate", per(self.retries, self.firsts), p.retry_rate),
            (
                "timeout_rate",
                per(self.timeouts, self.attempts),
                p.timeout_rate,
            ),
            (
                "error_ratio",
                per(self.errors, self.attempts),
                p.error_ratio,
            ),
        ];
        if let Some(p99) = p.p99 {
            out.push(("p99", self.p99_ms(), p99.as_secs_f64() * 1e3));
        }
        out
    }

    /// The 99th percentile of the attempts' times, in ms: the upper edge of its bucket.
    fn p99_ms(&self) -> f64 {
        let total: u64 = self.latency.iter().map(|&n| u64::from(n)).sum();
        if total == 0 {
            return 0.0;
        }
        let rank = (total * 99).div_ceil(100);
        let mut seen = 0u64;
        for (i, &n) in self.latency.iter().enumerate() {
            seen += u64::from(n);
            if seen >= rank {
                return bucket_edge_ms(i);
            }
        }
        bucket_edge_ms(LATENCY_BUCKETS - 1)
    }
}

/// The bucket of `d`: the first whose upper edge is at least `d`.
fn latency_bucket(d: Duration) -> usize {
    let ms = d.as_secs_f64() * 1e3;
    if ms <= 1.0 {
        return 0;
    }
    let i = (ms.log2() * 4.0).ceil();
    if i >= (LATENCY_BUCKETS - 1) as f64 {
        LATENCY_BUCKETS - 1
    } else {
        i as usize
    }
}

/// The upper edge of bucket `i`, in ms.
fn bucket_edge_ms(i: usize) -> f64 {
    (i as f64 / 4.0).exp2()
}

#[cfg(test)]
mod tests;
