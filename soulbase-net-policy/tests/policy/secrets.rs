//! Secrets in output (issue 33, item 9): a credential planted in every credential-bearing field
//! of a document — the proxy URLs' passwords, the alternate endpoints' passwords, the mTLS
//! private key, the `[store]` passwords — appears in no `Debug`, no explanation and no error,
//! while the host, port and user name still do, and while the values the client uses and the
//! document's serialised forms keep it.

use soulbase_net_core::NetError;
use soulbase_net_policy::*;

const SECRET: &str = "s3cr3t-PLANTED";

/// A document with the secret in every credential-bearing field, in every kind of layer.
fn planted_toml() -> String {
    r#"
[default]
proxy.http_proxy = "http://alice:SECRET@proxy.internal:3128"
proxy.https_proxy = "https://alice:SECRET@proxy.internal:3129"
proxy.no_proxy = [".internal"]
endpoints.urls = ["https://bob:SECRET@eu.api.example.com:8443", "https://us.api.example.com"]
tls.mtls = { client_cert_pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", client_key_pem = "-----BEGIN PRIVATE KEY-----\nSECRET\n-----END PRIVATE KEY-----\n" }

[overrides."*.example.com"]
proxy.https_proxy = "http://carol:SECRET@egress.example.net:8080"

[tenants.t1]
proxy.http_proxy = "http://dave:SECRET@t1-proxy.internal:3128"

[tenants.t1.overrides."api.example.com"]
endpoints.urls = ["https://erin:SECRET@t1.api.example.com"]

[keys.payments]
proxy.https_proxy = "https://frank:SECRET@pay-proxy.internal:443"

[store]
redis_sentinel = { master = "mymaster", nodes = ["redis://grace:SECRET@10.0.0.7:26379"], username = "app", password = "SECRET" }
"#
    .replace("SECRET", SECRET)
}

fn planted() -> PolicyDocument {
    PolicyDocument::from_toml_str(&planted_toml()).unwrap()
}

/// Every call shape the document distinguishes: each layer, alone and combined.
const CALLS: [(Option<&str>, &str, Option<&str>); 6] = [
    (None, "other.org", None),
    (None, "www.example.com", None),
    (Some("t1"), "other.org", None),
    (Some("t1"), "api.example.com", None),
    (None, "other.org", Some("payments")),
    (Some("t1"), "api.example.com", Some("payments")),
];

fn assert_clean(what: &str, shown: &str) {
    assert!(!shown.contains(SECRET), "{what} shows the secret:\n{shown}");
}

#[test]
fn debug_of_documents_policies_and_resolvers_never_shows_a_secret() {
    let doc = planted();
    for shown in [format!("{doc:?}"), format!("{doc:#?}")] {
        assert_clean("PolicyDocument's Debug", &shown);
        // Still useful: where the proxies and endpoints are, and as whom.
        for visible in [
            "alice",
            "proxy.internal:3128",
            "proxy.internal:3129",
            "carol",
            "egress.example.net:8080",
            "dave",
            "t1-proxy.internal:3128",
            "bob",
            "eu.api.example.com:8443",
            "us.api.example.com",
            "erin",
            "frank",
            "pay-proxy.internal",
            "10.0.0.7:26379",
            "BEGIN CERTIFICATE",
        ] {
            assert!(shown.contains(visible), "{visible} missing from\n{shown}");
        }
    }
    let resolver = SnapshotResolver::new(doc).unwrap();
    assert_clean("SnapshotResolver's Debug", &format!("{resolver:?}"));
    let snapshot = resolver.snapshot();
    assert_clean("Snapshot's Debug", &format!("{snapshot:?}"));
    for (tenant, host, key) in CALLS {
        let policy = match key {
            None => snapshot.resolve(tenant, host),
            Some(k) => snapshot.resolve_key(tenant, host, k).unwrap(),
        };
        let proxy = policy.proxy.as_ref().unwrap();
        for shown in [format!("{policy:?}"), format!("{policy:#?}")] {
            assert_clean("NetPolicy's Debug", &shown);
            for url in [&proxy.http_proxy, &proxy.https_proxy]
                .into_iter()
                .flatten()
                .chain(&policy.endpoints.urls)
            {
                let parsed = url::Url::parse(url).unwrap();
                assert!(shown.contains(parsed.host_str().unwrap()), "{shown}");
                assert!(shown.contains(parsed.username()), "{shown}");
                if let Some(port) = parsed.port() {
                    assert!(shown.contains(&format!(":{port}")), "{shown}");
                }
            }
        }
        for shown in [format!("{proxy:?}"), format!("{:?}", policy.endpoints)] {
            assert_clean("a sub-policy's Debug", &shown);
        }
        assert_clean("TlsPolicy's Debug", &format!("{:?}", policy.tls));
    }
}

#[test]
fn explanations_never_show_a_secret() {
    let snapshot = SnapshotResolver::new(planted()).unwrap().snapshot();
    for (tenant, host, key) in CALLS {
        let why = snapshot.explain(tenant, host, key).unwrap();
        assert_clean("Explanation's Debug", &format!("{why:?}"));
        assert_clean("Explanation's Debug", &format!("{why:#?}"));
        for f in why.fields() {
            let what = format!("explained field {}", f.path);
            assert_clean(&what, &f.value.to_string());
            assert_clean(&what, &format!("{f:?}"));
            assert_clean(&what, &format!("{}", f.layer));
        }
        // Still useful: the URLs are there, with host, port and user, the password masked.
        let http_proxy = why.field("proxy.http_proxy").unwrap().value.to_string();
        let want = if tenant == Some("t1") {
            "dave:***@t1-proxy.internal:3128"
        } else {
            "alice:***@proxy.internal:3128"
        };
        assert!(http_proxy.contains(want), "{http_proxy}");
        let urls = why.field("endpoints.urls").unwrap().value.to_string();
        assert!(urls.contains(":***@"), "{urls}");
        let key_pem = why
            .field("tls.mtls.client_key_pem")
            .unwrap()
            .value
            .to_string();
        assert!(!key_pem.contains("PRIVATE KEY"), "{key_pem}");
        let cert = why.field("tls.mtls.client_cert_pem").unwrap();
        assert!(cert.value.to_string().contains("BEGIN CERTIFICATE"));
        // With request timeouts on top, the same.
        let why = why.with_request_timeouts(
            &soulbase_net_core::TimeoutCfg::default().with_total(std::time::Duration::from_secs(5)),
        );
        assert_clean("Explanation's Debug", &format!("{why:?}"));
    }
}

#[test]
fn the_values_used_and_the_serialised_forms_keep_the_secret() {
    let doc = planted();
    let resolver = SnapshotResolver::new(doc.clone()).unwrap();
    let p = resolver.resolve(None, "other.org");
    let proxy = p.proxy.as_ref().unwrap();
    assert_eq!(
        proxy.http_proxy.as_deref(),
        Some(&*format!("http://alice:{SECRET}@proxy.internal:3128"))
    );
    assert_eq!(
        p.endpoints.urls[0],
        format!("https://bob:{SECRET}@eu.api.example.com:8443")
    );
    assert!(p.tls.mtls.as_ref().unwrap().client_key_pem.contains(SECRET));
    let why = resolver
        .snapshot()
        .explain(None, "other.org", None)
        .unwrap();
    assert_eq!(
        why.policy(),
        &*p,
        "the explanation's policy is the one used"
    );
    // Serialisation is not display: it keeps everything, and round-trips.
    let toml_text = doc.to_toml_string().unwrap();
    assert!(toml_text.contains(SECRET));
    assert_eq!(PolicyDocument::from_toml_str(&toml_text).unwrap(), doc);
    let json_text = doc.to_json_string();
    assert!(json_text.contains(SECRET));
    assert_eq!(PolicyDocument::from_json_str(&json_text).unwrap(), doc);
    let policy_json = serde_json::to_string(&*p).unwrap();
    assert!(policy_json.contains(&format!("alice:{SECRET}@")));
    let back: NetPolicy = serde_json::from_str(&policy_json).unwrap();
    assert_eq!(back, *p);
}

/// Every rendering of an error: its `Display`, its `Debug`, each problem, and as a `NetError`.
fn renderings(err: &PolicyError) -> Vec<String> {
    let mut out = vec![err.to_string(), format!("{err:?}")];
    out.extend(err.problems().iter().map(|p| format!("{p} {p:?}")));
    let net: NetError = err.clone().into();
    out.push(net.to_string());
    out.push(format!("{net:?}"));
    out.extend(net.message().map(str::to_owned));
    out
}

/// `section` under `[default]`, `[overrides."*.example.com"]` and `[tenants.t1]` must fail with
/// a problem at `field` (under each) that names `visible`, and show the secret nowhere.
fn fails_without_the_secret(section: &str, field: &str, visible: &str) {
    let section = section.replace("SECRET", SECRET);
    for (layer, header) in [
        ("default", "[default]"),
        (
            r#"overrides."*.example.com""#,
            r#"[overrides."*.example.com"]"#,
        ),
        ("tenants.t1", "[tenants.t1]"),
    ] {
        let text = format!("{header}\n{section}\n");
        let err = PolicyDocument::from_toml_str(&text).unwrap_err();
        for shown in renderings(&err) {
            assert_clean(&format!("the error for {section}"), &shown);
        }
        let path = format!("{layer}.{field}");
        let problem = err
            .problems()
            .iter()
            .find(|p| p.path == path)
            .unwrap_or_else(|| panic!("no problem at {path} in\n{err}"));
        assert!(
            problem.reason.contains(visible),
            "{path}: `{visible}` missing from {:?}",
            problem.reason
        );
        // A fragment laid over a good document fails the same way.
        let err = PolicyDocument::new().merged_with_toml(&text).unwrap_err();
        for shown in renderings(&err) {
            assert_clean(&format!("the patch error for {section}"), &shown);
        }
    }
    // And as JSON.
    let value: serde_json::Value = toml::from_str(&format!("[default]\n{section}\n")).unwrap();
    let err = PolicyDocument::from_json_str(&value.to_string()).unwrap_err();
    for shown in renderings(&err) {
        assert_clean(&format!("the JSON error for {section}"), &shown);
    }
}

#[test]
fn a_malformed_proxy_url_is_reported_where_it_is_without_its_password() {
    let cases = [
        (
            r#"proxy.http_proxy = "socks5://alice:SECRET@proxy.internal:1080""#,
            "proxy.http_proxy",
            "alice:***@proxy.internal:1080",
        ),
        (
            r#"proxy.https_proxy = "http://alice:SECRET@""#,
            "proxy.https_proxy",
            "alice:***@",
        ),
        (
            r#"proxy.http_proxy = "alice:SECRET@proxy.internal:3128""#,
            "proxy.http_proxy",
            "alice:***@proxy.internal:3128",
        ),
        (
            r#"proxy.https_proxy = "http://alice:SECRET@proxy internal:3128""#,
            "proxy.https_proxy",
            "not an absolute URL",
        ),
        (
            r#"proxy.http_proxy = "http://alice:SECRET@proxy.internal:99999""#,
            "proxy.http_proxy",
            "alice:***@proxy.internal:99999",
        ),
        (
            r#"proxy.https_proxy = "http://alice:pa/ss:SECRET@proxy.internal""#,
            "proxy.https_proxy",
            "alice:***@proxy.internal",
        ),
        (
            r#"endpoints.urls = ["https://ok.example.com", "ftp://bob:SECRET@files.example.com"]"#,
            "endpoints.urls[1]",
            "bob:***@files.example.com",
        ),
    ];
    for (section, field, visible) in cases {
        fails_without_the_secret(section, field, visible);
    }
}

#[test]
fn other_errors_about_credential_fields_never_show_a_secret() {
    // The wrong type where a table or a string is expected: serde quotes the value it got.
    fails_without_the_secret(
        r#"proxy = "http://alice:SECRET@proxy.internal:3128""#,
        "proxy",
        "invalid type",
    );
    fails_without_the_secret(
        r#"tls.mtls = "-----BEGIN PRIVATE KEY-----SECRET""#,
        "tls.mtls",
        "invalid type",
    );
    fails_without_the_secret(
        r#"tls.mtls = { client_cert_pem = "nope", client_key_pem = "SECRET" }"#,
        "tls.mtls.client_key_pem",
        "PEM private key",
    );
    fails_without_the_secret(
        r#"endpoints.urls = "https://bob:SECRET@eu.api.example.com""#,
        "endpoints.urls",
        "invalid type",
    );
    // A policy checked on its own.
    let mut p = NetPolicy::default();
    let mut proxy = ProxyPolicy::default();
    proxy.https_proxy = Some(format!("socks5://alice:{SECRET}@proxy.internal:1080"));
    p.proxy = Some(proxy);
    let err = p.validate().unwrap_err();
    assert_eq!(err.problems()[0].path, "proxy.https_proxy");
    for shown in renderings(&err) {
        assert_clean("NetPolicy::validate", &shown);
    }
    // A TOML syntax error on the line of a proxy URL.
    let text =
        format!("[default]\nproxy.http_proxy = \"http://alice:{SECRET}@proxy.internal:3128\n");
    let err = PolicyDocument::from_toml_str(&text).unwrap_err();
    for shown in renderings(&err) {
        assert_clean("a TOML syntax error", &shown);
    }
}
