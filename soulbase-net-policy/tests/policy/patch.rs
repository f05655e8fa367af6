//! Patching a document with `merged_with_toml`: a fragment laid over the default, a host
//! override, a tenant and a tenant + host override; every problem of an invalid fragment
//! listed with its path; the original document unchanged.

use std::time::Duration;

use soulbase_net_policy::*;

const PROD: &str = r#"
    [default]
    timeout.total = "60s"
    retry.backoff.base = "200ms"
    security.grants.cidrs = ["10.1.0.0/16"]

    [overrides."inventory.example.com"]
    retry.max_attempts = 5

    [tenants.acme]
    limits.per_tenant_concurrency = 8

    [tenants.acme.overrides."pricing.example.com"]
    retry.max_attempts = 2
"#;

fn prod() -> PolicyDocument {
    PolicyDocument::from_toml_str(PROD).unwrap()
}

fn resolve(doc: PolicyDocument, tenant: Option<&str>, host: &str) -> NetPolicy {
    SnapshotResolver::new(doc)
        .unwrap()
        .resolve(tenant, host)
        .as_ref()
        .clone()
}

fn paths(e: &PolicyError) -> Vec<&str> {
    e.problems().iter().map(|p| p.path.as_str()).collect()
}

#[test]
fn a_fragment_on_the_default_changes_only_what_it_states() {
    let doc = prod()
        .merged_with_toml(
            r#"
            [default]
            security.grants.cidrs = ["127.0.0.0/8", "::1/128"]
            dns.nameservers = ["127.0.0.1:5353"]
            "#,
        )
        .unwrap();
    let p = resolve(doc.clone(), None, "other.org");
    // Lists replace: the production grant gives way to loopback.
    let cidrs: Vec<String> = p
        .security
        .grants
        .cidrs
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(cidrs, ["127.0.0.0/8", "::1/128"]);
    assert_eq!(p.dns.nameservers, ["127.0.0.1:5353".parse().unwrap()]);
    // Production's default fields the fragment did not state are kept.
    assert_eq!(p.timeout.total, Duration::from_secs(60));
    assert_eq!(p.retry.backoff.base, Duration::from_millis(200));
    // And so are the other layers.
    let inv = resolve(doc.clone(), None, "inventory.example.com");
    assert_eq!(inv.retry.max_attempts, 5);
    assert_eq!(inv.dns.nameservers, p.dns.nameservers);
    let acme = resolve(doc, Some("acme"), "pricing.example.com");
    assert_eq!(acme.limits.per_tenant_concurrency, 8);
    assert_eq!(acme.retry.max_attempts, 2);
}

#[test]
fn a_fragment_on_an_override_merges_into_it() {
    let doc = prod()
        .merged_with_toml(
            r#"
            [overrides."inventory.example.com"]
            retry.backoff.base = "1ms"
            "#,
        )
        .unwrap();
    let inv = resolve(doc.clone(), None, "inventory.example.com");
    assert_eq!(
        inv.retry.max_attempts, 5,
        "the override's own field is kept"
    );
    assert_eq!(inv.retry.backoff.base, Duration::from_millis(1));
    let other = resolve(doc, None, "other.org");
    assert_eq!(other.retry.backoff.base, Duration::from_millis(200));
}

#[test]
fn a_fragment_can_reach_tenants_and_add_sections() {
    let doc = prod()
        .merged_with_toml(
            r#"
            [tenants.acme]
            limits.per_tenant_concurrency = 2

            [tenants.acme.overrides."pricing.example.com"]
            retry.backoff.base = "1ms"

            [overrides."new.example.com"]
            retry.enabled = false
            "#,
        )
        .unwrap();
    let acme = resolve(doc.clone(), Some("acme"), "pricing.example.com");
    assert_eq!(acme.limits.per_tenant_concurrency, 2);
    assert_eq!(acme.retry.backoff.base, Duration::from_millis(1));
    assert_eq!(
        acme.retry.max_attempts, 2,
        "the tenant + host override's own field is kept"
    );
    assert!(!resolve(doc, None, "new.example.com").retry.enabled);
}

#[test]
fn an_invalid_fragment_lists_every_problem_with_its_path() {
    let e = prod()
        .merged_with_toml(
            r#"
            [default]
            retry.max_attempts = 0

            [overrides."inventory.example.com"]
            tls.verify_cert = false

            [tenants.acme]
            limits.per_tenant_concurrency = "many"
            "#,
        )
        .unwrap_err();
    let found = paths(&e);
    for want in [
        "default.retry.max_attempts",
        r#"overrides."inventory.example.com".tls.verify_cert"#,
        "tenants.acme.limits.per_tenant_concurrency",
    ] {
        assert!(found.contains(&want), "{want} missing from {found:?}");
    }
}

#[test]
fn a_fragment_of_the_wrong_shape_is_refused_with_its_paths() {
    let e = prod()
        .merged_with_toml("overrides = 1\n[defaults]\nretry.max_attempts = 2\n")
        .unwrap_err();
    assert_eq!(paths(&e), ["defaults", "overrides"]);

    let e = prod().merged_with_toml("[default\n").unwrap_err();
    assert_eq!(paths(&e), [""]);
}

#[test]
fn the_original_document_is_unchanged() {
    let original = prod();
    let before = original.clone();
    let patched = original
        .merged_with_toml("[default]\nretry.max_attempts = 4\n")
        .unwrap();
    assert_eq!(original, before);
    assert_ne!(patched, original);
    let _ = original
        .merged_with_toml("[default]\nretry.max_attempts = 0\n")
        .unwrap_err();
    assert_eq!(original, before);
}

#[test]
fn merging_an_empty_fragment_gives_the_same_document() {
    let doc = prod();
    assert_eq!(doc.merged_with_toml("").unwrap(), doc);
}
