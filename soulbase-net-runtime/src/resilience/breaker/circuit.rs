//! One circuit's state machine: Closed → Open → HalfOpen → Closed | Open, on an injected clock.

use std::time::Duration;

use soulbase_net_core::{BreakerState, ErrorKind, NetError};
use soulbase_net_policy::CircuitBreakerPolicy;
use tokio::time::Instant;

use crate::resilience::keymap::Evictable;
use crate::resilience::window::{Buckets, Tally};

/// The breaker of one key (host, or host and tenant).
#[derive(Debug)]
pub(crate) struct Circuit {
    /// Unique among the circuits of a registry, so a permit outliving an evicted circuit
    /// cannot touch its successor.
    id: u64,
    /// Bumped on every transition: results of calls admitted in an earlier state are ignored.
    generation: u64,
    state: State,
    window: Buckets<Calls>,
    consecutive: u32,
}

#[derive(Clone, Copy, Debug)]
enum State {
    Closed,
    Open {
        until: Instant,
    },
    HalfOpen {
        issued: u32,
        succeeded: u32,
        failed: u32,
    },
}

#[derive(Clone, Copy, Debug, Default)]
struct Calls {
    total: u32,
    failed: u32,
    slow: u32,
}

impl Tally for Calls {
    fn add(&mut self, other: &Self) {
        self.total = self.total.saturating_add(other.total);
        self.failed = self.failed.saturating_add(other.failed);
        self.slow = self.slow.saturating_add(other.slow);
    }
}

/// What an admitted call holds, to record its result against the right circuit and state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    id: u64,
    generation: u64,
    /// A half-open probe (its result decides the circuit) rather than a normal call.
    pub(crate) probe: bool,
}

/// A call the breaker refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rejected {
    /// `Open`, or `HalfOpen` when every probe is already out.
    pub(crate) state: BreakerState,
    /// When the circuit will admit again: the rest of the cooldown while open; `None` while
    /// half-open, where it depends on the probes.
    pub(crate) retry_after: Option<Duration>,
}

/// A change of state, for the `BreakerTransition` event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Transition {
    /// The state left.
    pub(crate) from: BreakerState,
    /// The state entered.
    pub(crate) to: BreakerState,
}

/// How a call ended, as far as the breaker cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallResult {
    /// Whether it failed (see [`is_failure`](super::is_failure)).
    pub(crate) failure: bool,
    /// How long it took, for the slow-call rule.
    pub(crate) elapsed: Duration,
}

// === impl Circuit ===

impl Circuit {
    /// A closed circuit with an empty window, starting at `now`.
    pub(crate) fn new(id: u64, p: &CircuitBreakerPolicy, now: Instant) -> Self {
        Self {
            id,
            generation: 0,
            state: State::Closed,
            window: Buckets::new(p.window, now),
            consecutive: 0,
        }
    }

    /// The state at `now` (an open circuit whose cooldown is over reads as half-open).
    pub(crate) fn state(&self, now: Instant) -> BreakerState {
        match self.state {
            State::Closed => BreakerState::Closed,
            State::Open { until } if now < until => BreakerState::Open,
            State::Open { .. } | State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Lets a call through, or refuses it. Open past its cooldown becomes half-open here
    /// (the transition is returned), and half-open lets exactly `half_open_probes` probes out.
    pub(crate) fn admit(
        &mut self,
        p: &CircuitBreakerPolicy,
        now: Instant,
    ) -> (Result<Ticket, Rejected>, Option<Transition>) {
        let mut transition = None;
        if let State::Open { until } = self.state {
            if now < until {
                let rejected = Rejected {
                    state: BreakerState::Open,
                    retry_after: Some(until - now),
                };
                return (Err(rejected), None);
            }
            transition = self.enter(State::HalfOpen {
                issued: 0,
                succeeded: 0,
                failed: 0,
            });
        }
        let admitted = match self.state {
            State::HalfOpen {
                issued,
                succeeded,
                failed,
            } => {
                if issued >= p.half_open_probes.max(1) {
                    Err(Rejected {
                        state: BreakerState::HalfOpen,
                        retry_after: None,
                    })
                } else {
                    self.state = State::HalfOpen {
                        issued: issued + 1,
                        succeeded,
                        failed,
                    };
                    Ok(self.ticket(true))
                }
            }
            _ => Ok(self.ticket(false)),
        };
        (admitted, transition)
    }

    /// Records the result of a call admitted with `ticket`. Results from an earlier state
    /// (or another circuit) are ignored.
    pub(crate) fn record(
        &mut self,
        p: &CircuitBreakerPolicy,
        ticket: Ticket,
        result: CallResult,
        now: Instant,
    ) -> Option<Transition> {
        if !self.owns(ticket) {
            return None;
        }
        let slow = p
            .slow_call
            .as_ref()
            .is_some_and(|s| result.elapsed >= s.threshold);
        match self.state {
            State::Closed => self.record_closed(p, result.failure, slow, now),
            State::HalfOpen { .. } => self.record_probe(p, !(result.failure || slow), now),
            State::Open { .. } => None,
        }
    }

    /// A call that ended without saying anything of the upstream's health: its caller
    /// cancelled it (the permit dropped), or the server provably did not process it (GOAWAY,
    /// a refused stream). Neither is the upstream's fault nor proof it recovered: a normal
    /// call is ignored, and a probe gives its slot back so that the next call probes instead.
    pub(crate) fn release(&mut self, ticket: Ticket) {
        if !ticket.probe || !self.owns(ticket) {
            return;
        }
        if let State::HalfOpen { issued, .. } = &mut self.state {
            *issued = issued.saturating_sub(1);
        }
    }

    /// A probe's result: the circuit closes once `half_open_success_ratio` of the probes
    /// succeeded, and opens again as soon as too many failed for that to happen.
    fn record_probe(
        &mut self,
        p: &CircuitBreakerPolicy,
        success: bool,
        now: Instant,
    ) -> Option<Transition> {
        let State::HalfOpen {
            issued,
            succeeded,
            failed,
        } = self.state
        else {
            return None;
        };
        let probes = p.half_open_probes.max(1);
        let needed = probes_needed(p);
        let (succeeded, failed) = if success {
            (succeeded.saturating_add(1), failed)
        } else {
            (succeeded, failed.saturating_add(1))
        };
        if succeeded >= needed {
            return self.enter(State::Closed);
        }
        if failed > probes - needed {
            return self.trip(p, now);
        }
        self.state = State::HalfOpen {
            issued,
            succeeded,
            failed,
        };
        None
    }

    fn record_closed(
        &mut self,
        p: &CircuitBreakerPolicy,
        failure: bool,
        slow: bool,
        now: Instant,
    ) -> Option<Transition> {
        self.window.reconfigure(p.window, now);
        let call = Calls {
            total: 1,
            failed: u32::from(failure),
            slow: u32::from(slow),
        };
        self.window.add(now, call);
        self.consecutive = if failure {
            self.consecutive.saturating_add(1)
        } else {
            0
        };
        if self.should_trip(p, now) {
            return self.trip(p, now);
        }
        None
    }

    fn should_trip(&mut self, p: &CircuitBreakerPolicy, now: Instant) -> bool {
        if p.consecutive_failures > 0 && self.consecutive >= p.consecutive_failures {
            return true;
        }
        let c = self.window.total(now);
        if c.total == 0 || c.total < p.min_samples {
            return false;
        }
        let total = f64::from(c.total);
        let failing = f64::from(c.failed) / total >= p.failure_ratio;
        let slow = p
            .slow_call
            .as_ref()
            .is_some_and(|s| f64::from(c.slow) / total >= s.ratio);
        failing || slow
    }

    fn trip(&mut self, p: &CircuitBreakerPolicy, now: Instant) -> Option<Transition> {
        // An absurd cooldown that overflows the clock is held for a year at a time.
        let until = now
            .checked_add(p.cooldown)
            .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
            .unwrap_or(now);
        self.enter(State::Open { until })
    }

    fn enter(&mut self, to: State) -> Option<Transition> {
        let from = self.state.label();
        self.generation = self.generation.wrapping_add(1);
        self.window.clear();
        self.consecutive = 0;
        self.state = to;
        let to = to.label();
        (from != to).then_some(Transition { from, to })
    }

    fn ticket(&self, probe: bool) -> Ticket {
        Ticket {
            id: self.id,
            generation: self.generation,
            probe,
        }
    }

    fn owns(&self, ticket: Ticket) -> bool {
        ticket.id == self.id && ticket.generation == self.generation
    }

    /// This circuit's id: unique among the client's circuits, a fresh one for a key included.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

impl Ticket {
    /// The id of the circuit that issued the ticket.
    pub(crate) fn circuit(self) -> u64 {
        self.id
    }
}

impl Rejected {
    /// The `CircuitOpen` error (`PROVIDER.UNAVAILABLE`) for this refusal, with its
    /// retry-after when known.
    pub(crate) fn into_error(self) -> NetError {
        let err = NetError::new(ErrorKind::CircuitOpen);
        match self.retry_after {
            Some(after) => err.with_retry_after(after),
            None => err,
        }
    }
}

impl State {
    fn label(self) -> BreakerState {
        match self {
            State::Closed => BreakerState::Closed,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }
}

impl Evictable for Circuit {
    /// A closed circuit may go; an open one only once its cooldown is over; a half-open one
    /// only once idle for the idle period (its probes long finished or lost). Evicting one in
    /// its cooldown or while probing would let a failing host's traffic through at once.
    fn evictable(&self, now: Instant, idle: bool) -> bool {
        match self.state {
            State::Closed => true,
            State::Open { until } => now >= until,
            State::HalfOpen { .. } => idle,
        }
    }
}

/// How many of the half-open probes must succeed: `half_open_success_ratio` of them, rounded
/// up, at least one and at most all.
fn probes_needed(p: &CircuitBreakerPolicy) -> u32 {
    let probes = p.half_open_probes.max(1);
    let ratio = if p.half_open_success_ratio.is_nan() {
        1.0
    } else {
        p.half_open_success_ratio.clamp(0.0, 1.0)
    };
    // At most `probes` (a u32), so the cast back cannot truncate.
    let needed = (f64::from(probes) * ratio).ceil() as u32;
    needed.clamp(1, probes)
}
