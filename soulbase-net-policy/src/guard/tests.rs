use std::net::IpAddr;

use proptest::prelude::*;
use soulbase_net_core::ErrorCode;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn guard(edit: impl FnOnce(&mut SecurityPolicy)) -> AddressGuard {
    let mut p = SecurityPolicy::default();
    edit(&mut p);
    AddressGuard::new(&p).unwrap()
}

#[test]
fn default_guard_refuses_every_special_range_and_allows_public() {
    let g = guard(|_| {});
    for addr in [
        "127.0.0.1",
        "10.1.2.3",
        "172.20.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fd00::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "64:ff9b::a00:1",
        "2002:a00:1::",
        "2001:db8::1",
        "::ff:ff:a00:1",
        "::1:0:a9fe:a9fe",
        "::ffff:ffff:a00:1",
        "4000::1",
        "192.0.0.9",
        "192.31.196.1",
        "2620:4f:8000::1",
    ] {
        let denied = g.check_addr("h.example", ip(addr)).unwrap_err();
        assert!(matches!(denied.rule, DenyRule::Range(_)), "{addr}");
        let err = NetError::from(denied);
        assert_eq!(err.kind(), ErrorKind::Blocked, "{addr}");
        assert_eq!(err.code(), ErrorCode::AuthForbidden, "{addr}");
    }
    for addr in [
        "93.184.215.14",
        "8.8.8.8",
        "2606:4700:4700::1111",
        "2606:4700::1111",
        "2000::1",
        "::ffff:8.8.8.8",
    ] {
        g.check_addr("h.example", ip(addr)).unwrap();
    }
}

/// Issue 33, item 10: the rest of `::/8` was dialled as public.
#[test]
fn reserved_ipv6_is_refused_and_named() {
    let g = guard(|_| {});
    for addr in ["::ff:ff:a00:1", "::1:0:a9fe:a9fe", "::ffff:ffff:a00:1"] {
        let denied = g.check_addr("h", ip(addr)).unwrap_err();
        assert_eq!(
            denied.rule,
            DenyRule::Range(SpecialRange::Reserved),
            "{addr}"
        );
        assert_eq!(denied.addr, Some(ip(addr)), "{addr}");
        assert_eq!(
            denied.to_string(),
            format!("{addr} (for h) is a reserved address")
        );
    }
    // Like every special range but cloud metadata: opened by a grant, or with deny_private off.
    guard(|p| p.grants.cidrs = vec!["::/8".parse().unwrap()])
        .check_addr("h", ip("::1:0:a9fe:a9fe"))
        .unwrap();
    guard(|p| p.deny_private = false)
        .check_addr("h", ip("::ffff:ffff:a00:1"))
        .unwrap();
}

#[test]
fn the_refused_address_is_reported_canonical() {
    let denied = guard(|_| {})
        .check_addr("h", ip("::ffff:10.0.0.1"))
        .unwrap_err();
    assert_eq!(denied.addr, Some(ip("10.0.0.1")));
    assert_eq!(denied.rule.as_str(), "private");
    assert_eq!(denied.to_string(), "10.0.0.1 (for h) is a private address");
}

#[test]
fn mixed_answers_keep_only_allowed_addresses_unless_strict() {
    let g = guard(|_| {});
    let answers = [
        ip("10.0.0.1"),
        ip("8.8.8.8"),
        ip("::ffff:1.1.1.1"),
        ip("127.0.0.1"),
    ];
    assert_eq!(
        g.filter_addrs("h", &answers).unwrap(),
        vec![ip("8.8.8.8"), ip("1.1.1.1")]
    );
    let only_private = [ip("10.0.0.1"), ip("127.0.0.1")];
    let denied = g.filter_addrs("h", &only_private).unwrap_err();
    assert_eq!(denied.addr, Some(ip("10.0.0.1")));
    assert!(g.filter_addrs("h", &[]).unwrap().is_empty());

    let strict = guard(|p| p.strict_mixed_answers = true);
    let denied = strict.filter_addrs("h", &answers).unwrap_err();
    assert_eq!(denied.rule, DenyRule::StrictMixed(SpecialRange::Private));
    assert!(denied.to_string().contains("strict_mixed_answers"));
    assert_eq!(
        strict.filter_addrs("h", &[ip("8.8.8.8")]).unwrap(),
        vec![ip("8.8.8.8")]
    );
}

#[test]
fn grants_open_what_they_name_and_nothing_else() {
    let g = guard(|p| {
        p.grants.cidrs = vec![
            "10.1.0.0/16".parse().unwrap(),
            "169.254.169.254/32".parse().unwrap(),
        ];
        p.grants.hosts = vec!["*.internal.example".to_owned()];
    });
    g.check_addr("any", ip("10.1.200.3")).unwrap();
    g.check_addr("any", ip("::ffff:10.1.0.1")).unwrap();
    g.check_addr("any", ip("169.254.169.254")).unwrap();
    assert!(g.check_addr("any", ip("10.2.0.1")).is_err());
    // A host grant opens private ranges for that host, but never cloud metadata.
    g.check_addr("db.internal.example", ip("10.9.9.9")).unwrap();
    let denied = g
        .check_addr("db.internal.example", ip("169.254.170.2"))
        .unwrap_err();
    assert_eq!(denied.rule, DenyRule::Range(SpecialRange::CloudMetadata));
    assert!(g.check_addr("internal.example", ip("10.9.9.9")).is_err());
    assert!(g
        .check_addr("evilinternal.example", ip("10.9.9.9"))
        .is_err());
}

#[test]
fn only_an_exact_grant_opens_cloud_metadata() {
    let wide = guard(|p| {
        p.grants.cidrs = vec![
            "169.254.0.0/16".parse().unwrap(),
            "0.0.0.0/0".parse().unwrap(),
            "::/0".parse().unwrap(),
        ];
    });
    for metadata in [
        "169.254.169.254",
        "169.254.170.2",
        "100.100.100.200",
        "fd00:ec2::254",
    ] {
        let denied = wide.check_addr("any", ip(metadata)).unwrap_err();
        assert_eq!(
            denied.rule,
            DenyRule::Range(SpecialRange::CloudMetadata),
            "{metadata}"
        );
    }
    // The wide grants still open everything else they cover.
    wide.check_addr("any", ip("169.254.1.1")).unwrap();
    wide.check_addr("any", ip("10.0.0.1")).unwrap();
    let exact = guard(|p| p.grants.cidrs = vec!["169.254.169.254/32".parse().unwrap()]);
    exact.check_addr("any", ip("169.254.169.254")).unwrap();
    assert!(exact.check_addr("any", ip("169.254.170.2")).is_err());
}

#[test]
fn deny_private_off_still_refuses_cloud_metadata() {
    let g = guard(|p| p.deny_private = false);
    g.check_addr("h", ip("127.0.0.1")).unwrap();
    g.check_addr("h", ip("10.0.0.1")).unwrap();
    for addr in [
        "169.254.169.254",
        "168.63.129.16",
        "fd00:ec2::254",
        "::ffff:100.100.100.200",
    ] {
        let denied = g.check_addr("h", ip(addr)).unwrap_err();
        assert_eq!(
            denied.rule,
            DenyRule::Range(SpecialRange::CloudMetadata),
            "{addr}"
        );
    }
}

#[test]
fn allow_hosts_matches_by_suffix_with_normalisation() {
    let g = guard(|p| {
        p.allow_hosts = Some(vec![
            "*.example.com".to_owned(),
            "api.partner.io".to_owned(),
        ])
    });
    for host in [
        "a.example.com",
        "A.B.EXAMPLE.COM",
        "a.example.com.",
        "api.partner.io",
    ] {
        g.check_host(host).unwrap_or_else(|d| panic!("{host}: {d}"));
    }
    for host in [
        "example.com",
        "evilexample.com",
        "example.com.evil.io",
        "partner.io",
        "x.api.partner.io",
    ] {
        let denied = g.check_host(host).unwrap_err();
        assert_eq!(denied.rule, DenyRule::NotAllowed, "{host}");
        assert_eq!(NetError::from(denied).code(), ErrorCode::AuthForbidden);
    }
    // Internationalised names are compared as A-labels.
    let idn = guard(|p| p.allow_hosts = Some(vec!["*.bücher.example".to_owned()]));
    idn.check_host("shop.xn--bcher-kva.example").unwrap();
    idn.check_host("shop.BÜCHER.example").unwrap();
    assert!(idn.check_host("shop.bucher.example").is_err());
    // Without an allow-list every host passes the host check.
    guard(|_| {}).check_host("anything.example").unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the policy, a kept address is never in a special range it did not grant.
    #[test]
    fn filtered_addresses_are_always_allowed(bits in proptest::collection::vec(any::<u32>(), 0..8), strict in any::<bool>()) {
        let g = guard(|p| p.strict_mixed_answers = strict);
        let addrs: Vec<IpAddr> = bits.iter().map(|b| IpAddr::from(b.to_be_bytes())).collect();
        if let Ok(kept) = g.filter_addrs("h", &addrs) {
            for a in &kept {
                prop_assert!(classify(*a).is_none(), "{}", a);
            }
            let public = addrs.iter().filter(|a| classify(**a).is_none()).count();
            prop_assert_eq!(kept.len(), public);
        } else {
            prop_assert!(strict || addrs.iter().all(|a| classify(*a).is_some()));
        }
    }
}
