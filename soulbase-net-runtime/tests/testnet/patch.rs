//! The document patch: production's overrides, tenants and grants are kept; every layer
//! that names its own name servers or grants is patched too; bad mappings are reported.

use std::net::{IpAddr, SocketAddr};

use soulbase_net_core::ErrorKind;
use soulbase_net_policy::{PolicyDocument, SnapshotResolver};
use soulbase_net_runtime::testing::TestNet;

const LAYERED: &str = r#"
    [default]
    security.allow_hosts = ["api.shop.example", "*.partner.example"]
    security.grants.cidrs = ["10.20.0.0/16"]
    dns.static_hosts = { "legacy.shop.example" = ["10.20.0.7"] }

    [overrides."api.shop.example"]
    retry.max_attempts = 5
    timeout = { connect = "1s", ttfb = "2s", read = "2s", write = "2s", attempt = "2s" }

    [overrides."*.partner.example"]
    dns.nameservers = ["192.0.2.53:53"]
    security.grants.cidrs = ["10.30.0.0/16"]

    [tenants.wholesale.overrides."api.shop.example"]
    retry.max_attempts = 1

    [keys.payments]
    dns.nameservers = ["192.0.2.54:53"]
"#;

fn cidrs(p: &soulbase_net_policy::NetPolicy) -> Vec<String> {
    p.security
        .grants
        .cidrs
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn the_patch_keeps_production_and_patches_every_layer_that_needs_it() {
    let prod = PolicyDocument::from_toml_str(LAYERED).unwrap();
    let to: SocketAddr = "127.0.0.1:4100".parse().unwrap();
    let net = TestNet::new().map("http://api.shop.example", to).map(
        "https://pay.partner.example",
        "127.0.0.1:4200".parse().unwrap(),
    );
    let test = net.document(&prod).unwrap();
    let api = net.stand_in("api.shop.example").unwrap();
    let pay = net.stand_in("pay.partner.example").unwrap();
    assert_ne!(api, pay);
    assert!(api.is_loopback() && pay.is_loopback());
    let refusing: SocketAddr = "127.0.0.1:0".parse().unwrap();

    let r = SnapshotResolver::new(test).unwrap();
    let p = r.resolve(None, "api.shop.example");
    assert_eq!(p.retry.max_attempts, 5, "the host override is kept");
    assert_eq!(
        p.security.allow_hosts.as_deref(),
        Some(
            &[
                "api.shop.example".to_owned(),
                "*.partner.example".to_owned()
            ][..]
        ),
        "the allow-list is untouched"
    );
    assert_eq!(
        cidrs(&p),
        ["10.20.0.0/16", &format!("{api}/32"), &format!("{pay}/32")]
    );
    assert_eq!(p.dns.static_hosts["api.shop.example"], [api]);
    assert_eq!(
        p.dns.static_hosts["legacy.shop.example"],
        ["10.20.0.7".parse::<IpAddr>().unwrap()],
        "production's static entries are kept"
    );
    assert_eq!(p.dns.nameservers, [refusing]);

    let w = r.resolve(Some("wholesale"), "api.shop.example");
    assert_eq!(
        w.retry.max_attempts, 1,
        "the tenant + host override is kept"
    );

    // A layer with its own grants and name servers: the stand-ins are appended to its
    // grants, and its name servers give way to the test's.
    let partner = r.resolve(None, "pay.partner.example");
    assert_eq!(
        cidrs(&partner),
        ["10.30.0.0/16", &format!("{api}/32"), &format!("{pay}/32")]
    );
    assert_eq!(partner.dns.nameservers, [refusing]);
    assert_eq!(partner.dns.static_hosts["pay.partner.example"], [pay]);

    // The named policy too.
    let snapshot = r.snapshot();
    let keyed = snapshot
        .document()
        .keys()
        .find(|(k, _)| *k == "payments")
        .unwrap()
        .1;
    assert_eq!(
        keyed["dns"]["nameservers"],
        serde_json::json!(["127.0.0.1:0"])
    );

    // The production document itself is unchanged.
    assert_eq!(prod, PolicyDocument::from_toml_str(LAYERED).unwrap());
}

#[test]
fn a_name_server_given_replaces_the_refusing_one() {
    let ns: SocketAddr = "127.0.0.1:5353".parse().unwrap();
    let net = TestNet::new()
        .map("http://api.shop.example", "127.0.0.1:4100".parse().unwrap())
        .name_server(ns);
    let doc = net.document(&PolicyDocument::new()).unwrap();
    let p = SnapshotResolver::new(doc)
        .unwrap()
        .resolve(None, "x.example");
    assert_eq!(p.dns.nameservers, [ns]);
}

#[test]
fn bad_mappings_and_name_servers_are_reported() {
    let loopback: SocketAddr = "127.0.0.1:4100".parse().unwrap();
    let cases = [
        TestNet::new().map("api.shop.example", loopback),
        TestNet::new().map("ftp://api.shop.example", loopback),
        TestNet::new().map("http://user@api.shop.example", loopback),
        TestNet::new().map("http://10.0.0.1", loopback),
        TestNet::new().map("http://[::1]", loopback),
        TestNet::new().map("http://api.shop.example/v1", loopback),
        TestNet::new().map("http://api.shop.example/?q=1", loopback),
        TestNet::new().map("http://api.shop.example", "10.0.0.1:80".parse().unwrap()),
        TestNet::new().map("http://api.shop.example", "127.0.0.1:0".parse().unwrap()),
        TestNet::new().name_server("192.0.2.53:53".parse().unwrap()),
    ];
    for net in cases {
        let err = net.document(&PolicyDocument::new()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{net:?}: {err}");
        assert!(net.client_builder(&PolicyDocument::new()).is_err());
        assert!(net.policy(Default::default()).is_err());
    }
}

#[test]
fn origins_are_normalised_and_ports_default_by_scheme() {
    let net = TestNet::new()
        .map("http://API.Shop.Example", "127.0.0.1:4100".parse().unwrap())
        .map(
            "https://api.shop.example",
            "127.0.0.1:4101".parse().unwrap(),
        )
        .map(
            "http://api.shop.example:8443/",
            "127.0.0.1:4102".parse().unwrap(),
        );
    let doc = net.document(&PolicyDocument::new()).unwrap();
    let stand_in = net.stand_in("api.shop.example").unwrap();
    let p = SnapshotResolver::new(doc)
        .unwrap()
        .resolve(None, "api.shop.example");
    // One host, one stand-in, whatever the case or the port.
    assert_eq!(p.dns.static_hosts.len(), 1);
    assert_eq!(p.dns.static_hosts["api.shop.example"], [stand_in]);
    assert_eq!(cidrs(&p), [format!("{stand_in}/32")]);
}

#[test]
fn every_host_gets_its_own_loopback_stand_in() {
    let to: SocketAddr = "127.0.0.1:4100".parse().unwrap();
    let mut net = TestNet::new();
    for i in 0..600 {
        net = net.map(&format!("http://h{i}.shop.example"), to);
    }
    net.document(&PolicyDocument::new()).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..600 {
        let ip = net.stand_in(&format!("h{i}.shop.example")).unwrap();
        let IpAddr::V4(v4) = ip else {
            panic!("{ip} is not IPv4")
        };
        let [a, b, _, d] = v4.octets();
        assert_eq!((a, b), (127, 77), "{ip}");
        assert!(d != 0 && d != 255, "{ip}");
        assert!(seen.insert(ip), "{ip} given twice");
    }
}
