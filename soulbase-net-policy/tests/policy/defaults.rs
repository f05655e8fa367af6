//! Every built-in default equals the seed's (seed 000 §3, seeds 001, 002, 004), one assertion
//! per field.

use std::time::Duration;

use soulbase_net_policy::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn retry_defaults() {
    let r = NetPolicy::default().retry;
    assert!(r.enabled);
    assert_eq!(r.max_attempts, 3);
    assert_eq!(r.backoff.base, ms(100));
    assert_eq!(r.backoff.factor, 2.0);
    assert_eq!(r.backoff.jitter, 1.0);
    assert_eq!(r.backoff.cap, secs(5));
    assert_eq!(r.backoff.mode, JitterMode::Full);
    assert!(r.retry_on.status_5xx);
    assert!(r.retry_on.status_429);
    assert!(r.retry_on.dns);
    assert!(r.retry_on.connect);
    assert!(r.retry_on.io);
    assert!(r.retry_on.timeout_connect);
    assert!(r.retry_on.timeout_ttfb);
    assert!(r.retry_on.timeout_read);
    assert!(r.respect_retry_after);
    assert!(r.budget.enabled);
    assert_eq!(r.budget.retry_ratio, 0.2);
    assert_eq!(r.budget.min_retries_per_sec, 10);
    assert_eq!(r.budget.window, secs(10));
    assert!(!r.budget.per_tenant);
    assert_eq!(r.effective_attempts(), 3);
}

#[test]
fn breaker_defaults() {
    let b = NetPolicy::default().cbreaker;
    assert!(!b.enabled);
    assert_eq!(b.window, secs(10));
    assert_eq!(b.failure_ratio, 0.5);
    assert_eq!(b.min_samples, 20);
    assert_eq!(b.consecutive_failures, 5);
    assert_eq!(b.cooldown, secs(30));
    assert_eq!(b.half_open_probes, 3);
    assert_eq!(b.key_by, CbKey::Host);
    assert_eq!(b.slow_call, None);
    assert!(b.count_5xx);
    assert_eq!(b.max_keys, 10_000);
    assert_eq!(b.idle_evict, secs(600));
    let s = SlowCallCfg::default();
    assert_eq!(s.threshold, secs(5));
    assert_eq!(s.ratio, 0.5);
}

#[test]
fn redirect_defaults() {
    let r = NetPolicy::default().redirect;
    assert!(r.enabled);
    assert_eq!(r.max, 5);
    assert!(r.allow_cross_origin);
    assert!(!r.keep_method_on_303);
}

#[test]
fn tls_defaults() {
    let t = NetPolicy::default().tls;
    assert_eq!(t.min_tls, TlsVersion::Tls12);
    assert_eq!(t.max_tls, TlsVersion::Tls13);
    assert!(t.verify_cert);
    assert_eq!(t.pinset_sha256, None);
    assert_eq!(t.mtls, None);
    assert!(t.extra_roots_pem.is_empty());
    assert!(t.http2);
}

#[test]
fn http_defaults() {
    let h = NetPolicy::default().http;
    assert_eq!(h.version, HttpVersionPolicy::Auto);
    assert!(!h.wants_h3());
    assert!(!h.zero_rtt);
}

#[test]
fn dns_defaults() {
    let d = NetPolicy::default().dns;
    assert_eq!(d.timeout, secs(2));
    assert_eq!(d.cache_ttl, secs(3600));
    assert_eq!(d.min_ttl, Duration::ZERO);
    assert!(d.happy_eyeballs);
    assert_eq!(d.happy_eyeballs_delay, ms(300));
    assert!(!d.prefer_ipv6);
    assert!(d.shuffle);
    assert!(d.serve_stale);
    assert_eq!(d.stale_for, secs(3600));
    assert_eq!(d.persist_file, None);
    assert_eq!(d.persist_interval, Some(secs(1800)));
    assert_eq!(d.refresh_interval, Some(secs(1800)));
    assert_eq!(d.resolve_retries, 10);
    assert_eq!(d.resolve_retry_delay, secs(1));
    assert!(d.prefetch.is_empty());
    assert!(d.static_hosts.is_empty());
    assert!(d.nameservers.is_empty());
}

#[test]
fn proxy_defaults() {
    assert_eq!(NetPolicy::default().proxy, None);
    let p = ProxyPolicy::default();
    assert_eq!(p.http_proxy, None);
    assert_eq!(p.https_proxy, None);
    assert!(p.no_proxy.is_empty());
    assert!(!p.from_env);
}

#[test]
fn security_defaults() {
    let s = NetPolicy::default().security;
    assert_eq!(s.allow_hosts, None);
    assert!(s.deny_private);
    assert!(!s.strict_mixed_answers);
    assert_eq!(s.max_redirects, 5);
    assert_eq!(s.max_resp_bytes, ByteSize(32 * 1024 * 1024));
    assert_eq!(s.max_req_bytes, ByteSize(32 * 1024 * 1024));
    assert!(s.strip_headers.is_empty());
    assert!(s.grants.hosts.is_empty());
    assert!(s.grants.cidrs.is_empty());
}

#[test]
fn limits_defaults() {
    let l = NetPolicy::default().limits;
    assert_eq!(l.per_host_concurrency, 64);
    assert_eq!(l.per_tenant_concurrency, 256);
    assert_eq!(l.per_host_rate_rps, None);
    assert_eq!(l.rate_burst, None);
    assert_eq!(l.max_wait, Duration::ZERO);
    assert!(!l.aimd.enabled);
    assert_eq!(l.aimd.scope, AimdScope::Host);
    assert_eq!(l.aimd.initial, 16);
    assert_eq!(l.aimd.min, 1);
    assert_eq!(l.aimd.max, 256);
    assert_eq!(l.aimd.increase, 1);
    assert_eq!(l.aimd.decrease_factor, 0.5);
}

#[test]
fn cache_hedge_endpoint_defaults() {
    let p = NetPolicy::default();
    assert!(p.cache.enable_etag);
    assert!(!p.cache.swr);
    assert_eq!(p.cache.max_entries, 10_000);
    assert_eq!(p.cache.max_entry_bytes, ByteSize(1024 * 1024));
    assert!(!p.hedge.enabled);
    assert_eq!(p.hedge.delay, ms(50));
    assert_eq!(p.hedge.max_hedges, 1);
    assert!(p.endpoints.freeze);
    assert_eq!(p.endpoints.frozen_duration, secs(600));
    assert!(p.endpoints.urls.is_empty());
}

#[test]
fn timeout_defaults() {
    let t = NetPolicy::default().timeout;
    assert_eq!(t.connect, secs(2));
    assert_eq!(t.ttfb, secs(8));
    assert_eq!(t.read, secs(8));
    assert_eq!(t.write, secs(8));
    assert_eq!(t.attempt, secs(9));
    assert_eq!(t.total, secs(30));
    assert_eq!(t.margin, ms(100));
    assert!(!t.dynamic.enabled);
    assert_eq!(t.dynamic.percentile, 0.99);
    assert_eq!(t.dynamic.factor, 1.5);
    assert_eq!(t.dynamic.min, ms(100));
    assert_eq!(t.dynamic.max, secs(9));
    assert_eq!(t.dynamic.min_samples, 50);
}

#[test]
fn defaults_are_valid_and_keep_their_deadline() {
    let p = NetPolicy::default();
    p.validate().unwrap();
    assert_eq!(p.worst_case_latency(), ms(27_300));
    assert!(p.worst_case_latency() <= p.timeout.total - p.timeout.margin);
    assert_eq!(p.effective_max_redirects(), 5);
}

#[test]
fn an_empty_document_is_all_defaults() {
    let r = SnapshotResolver::new(PolicyDocument::from_toml_str("").unwrap()).unwrap();
    assert_eq!(*r.resolve(Some("any"), "any.example"), NetPolicy::default());
    let r = SnapshotResolver::new(PolicyDocument::from_json_str("{}").unwrap()).unwrap();
    assert_eq!(*r.resolve(None, "any.example"), NetPolicy::default());
}
