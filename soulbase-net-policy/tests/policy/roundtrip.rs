//! TOML and JSON round-trips: of `NetPolicy::default()`, of a policy with every option set,
//! and of a full document.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use soulbase_net_policy::*;

pub(crate) const CERT: &str =
    "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n";
pub(crate) const KEY: &str =
    "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n";
/// base64 of 32 bytes of 0x07.
pub(crate) const PIN: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";

/// A valid policy where every field differs from its default and every `Option` is `Some`.
pub(crate) fn everything_set() -> NetPolicy {
    let mut p = NetPolicy::default();
    p.retry.enabled = true;
    p.retry.max_attempts = 2;
    p.retry.backoff.base = Duration::from_millis(50);
    p.retry.backoff.factor = 1.5;
    p.retry.backoff.jitter = 0.25;
    p.retry.backoff.cap = Duration::from_millis(1_234);
    p.retry.backoff.mode = JitterMode::Equal;
    p.retry.retry_on.status_429 = false;
    p.retry.respect_retry_after = false;
    p.retry.budget.retry_ratio = 0.1;
    p.retry.budget.per_tenant = true;
    p.cbreaker.enabled = true;
    p.cbreaker.key_by = CbKey::HostTenant;
    p.cbreaker.slow_call = Some(SlowCallCfg::default());
    p.redirect.max = 3;
    p.tls.min_tls = TlsVersion::Tls13;
    p.tls.pinset_sha256 = Some(vec![PIN.to_owned()]);
    let mut mtls = MtlsCfg::default();
    mtls.client_cert_pem = CERT.to_owned();
    mtls.client_key_pem = KEY.to_owned();
    p.tls.mtls = Some(mtls);
    p.tls.extra_roots_pem = vec![CERT.to_owned()];
    p.tls.http2 = false;
    p.dns.min_ttl = Duration::from_secs(5);
    p.dns.persist_file = Some("/var/cache/soulbase/dns.json".into());
    p.dns.persist_interval = None;
    p.dns.refresh_interval = Some(Duration::from_secs(90));
    p.dns.prefetch = vec!["api.example.com".to_owned()];
    p.dns.static_hosts = BTreeMap::from([(
        "db.internal".to_owned(),
        vec!["10.0.0.7".parse().unwrap(), "::1".parse().unwrap()],
    )]);
    p.dns.nameservers = vec!["127.0.0.1:5353".parse().unwrap()];
    let mut proxy = ProxyPolicy::default();
    proxy.http_proxy = Some("http://proxy.internal:3128".to_owned());
    proxy.https_proxy = Some("http://proxy.internal:3128".to_owned());
    proxy.no_proxy = vec![".internal".to_owned(), "10.0.0.0/8".to_owned()];
    proxy.from_env = true;
    p.proxy = Some(proxy);
    p.security.allow_hosts = Some(vec!["*.example.com".to_owned()]);
    p.security.strict_mixed_answers = true;
    p.security.max_resp_bytes = ByteSize(10_000_000);
    p.security.max_req_bytes = ByteSize(1_500);
    p.security.strip_headers = vec!["x-internal-token".to_owned()];
    p.security.grants.hosts = vec!["metadata.internal".to_owned()];
    p.security.grants.cidrs = vec!["10.1.0.0/16".parse().unwrap()];
    p.limits.per_host_rate_rps = Some(100);
    p.limits.rate_burst = Some(20);
    p.limits.max_wait = Duration::from_millis(250);
    p.limits.aimd.enabled = true;
    p.limits.aimd.scope = AimdScope::Global;
    p.cache.swr = true;
    p.cache.max_entry_bytes = ByteSize::kib(512);
    p.hedge.enabled = true;
    p.hedge.delay = Duration::from_millis(75);
    p.endpoints.urls = vec!["https://eu.api.example.com".to_owned()];
    p.timeout.total = Duration::from_secs(25);
    p.timeout.dynamic.enabled = true;
    p.validate().unwrap();
    p
}

#[test]
fn default_policy_round_trips_in_toml_and_json() {
    let p = NetPolicy::default();
    let t = toml::to_string(&p).unwrap();
    assert_eq!(toml::from_str::<NetPolicy>(&t).unwrap(), p, "{t}");
    let j = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<NetPolicy>(&j).unwrap(), p, "{j}");
}

#[test]
fn a_policy_with_everything_set_round_trips() {
    let p = everything_set();
    let t = toml::to_string(&p).unwrap();
    assert_eq!(toml::from_str::<NetPolicy>(&t).unwrap(), p, "{t}");
    let j = serde_json::to_string_pretty(&p).unwrap();
    assert_eq!(serde_json::from_str::<NetPolicy>(&j).unwrap(), p, "{j}");
    assert!(t.contains("persist_interval = \"off\""), "{t}");
    assert!(t.contains("min_tls = \"1.3\""), "{t}");
    assert!(t.contains("max_resp_bytes = \"10MB\""), "{t}");
}

fn full_document() -> PolicyDocument {
    let mut doc = PolicyDocument::from_policy(&everything_set());
    doc.set_override(
        "*.example.com",
        json!({"retry": {"backoff": {"cap": "2s"}}}),
    )
    .set_override(
        "api.example.com",
        json!({"limits": {"per_host_concurrency": 8}}),
    )
    .set_tenant("t1", json!({"limits": {"per_tenant_concurrency": 32}}))
    .set_tenant("empty", json!({}))
    .set_tenant_override("t1", "api.example.com", json!({"tls": {"min_tls": "1.3"}}));
    doc.validate().unwrap();
    doc
}

#[test]
fn a_full_document_round_trips_in_toml() {
    let doc = full_document();
    let t = doc.to_toml_string().unwrap();
    let back = PolicyDocument::from_toml_str(&t).unwrap();
    assert_eq!(back, doc, "{t}");
    assert_eq!(back.to_toml_string().unwrap(), t);
    assert!(
        t.contains(r#"[overrides."*.example.com".retry.backoff]"#)
            || t.contains(r#"[overrides."*.example.com"]"#),
        "{t}"
    );
}

#[test]
fn a_full_document_round_trips_in_json() {
    let doc = full_document();
    let j = doc.to_json_string();
    let back = PolicyDocument::from_json_str(&j).unwrap();
    assert_eq!(back, doc, "{j}");
    assert_eq!(back.to_json_string(), j);
}

#[test]
fn toml_and_json_give_the_same_document() {
    let doc = full_document();
    let via_toml = PolicyDocument::from_toml_str(&doc.to_toml_string().unwrap()).unwrap();
    let via_json = PolicyDocument::from_json_str(&doc.to_json_string()).unwrap();
    let a = SnapshotResolver::new(via_toml).unwrap();
    let b = SnapshotResolver::new(via_json).unwrap();
    for (tenant, host) in [
        (None, "x.org"),
        (Some("t1"), "api.example.com"),
        (Some("t1"), "a.example.com"),
    ] {
        assert_eq!(
            a.resolve(tenant, host),
            b.resolve(tenant, host),
            "{tenant:?} {host}"
        );
    }
}
