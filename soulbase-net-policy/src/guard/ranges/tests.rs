use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;
use SpecialRange::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// `(first address, last address, range)`: both ends of every range, so an off-by-one in a
/// prefix length fails here.
const ENDS: &[(&str, &str, SpecialRange)] = &[
    ("0.0.0.0", "0.255.255.255", ThisNetwork),
    ("10.0.0.0", "10.255.255.255", Private),
    ("100.64.0.0", "100.127.255.255", SharedAddressSpace),
    ("127.0.0.0", "127.255.255.255", Loopback),
    ("169.254.0.0", "169.254.255.255", LinkLocal),
    ("172.16.0.0", "172.31.255.255", Private),
    ("192.0.0.0", "192.0.0.255", IetfProtocol),
    ("192.0.0.8", "192.0.0.8", Dummy),
    ("192.0.2.0", "192.0.2.255", Documentation),
    ("192.31.196.0", "192.31.196.255", As112),
    ("192.52.193.0", "192.52.193.255", Amt),
    ("192.88.99.0", "192.88.99.255", Relay6to4),
    ("192.168.0.0", "192.168.255.255", Private),
    ("192.175.48.0", "192.175.48.255", As112),
    ("198.18.0.0", "198.19.255.255", Benchmarking),
    ("198.51.100.0", "198.51.100.255", Documentation),
    ("203.0.113.0", "203.0.113.255", Documentation),
    ("224.0.0.0", "239.255.255.255", Multicast),
    ("240.0.0.0", "255.255.255.254", Reserved),
    ("::", "::", Unspecified),
    ("::1", "::1", Loopback),
    ("::2", "::ffff:ffff", Ipv4Compatible),
    ("::ffff:0:0:0", "::ffff:0:ffff:ffff", Ipv4Translated),
    ("64:ff9b::", "64:ff9b::ffff:ffff", Nat64),
    ("64:ff9b:1::", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff", Nat64),
    ("100::", "100::ffff:ffff:ffff:ffff", Discard),
    ("100:0:0:1::", "100::1:ffff:ffff:ffff:ffff", Dummy),
    ("2001::", "2001:0:ffff:ffff:ffff:ffff:ffff:ffff", Teredo),
    (
        "2001:1::",
        "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff",
        IetfProtocol,
    ),
    (
        "2001:2::",
        "2001:2:0:ffff:ffff:ffff:ffff:ffff",
        Benchmarking,
    ),
    ("2001:3::", "2001:3:ffff:ffff:ffff:ffff:ffff:ffff", Amt),
    ("2001:4:112::", "2001:4:112:ffff:ffff:ffff:ffff:ffff", As112),
    (
        "2001:db8::",
        "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
        Documentation,
    ),
    (
        "2002::",
        "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        SixToFour,
    ),
    (
        "2620:4f:8000::",
        "2620:4f:8000:ffff:ffff:ffff:ffff:ffff",
        As112,
    ),
    (
        "3fff::",
        "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff",
        Documentation,
    ),
    ("5f00::", "5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Srv6),
    (
        "fc00::",
        "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        UniqueLocal,
    ),
    (
        "fe80::",
        "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        LinkLocal,
    ),
    (
        "fec0::",
        "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        SiteLocal,
    ),
    (
        "ff00::",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        Multicast,
    ),
    // IPv6 outside 2000::/3 that no entry names: the gaps between the entries of ::/8 …
    ("::1:0:0", "::fffe:ffff:ffff", Reserved),
    ("::1:0:0:0", "::fffe:ffff:ffff:ffff", Reserved),
    (
        "::ffff:1:0:0",
        "64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff",
        Reserved,
    ),
    (
        "64:ff9b::1:0:0",
        "64:ff9b:0:ffff:ffff:ffff:ffff:ffff",
        Reserved,
    ),
    (
        "64:ff9b:2::",
        "ff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        Reserved,
    ),
    // … and of 100::/8, then the blocks the IANA IPv6 Address Space registry reserves.
    (
        "100:0:0:2::",
        "1ff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        Reserved,
    ),
    ("200::", "1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Reserved),
    (
        "4000::",
        "5eff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        Reserved,
    ),
    (
        "5f01::",
        "fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        Reserved,
    ),
    (
        "fe00::",
        "fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        Reserved,
    ),
];

/// Addresses just outside a range: ordinary public unicast.
const PUBLIC: &[&str] = &[
    "1.1.1.1",
    "8.8.8.8",
    "9.255.255.255",
    "11.0.0.0",
    "100.63.255.255",
    "100.128.0.0",
    "126.255.255.255",
    "128.0.0.0",
    "169.253.255.255",
    "169.255.0.0",
    "172.15.255.255",
    "172.32.0.0",
    "192.0.1.0",
    "192.0.3.0",
    "192.31.195.255",
    "192.31.197.0",
    "192.52.192.255",
    "192.52.194.0",
    "192.88.98.255",
    "192.167.255.255",
    "192.169.0.0",
    "192.175.47.255",
    "192.175.49.0",
    "198.17.255.255",
    "198.20.0.0",
    "198.51.99.255",
    "203.0.112.255",
    "223.255.255.255",
    "2000::",
    "2000::1",
    "2001:200::",
    "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff",
    "2001:db9::",
    "2003::",
    "2606:4700::1111",
    "2606:4700:4700::1111",
    "2620:4f:7fff:ffff:ffff:ffff:ffff:ffff",
    "2620:4f:8001::",
    "2a00:1450:4001:80b::200e",
    "3fff:1000::",
    "3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "::ffff:8.8.8.8",
];

#[test]
fn both_ends_of_every_range_are_classified() {
    for &(first, last, range) in ENDS {
        assert_eq!(classify(ip(first)), Some(range), "{first}");
        assert_eq!(classify(ip(last)), Some(range), "{last}");
    }
}

/// An address inside each range, away from both ends.
const INTERIOR: &[(&str, SpecialRange)] = &[
    ("0.12.34.56", ThisNetwork),
    ("10.20.30.40", Private),
    ("100.100.0.1", SharedAddressSpace),
    ("127.1.2.3", Loopback),
    ("169.254.10.20", LinkLocal),
    ("172.20.1.1", Private),
    ("192.0.0.100", IetfProtocol),
    ("192.0.0.4", IetfProtocol),   // DS-Lite, 192.0.0.0/29
    ("192.0.0.9", IetfProtocol),   // PCP anycast, globally reachable: still refused
    ("192.0.0.10", IetfProtocol),  // TURN anycast, globally reachable: still refused
    ("192.0.0.170", IetfProtocol), // NAT64/DNS64 discovery
    ("192.0.0.171", IetfProtocol),
    ("192.0.2.100", Documentation),
    ("192.31.196.1", As112),
    ("192.52.193.8", Amt),
    ("192.88.99.100", Relay6to4),
    ("192.88.99.2", Relay6to4), // 6a44 relay anycast
    ("192.168.100.100", Private),
    ("192.175.48.6", As112),
    ("198.18.200.1", Benchmarking),
    ("198.51.100.100", Documentation),
    ("203.0.113.100", Documentation),
    ("230.1.2.3", Multicast),
    ("250.1.2.3", Reserved),
    ("::1:2", Ipv4Compatible),
    ("::ffff:0:102:304", Ipv4Translated),
    ("64:ff9b::102:304", Nat64),
    ("64:ff9b:1:2::3", Nat64),
    ("100::1:2:3", Discard),
    ("100:0:0:1::2:3", Dummy),
    ("2001:0:1:2::3", Teredo),
    ("2001:100::1", IetfProtocol),
    ("2001:1::1", IetfProtocol),  // PCP anycast
    ("2001:1::2", IetfProtocol),  // TURN anycast
    ("2001:1::3", IetfProtocol),  // DNS-SD SRP anycast
    ("2001:10::1", IetfProtocol), // deprecated ORCHID
    ("2001:20::1", IetfProtocol), // ORCHIDv2
    ("2001:30::1", IetfProtocol), // DRIP entity tags
    ("2001:2:0:1::2", Benchmarking),
    ("2001:3:1::1", Amt),
    ("2001:4:112::1", As112),
    ("2001:db8:1:2::3", Documentation),
    ("2002:102:304::1", SixToFour),
    ("2620:4f:8000::42", As112),
    ("3fff:123::1", Documentation),
    ("5f00:1::1", Srv6),
    ("fc12:3456::1", UniqueLocal),
    ("fd12:3456::1", UniqueLocal),
    ("fe80::1:2:3", LinkLocal),
    ("fed0::1", SiteLocal),
    ("ff05::1:3", Multicast),
    ("1:2:3:4::5", Reserved),
    ("101::1", Reserved),
    ("400::1", Reserved),
    ("800::1", Reserved),
    ("1000::1", Reserved),
    ("6000::1", Reserved),
    ("8000::1", Reserved),
    ("a000::1", Reserved),
    ("c000::1", Reserved),
    ("e000::1", Reserved),
    ("f000::1", Reserved),
    ("f800::1", Reserved),
    ("fe00::1", Reserved),
];

#[test]
fn an_interior_address_of_every_range_is_classified() {
    for &(addr, range) in INTERIOR {
        assert_eq!(classify(ip(addr)), Some(range), "{addr}");
    }
}

/// Issue 33, item 10: these were dialled as public.
#[test]
fn the_rest_of_the_first_slash_8_is_reserved() {
    for addr in ["::ff:ff:a00:1", "::1:0:a9fe:a9fe", "::ffff:ffff:a00:1"] {
        assert_eq!(classify(ip(addr)), Some(Reserved), "{addr}");
        // None of them is a form that embeds IPv4: they stay IPv6.
        assert_eq!(canonical(ip(addr)), ip(addr), "{addr}");
    }
}

#[test]
fn addresses_just_outside_are_public() {
    for &addr in PUBLIC {
        assert_eq!(classify(ip(addr)), None, "{addr}");
    }
}

#[test]
fn broadcast_and_cloud_metadata_are_named() {
    assert_eq!(classify(ip("255.255.255.255")), Some(Broadcast));
    for addr in [
        "169.254.169.254",
        "169.254.169.253",
        "169.254.170.2",
        "100.100.100.200",
        "168.63.129.16",
        "fd00:ec2::254",
        "fd00:ec2::23",
        "::ffff:169.254.169.254",
    ] {
        assert_eq!(classify(ip(addr)), Some(CloudMetadata), "{addr}");
    }
    // Neighbours of a public metadata address are public.
    assert_eq!(classify(ip("168.63.129.15")), None);
}

#[test]
fn mapped_addresses_are_classified_as_the_ipv4_they_reach() {
    for &(first, last, range) in ENDS.iter().filter(|(f, _, _)| !f.contains(':')) {
        for v4 in [first, last] {
            let mapped = format!("::ffff:{v4}");
            assert_eq!(classify(ip(&mapped)), Some(range), "{mapped}");
        }
    }
    assert_eq!(canonical(ip("::ffff:127.0.0.1")), ip("127.0.0.1"));
    assert_eq!(canonical(ip("::1")), ip("::1"));
    assert_eq!(canonical(ip("10.0.0.1")), ip("10.0.0.1"));
}

#[test]
fn every_form_that_embeds_ipv4_is_refused_even_with_a_public_ipv4_inside() {
    // 8.8.8.8 embedded in each IPv6 form that can carry an IPv4 address.
    for (addr, range) in [
        ("::8.8.8.8", Ipv4Compatible),
        ("::ffff:0:808:808", Ipv4Translated),
        ("64:ff9b::808:808", Nat64),
        ("64:ff9b:1::808:808", Nat64),
        ("2002:808:808::1", SixToFour),
        ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", Teredo),
    ] {
        assert_eq!(classify(ip(addr)), Some(range), "{addr}");
    }
}

#[test]
fn labels_are_unique() {
    let mut labels: Vec<&str> = ENDS.iter().map(|e| e.2.as_str()).collect();
    labels.extend(["cloud_metadata", Broadcast.as_str()]);
    labels.sort_unstable();
    labels.dedup();
    let mut ranges: Vec<SpecialRange> = ENDS.iter().map(|e| e.2).collect();
    ranges.extend([CloudMetadata, Broadcast]);
    ranges.sort_unstable();
    ranges.dedup();
    assert_eq!(labels.len(), ranges.len());
}

fn in_v4(net: &str, len: u8, offset: u32) -> IpAddr {
    let base = u32::from(net.parse::<Ipv4Addr>().unwrap());
    let span = if len == 0 {
        u32::MAX
    } else {
        (1u64 << (32 - len as u32)) as u32 - 1
    };
    IpAddr::V4(Ipv4Addr::from(base | (offset & span)))
}

fn in_v6(net: &str, len: u8, offset: u128) -> IpAddr {
    let base = u128::from(net.parse::<Ipv6Addr>().unwrap());
    let span = if len == 0 {
        u128::MAX
    } else {
        (1u128 << (128 - len as u32)) - 1
    };
    IpAddr::V6(Ipv6Addr::from(base | (offset & span)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every address inside a denied IPv4 range is classified (never public).
    #[test]
    fn anything_inside_a_v4_range_is_special(offset in any::<u32>(), which in 0usize..14) {
        let nets = [("0.0.0.0", 8), ("10.0.0.0", 8), ("100.64.0.0", 10), ("127.0.0.0", 8),
            ("169.254.0.0", 16), ("172.16.0.0", 12), ("192.168.0.0", 16), ("198.18.0.0", 15),
            ("224.0.0.0", 4), ("240.0.0.0", 4), ("192.0.0.0", 24), ("192.31.196.0", 24),
            ("192.52.193.0", 24), ("192.175.48.0", 24)];
        let (net, len) = nets[which];
        let addr = in_v4(net, len, offset);
        prop_assert!(classify(addr).is_some(), "{}", addr);
        let mapped = IpAddr::V6(match addr { IpAddr::V4(v4) => v4.to_ipv6_mapped(), IpAddr::V6(v6) => v6 });
        prop_assert_eq!(classify(mapped), classify(addr));
    }

    /// Every address inside a denied IPv6 range is classified.
    #[test]
    fn anything_inside_a_v6_range_is_special(offset in any::<u128>(), which in 0usize..15) {
        let nets = [("fc00::", 7), ("fe80::", 10), ("fec0::", 10), ("ff00::", 8), ("2002::", 16),
            ("64:ff9b::", 96), ("2001::", 23), ("2001:db8::", 32), ("100::", 64),
            ("100:0:0:1::", 64), ("2620:4f:8000::", 48), ("3fff::", 20), ("5f00::", 16),
            ("64:ff9b:1::", 48), ("::", 8)];
        let (net, len) = nets[which];
        let addr = in_v6(net, len, offset);
        prop_assert!(classify(addr).is_some(), "{}", addr);
    }

    /// IANA allocates only 2000::/3 for global unicast: nothing outside it is public (but
    /// an IPv4-mapped address, which is the IPv4 address it maps to).
    #[test]
    fn nothing_outside_2000_slash_3_is_public(bits in any::<u128>()) {
        let v6 = Ipv6Addr::from(bits);
        prop_assume!(bits >> 125 != 1 && v6.to_ipv4_mapped().is_none());
        prop_assert!(classify(IpAddr::V6(v6)).is_some(), "{}", v6);
    }

    /// Classification agrees with the standard library where it has stable answers.
    #[test]
    fn agrees_with_std_on_what_std_knows(bits in any::<u32>()) {
        let v4 = Ipv4Addr::from(bits);
        if v4.is_private() || v4.is_loopback() || v4.is_link_local() || v4.is_multicast()
            || v4.is_broadcast() || v4.is_documentation() || v4.is_unspecified() {
            prop_assert!(classify(IpAddr::V4(v4)).is_some(), "{}", v4);
        }
    }
}
