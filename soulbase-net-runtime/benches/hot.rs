//! The hot parts of one call, each in ns: breaker admission and record, limiter acquire and
//! release, a DNS cache hit, address classification and filtering, the backoff computation,
//! and policy resolution.
#![allow(
    clippy::expect_used,
    reason = "a benchmark: a setup failure must stop it"
)]

use std::hint::black_box;
use std::net::IpAddr;

use criterion::{criterion_group, criterion_main, Criterion};
use soulbase_net_policy::{
    classify, AddressGuard, BackoffCfg, CircuitBreakerPolicy, DynamicTimeout, LimitsPolicy,
    PolicyDocument, SecurityPolicy, SnapshotResolver,
};
use soulbase_net_runtime::bench_hooks::HotParts;

fn hot(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime builds");
    let _guard = rt.enter();
    let parts = HotParts::new();
    let mut breaker = CircuitBreakerPolicy::default();
    breaker.enabled = true;
    assert!(parts.breaker_admit_record("api.example.com", &breaker));
    c.bench_function("breaker/admit+record", |b| {
        b.iter(|| black_box(parts.breaker_admit_record(black_box("api.example.com"), &breaker)))
    });
    let limits = LimitsPolicy::default();
    assert!(parts.limiter_acquire_release("api.example.com", &limits));
    c.bench_function("limiter/acquire+release", |b| {
        b.iter(|| black_box(parts.limiter_acquire_release(black_box("api.example.com"), &limits)))
    });
    let mut dynamic = DynamicTimeout::default();
    dynamic.enabled = true;
    let ttfb = std::time::Duration::from_millis(12);
    for _ in 0..1000 {
        parts.dynamic_timeout("api.example.com", ttfb, &dynamic);
    }
    assert!(
        parts.dynamic_timeout("api.example.com", ttfb, &dynamic)
            < std::time::Duration::from_secs(30)
    );
    c.bench_function("dynamic timeout/record+read", |b| {
        b.iter(|| black_box(parts.dynamic_timeout(black_box("api.example.com"), ttfb, &dynamic)))
    });
    assert_eq!(parts.dns_hit("api.example.com"), 2);
    c.bench_function("dns/cache hit", |b| {
        b.iter(|| black_box(parts.dns_hit(black_box("api.example.com"))))
    });
    let addrs: Vec<IpAddr> = [
        "93.184.216.34",
        "10.0.0.1",
        "::ffff:169.254.169.254",
        "2001:db8::1",
    ]
    .iter()
    .map(|a| a.parse().expect("a literal address"))
    .collect();
    c.bench_function("guard/classify 4 addresses", |b| {
        b.iter(|| {
            for a in &addrs {
                black_box(classify(black_box(*a)));
            }
        })
    });
    let guard = AddressGuard::new(&SecurityPolicy::default()).expect("default policy is valid");
    c.bench_function("guard/filter 4 addresses", |b| {
        b.iter(|| black_box(guard.filter_addrs(black_box("api.example.com"), &addrs)))
    });
    let backoff = BackoffCfg::default();
    c.bench_function("retry/backoff delay", |b| {
        b.iter(|| black_box(parts.backoff(&backoff, black_box(3))))
    });
    let uniform = SnapshotResolver::new(PolicyDocument::new()).expect("empty document");
    c.bench_function("policy/resolve, no overrides", |b| {
        b.iter(|| black_box(uniform.resolve(None, black_box("api.example.com"))))
    });
    let doc = PolicyDocument::from_toml_str(
        "[overrides.\"*.example.com\"]\nretry.max_attempts = 2\n[tenants.t1]\nredirect.max = 2",
    )
    .expect("a valid document");
    let layered = SnapshotResolver::new(doc).expect("a valid document");
    c.bench_function("policy/resolve, overrides (cached)", |b| {
        b.iter(|| black_box(layered.resolve(Some("t1"), black_box("api.example.com"))))
    });
}

criterion_group!(benches, hot);
criterion_main!(benches);
