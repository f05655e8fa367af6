//! Prefetch, background refresh with retries, and stopping on drop.

use std::time::Duration;

use soulbase_net_core::DnsSource;
use soulbase_net_testkit::MockDns;

use crate::{a_queries, eventually, ips, policy, resolver};

#[tokio::test]
async fn prefetched_names_are_cached_at_start() {
    let dns = MockDns::start().await.unwrap();
    let name = "early.example.test";
    dns.set_ips(name, &ips(&["192.0.2.1"]), 60);
    let mut p = policy(&dns);
    p.prefetch = vec![name.into(), "Static.Example.Test".into()];
    p.static_hosts
        .insert("static.example.test".into(), ips(&["192.0.2.9"]));
    let r = resolver(&p);
    assert!(eventually(Duration::from_secs(2), || r.cached_names() == 1).await);
    assert_eq!(r.resolve(name).await.unwrap().source, DnsSource::Cache);
    assert_eq!(a_queries(&dns, name), 1);
    assert_eq!(
        a_queries(&dns, "static.example.test"),
        0,
        "static names are not looked up"
    );
}

#[tokio::test]
async fn prefetch_retries_with_a_randomised_delay() {
    let dns = MockDns::start().await.unwrap();
    let name = "flaky.example.test";
    dns.servfail(name);
    let mut p = policy(&dns);
    p.prefetch = vec![name.into()];
    p.resolve_retries = 3;
    p.resolve_retry_delay = Duration::from_millis(200);
    let r = resolver(&p);
    // Three rounds, then it gives up. Hickory may re-send within one round, at once; the
    // rounds are the bursts of A queries at least 50 % of the delay apart.
    let rounds = |dns: &MockDns| {
        let at: Vec<Duration> = dns
            .queries()
            .iter()
            .filter(|q| q.qtype == "A")
            .map(|q| q.at)
            .collect();
        1 + at
            .windows(2)
            .filter(|w| w[1] - w[0] >= Duration::from_millis(100))
            .count()
    };
    assert!(eventually(Duration::from_secs(3), || rounds(&dns) >= 3).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rounds(&dns), 3, "{:?}", dns.queries());
    assert_eq!(r.cached_names(), 0);
}

#[tokio::test]
async fn expired_names_are_refreshed_in_the_background() {
    let dns = MockDns::start().await.unwrap();
    let name = "refresh.example.test";
    dns.set_ips(name, &ips(&["192.0.2.2"]), 1);
    let mut p = policy(&dns);
    p.refresh_interval = Some(Duration::from_millis(300));
    let r = resolver(&p);
    r.resolve(name).await.unwrap();
    dns.set_ips(name, &ips(&["192.0.2.3"]), 60);
    // The 1s TTL passes; a refresh tick looks it up again without any caller.
    assert!(eventually(Duration::from_secs(3), || a_queries(&dns, name) >= 2).await);
    // The caller gets the refreshed answer — from the cache, or by joining the refresh if it
    // is still being stored — and makes no lookup of its own.
    let res = r.resolve(name).await.unwrap();
    assert!(
        matches!(res.source, DnsSource::Cache | DnsSource::Lookup),
        "{:?}",
        res.source
    );
    assert_eq!(&*res.addrs, ips(&["192.0.2.3"]).as_slice());
    assert_eq!(a_queries(&dns, name), 2, "{:?}", dns.queries());
}

#[tokio::test]
async fn background_work_stops_when_the_resolver_is_dropped() {
    let dns = MockDns::start().await.unwrap();
    let name = "gone.example.test";
    dns.set_ips(name, &ips(&["192.0.2.4"]), 1);
    let mut p = policy(&dns);
    p.refresh_interval = Some(Duration::from_millis(200));
    let r = resolver(&p);
    r.resolve(name).await.unwrap();
    drop(r);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(a_queries(&dns, name), 1, "no refresh after drop");
}

#[tokio::test]
async fn names_nobody_asks_for_are_not_kept_warm() {
    let dns = MockDns::start().await.unwrap();
    let name = "idle.example.test";
    dns.set_ips(name, &ips(&["192.0.2.5"]), 1);
    let mut p = policy(&dns);
    p.prefetch = vec![name.into()];
    p.refresh_interval = Some(Duration::from_millis(200));
    let r = resolver(&p);
    assert!(eventually(Duration::from_secs(2), || r.cached_names() == 1).await);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(
        a_queries(&dns, name),
        1,
        "prefetched, never asked for, not refreshed"
    );
    assert_eq!(r.cached_names(), 1, "kept, stale, until stale_for ends");
}

#[test]
fn building_outside_a_runtime_starts_no_background_work() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dns = rt.block_on(MockDns::start()).unwrap();
    let name = "outside.example.test";
    dns.set_ips(name, &ips(&["192.0.2.6"]), 60);
    let mut p = policy(&dns);
    p.prefetch = vec![name.into()];
    p.refresh_interval = Some(Duration::from_millis(50));
    let r = resolver(&p);
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(300)).await });
    assert_eq!(a_queries(&dns, name), 0, "no prefetch without a runtime");
    let res = rt.block_on(r.resolve(name)).unwrap();
    assert_eq!(res.source, DnsSource::Lookup);
    drop(r);
    drop(dns);
}

#[tokio::test]
async fn a_slow_name_does_not_hold_up_the_other_prefetches() {
    let dns = MockDns::start().await.unwrap();
    dns.set_ips("slow.example.test", &ips(&["192.0.2.7"]), 60);
    dns.delay("slow.example.test", Duration::from_millis(1500));
    dns.set_ips("fast.example.test", &ips(&["192.0.2.8"]), 60);
    let mut p = policy(&dns);
    p.prefetch = vec!["slow.example.test".into(), "fast.example.test".into()];
    let r = resolver(&p);
    assert!(eventually(Duration::from_millis(700), || r.cached_names() == 1).await);
    let fast = r.resolve("fast.example.test").await.unwrap();
    assert_eq!(fast.source, DnsSource::Cache);
    assert!(eventually(Duration::from_secs(3), || r.cached_names() == 2).await);
}
