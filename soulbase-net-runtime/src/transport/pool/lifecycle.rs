//! A connection after its request: given back to a waiting request or to the idle list,
//! kept under the client's budget of idle connections, retired (too old, idle too long, its
//! host name moved in DNS, its HTTP/2 connection going away) and reaped.

use std::{
    any::Any,
    sync::{atomic::Ordering, Arc, Weak},
    time::Duration,
};

use hyper::client::conn::http1;
use soulbase_net_core::{NetEvent, RetireReason};
use tokio::time::Instant;

use super::budget::{Candidate, Kept};
use super::{Facts, Idle, Origin, Sender, Shared, SharedH2, State, Stream, DNS_RECHECK};
use crate::transport::body::{self, ReqBody, RequestBody, WireBody};

impl<B: RequestBody> Shared<B> {
    /// Gives a connection back: to the first request still waiting, else to the idle list.
    pub(super) fn give_back(
        self: &Arc<Self>,
        origin: &Origin<B>,
        tx: http1::SendRequest<B>,
        facts: Facts,
    ) {
        let now = Instant::now();
        if tx.is_closed() || self.too_old(facts.born, now) {
            return;
        }
        let mut sender = Sender::H1 { tx, facts };
        let mut state = origin.state.lock();
        if state.dns.moved(facts.peer) {
            drop(state);
            self.retired(origin, RetireReason::DnsMoved, 1);
            return;
        }
        while let Some(waiter) = state.waiters.pop_front() {
            match waiter.send(sender) {
                Ok(()) => return,
                Err(back) => sender = back,
            }
        }
        if self.cfg.idle_timeout.is_zero() || state.idle.len() >= self.cfg.max_idle_per_origin {
            return;
        }
        if let Sender::H1 { tx, facts } = sender {
            self.push_idle(
                &mut state,
                Idle {
                    tx,
                    facts,
                    since: now,
                },
            );
        }
        drop(state);
        self.start_reaper();
        self.keep_budget();
    }

    /// Sets the origin's shared HTTP/2 connection, counting it in the budget.
    pub(super) fn set_h2(&self, state: &mut State<B>, h2: Option<SharedH2<B>>) {
        match (state.h2.is_some(), h2.is_some()) {
            (false, true) => self.budget.add(1),
            (true, false) => self.budget.sub(1),
            _ => {}
        }
        state.h2 = h2;
    }

    /// Takes the most recently used idle HTTP/1.1 connection of the origin.
    pub(super) fn pop_idle(&self, state: &mut State<B>) -> Option<Idle<B>> {
        let idle = state.idle.pop();
        if idle.is_some() {
            self.budget.sub(1);
        }
        idle
    }

    /// Keeps `idle` as the origin's most recently used idle HTTP/1.1 connection.
    pub(super) fn push_idle(&self, state: &mut State<B>, idle: Idle<B>) {
        state.idle.push(idle);
        self.budget.add(1);
    }

    /// Keeps the idle HTTP/1.1 connections of the origin for which `keep` says so; returns
    /// how many went.
    pub(super) fn retain_idle(
        &self,
        state: &mut State<B>,
        keep: impl FnMut(&Idle<B>) -> bool,
    ) -> usize {
        let before = state.idle.len();
        state.idle.retain(keep);
        let gone = before - state.idle.len();
        self.budget.sub(gone);
        gone
    }

    /// Evicts the least recently used idle connections when the client keeps more than its
    /// budget allows (see [`IdleBudget`]).
    pub(super) fn keep_budget(&self) {
        if self.budget.over() {
            self.budget.evict();
        }
    }

    /// Reports `n` connections of `origin` retired for `reason`.
    pub(super) fn retired(&self, origin: &Origin<B>, reason: RetireReason, n: usize) {
        let host = origin.host.to_str().unwrap_or("");
        for _ in 0..n {
            self.connector
                .observer()
                .on_event(&NetEvent::ConnectionRetired { host, reason });
        }
    }

    /// Asks for the origin's host name again (see [`Follow`]), in a task of its own: when the
    /// answer no longer holds the address a pooled connection went to, that connection takes
    /// no new request (idle ones close now, busy ones when given back, the HTTP/2 one when
    /// its streams are done). A failed lookup changes nothing.
    pub(super) fn follow_dns(self: &Arc<Self>, origin: &Arc<Origin<B>>) {
        let (Some(name), Ok(runtime)) = (
            origin.name.as_deref(),
            tokio::runtime::Handle::try_current(),
        ) else {
            origin.state.lock().dns.checking = false;
            return;
        };
        let name: Arc<str> = name.into();
        let (shared, origin) = (self.clone(), origin.clone());
        runtime.spawn(async move {
            let answer = shared.connector.answer(&name).await;
            let moved = {
                let mut guard = origin.state.lock();
                let state = &mut *guard;
                state.dns.checking = false;
                state.dns.next = Some(Instant::now() + DNS_RECHECK);
                let Ok(answer) = answer else { return };
                state.dns.answer = Some(answer);
                let dns = &state.dns;
                let h2_moved = state.h2.as_ref().is_some_and(|h2| dns.moved(h2.peer));
                let before = state.idle.len();
                state.idle.retain(|idle| !dns.moved(idle.facts.peer));
                let gone = before - state.idle.len();
                shared.budget.sub(gone);
                if h2_moved {
                    shared.set_h2(state, None);
                }
                gone + usize::from(h2_moved)
            };
            if moved > 0 {
                shared.retired(&origin, RetireReason::DnsMoved, moved);
            }
        });
    }

    /// Takes the origin's HTTP/2 connection `serial` out of the pool (it is going away): it
    /// finishes the streams it has, and the next request opens another.
    pub(super) fn retire_h2(&self, origin: &Origin<B>, serial: u64) {
        let mut state = origin.state.lock();
        if state.h2.as_ref().is_some_and(|h2| h2.serial == serial) {
            self.set_h2(&mut state, None);
            drop(state);
            self.retired(origin, RetireReason::GoAway, 1);
        }
    }

    /// Takes the origin's HTTP/2 connection `serial` out of the pool, without an event: its
    /// task has ended (the server closed it, or it finished draining).
    pub(super) fn forget_h2(&self, origin: &Origin<B>, serial: u64) {
        let mut state = origin.state.lock();
        if state.h2.as_ref().is_some_and(|h2| h2.serial == serial) {
            self.set_h2(&mut state, None);
        }
    }

    /// Whether a connection opened at `born` is past the maximum lifetime at `now`.
    pub(super) fn too_old(&self, born: Instant, now: Instant) -> bool {
        self.cfg
            .max_lifetime
            .is_some_and(|max| crate::resilience::passed(born, max, now))
    }

    /// Starts the reaper unless it runs: every idle timeout (or maximum lifetime, when
    /// shorter) it closes connections idle for longer or past their lifetime, and it stops
    /// when none are left idle.
    pub(super) fn start_reaper(self: &Arc<Self>) {
        if self.reaping.load(Ordering::Relaxed) || self.reaping.swap(true, Ordering::AcqRel) {
            return;
        }
        // Outside a runtime (a response dropped after its runtime ended) there is nothing to
        // run it on; the connections then close when the pool is dropped.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.reaping.store(false, Ordering::Release);
            return;
        };
        let lifetime = self.cfg.max_lifetime.unwrap_or(Duration::MAX);
        let every = self
            .cfg
            .idle_timeout
            .min(lifetime)
            .max(Duration::from_millis(10));
        let pool: Weak<Shared<B>> = Arc::downgrade(self);
        let mut alive = self.alive.subscribe();
        runtime.spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    // The pool was dropped (a reload replaced its policy): nothing to reap.
                    Err(_) = alive.changed() => return,
                }
                let Some(shared) = pool.upgrade() else { return };
                if shared.reap() {
                    continue;
                }
                shared.reaping.store(false, Ordering::Release);
                // A connection given back while this pass stopped found the flag still set.
                if !shared.reap() || shared.reaping.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
        });
    }

    /// Closes connections idle past the timeout and forgets origins with no connections.
    /// Returns whether any connection is still kept.
    pub(super) fn reap(&self) -> bool {
        let now = Instant::now();
        let timeout = self.cfg.idle_timeout;
        let cap = self.cfg.per_origin_cap.max(1);
        let mut kept = false;
        let mut origins = self.origins.lock();
        let origins = &mut *origins;
        for map in [&mut origins.http.map, &mut origins.https.map] {
            map.retain(|_, origin| {
                let mut state = origin.state.lock();
                self.retain_idle(&mut state, |idle| {
                    !idle.tx.is_closed()
                        && !crate::resilience::passed(idle.since, timeout, now)
                        && !self.too_old(idle.facts.born, now)
                });
                if let Some(h2) = &state.h2 {
                    if h2.tx.is_closed()
                        || (h2.is_idle() && crate::resilience::passed(h2.used, timeout, now))
                        || self.too_old(h2.born, now)
                    {
                        self.set_h2(&mut state, None);
                    }
                }
                state.waiters.retain(|w| !w.is_closed());
                kept |= !state.idle.is_empty() || state.h2.is_some();
                drop(state);
                !origin.is_empty(cap)
            });
        }
        kept
    }
}

impl<B: RequestBody> Kept for Shared<B> {
    /// Every idle HTTP/1.1 connection of the pool, and each HTTP/2 one with no request on it.
    fn idle_candidates(self: Arc<Self>, out: &mut Vec<Candidate>) {
        let origins = self.origins.lock();
        for origin in origins.http.map.values().chain(origins.https.map.values()) {
            let state = origin.state.lock();
            let candidate = |since, h2| Candidate {
                since,
                pool: self.clone(),
                origin: origin.clone(),
                h2,
            };
            out.extend(state.idle.iter().map(|idle| candidate(idle.since, None)));
            if let Some(h2) = state.h2.as_ref().filter(|h2| h2.is_idle()) {
                out.push(candidate(h2.used, Some(h2.serial)));
            }
        }
    }

    /// Evicts the origin's oldest idle HTTP/1.1 connection (`h2` is `None`), or its HTTP/2
    /// connection `h2` if it still has no request on it.
    fn evict(&self, origin: &(dyn Any + Send + Sync), h2: Option<u64>) {
        // Always one of this pool's origins (see `idle_candidates`).
        let Some(origin) = origin.downcast_ref::<Origin<B>>() else {
            return;
        };
        let mut state = origin.state.lock();
        let evicted = match h2 {
            None if !state.idle.is_empty() => {
                state.idle.remove(0);
                self.budget.sub(1);
                true
            }
            None => false,
            Some(serial) => {
                let idle =
                    (state.h2.as_ref()).is_some_and(|h2| h2.serial == serial && h2.is_idle());
                if idle {
                    self.set_h2(&mut state, None);
                }
                idle
            }
        };
        drop(state);
        if evicted {
            self.retired(origin, RetireReason::IdleBudget, 1);
        }
    }
}

/// Gives an HTTP/1.1 connection back to the pool once its response was read to the end.
pub(crate) struct GiveBack<B> {
    pub(super) shared: Arc<Shared<B>>,
    pub(super) origin: Arc<Origin<B>>,
    pub(super) tx: http1::SendRequest<B>,
    pub(super) facts: Facts,
}

impl<B: RequestBody> GiveBack<B> {
    fn give(self) {
        self.shared.give_back(&self.origin, self.tx, self.facts);
    }
}

/// What a pool response's body holds on its connection (see [`body::Lease`]).
pub(crate) enum Lease<B = ReqBody> {
    /// An HTTP/1.1 connection, given back when the body ends (hyper drains what is left of
    /// a dropped body when it has already arrived, and closes the connection otherwise; the
    /// request that takes the connection next waits for one or the other, and a closed one
    /// is discarded).
    H1(GiveBack<B>),
    /// An HTTP/2 response's stream, counted on its connection until the body reports its
    /// end or is dropped.
    H2(Stream),
}

impl<B: RequestBody> body::Lease for Lease<B> {
    fn release(self) {
        match self {
            Lease::H1(back) => back.give(),
            Lease::H2(stream) => drop(stream),
        }
    }

    /// An HTTP/1.1 connection, yes; an HTTP/2 stream only counts toward its connection's
    /// idleness (a gauge), which can wait for the body's end or drop.
    fn early(&self) -> bool {
        matches!(self, Lease::H1(_))
    }
}

/// A response body from the pool.
pub(crate) type PoolBody<B = ReqBody> = WireBody<Lease<B>>;
