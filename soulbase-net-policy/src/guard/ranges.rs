//! The special-purpose address table: every address the address guard refuses by default.
//!
//! Built from the IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and
//! successors), every entry of them, plus multicast, the addresses of cloud metadata services
//! (some are public unicast addresses, Azure's `168.63.129.16`, and so can only be refused by
//! name), and, for IPv6, the IANA IPv6 Address Space registry: only `2000::/3` is allocated for
//! global unicast, so every address outside it that no entry names (the rest of `::/8`,
//! `100::/8`, `4000::/3`, `fe00::/9`, …) is [`SpecialRange::Reserved`].
//!
//! Entries IANA marks globally reachable are refused too (`192.0.0.9`, `192.0.0.10`, AS112,
//! AMT, `2001:1::1`–`::3`, ORCHIDv2, DETs): they are anycast or protocol infrastructure, never
//! an ordinary HTTP destination, and an anycast address reaches whichever instance is nearest,
//! which may be inside the caller's network (the PCP anycast address is answered by the local
//! NAT gateway). A policy that needs one grants it (`security.grants.cidrs`).
//!
//! Why bit masks and not a CIDR crate: this runs on every dialled address; a linear scan of
//! ~20 `(network, prefix)` pairs over integers costs a few nanoseconds.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

/// Why an address is not an ordinary public unicast address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum SpecialRange {
    /// A cloud metadata or platform service (169.254.169.254, 169.254.170.2,
    /// 100.100.100.200, 168.63.129.16, fd00:ec2::254, …).
    CloudMetadata,
    /// `0.0.0.0/8`: "this network"; dialling 0.0.0.0 reaches the local host.
    ThisNetwork,
    /// `10/8`, `172.16/12`, `192.168/16` (RFC 1918).
    Private,
    /// `100.64/10`: carrier-grade NAT (RFC 6598).
    SharedAddressSpace,
    /// `127/8`, `::1`.
    Loopback,
    /// `169.254/16`, `fe80::/10`.
    LinkLocal,
    /// `192.0.0.0/24`, `2001::/23` (IETF protocol assignments), with every sub-entry the
    /// registries list and no other range names: `192.0.0.0/29` (DS-Lite), the PCP and TURN
    /// anycast addresses `192.0.0.9`, `192.0.0.10`, `2001:1::1`, `2001:1::2`, the DNS-SD SRP
    /// anycast `2001:1::3`, NAT64 discovery `192.0.0.170`, `192.0.0.171`, ORCHID
    /// `2001:10::/28`, ORCHIDv2 `2001:20::/28`, DRIP entity tags `2001:30::/28`.
    IetfProtocol,
    /// `192.0.2/24`, `198.51.100/24`, `203.0.113/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `192.88.99.0/24`: the deprecated 6to4 relay anycast.
    Relay6to4,
    /// `198.18/15`, `2001:2::/48` (benchmarking).
    Benchmarking,
    /// `240/4` (reserved for future use); IPv6 outside `2000::/3` that no other range names
    /// (reserved by the IETF in the IANA IPv6 Address Space registry: the rest of `::/8`,
    /// `100::/8`, `200::/7` … `1000::/4`, `4000::/3` … `f800::/6`, `fe00::/9`).
    Reserved,
    /// `255.255.255.255`.
    Broadcast,
    /// `224/4`, `ff00::/8`.
    Multicast,
    /// `::`.
    Unspecified,
    /// `fc00::/7` (unique local).
    UniqueLocal,
    /// `fec0::/10` (deprecated site-local).
    SiteLocal,
    /// `100::/64` (discard-only).
    Discard,
    /// `::/96`: deprecated IPv4-compatible addresses.
    Ipv4Compatible,
    /// `::ffff:0:0:0/96`: SIIT IPv4-translated addresses.
    Ipv4Translated,
    /// `64:ff9b::/96`, `64:ff9b:1::/48`: NAT64 prefixes, which reach any embedded IPv4.
    Nat64,
    /// `2002::/16`: 6to4, which embeds an IPv4 address.
    SixToFour,
    /// `2001::/32`: Teredo, which embeds an IPv4 address.
    Teredo,
    /// `5f00::/16`: SRv6 segment identifiers.
    Srv6,
    /// `192.31.196/24`, `192.175.48/24`, `2001:4:112::/48`, `2620:4f:8000::/48`: AS112 DNS
    /// sinks (RFC 7534, RFC 7535).
    As112,
    /// `192.52.193/24`, `2001:3::/32`: AMT relay anycast (RFC 7450).
    Amt,
    /// `192.0.0.8`, `100:0:0:1::/64`: dummy addresses of hosts that have no address of their
    /// own (RFC 7600, RFC 9780).
    Dummy,
}

impl SpecialRange {
    /// A stable snake_case label, used as the `rule` of a `Blocked` event.
    pub const fn as_str(self) -> &'static str {
        match self {
            SpecialRange::CloudMetadata => "cloud_metadata",
            SpecialRange::ThisNetwork => "this_network",
            SpecialRange::Private => "private",
            SpecialRange::SharedAddressSpace => "shared_address_space",
            SpecialRange::Loopback => "loopback",
            SpecialRange::LinkLocal => "link_local",
            SpecialRange::IetfProtocol => "ietf_protocol",
            SpecialRange::Documentation => "documentation",
            SpecialRange::Relay6to4 => "relay_6to4",
            SpecialRange::Benchmarking => "benchmarking",
            SpecialRange::Reserved => "reserved",
            SpecialRange::Broadcast => "broadcast",
            SpecialRange::Multicast => "multicast",
            SpecialRange::Unspecified => "unspecified",
            SpecialRange::UniqueLocal => "unique_local",
            SpecialRange::SiteLocal => "site_local",
            SpecialRange::Discard => "discard",
            SpecialRange::Ipv4Compatible => "ipv4_compatible",
            SpecialRange::Ipv4Translated => "ipv4_translated",
            SpecialRange::Nat64 => "nat64",
            SpecialRange::SixToFour => "6to4",
            SpecialRange::Teredo => "teredo",
            SpecialRange::Srv6 => "srv6",
            SpecialRange::As112 => "as112",
            SpecialRange::Amt => "amt",
            SpecialRange::Dummy => "dummy",
        }
    }
}

impl fmt::Display for SpecialRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Cloud metadata services, refused by name.
const METADATA_V4: [u32; 5] = [
    u32::from_be_bytes([169, 254, 169, 254]), // AWS, GCP, Azure, OpenStack, Oracle IMDS
    u32::from_be_bytes([169, 254, 169, 253]), // AWS VPC DNS
    u32::from_be_bytes([169, 254, 170, 2]),   // AWS ECS task metadata
    u32::from_be_bytes([100, 100, 100, 200]), // Alibaba Cloud metadata
    u32::from_be_bytes([168, 63, 129, 16]),   // Azure WireServer (a public address)
];

const METADATA_V6: [u128; 2] = [
    0xfd00_0ec2_0000_0000_0000_0000_0000_0254, // AWS IMDS over IPv6
    0xfd00_0ec2_0000_0000_0000_0000_0000_0023, // AWS VPC DNS over IPv6
];

/// `(network, prefix length, range)`, most specific first where ranges nest. IPv4-mapped
/// addresses (`::ffff:0:0/96`) never reach the IPv6 tables: [`canonical`] turns them into IPv4.
const TABLE_V4: [(u32, u8, SpecialRange); 20] = [
    (0x0000_0000, 8, SpecialRange::ThisNetwork),
    (0x0a00_0000, 8, SpecialRange::Private),
    (0x6440_0000, 10, SpecialRange::SharedAddressSpace),
    (0x7f00_0000, 8, SpecialRange::Loopback),
    (0xa9fe_0000, 16, SpecialRange::LinkLocal),
    (0xac10_0000, 12, SpecialRange::Private),
    (0xc000_0008, 32, SpecialRange::Dummy),
    // The rest of 192.0.0.0/24: 192.0.0.0/29, .9, .10, .170, .171 and the unassigned.
    (0xc000_0000, 24, SpecialRange::IetfProtocol),
    (0xc000_0200, 24, SpecialRange::Documentation),
    (0xc01f_c400, 24, SpecialRange::As112),
    (0xc034_c100, 24, SpecialRange::Amt),
    // With the 6a44 relay anycast 192.88.99.2 (RFC 6751).
    (0xc058_6300, 24, SpecialRange::Relay6to4),
    (0xc0a8_0000, 16, SpecialRange::Private),
    (0xc0af_3000, 24, SpecialRange::As112),
    (0xc612_0000, 15, SpecialRange::Benchmarking),
    (0xc633_6400, 24, SpecialRange::Documentation),
    (0xcb00_7100, 24, SpecialRange::Documentation),
    (0xe000_0000, 4, SpecialRange::Multicast),
    (0xffff_ffff, 32, SpecialRange::Broadcast),
    (0xf000_0000, 4, SpecialRange::Reserved),
];

/// `2000::/3`, the only IPv6 space IANA has allocated for global unicast.
const GLOBAL_UNICAST_V6: (u128, u8) = (0x2000_0000_0000_0000_0000_0000_0000_0000, 3);

/// The special ranges inside [`GLOBAL_UNICAST_V6`]; the rest of it is public.
const TABLE_V6_GLOBAL: [(u128, u8, SpecialRange); 9] = [
    (
        0x2001_0000_0000_0000_0000_0000_0000_0000,
        32,
        SpecialRange::Teredo,
    ),
    (
        0x2001_0002_0000_0000_0000_0000_0000_0000,
        48,
        SpecialRange::Benchmarking,
    ),
    (
        0x2001_0003_0000_0000_0000_0000_0000_0000,
        32,
        SpecialRange::Amt,
    ),
    (
        0x2001_0004_0112_0000_0000_0000_0000_0000,
        48,
        SpecialRange::As112,
    ),
    // The rest of 2001::/23: 2001:1::1, ::2, ::3, 2001:10::/28, 2001:20::/28, 2001:30::/28
    // and the unassigned.
    (
        0x2001_0000_0000_0000_0000_0000_0000_0000,
        23,
        SpecialRange::IetfProtocol,
    ),
    (
        0x2001_0db8_0000_0000_0000_0000_0000_0000,
        32,
        SpecialRange::Documentation,
    ),
    (
        0x2002_0000_0000_0000_0000_0000_0000_0000,
        16,
        SpecialRange::SixToFour,
    ),
    (
        0x2620_004f_8000_0000_0000_0000_0000_0000,
        48,
        SpecialRange::As112,
    ),
    (
        0x3fff_0000_0000_0000_0000_0000_0000_0000,
        20,
        SpecialRange::Documentation,
    ),
];

/// The named ranges outside [`GLOBAL_UNICAST_V6`]; the rest of it is
/// [`SpecialRange::Reserved`].
const TABLE_V6_OTHER: [(u128, u8, SpecialRange); 13] = [
    (0, 128, SpecialRange::Unspecified),
    (1, 128, SpecialRange::Loopback),
    (
        0x0000_0000_0000_0000_ffff_0000_0000_0000,
        96,
        SpecialRange::Ipv4Translated,
    ),
    (0, 96, SpecialRange::Ipv4Compatible),
    (
        0x0064_ff9b_0000_0000_0000_0000_0000_0000,
        96,
        SpecialRange::Nat64,
    ),
    (
        0x0064_ff9b_0001_0000_0000_0000_0000_0000,
        48,
        SpecialRange::Nat64,
    ),
    (
        0x0100_0000_0000_0000_0000_0000_0000_0000,
        64,
        SpecialRange::Discard,
    ),
    (
        0x0100_0000_0000_0001_0000_0000_0000_0000,
        64,
        SpecialRange::Dummy,
    ),
    (
        0x5f00_0000_0000_0000_0000_0000_0000_0000,
        16,
        SpecialRange::Srv6,
    ),
    (
        0xfc00_0000_0000_0000_0000_0000_0000_0000,
        7,
        SpecialRange::UniqueLocal,
    ),
    (
        0xfe80_0000_0000_0000_0000_0000_0000_0000,
        10,
        SpecialRange::LinkLocal,
    ),
    (
        0xfec0_0000_0000_0000_0000_0000_0000_0000,
        10,
        SpecialRange::SiteLocal,
    ),
    (
        0xff00_0000_0000_0000_0000_0000_0000_0000,
        8,
        SpecialRange::Multicast,
    ),
];

/// The address as it will really be dialled: an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`)
/// becomes the IPv4 address it maps to; everything else is unchanged.
///
/// # Examples
/// ```
/// # use soulbase_net_policy::canonical;
/// let mapped: std::net::IpAddr = "::ffff:10.0.0.1".parse().unwrap();
/// assert_eq!(canonical(mapped), "10.0.0.1".parse::<std::net::IpAddr>().unwrap());
/// ```
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The special range `ip` belongs to, after [`canonical`]; `None` for an ordinary public
/// unicast address.
///
/// # Examples
/// ```
/// # use soulbase_net_policy::{classify, SpecialRange};
/// let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
/// assert_eq!(classify(ip("169.254.169.254")), Some(SpecialRange::CloudMetadata));
/// assert_eq!(classify(ip("::ffff:192.168.1.1")), Some(SpecialRange::Private));
/// assert_eq!(classify(ip("2002:7f00:1::")), Some(SpecialRange::SixToFour));
/// assert_eq!(classify(ip("::1:0:a9fe:a9fe")), Some(SpecialRange::Reserved));
/// assert_eq!(classify(ip("93.184.215.14")), None);
/// ```
pub fn classify(ip: IpAddr) -> Option<SpecialRange> {
    match canonical(ip) {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<SpecialRange> {
    let bits = u32::from(ip);
    if METADATA_V4.contains(&bits) {
        return Some(SpecialRange::CloudMetadata);
    }
    TABLE_V4
        .iter()
        .find(|(net, len, _)| bits & mask_v4(*len) == *net)
        .map(|(_, _, range)| *range)
}

fn classify_v6(ip: Ipv6Addr) -> Option<SpecialRange> {
    let bits = u128::from(ip);
    if METADATA_V6.contains(&bits) {
        return Some(SpecialRange::CloudMetadata);
    }
    let (global, len) = GLOBAL_UNICAST_V6;
    let find = |table: &[(u128, u8, SpecialRange)]| {
        table
            .iter()
            .find(|(net, len, _)| bits & mask_v6(*len) == *net)
            .map(|(_, _, range)| *range)
    };
    if bits & mask_v6(len) == global {
        find(&TABLE_V6_GLOBAL)
    } else {
        // IANA has allocated nothing else for global unicast: what no entry names is reserved.
        Some(find(&TABLE_V6_OTHER).unwrap_or(SpecialRange::Reserved))
    }
}

const fn mask_v4(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - len as u32)
    }
}

const fn mask_v6(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - len as u32)
    }
}

#[cfg(test)]
mod tests;
