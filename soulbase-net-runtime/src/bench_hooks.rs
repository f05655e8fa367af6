//! Entry points to internal hot-path parts, for this crate's criterion benches
//! (`benches/hot.rs`). Hidden from the docs and not part of the API: they may change.

use std::{
    future::Future,
    net::IpAddr,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::{Duration, SystemTime},
};

use soulbase_net_policy::{BackoffCfg, CircuitBreakerPolicy, DynamicTimeout, LimitsPolicy};
use tokio::time::Instant;

use crate::client::Latencies;
use crate::dns::cache::{Answer, CacheCfg, DnsCache};
use crate::resilience::{backoff_delay, Breakers, FastRand, Limiter};

/// The parts, each as the client holds one.
pub struct HotParts {
    breakers: Breakers,
    limiter: Limiter,
    dns: DnsCache<()>,
    latencies: Latencies,
}

impl std::fmt::Debug for HotParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotParts").finish_non_exhaustive()
    }
}

impl Default for HotParts {
    fn default() -> Self {
        Self::new()
    }
}

impl HotParts {
    /// Empty parts; the DNS cache holds `api.example.com` → two addresses for an hour.
    pub fn new() -> Self {
        let dns = DnsCache::new(CacheCfg {
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(3600),
            stale_for: Duration::ZERO,
            max_entries: 1024,
        });
        let addrs: Arc<[IpAddr]> = Arc::from(vec![
            IpAddr::from([192, 0, 2, 1]),
            IpAddr::from([192, 0, 2, 2]),
        ]);
        let answer = Answer {
            addrs,
            ttl: Duration::from_secs(3600),
        };
        dns.insert(
            "api.example.com",
            &answer,
            Instant::now(),
            SystemTime::now(),
        );
        HotParts {
            breakers: Breakers::new(10_000, Duration::from_secs(600), None),
            limiter: Limiter::new(10_000),
            dns,
            latencies: Latencies::default(),
        }
    }

    /// What an attempt pays for the dynamic timeout: one time-to-first-byte recorded in
    /// `host`'s latency histogram and the learnt timeout read back (the percentile of
    /// `cfg`, once enough latencies are known). Returns the timeout.
    pub fn dynamic_timeout(&self, host: &str, ttfb: Duration, cfg: &DynamicTimeout) -> Duration {
        self.latencies.record(host, ttfb);
        self.latencies.timeout(host, cfg, Duration::from_secs(30))
    }

    /// One breaker admission and its outcome recorded, for `key`; whether it was admitted.
    pub fn breaker_admit_record(&self, key: &str, p: &CircuitBreakerPolicy) -> bool {
        let now = Instant::now();
        match self.breakers.admit(key, p, now) {
            Ok(permit) => {
                permit.record(false, Duration::from_millis(1), now);
                true
            }
            Err(_) => false,
        }
    }

    /// One limiter acquisition for `host` as the client makes it (at once, without a
    /// future, when no wait is needed) and its release; whether a permit was granted.
    pub fn limiter_acquire_release(&self, host: &str, p: &LimitsPolicy) -> bool {
        match self
            .limiter
            .acquire_now(host, None, p, tokio::time::Instant::now())
        {
            Some(acquired) => acquired.is_ok(),
            None => {
                let acquire = std::pin::pin!(self.limiter.acquire(host, None, p));
                let mut cx = Context::from_waker(Waker::noop());
                matches!(acquire.poll(&mut cx), Poll::Ready(Ok(_)))
            }
        }
    }

    /// A fresh cache hit for `name`: the number of addresses (0 on a miss).
    pub fn dns_hit(&self, name: &str) -> usize {
        self.dns
            .get_fresh(name, Instant::now())
            .map_or(0, |addrs| addrs.len())
    }

    /// The wait before retry `k` (full jitter).
    pub fn backoff(&self, cfg: &BackoffCfg, k: u32) -> Duration {
        backoff_delay(cfg, k, &mut FastRand)
    }
}
