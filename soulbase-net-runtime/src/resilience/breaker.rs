//! Per-key circuit breakers (seed 000 §5.2, DESIGN §4 "Breaker"), with probe permits that
//! record their result, a bounded key map, and transitions reported to a listener.

mod circuit;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use soulbase_net_core::{ErrorKind, Outcome, Phase};
use soulbase_net_policy::{CbKey, CircuitBreakerPolicy};
use tokio::time::Instant;

pub(crate) use self::circuit::{CallResult, Circuit, Rejected, Ticket, Transition};
use super::keymap::{scoped_key, BoundedMap};
use super::retry::status_of;

/// Called with the key and the transition, outside the breaker's lock, for every change of
/// state, so the client can emit `BreakerTransition`. It should be quick and must not block.
pub(crate) type Listener = Box<dyn Fn(&str, Transition) + Send + Sync>;

/// The circuit breakers of a client, one per key, at most `max_keys` of them.
///
/// Cheap to clone; clones share the circuits.
#[derive(Clone)]
pub(crate) struct Breakers {
    shared: Arc<Shared>,
}

struct Shared {
    circuits: Mutex<BoundedMap<Circuit>>,
    next_id: AtomicU64,
    listener: Option<Listener>,
}

/// Permission for one call. Record its result with [`record`](Self::record); given back
/// with [`release`](Self::release) or dropped (the caller cancelled), it counts for nothing,
/// and a probe's slot goes to the next call.
#[must_use = "a permit that is dropped at once is a call that never happened"]
pub(crate) struct BreakerPermit<'a> {
    tracked: Option<Tracked<'a>>,
}

/// Borrowed from the admission's caller, which outlives the attempt: no allocation, copy
/// or reference count per call.
struct Tracked<'a> {
    shared: &'a Shared,
    key: &'a str,
    /// Where the key map held the circuit at admission: the result goes there without
    /// hashing the key again while it is still there (see `BoundedMap::get_mut_at`).
    position: usize,
    ticket: Ticket,
    policy: &'a CircuitBreakerPolicy,
    admitted_at: Instant,
}

// === impl Breakers ===

impl Breakers {
    /// Breakers for at most `max_keys` keys (the policy's `max_keys`), dropping closed ones
    /// unused for `idle` (`idle_evict`); `listener` hears every transition.
    pub(crate) fn new(max_keys: usize, idle: Duration, listener: Option<Listener>) -> Self {
        Self {
            shared: Arc::new(Shared {
                circuits: Mutex::new(BoundedMap::new(max_keys, idle).reporting_evictions()),
                next_id: AtomicU64::new(0),
                listener,
            }),
        }
    }

    /// Asks `key`'s breaker to let a call through at `now`.
    ///
    /// A disabled policy admits everything without keeping state. A full key map whose
    /// circuits are all open or probing admits without tracking (fail open) rather than grow.
    ///
    /// # Errors
    ///
    /// [`Rejected`] while the circuit is open (with the rest of the cooldown, for
    /// `CircuitOpen`'s retry-after) or half-open with every probe out.
    pub(crate) fn admit<'a>(
        &'a self,
        key: &'a str,
        p: &'a CircuitBreakerPolicy,
        now: Instant,
    ) -> Result<BreakerPermit<'a>, Rejected> {
        if !p.enabled {
            return Ok(BreakerPermit { tracked: None });
        }
        let (admitted, transition, evicted) = {
            let mut map = self.shared.circuits.lock();
            let id = &self.shared.next_id;
            let make = || Circuit::new(id.fetch_add(1, Ordering::Relaxed), p, now);
            let visited = map.visit_at(key, now, make, |circuit| circuit.admit(p, now));
            let evicted = map.take_evicted();
            match visited {
                Some(((admitted, transition), position)) => {
                    (admitted.map(|t| (t, position)), transition, evicted)
                }
                None => {
                    drop(map);
                    self.shared.forgotten(evicted, now);
                    return Ok(BreakerPermit { tracked: None });
                }
            }
        };
        self.shared.forgotten(evicted, now);
        self.shared.notify(key, transition);
        let (ticket, position) = admitted?;
        Ok(BreakerPermit {
            tracked: Some(Tracked {
                shared: &self.shared,
                key,
                position,
                ticket,
                policy: p,
                admitted_at: now,
            }),
        })
    }

    /// The state of `key`'s circuit at `now` (`Closed` for a key without one).
    #[cfg(test)]
    pub(crate) fn state(&self, key: &str, now: Instant) -> soulbase_net_core::BreakerState {
        self.shared
            .circuits
            .lock()
            .get(key)
            .map_or(soulbase_net_core::BreakerState::Closed, |c| c.state(now))
    }

    /// How many circuits are held.
    pub(crate) fn len(&self) -> usize {
        self.shared.circuits.lock().len()
    }
}

impl fmt::Debug for Breakers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breakers")
            .field("circuits", &self.len())
            .field("listener", &self.shared.listener.is_some())
            .finish()
    }
}

// === impl Shared ===

impl Shared {
    /// Reports the circuits the key map dropped (or replaced by fresh ones) while not closed
    /// as transitions to closed: the next call to such a key starts closed, and whoever
    /// followed the circuit's transitions (the `open_ratio` gauge) must not keep it open.
    fn forgotten(&self, evicted: Vec<(Box<str>, Circuit)>, now: Instant) {
        // Nearly always none: not even the loop's set-up and the vector's drop.
        if evicted.is_empty() {
            return;
        }
        for (key, circuit) in evicted {
            let from = circuit.state(now);
            if from != soulbase_net_core::BreakerState::Closed {
                self.notify(
                    &key,
                    Some(Transition {
                        from,
                        to: soulbase_net_core::BreakerState::Closed,
                    }),
                );
            }
        }
    }

    fn notify(&self, key: &str, transition: Option<Transition>) {
        if let (Some(listener), Some(t)) = (&self.listener, transition) {
            listener(key, t);
        }
    }

    fn finish(&self, t: &Tracked<'_>, result: CallResult, now: Instant) {
        let transition = {
            let mut map = self.circuits.lock();
            let Some(circuit) = t.circuit(&mut map, now) else {
                return;
            };
            circuit.record(t.policy, t.ticket, result, now)
        };
        self.notify(t.key, transition);
    }

    fn release(&self, t: &Tracked<'_>) {
        let mut map = self.circuits.lock();
        if let Some(circuit) = t.circuit(&mut map, t.admitted_at) {
            circuit.release(t.ticket);
        }
    }
}

// === impl Tracked ===

impl Tracked<'_> {
    /// The circuit that admitted the call, if the map still holds it (or a fresh one for its
    /// key, which the ticket no longer owns): found by position while it is there.
    fn circuit<'m>(
        &self,
        map: &'m mut BoundedMap<Circuit>,
        now: Instant,
    ) -> Option<&'m mut Circuit> {
        let id = self.ticket.circuit();
        map.get_mut_at(self.position, self.key, now, |c| c.id() == id)
    }
}

// === impl BreakerPermit ===

impl BreakerPermit<'_> {
    /// Records how the call ended: `failure` as decided by [`is_failure`], `elapsed` for the
    /// slow-call rule, at `now`.
    pub(crate) fn record(mut self, failure: bool, elapsed: Duration, now: Instant) {
        if let Some(t) = self.tracked.take() {
            let result = CallResult { failure, elapsed };
            t.shared.finish(&t, result, now);
        }
    }

    /// Gives the permit back without a result: the server did not process the call (see
    /// [`Circuit::release`]).
    pub(crate) fn release(mut self) {
        if let Some(t) = self.tracked.take() {
            t.shared.release(&t);
        }
    }

    /// Whether the permit takes a result: `false` when the breaker is disabled or the key
    /// had no room (fail open), so that the caller need not read the clock for it.
    pub(crate) fn is_tracked(&self) -> bool {
        self.tracked.is_some()
    }

    /// Whether this call is a half-open probe.
    pub(crate) fn is_probe(&self) -> bool {
        self.tracked.as_ref().is_some_and(|t| t.ticket.probe)
    }
}

impl Drop for BreakerPermit<'_> {
    /// The caller cancelled the call: nothing is learnt of the upstream (see
    /// [`Circuit::release`]).
    fn drop(&mut self) {
        if let Some(t) = self.tracked.take() {
            t.shared.release(&t);
        }
    }
}

impl fmt::Debug for BreakerPermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.tracked.as_ref().map(|t| t.key);
        f.debug_struct("BreakerPermit")
            .field("key", &key)
            .field("probe", &self.is_probe())
            .finish()
    }
}

/// The circuit key of a call to `origin` (`scheme://host[:port]`, as the pool keys its
/// connections: two ports of one host are two upstreams) for `tenant`: per origin, or per
/// (origin, tenant) when `key_by` is [`CbKey::HostTenant`].
pub(crate) fn breaker_key<'a>(
    p: &CircuitBreakerPolicy,
    origin: &'a str,
    tenant: Option<&str>,
) -> std::borrow::Cow<'a, str> {
    scoped_key(origin, tenant, matches!(p.key_by, CbKey::HostTenant))
}

/// Whether an attempt's outcome counts as a failure for the breaker.
///
/// Failures: DNS, connect and TLS-handshake errors, I/O errors on an open connection, proxy
/// failures, timeouts in any phase but `Total` (the total deadline is the caller's budget, not
/// the upstream's health), and 5xx responses when `count_5xx`. Never: 4xx (429 included: the
/// upstream is up and pacing us), certificate rejections (`TlsVerify`: a security decision),
/// local refusals (`Blocked`, `InvalidRequest`, `RateLimited`, `CircuitOpen`, …), the
/// caller's cancel (`Cancelled`), and requests the server did not process (`NotProcessed`:
/// GOAWAY, a refused stream), which the retry loop gives back unrecorded anyway.
pub(crate) fn is_failure(outcome: Outcome, count_5xx: bool) -> bool {
    if let Some(s) = status_of(outcome) {
        return count_5xx && (500..600).contains(&s);
    }
    match outcome {
        Outcome::Error(kind) => {
            matches!(
                kind,
                ErrorKind::Dns
                    | ErrorKind::Connect
                    | ErrorKind::Tls
                    | ErrorKind::Io
                    | ErrorKind::Proxy
            ) || matches!(kind, ErrorKind::Timeout(phase) if phase != Phase::Total)
        }
        Outcome::Response(_) => false,
    }
}

#[cfg(test)]
mod tests;
