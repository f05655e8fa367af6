//! Backpressure before an attempt (seed 000 §7, seed 002, DESIGN §4 step 4): per-host and
//! per-tenant concurrency, the AIMD window (global or per host) and a per-host GCRA rate.
//!
//! Over a limit the call fails at once with the [`LimitScope`] that refused it, unless the
//! policy's `max_wait` allows a bounded wait (one budget shared by all the limits). Permits are
//! owned and released on drop, so a cancelled or panicking request gives its slot back.

mod aimd;
mod gcra;
mod slots;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use soulbase_net_core::{GaugeReading, LimitScope, Outcome};
use soulbase_net_policy::{AimdPolicy, AimdScope, LimitsPolicy};
use tokio::time::Instant;

pub(crate) use self::aimd::{signal, Signal};
use self::aimd::{Aimd, AimdPermit};
pub use self::aimd::{AimdLimit, AimdLimitPermit};
use self::gcra::Gcra;
use self::slots::{HasSlots, SlotPermit, Slots};
use crate::pruned::PrunedMap;

/// The limits of a client: one entry per host and per tenant.
///
/// The maps prune their idle entries once they hold `max_keys` (see [`PrunedMap`]); entries with
/// calls in flight or waiting are kept whatever their number (they are bounded by the calls
/// themselves), and when many were kept the next pruning waits until the map has doubled. A host's
/// concurrency cap is fixed when its entry is made; after a policy reload the new cap applies
/// once the entry has gone idle and been evicted. Its rate follows the policy of each call
/// (a reload, the SLO controller's scaling) at once, the bucket's state carried over.
#[derive(Debug)]
pub(crate) struct Limiter {
    hosts: Mutex<PrunedMap<Arc<HostLimits>>>,
    tenants: Mutex<PrunedMap<Arc<Slots>>>,
    global: Mutex<Option<Arc<Aimd>>>,
}

#[derive(Debug)]
struct HostLimits {
    slots: Slots,
    rate: Mutex<Option<Gcra>>,
    aimd: Arc<Aimd>,
    queued: AtomicUsize,
}

/// A call's place under every limit; dropping it frees them all.
#[derive(Debug)]
pub(crate) struct LimitPermit {
    _host: SlotPermit<HostLimits>,
    _tenant: Option<SlotPermit<Slots>>,
    aimd: Option<(AimdPermit, Arc<Aimd>, AimdPolicy)>,
}

/// Gauges of one host for metrics (seed 002: in flight, queue depth, window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LimitGauges {
    /// Calls holding the host's concurrency slot.
    pub(crate) in_flight: u32,
    /// Calls waiting for a slot or a rate reservation (bounded wait only).
    pub(crate) queued: usize,
    /// The host's AIMD limit, once a call entered its per-host window.
    pub(crate) window: Option<u32>,
}

// === impl Limiter ===

impl Limiter {
    /// A limiter keeping at most `max_keys` idle host and tenant entries.
    pub(crate) fn new(max_keys: usize) -> Self {
        let max_keys = max_keys.max(1);
        Self {
            hosts: Mutex::new(PrunedMap::new(max_keys)),
            tenants: Mutex::new(PrunedMap::new(max_keys)),
            global: Mutex::default(),
        }
    }

    /// [`acquire`](Self::acquire) when it needs no wait: `Some` with the permit, or with the
    /// scope that refused when the policy allows no waiting; `None` when the call would have
    /// to wait (what was taken is given back, and `acquire` starts over).
    ///
    /// Why: nearly every call finds room at once, and answering it without a future keeps
    /// the waiting machinery (timers, notifications) out of every request's state.
    ///
    /// `now` is when the rate reservation is made: the caller's clock reading from just
    /// before (a call reads the clock when it starts), so the limiter reads none of its own.
    /// The rate is reserved here only when the policy allows no wait, so nothing waited
    /// since that reading: it is microseconds old, and the reservation is early by as much
    /// (the bucket as seen that much earlier: a refusal a little sooner, a slot a little
    /// earlier).
    pub(crate) fn acquire_now(
        &self,
        host: &str,
        tenant: Option<&str>,
        p: &LimitsPolicy,
        now: Instant,
    ) -> Option<Result<LimitPermit, LimitScope>> {
        let may_wait = !p.max_wait.is_zero();
        if may_wait && p.per_host_rate_rps.is_some() {
            return None;
        }
        let refused = |scope| (!may_wait).then_some(Err(scope));
        let Ok(host_permit) = SlotPermit::try_take(self.host(host, p)) else {
            return refused(LimitScope::HostConcurrency);
        };
        let entry = host_permit.owner();
        let tenant_permit = match tenant {
            Some(t) => match SlotPermit::try_take(self.tenant(t, p)) {
                Ok(permit) => Some(permit),
                Err(_) => return refused(LimitScope::TenantConcurrency),
            },
            None => None,
        };
        let aimd = match self.aimd_for(entry, &p.aimd) {
            Some(aimd) => match aimd.try_acquire(&p.aimd) {
                Some(permit) => Some((permit, aimd, p.aimd.clone())),
                None => return refused(LimitScope::Adaptive),
            },
            None => None,
        };
        if let Some(rps) = p.per_host_rate_rps {
            // No waiting is allowed here (checked above): a reservation now or a refusal.
            let burst = p.rate_burst.unwrap_or(rps);
            if let Err(scope) = entry.reserve_rate(rps, burst, now, None) {
                return Some(Err(scope));
            }
        }
        Some(Ok(LimitPermit {
            _host: host_permit,
            _tenant: tenant_permit,
            aimd,
        }))
    }

    /// Takes a place for one call to `host` for `tenant`: host concurrency, tenant
    /// concurrency, the AIMD window, then the host rate — waiting up to `max_wait` in all.
    ///
    /// # Errors
    ///
    /// The [`LimitScope`] that refused the call: `HostConcurrency`, `TenantConcurrency`,
    /// `Adaptive` or `HostRate`; the client turns it into `RateLimited`.
    pub(crate) async fn acquire(
        &self,
        host: &str,
        tenant: Option<&str>,
        p: &LimitsPolicy,
    ) -> Result<LimitPermit, LimitScope> {
        // The clock is read only when the policy allows waiting.
        let deadline = (!p.max_wait.is_zero())
            .then(|| Instant::now().checked_add(p.max_wait))
            .flatten();
        let entry = self.host(host, p);
        let host_permit = take(entry.clone(), deadline, &entry.queued)
            .await
            .ok_or(LimitScope::HostConcurrency)?;
        let queued = &entry.queued;
        let tenant_permit = match tenant {
            Some(t) => Some(
                take(self.tenant(t, p), deadline, queued)
                    .await
                    .ok_or(LimitScope::TenantConcurrency)?,
            ),
            None => None,
        };
        let aimd = match self.aimd_for(&entry, &p.aimd) {
            Some(aimd) => Some(enter_aimd(aimd, &p.aimd, deadline, queued).await?),
            None => None,
        };
        if let Some(rps) = p.per_host_rate_rps {
            let burst = p.rate_burst.unwrap_or(rps);
            let wait = entry.reserve_rate(rps, burst, Instant::now(), deadline)?;
            if !wait.is_zero() {
                let _queued = Queued::enter(queued);
                tokio::time::sleep(wait).await;
            }
        }
        Ok(LimitPermit {
            _host: host_permit,
            _tenant: tenant_permit,
            aimd,
        })
    }

    /// The gauges of `host`, if it has an entry.
    #[cfg(test)]
    pub(crate) fn gauges(&self, host: &str) -> Option<LimitGauges> {
        let entry = self.hosts.lock().map.get(host).cloned()?;
        Some(entry.gauges())
    }

    /// The global AIMD limit, when global AIMD is on and has been used.
    pub(crate) fn global_window(&self) -> Option<u32> {
        self.global.lock().as_ref().and_then(|a| a.gauge())
    }

    /// Calls `visit` with the gauges of every host entry and the global window.
    pub(crate) fn read_gauges(&self, visit: &mut dyn FnMut(GaugeReading<'_>)) {
        let hosts = self.hosts.lock();
        for (host, entry) in hosts.map.iter() {
            let g = entry.gauges();
            visit(GaugeReading::LimiterInFlight {
                host,
                value: u64::from(g.in_flight),
            });
            visit(GaugeReading::LimiterQueued {
                host,
                value: g.queued as u64,
            });
            if let Some(window) = g.window {
                visit(GaugeReading::LimiterWindow {
                    host: Some(host),
                    value: u64::from(window),
                });
            }
        }
        drop(hosts);
        for (tenant, slots) in self.tenants.lock().map.iter() {
            visit(GaugeReading::TenantInFlight {
                tenant,
                value: u64::from(slots.in_flight()),
            });
        }
        if let Some(window) = self.global_window() {
            visit(GaugeReading::LimiterWindow {
                host: None,
                value: u64::from(window),
            });
        }
    }

    /// How many host entries are held.
    #[cfg(test)]
    pub(crate) fn hosts_len(&self) -> usize {
        self.hosts.lock().map.len()
    }

    fn host(&self, host: &str, p: &LimitsPolicy) -> Arc<HostLimits> {
        let mut hosts = self.hosts.lock();
        if let Some(e) = hosts.map.get(host) {
            return e.clone();
        }
        let now = Instant::now();
        hosts.make_room(|e| !e.is_idle(now) || Arc::strong_count(e) > 1);
        let entry = Arc::new(HostLimits {
            slots: Slots::new(p.per_host_concurrency),
            rate: Mutex::new(None),
            aimd: Arc::new(Aimd::new(&p.aimd)),
            queued: AtomicUsize::new(0),
        });
        hosts.map.insert(host.into(), entry.clone());
        entry
    }

    fn tenant(&self, tenant: &str, p: &LimitsPolicy) -> Arc<Slots> {
        let mut tenants = self.tenants.lock();
        if let Some(slots) = tenants.map.get(tenant) {
            return slots.clone();
        }
        tenants.make_room(|slots| Arc::strong_count(slots) > 1 || !slots.is_idle());
        let slots = Arc::new(Slots::new(p.per_tenant_concurrency));
        tenants.map.insert(tenant.into(), slots.clone());
        slots
    }

    fn aimd_for(&self, entry: &HostLimits, p: &AimdPolicy) -> Option<Arc<Aimd>> {
        if !p.enabled {
            return None;
        }
        Some(match p.scope {
            AimdScope::Global => self
                .global
                .lock()
                .get_or_insert_with(|| Arc::new(Aimd::new(p)))
                .clone(),
            _ => entry.aimd.clone(),
        })
    }
}

// === impl HostLimits ===

impl HasSlots for HostLimits {
    fn slots(&self) -> &Slots {
        &self.slots
    }
}

impl HostLimits {
    fn gauges(&self) -> LimitGauges {
        LimitGauges {
            in_flight: self.slots.in_flight(),
            queued: self.queued.load(Ordering::Relaxed),
            window: self.aimd.gauge(),
        }
    }

    /// Reserves the next rate slot, as of `now`, within the wait left before `deadline`;
    /// the wait.
    fn reserve_rate(
        &self,
        rps: u32,
        burst: u32,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Result<Duration, LimitScope> {
        let max_wait = deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(now));
        let mut rate = self.rate.lock();
        let gcra = rate.get_or_insert_with(|| Gcra::new(rps, burst));
        // A new rate (the SLO controller's factor, a reload) keeps how full the bucket is:
        // rebuilding it would start it full, and let a burst through just then.
        gcra.retune(rps, burst, now);
        gcra.reserve(now, max_wait)
            .map_err(|_| LimitScope::HostRate)
    }

    /// Nothing in flight, nobody waiting, the rate bucket full: forgetting it loses nothing.
    fn is_idle(&self, now: Instant) -> bool {
        self.slots.is_idle()
            && self.queued.load(Ordering::Relaxed) == 0
            && self.aimd.in_flight() == 0
            && self.rate.lock().as_ref().is_none_or(|g| g.is_idle(now))
    }
}

// === impl LimitPermit ===

impl LimitPermit {
    /// Feeds the attempt's outcome to the AIMD window (no-op when AIMD is off).
    pub(crate) fn record(&self, outcome: Outcome) {
        if let Some((_, aimd, p)) = &self.aimd {
            aimd.record(p, signal(outcome));
        }
    }
}

/// A place in an AIMD window, now or by `deadline` when there is one.
async fn enter_aimd(
    aimd: Arc<Aimd>,
    p: &AimdPolicy,
    deadline: Option<Instant>,
    queued: &AtomicUsize,
) -> Result<(AimdPermit, Arc<Aimd>, AimdPolicy), LimitScope> {
    let permit = match aimd.try_acquire(p) {
        Some(permit) => permit,
        None => {
            let _queued = Queued::enter(queued);
            aimd.acquire(p, deadline)
                .await
                .ok_or(LimitScope::Adaptive)?
        }
    };
    Ok((permit, aimd, p.clone()))
}

/// A slot of `owner`'s now, or by `deadline` when there is one, counted in `queued` while
/// it waits.
async fn take<T: HasSlots>(
    owner: Arc<T>,
    deadline: Option<Instant>,
    queued: &AtomicUsize,
) -> Option<SlotPermit<T>> {
    let owner = match SlotPermit::try_take(owner) {
        Ok(permit) => return Some(permit),
        Err(owner) => owner,
    };
    let deadline = deadline?;
    let _queued = Queued::enter(queued);
    SlotPermit::wait(owner, deadline).await
}

/// Counts a call in the queue-depth gauge while it may wait.
struct Queued<'a>(&'a AtomicUsize);

impl<'a> Queued<'a> {
    fn enter(gauge: &'a AtomicUsize) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
