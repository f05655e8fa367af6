//! `NetPolicy`: everything that governs one outbound call, and its sub-policies.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::validate::{Checker, PolicyError, Problem};

pub(crate) mod breaker;
pub(crate) mod cache;
pub(crate) mod delivery;
pub(crate) mod dns;
pub(crate) mod endpoints;
pub(crate) mod hedge;
pub(crate) mod http;
pub(crate) mod limits;
pub(crate) mod pool;
pub(crate) mod proxy;
pub(crate) mod redirect;
pub(crate) mod retry;
pub(crate) mod security;
pub(crate) mod slo;
pub(crate) mod timeout;
pub(crate) mod tls;

use self::breaker::CircuitBreakerPolicy;
use self::cache::CacheHookPolicy;
use self::delivery::DeliveryPolicy;
use self::dns::DnsPolicy;
use self::endpoints::EndpointPolicy;
use self::hedge::HedgePolicy;
use self::http::HttpPolicy;
use self::limits::LimitsPolicy;
use self::pool::PoolPolicy;
use self::proxy::ProxyPolicy;
use self::redirect::RedirectPolicy;
use self::retry::RetryPolicy;
use self::security::SecurityPolicy;
use self::slo::SloPolicy;
use self::timeout::TimeoutPolicy;
use self::tls::TlsPolicy;

/// The policy for one outbound call: retries, breaker, redirects, TLS, DNS, proxy, security,
/// limits, cache, hedging, endpoint freezing, timeouts, SLO targets and the HTTP version.
///
/// Built-in defaults are the seed's: TLS 1.2+, private addresses denied, 3 attempts for
/// idempotent requests, breaker off, at most 5 redirects, 32MiB bodies, 64 requests in flight
/// per host, a 30s total deadline. Each field's type documents its own defaults.
///
/// A `NetPolicy` is usually resolved from a [`PolicyDocument`](crate::PolicyDocument) by a
/// [`PolicyResolver`](crate::PolicyResolver); [`validate`](Self::validate) checks one on its own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct NetPolicy {
    /// Retries with backoff and a budget. Default is [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// The circuit breaker. Default is off.
    pub cbreaker: CircuitBreakerPolicy,
    /// Following redirects. Default is on, at most 5.
    pub redirect: RedirectPolicy,
    /// TLS. Default is TLS 1.2+, verification on.
    pub tls: TlsPolicy,
    /// DNS. Default is [`DnsPolicy::default`].
    pub dns: DnsPolicy,
    /// Proxies. Default is `None` (connect directly).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyPolicy>,
    /// Egress security. Default is [`SecurityPolicy::default`].
    pub security: SecurityPolicy,
    /// Concurrency and rate limits. Default is [`LimitsPolicy::default`].
    pub limits: LimitsPolicy,
    /// The cache hook. Default is [`CacheHookPolicy::default`].
    pub cache: CacheHookPolicy,
    /// Hedged requests. Default is off.
    pub hedge: HedgePolicy,
    /// Alternate endpoints and freezing. Default is [`EndpointPolicy::default`].
    pub endpoints: EndpointPolicy,
    /// Timeouts and the total deadline. Default is [`TimeoutPolicy::default`].
    pub timeout: TimeoutPolicy,
    /// SLO targets and the self-healing controller. Default is off.
    pub slo: SloPolicy,
    /// The HTTP version: TCP (HTTP/2 or 1.1) unless HTTP/3 is advertised or asked for.
    /// Default is [`HttpPolicy::default`] (`auto`).
    pub http: HttpPolicy,
    /// The connection pool of the hosts this policy covers; unset fields take the client
    /// builder's values. Default: every field unset.
    pub pool: PoolPolicy,
    /// The delivery semantics the route declares (seed 001's `sem`) and its dedup window.
    /// Default: nothing declared.
    pub delivery: DeliveryPolicy,
}

impl NetPolicy {
    /// Checks every rule and returns every problem at once, with paths relative to the
    /// policy (`retry.backoff.cap`).
    ///
    /// # Errors
    /// A [`PolicyError`] listing each problem, e.g. zero attempts, jitter outside `[0, 1]`,
    /// `cap < base`, TLS below 1.2, certificate verification off, or a policy that cannot keep
    /// its own deadline (its worst case, [`worst_case_latency`](Self::worst_case_latency), must
    /// fit in `timeout.total − timeout.margin`).
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_policy::NetPolicy;
    /// let mut p = NetPolicy::default();
    /// assert!(p.validate().is_ok());
    /// p.retry.max_attempts = 0;
    /// p.tls.verify_cert = false;
    /// let err = p.validate().unwrap_err();
    /// assert_eq!(err.problems().len(), 2);
    /// assert_eq!(err.problems()[0].path, "retry.max_attempts");
    /// ```
    pub fn validate(&self) -> Result<(), PolicyError> {
        PolicyError::check(self.problems())
    }

    /// Every problem of this policy, paths relative to it; empty when valid.
    pub(crate) fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let mut c = Checker::new("", &mut out);
        self.retry.check(&mut c.nested("retry"));
        self.cbreaker.check(&mut c.nested("cbreaker"));
        self.redirect.check(&mut c.nested("redirect"));
        self.tls.check(&mut c.nested("tls"));
        self.dns.check(&mut c.nested("dns"));
        if let Some(proxy) = &self.proxy {
            proxy.check(&mut c.nested("proxy"));
        }
        self.security.check(&mut c.nested("security"));
        self.limits.check(&mut c.nested("limits"));
        self.cache.check(&mut c.nested("cache"));
        self.hedge.check(&mut c.nested("hedge"));
        self.endpoints.check(&mut c.nested("endpoints"));
        self.timeout.check(&mut c.nested("timeout"));
        self.slo.check(&mut c.nested("slo"));
        self.http.check(&self.tls, &mut c.nested("http"));
        self.pool.check(&mut c.nested("pool"));
        self.delivery
            .check(&self.retry, &self.hedge, &mut c.nested("delivery"));
        timeout::check_deadline(&self.retry, &self.timeout, &mut c);
        out
    }

    /// The longest a call can take under this policy, with backoff at its worst: `Σ_{k=1}^{attempts-1} retry.backoff.max_delay(k) + attempts × timeout.attempt`.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use soulbase_net_policy::NetPolicy;
    /// // 3 × 9s + (100ms + 200ms) of backoff
    /// assert_eq!(NetPolicy::default().worst_case_latency(), Duration::from_millis(27_300));
    /// ```
    pub fn worst_case_latency(&self) -> Duration {
        self.timeout.worst_case_latency(&self.retry)
    }

    /// The limit on redirects actually applied: the smaller of `redirect.max` and
    /// `security.max_redirects`, or 0 when redirects are off.
    pub fn effective_max_redirects(&self) -> u8 {
        if self.redirect.enabled {
            self.redirect.max.min(self.security.max_redirects)
        } else {
            0
        }
    }
}
