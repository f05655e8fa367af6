//! The order of addresses: preferred family first, families alternating, shuffling.

use std::collections::HashSet;

use soulbase_net_testkit::MockDns;

use crate::{ips, policy, resolver, sorted};

#[tokio::test]
async fn the_preferred_family_comes_first_and_families_alternate() {
    let dns = MockDns::start().await.unwrap();
    let name = "dual.example.test";
    let all = ips(&["192.0.2.1", "192.0.2.2", "2001:db8::1", "2001:db8::2"]);
    dns.set_ips(name, &all, 60);

    let mut p = policy(&dns);
    let v4_first = resolver(&p).resolve(name).await.unwrap();
    let families: Vec<bool> = v4_first.addrs.iter().map(|ip| ip.is_ipv6()).collect();
    assert_eq!(families, [false, true, false, true]);
    assert_eq!(sorted(&v4_first.addrs), sorted(&all));

    p.prefer_ipv6 = true;
    let v6_first = resolver(&p).resolve(name).await.unwrap();
    let families: Vec<bool> = v6_first.addrs.iter().map(|ip| ip.is_ipv6()).collect();
    assert_eq!(families, [true, false, true, false]);

    // Without happy eyeballs the preferred family still comes first, grouped.
    p.happy_eyeballs = false;
    let grouped = resolver(&p).resolve(name).await.unwrap();
    let families: Vec<bool> = grouped.addrs.iter().map(|ip| ip.is_ipv6()).collect();
    assert_eq!(families, [true, true, false, false]);
}

#[tokio::test]
async fn shuffling_changes_the_order_across_calls() {
    let dns = MockDns::start().await.unwrap();
    let name = "many.example.test";
    let all = ips(&[
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
        "192.0.2.4",
        "192.0.2.5",
        "192.0.2.6",
    ]);
    dns.set_ips(name, &all, 60);
    let mut p = policy(&dns);
    p.shuffle = true;
    let r = resolver(&p);
    let mut orders = HashSet::new();
    for _ in 0..30 {
        let res = r.resolve(name).await.unwrap();
        assert_eq!(sorted(&res.addrs), all);
        orders.insert(res.addrs.to_vec());
    }
    // 30 draws from 720 orders all equal has probability 720^-29.
    assert!(orders.len() > 1);
    assert_eq!(
        dns.query_count(name),
        2,
        "one lookup (A + AAAA); the rest from the cache"
    );

    // Without shuffling, the order is stable.
    let fixed = resolver(&policy(&dns));
    let first = fixed.resolve(name).await.unwrap().addrs;
    for _ in 0..10 {
        assert_eq!(fixed.resolve(name).await.unwrap().addrs, first);
    }
}
