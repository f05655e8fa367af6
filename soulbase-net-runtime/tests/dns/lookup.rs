//! Lookups, TTLs, singleflight, serve-stale, TCP fallback and errors.

use std::sync::Arc;
use std::time::Duration;

use soulbase_net_core::{DnsSource, ErrorKind, Phase};
use soulbase_net_testkit::MockDns;

use crate::{a_queries, ips, policy, resolver, sorted};

#[tokio::test]
async fn answers_are_cached_for_their_ttl() {
    let dns = MockDns::start().await.unwrap();
    let name = "ttl.example.test";
    dns.set_ips(name, &ips(&["192.0.2.1", "2001:db8::1"]), 1);
    let r = resolver(&policy(&dns));

    let first = r.resolve(name).await.unwrap();
    assert_eq!(first.source, DnsSource::Lookup);
    assert_eq!(sorted(&first.addrs), ips(&["192.0.2.1", "2001:db8::1"]));
    assert_eq!(a_queries(&dns, name), 1);
    assert_eq!(r.cached_names(), 1);

    // Within the TTL: from the cache, no query.
    for _ in 0..5 {
        let again = r.resolve(name).await.unwrap();
        assert_eq!(again.source, DnsSource::Cache);
        assert_eq!(sorted(&again.addrs), sorted(&first.addrs));
    }
    assert_eq!(a_queries(&dns, name), 1);

    // After the TTL (1s): one new lookup, which sees the new answer.
    dns.set_ips(name, &ips(&["192.0.2.2"]), 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later = r.resolve(name).await.unwrap();
    assert_eq!(later.source, DnsSource::Lookup);
    assert_eq!(&*later.addrs, ips(&["192.0.2.2"]).as_slice());
    assert_eq!(a_queries(&dns, name), 2);
}

#[tokio::test]
async fn min_ttl_keeps_a_zero_ttl_answer() {
    let dns = MockDns::start().await.unwrap();
    let name = "zero.example.test";
    dns.set_ips(name, &ips(&["192.0.2.3"]), 0);
    let mut p = policy(&dns);
    p.min_ttl = Duration::from_secs(60);
    let r = resolver(&p);
    assert_eq!(r.resolve(name).await.unwrap().source, DnsSource::Lookup);
    assert_eq!(r.resolve(name).await.unwrap().source, DnsSource::Cache);
    assert_eq!(a_queries(&dns, name), 1);
}

#[tokio::test]
async fn hundred_concurrent_resolves_make_one_lookup() {
    let dns = MockDns::start().await.unwrap();
    let name = "flight.example.test";
    dns.set_ips(name, &ips(&["192.0.2.10"]), 60);
    dns.delay(name, Duration::from_millis(100));
    let r = resolver(&policy(&dns));

    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let r = r.clone();
            tokio::spawn(async move { r.resolve(name).await })
        })
        .collect();
    for t in tasks {
        let res = t.await.unwrap().unwrap();
        assert_eq!(res.source, DnsSource::Lookup);
        assert_eq!(&*res.addrs, ips(&["192.0.2.10"]).as_slice());
    }
    let log: Vec<_> = dns.queries();
    assert_eq!(a_queries(&dns, name), 1, "{log:?}");
    assert_eq!(
        dns.query_count(name),
        2,
        "one A and one AAAA query: {log:?}"
    );
}

#[tokio::test]
async fn a_failing_server_gets_the_stale_answer() {
    let dns = MockDns::start().await.unwrap();
    let name = "stale.example.test";
    dns.set_ips(name, &ips(&["192.0.2.20"]), 1);
    let r = resolver(&policy(&dns));
    assert_eq!(r.resolve(name).await.unwrap().source, DnsSource::Lookup);

    dns.servfail(name);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let res = r.resolve(name).await.unwrap();
    assert_eq!(res.source, DnsSource::Stale);
    assert_eq!(&*res.addrs, ips(&["192.0.2.20"]).as_slice());
    assert!(a_queries(&dns, name) >= 2, "the lookup was tried");

    // Without serve_stale, the failure is the answer.
    let mut p = policy(&dns);
    p.serve_stale = false;
    let strict = resolver(&p);
    dns.set_ips(name, &ips(&["192.0.2.21"]), 1);
    strict.resolve(name).await.unwrap();
    dns.servfail(name);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let err = strict.resolve(name).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Dns);
}

#[tokio::test]
async fn truncated_udp_answers_fall_back_to_tcp() {
    let dns = MockDns::start().await.unwrap();
    let name = "big.example.test";
    dns.set_ips(name, &ips(&["192.0.2.30", "192.0.2.31"]), 60);
    dns.truncate_udp(name, true);
    let r = resolver(&policy(&dns));
    let res = r.resolve(name).await.unwrap();
    assert_eq!(res.source, DnsSource::Lookup);
    assert_eq!(sorted(&res.addrs), ips(&["192.0.2.30", "192.0.2.31"]));
    let log = dns.queries();
    assert!(log.iter().any(|q| q.qtype == "A" && !q.tcp), "{log:?}");
    assert!(log.iter().any(|q| q.qtype == "A" && q.tcp), "{log:?}");
}

#[tokio::test]
async fn unknown_names_and_server_failures_are_dns_errors() {
    let dns = MockDns::start().await.unwrap();
    let r = resolver(&policy(&dns));

    let err = r.resolve("missing.example.test").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Dns);
    assert!(err.message().unwrap().contains("missing.example.test"));
    assert!(
        std::error::Error::source(&err).is_some(),
        "the hickory error is the source"
    );

    dns.servfail("broken.example.test");
    let err = r.resolve("broken.example.test").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Dns);
    assert!(err.message().unwrap().contains("broken.example.test"));

    // A name with no A or AAAA records.
    dns.set_ips("empty.example.test", &[], 60);
    let err = r.resolve("empty.example.test").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Dns);
    assert_eq!(r.cached_names(), 0, "failures are not cached");

    // Not a host at all: refused before any query.
    let before = dns.queries().len();
    for bad in ["", "127.1", "2130706433", "a b.example.test"] {
        let err = r.resolve(bad).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{bad:?}");
    }
    assert_eq!(dns.queries().len(), before);
}

#[tokio::test]
async fn a_slow_answer_is_a_dns_timeout() {
    let dns = MockDns::start().await.unwrap();
    let name = "slow.example.test";
    dns.set_ips(name, &ips(&["192.0.2.40"]), 60);
    dns.delay(name, Duration::from_secs(3));
    let mut p = policy(&dns);
    p.timeout = Duration::from_millis(300);
    let r = resolver(&p);
    let start = tokio::time::Instant::now();
    let err = r.resolve(name).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Dns));
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn static_hosts_and_literals_make_no_queries() {
    let dns = MockDns::start().await.unwrap();
    let mut p = policy(&dns);
    p.static_hosts
        .insert("Pinned.Example.Test.".into(), ips(&["192.0.2.50"]));
    let r = resolver(&p);

    for host in [
        "pinned.example.test",
        "PINNED.example.test.",
        "pinned.example.test.",
    ] {
        let res = r.resolve(host).await.unwrap();
        assert_eq!(res.source, DnsSource::Static, "{host}");
        assert_eq!(&*res.addrs, ips(&["192.0.2.50"]).as_slice());
    }
    for (host, ip) in [
        ("10.1.2.3", "10.1.2.3"),
        ("[::1]", "::1"),
        ("2001:db8::7", "2001:db8::7"),
    ] {
        let res = r.resolve(host).await.unwrap();
        assert_eq!(res.source, DnsSource::Literal, "{host}");
        assert_eq!(&*res.addrs, ips(&[ip]).as_slice());
    }
    assert!(dns.queries().is_empty(), "{:?}", dns.queries());
    assert_eq!(r.cached_names(), 0);
}

#[tokio::test]
async fn clones_share_the_cache() {
    let dns = MockDns::start().await.unwrap();
    let name = "shared.example.test";
    dns.set_ips(name, &ips(&["192.0.2.60"]), 60);
    let r = resolver(&policy(&dns));
    let clone = r.clone();
    r.resolve(name).await.unwrap();
    let res = clone.resolve(name).await.unwrap();
    assert_eq!(res.source, DnsSource::Cache);
    let addrs: Arc<[_]> = res.addrs;
    assert_eq!(&*addrs, ips(&["192.0.2.60"]).as_slice());
    assert!(format!("{r:?}").contains("DnsResolver"));
}
