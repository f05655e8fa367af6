//! The example document shipped at `examples/policy.toml` parses, validates and resolves as its
//! comments say.

use std::time::Duration;

use soulbase_net_policy::*;

const EXAMPLE: &str = include_str!("../../../examples/policy.toml");

#[test]
fn the_example_document_is_valid_and_resolves_as_documented() {
    let doc = PolicyDocument::from_toml_str(EXAMPLE).unwrap_or_else(|e| panic!("{e}"));
    doc.validate().unwrap();
    let r = SnapshotResolver::new(doc).unwrap();

    let any = r.resolve(None, "www.example.com");
    assert_eq!(any.worst_case_latency(), Duration::from_millis(24_300));
    assert!(any.cbreaker.enabled);
    assert_eq!(any.security.allow_hosts.as_deref().map(<[_]>::len), Some(2));

    let pay = r.resolve(None, "api.payments.example.com");
    assert_eq!(pay.retry.max_attempts, 2);
    assert_eq!(pay.limits.per_host_rate_rps, Some(50));
    assert!(pay.hedge.enabled);
    assert_eq!(pay.endpoints.urls.len(), 2);
    assert_eq!(
        pay.timeout.connect,
        Duration::from_secs(2),
        "kept from default"
    );

    let storage = r.resolve(Some("batch"), "storage.partner.net");
    assert_eq!(storage.security.max_resp_bytes, ByteSize::gib(1));
    assert_eq!(storage.tls.min_tls, TlsVersion::Tls13);
    assert_eq!(storage.limits.per_tenant_concurrency, 32);
    assert!(storage.limits.aimd.enabled);
    assert!(storage.proxy.is_some());
    assert!(r.resolve(None, "storage.partner.net").proxy.is_none());
}

#[test]
fn the_example_document_round_trips() {
    let doc = PolicyDocument::from_toml_str(EXAMPLE).unwrap();
    let again = PolicyDocument::from_toml_str(&doc.to_toml_string().unwrap()).unwrap();
    assert_eq!(again, doc);
    assert_eq!(
        PolicyDocument::from_json_str(&doc.to_json_string()).unwrap(),
        doc
    );
}
