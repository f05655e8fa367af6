//! The address guard at the connector: refused destinations are never dialled.

use std::net::IpAddr;

use soulbase_net_core::{ErrorCode, ErrorKind, NetRequest};
use soulbase_net_policy::NetPolicy;
use soulbase_net_testkit::{FaultServer, Reply};

use crate::support::{harness, loopback_policy};

#[tokio::test]
async fn default_policy_refuses_loopback_without_dialling() {
    let srv = FaultServer::http1()
        .route("/", Reply::ok("secret"))
        .start()
        .await
        .unwrap();
    let h = harness(NetPolicy::default());
    let err = h
        .client
        .send(NetRequest::get(srv.url("/")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked);
    assert_eq!(err.code(), ErrorCode::AuthForbidden);
    assert!(err.to_string().contains("loopback"), "{err}");
    assert!(
        h.dialer.dialled().is_empty(),
        "a denied address reached the dialer"
    );
    assert_eq!(srv.connections(), 0);
    let seen = h.events.seen.lock().clone();
    assert!(
        seen.iter()
            .any(|e| e.starts_with("blocked Some(127.0.0.1) loopback")),
        "{seen:?}"
    );
    srv.join().await;
}

/// URLs that must be refused, each with the code expected; none may reach the dialer.
const CORPUS: &[(&str, ErrorCode)] = &[
    ("http://10.0.0.1/", ErrorCode::AuthForbidden),
    ("http://172.16.5.4:8080/", ErrorCode::AuthForbidden),
    ("http://192.168.0.1/", ErrorCode::AuthForbidden),
    (
        "http://169.254.169.254/latest/meta-data/",
        ErrorCode::AuthForbidden,
    ),
    (
        "http://169.254.170.2/v2/credentials",
        ErrorCode::AuthForbidden,
    ),
    ("http://100.100.100.200/", ErrorCode::AuthForbidden),
    ("http://168.63.129.16/", ErrorCode::AuthForbidden),
    ("http://100.64.0.1/", ErrorCode::AuthForbidden),
    ("http://0.0.0.0/", ErrorCode::AuthForbidden),
    ("http://127.0.0.1/", ErrorCode::AuthForbidden),
    ("http://127.255.255.254/", ErrorCode::AuthForbidden),
    ("http://224.0.0.1/", ErrorCode::AuthForbidden),
    ("http://255.255.255.255/", ErrorCode::AuthForbidden),
    ("http://240.0.0.1/", ErrorCode::AuthForbidden),
    ("http://192.0.0.8/", ErrorCode::AuthForbidden),
    ("http://198.18.0.1/", ErrorCode::AuthForbidden),
    ("http://[::1]/", ErrorCode::AuthForbidden),
    ("http://[::]/", ErrorCode::AuthForbidden),
    ("http://[::ffff:127.0.0.1]/", ErrorCode::AuthForbidden),
    ("http://[::ffff:7f00:1]/", ErrorCode::AuthForbidden),
    ("http://[::ffff:169.254.169.254]/", ErrorCode::AuthForbidden),
    ("http://[::127.0.0.1]/", ErrorCode::AuthForbidden),
    ("http://[64:ff9b::7f00:1]/", ErrorCode::AuthForbidden),
    ("http://[64:ff9b::a9fe:a9fe]/", ErrorCode::AuthForbidden),
    ("http://[2002:7f00:1::]/", ErrorCode::AuthForbidden),
    (
        "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",
        ErrorCode::AuthForbidden,
    ),
    ("http://[fd00:ec2::254]/", ErrorCode::AuthForbidden),
    ("http://[fc00::1]/", ErrorCode::AuthForbidden),
    ("http://[fe80::1]/", ErrorCode::AuthForbidden),
    ("http://[fec0::1]/", ErrorCode::AuthForbidden),
    ("http://[ff02::1]/", ErrorCode::AuthForbidden),
    ("http://2130706433/", ErrorCode::SchemaValidationFailed),
    ("http://0x7f.1/", ErrorCode::SchemaValidationFailed),
    ("http://0x7f000001/", ErrorCode::SchemaValidationFailed),
    ("http://127.1/", ErrorCode::SchemaValidationFailed),
    ("http://0177.0.0.1/", ErrorCode::SchemaValidationFailed),
    ("http://017700000001/", ErrorCode::SchemaValidationFailed),
    ("http://10.1/", ErrorCode::SchemaValidationFailed),
    (
        "http://user:pass@example.com/",
        ErrorCode::SchemaValidationFailed,
    ),
    (
        "http://example.com@127.0.0.1/",
        ErrorCode::SchemaValidationFailed,
    ),
    (
        "http://127.0.0.1@example.com/",
        ErrorCode::SchemaValidationFailed,
    ),
    ("file:///etc/passwd", ErrorCode::SchemaValidationFailed),
    ("gopher://127.0.0.1:25/", ErrorCode::SchemaValidationFailed),
    ("ftp://127.0.0.1/", ErrorCode::SchemaValidationFailed),
    ("dict://127.0.0.1:11211/", ErrorCode::SchemaValidationFailed),
    ("/relative/path", ErrorCode::SchemaValidationFailed),
    // More numeric encodings.
    (
        "http://0x7f.0x0.0x0.0x1/",
        ErrorCode::SchemaValidationFailed,
    ),
    ("http://0x7f.0.0.1/", ErrorCode::SchemaValidationFailed),
    ("http://0177.1/", ErrorCode::SchemaValidationFailed),
    ("http://127.0.1/", ErrorCode::SchemaValidationFailed),
    ("http://127.000.000.001/", ErrorCode::SchemaValidationFailed),
    ("http://4294967295/", ErrorCode::SchemaValidationFailed),
    ("http://0/", ErrorCode::SchemaValidationFailed),
    ("http://0xa9fea9fe/", ErrorCode::SchemaValidationFailed),
    ("http://2852039166/", ErrorCode::SchemaValidationFailed),
    // More IPv4 ranges, edges and interiors.
    ("http://10.255.255.255/", ErrorCode::AuthForbidden),
    ("http://172.31.255.255/", ErrorCode::AuthForbidden),
    ("http://192.168.255.255/", ErrorCode::AuthForbidden),
    ("http://127.0.0.2:8080/", ErrorCode::AuthForbidden),
    ("http://169.254.0.1/", ErrorCode::AuthForbidden),
    (
        "http://169.254.169.254:80/computeMetadata/v1/",
        ErrorCode::AuthForbidden,
    ),
    ("http://100.127.255.254/", ErrorCode::AuthForbidden),
    ("http://192.0.2.1/", ErrorCode::AuthForbidden),
    ("http://198.51.100.7/", ErrorCode::AuthForbidden),
    ("http://203.0.113.9/", ErrorCode::AuthForbidden),
    ("http://192.88.99.1/", ErrorCode::AuthForbidden),
    ("http://239.255.255.250/", ErrorCode::AuthForbidden),
    ("HTTP://127.0.0.1/", ErrorCode::AuthForbidden),
    // More IPv6 forms.
    (
        "http://[0:0:0:0:0:ffff:127.0.0.1]/",
        ErrorCode::AuthForbidden,
    ),
    ("http://[::ffff:0a00:0001]/", ErrorCode::AuthForbidden),
    ("http://[::ffff:a9fe:a9fe]/", ErrorCode::AuthForbidden),
    ("http://[0000::1]/", ErrorCode::AuthForbidden),
    ("http://[::ffff:0:7f00:1]/", ErrorCode::AuthForbidden),
    ("http://[64:ff9b:1::a00:1]/", ErrorCode::AuthForbidden),
    ("http://[2002:a9fe:a9fe::]/", ErrorCode::AuthForbidden),
    ("http://[2001:db8::1]/", ErrorCode::AuthForbidden),
    ("http://[3fff::1]/", ErrorCode::AuthForbidden),
    ("http://[100::1]/", ErrorCode::AuthForbidden),
    ("http://[5f00::1]/", ErrorCode::AuthForbidden),
    // Userinfo and delimiter tricks.
    (
        "http://127.0.0.1:80@evil.test/",
        ErrorCode::SchemaValidationFailed,
    ),
    (
        "http://evil.test@10.0.0.1/",
        ErrorCode::SchemaValidationFailed,
    ),
    (
        "http://10.0.0.1%2f@evil.test/",
        ErrorCode::SchemaValidationFailed,
    ),
    ("http://@127.0.0.1/", ErrorCode::AuthForbidden),
    ("http://127.0.0.1\\@evil.test/", ErrorCode::AuthForbidden),
    // Other schemes.
    ("javascript:alert(1)", ErrorCode::SchemaValidationFailed),
    ("data:text/plain,hi", ErrorCode::SchemaValidationFailed),
    ("ws://127.0.0.1/", ErrorCode::SchemaValidationFailed),
    ("wss://127.0.0.1/", ErrorCode::SchemaValidationFailed),
    ("ldap://127.0.0.1/", ErrorCode::SchemaValidationFailed),
    ("tftp://127.0.0.1/", ErrorCode::SchemaValidationFailed),
    ("jar:http://127.0.0.1!/", ErrorCode::SchemaValidationFailed),
    ("netdoc:///etc/passwd", ErrorCode::SchemaValidationFailed),
    // Names that resolve inside (MockDns records below).
    ("http://localhost.test/", ErrorCode::AuthForbidden),
    ("http://LOCALHOST.TEST./", ErrorCode::AuthForbidden),
    (
        "http://metadata.test/latest/meta-data/",
        ErrorCode::AuthForbidden,
    ),
    ("http://cname.test/", ErrorCode::AuthForbidden),
    ("http://ula.test/", ErrorCode::AuthForbidden),
    ("http://mapped.test/", ErrorCode::AuthForbidden),
    ("http://nat64.test/", ErrorCode::AuthForbidden),
    ("http://cgnat.test/", ErrorCode::AuthForbidden),
    ("http://zero.test/", ErrorCode::AuthForbidden),
    ("http://linklocal6.test/", ErrorCode::AuthForbidden),
    ("http://allprivate.test/", ErrorCode::AuthForbidden),
];

/// Records of the corpus's names, every one resolving inside.
const INSIDE: &[(&str, &[&str])] = &[
    ("localhost.test", &["127.0.0.1"]),
    ("metadata.test", &["169.254.169.254"]),
    ("ula.test", &["fd00::1"]),
    ("mapped.test", &["::ffff:10.0.0.1"]),
    ("nat64.test", &["64:ff9b::a00:1"]),
    ("cgnat.test", &["100.64.0.1"]),
    ("zero.test", &["0.0.0.0"]),
    ("linklocal6.test", &["fe80::1"]),
    (
        "allprivate.test",
        &["10.0.0.1", "192.168.1.1", "172.16.0.1"],
    ),
];

#[tokio::test]
async fn the_url_corpus_is_refused_and_nothing_is_dialled() {
    assert!(CORPUS.len() >= 90, "{} vectors", CORPUS.len());
    let dns = soulbase_net_testkit::MockDns::start().await.unwrap();
    for (name, ips) in INSIDE {
        let ips: Vec<IpAddr> = ips.iter().map(|ip| ip.parse().unwrap()).collect();
        dns.set_ips(name, &ips, 60);
    }
    dns.set_cname("cname.test", "metadata.test", 60);
    let mut p = NetPolicy::default();
    p.dns.nameservers = vec![dns.addr()];
    p.dns.prefetch.clear();
    let h = harness(p);
    for &(url, code) in CORPUS {
        let err = h.client.send(NetRequest::get(url)).await.unwrap_err();
        assert_eq!(err.code(), code, "{url}: {err}");
    }
    assert!(
        h.dialer.dialled().is_empty(),
        "dialled: {:?}",
        h.dialer.dialled()
    );
}

#[tokio::test]
async fn names_resolving_inside_are_refused_at_connect() {
    let mut p = NetPolicy::default();
    for (name, ip) in [
        ("internal.example", "10.1.2.3"),
        ("meta.example", "169.254.169.254"),
        ("local.example", "127.0.0.1"),
        ("mixed.example", "::ffff:192.168.1.1"),
    ] {
        p.dns
            .static_hosts
            .insert(name.to_owned(), vec![ip.parse::<IpAddr>().unwrap()]);
    }
    let h = harness(p);
    for name in [
        "internal.example",
        "meta.example",
        "local.example",
        "mixed.example",
    ] {
        let err = h
            .client
            .send(NetRequest::get(format!("http://{name}/")))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Blocked, "{name}");
        assert!(err.to_string().contains(name), "{err}");
    }
    assert!(h.dialer.dialled().is_empty());
}

#[tokio::test]
async fn mixed_answers_dial_only_allowed_addresses() {
    let srv = FaultServer::http1()
        .route("/m", Reply::ok("ok"))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.dns.static_hosts.insert(
        "svc.example".to_owned(),
        vec!["10.9.9.9".parse().unwrap(), "127.0.0.1".parse().unwrap()],
    );
    let h = harness(p);
    let url = format!("http://svc.example:{}/m", srv.addr().port());
    let res = h.client.send(NetRequest::get(url)).await.unwrap();
    assert_eq!(res.status, 200);
    let dialled = h.dialer.dialled();
    assert_eq!(dialled, vec![srv.addr()]);
    srv.join().await;
}

#[tokio::test]
async fn allow_hosts_is_checked_before_anything_is_resolved() {
    let srv = FaultServer::http1()
        .route("/", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.security.allow_hosts = Some(vec!["*.example.com".to_owned()]);
    let h = harness(p);
    let err = h
        .client
        .send(NetRequest::get(srv.url("/")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked);
    assert!(err.to_string().contains("allow_hosts"), "{err}");
    assert!(h.dialer.dialled().is_empty());
    srv.join().await;
}
