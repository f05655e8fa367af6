//! Limits policy: concurrency per host and per tenant, request rate, and AIMD adaptive
//! concurrency.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::validate::Checker;

/// Backpressure: concurrency per host and tenant, rates, and an adaptive (AIMD) window.
///
/// Over a limit the request fails at once with `RateLimited` unless `max_wait` allows a
/// bounded wait. The per-host limit also caps connections opened to the host.
///
/// Default: 64 in flight per host, 256 per tenant, no rate limit, no waiting, AIMD off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct LimitsPolicy {
    /// Requests in flight per host (and connections per host). Default is 64.
    pub per_host_concurrency: u32,
    /// Requests in flight per tenant. Default is 256.
    pub per_tenant_concurrency: u32,
    /// Requests per second per host (GCRA token bucket); `None` means no rate limit.
    /// Default is `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_host_rate_rps: Option<u32>,
    /// Burst allowed above the rate; `None` means one second's worth (= the rate). Ignored
    /// without a rate. Default is `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_burst: Option<u32>,
    /// Longest wait for a permit; 0s fails at once with `RateLimited`. Default is 0s. A freed
    /// concurrency slot goes to whichever call asks first (a new call or a woken waiter).
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
    /// Adaptive concurrency. Default is off.
    pub aimd: AimdPolicy,
    /// A request rate shared by every instance of the service (through the client's rate
    /// store, e.g. Redis); `None` means none. Default is `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global: Option<GlobalLimit>,
}

/// A request rate shared across a fleet: a GCRA token bucket kept in the client's rate store
/// (Redis for a fleet; in memory, exact for one process, when no store is configured), per
/// tenant, per host or per tenant + host.
///
/// With `lease > 1`, an instance takes up to `lease` tokens from the store in one round trip
/// and spends them itself, valid for `lease_ttl`: fewer store calls, at the cost of a bound on
/// the error — over any window, the fleet admits at most `rps × window + burst + instances ×
/// lease` (leased tokens spent later than the store counted them), and tokens leased but not
/// spent before `lease_ttl` are lost (fewer admissions, never more).
///
/// When the store fails or does not answer within `store_timeout`, `on_store_error` decides.
///
/// Default when the section is written: 100 rps, a burst of 100, per tenant, no leasing,
/// 50ms store timeout, `on_store_error = "local"` with one expected instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct GlobalLimit {
    /// Requests per second for the whole fleet, per key. Default is 100.
    pub rps: u32,
    /// Tokens the bucket holds (requests allowed at once above the rate). Default is 100.
    pub burst: u32,
    /// What one bucket is kept per. Default is [`GlobalScope::Tenant`].
    pub scope: GlobalScope,
    /// Tokens an instance takes per store call and spends locally; 1 is no leasing. Default is 1.
    pub lease: u32,
    /// How long leased tokens stay usable. Default is 1s.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// Longest a call waits for the store's answer before `on_store_error` decides it; the
    /// take itself goes on, and a late grant is leased, not lost. Default is 50ms (a GCRA
    /// call to a loopback Redis on a busy 2-core machine: p99 5.4 ms, at most 9.3 ms).
    #[serde(with = "humantime_serde")]
    pub store_timeout: Duration,
    /// What a request gets when the store fails, is too slow, or is skipped (see
    /// docs/policy.md). Default is [`OnStoreError::Local`].
    pub on_store_error: OnStoreError,
    /// Instances sharing the limit, for `allow`'s share while the store is away
    /// (`rps ÷ expected_instances` each). Default is 1.
    pub expected_instances: u32,
}

/// What one shared bucket is kept per.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum GlobalScope {
    /// One bucket per tenant (calls without a tenant share the tenant-less bucket). Default.
    #[default]
    Tenant,
    /// One bucket per host.
    Host,
    /// One bucket per tenant and host.
    TenantHost,
}

/// What a request gets when the shared store fails or is too slow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnStoreError {
    /// Admitted up to the instance's share, a local bucket of `rps ÷ expected_instances` (and
    /// `burst ÷ expected_instances`): available while the store is away, at the cost of the
    /// bound — each instance may add its share per second to what the store admits.
    Allow,
    /// Refused with `RateLimited`: nothing goes out unaccounted.
    Deny,
    /// Admitted on credit, at most `lease` calls per key and instance, paid with the next
    /// take (the store moves the bucket on by what is owed): the fleet never exceeds
    /// `rps × T + burst + instances × lease`; once the credit is spent, refused. Default.
    #[default]
    Local,
}

impl Default for GlobalLimit {
    fn default() -> Self {
        Self {
            rps: 100,
            burst: 100,
            scope: GlobalScope::Tenant,
            lease: 1,
            lease_ttl: Duration::from_secs(1),
            store_timeout: Duration::from_millis(50),
            on_store_error: OnStoreError::Local,
            expected_instances: 1,
        }
    }
}

/// Additive-increase / multiplicative-decrease concurrency window: each success
/// adds `increase`, each timeout or overload error multiplies by `decrease_factor`, clamped to
/// `[min, max]`.
///
/// Default: off, per host, 16 initial, 1..=256, +1, ×0.5.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct AimdPolicy {
    /// Whether the adaptive window applies. Default is `false`.
    pub enabled: bool,
    /// Where one window is kept. Default is [`AimdScope::Host`].
    pub scope: AimdScope,
    /// Starting window. Default is 16.
    pub initial: u32,
    /// Smallest window. Default is 1.
    pub min: u32,
    /// Largest window. Default is 256.
    pub max: u32,
    /// Added per success. Default is 1.
    pub increase: u32,
    /// Multiplier on timeout or overload, in `(0, 1)`. Default is 0.5.
    pub decrease_factor: f64,
}

/// Where an AIMD window is kept. Default is `Host`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum AimdScope {
    /// One window for the whole client.
    Global,
    /// One window per host. The default.
    #[default]
    Host,
}

impl Default for LimitsPolicy {
    fn default() -> Self {
        Self {
            per_host_concurrency: 64,
            per_tenant_concurrency: 256,
            per_host_rate_rps: None,
            rate_burst: None,
            max_wait: Duration::ZERO,
            aimd: AimdPolicy::default(),
            global: None,
        }
    }
}

impl Default for AimdPolicy {
    fn default() -> Self {
        Self {
            enabled: false,
            scope: AimdScope::Host,
            initial: 16,
            min: 1,
            max: 256,
            increase: 1,
            decrease_factor: 0.5,
        }
    }
}

impl LimitsPolicy {
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        c.at_least_one(self.per_host_concurrency.into(), "per_host_concurrency");
        c.at_least_one(self.per_tenant_concurrency.into(), "per_tenant_concurrency");
        c.when(
            self.per_host_rate_rps == Some(0),
            "per_host_rate_rps",
            || "must be at least 1; leave it out for no rate limit".to_owned(),
        );
        c.when(self.rate_burst == Some(0), "rate_burst", || {
            "must be at least 1; leave it out for a burst of one second".to_owned()
        });
        if let Some(g) = &self.global {
            let mut c = c.nested("global");
            c.at_least_one(g.rps.into(), "rps");
            c.at_least_one(g.burst.into(), "burst");
            c.at_least_one(g.lease.into(), "lease");
            c.at_least_one(g.expected_instances.into(), "expected_instances");
            c.nonzero(g.store_timeout, "store_timeout");
            c.nonzero(g.lease_ttl, "lease_ttl");
        }
        let a = &self.aimd;
        let mut c = c.nested("aimd");
        c.at_least_one(a.min.into(), "min");
        c.when(a.min > a.initial || a.initial > a.max, "initial", || {
            format!(
                "must satisfy min ≤ initial ≤ max, got {} ≤ {} ≤ {}",
                a.min, a.initial, a.max
            )
        });
        c.when(
            !(a.decrease_factor > 0.0 && a.decrease_factor < 1.0),
            "decrease_factor",
            || format!("must be in (0, 1), got {}", a.decrease_factor),
        );
        c.when(a.enabled && a.increase == 0, "increase", || {
            "must be at least 1 or the window never grows".to_owned()
        });
    }
}
