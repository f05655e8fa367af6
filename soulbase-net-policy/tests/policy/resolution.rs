//! Resolution order: tenant+host > tenant > host pattern > default; exact host > wildcard;
//! longest wildcard wins; hosts normalised.

use std::sync::Arc;
use std::time::Duration;

use soulbase_net_policy::*;

const DOC: &str = r#"
[default]
limits.per_host_concurrency = 10
security.strip_headers = ["x-default"]

[overrides."*.example.com"]
limits.per_host_concurrency = 20
retry.backoff.cap = "2s"
security.strip_headers = ["x-wild"]

[overrides."*.api.example.com"]
limits.per_host_concurrency = 30

[overrides."v1.api.example.com"]
limits.per_host_concurrency = 40

[overrides."*.bücher.example"]
limits.per_host_concurrency = 60

[tenants.t1]
limits.per_tenant_concurrency = 7
redirect.max = 2

[tenants.t1.overrides."*.example.com"]
limits.per_host_concurrency = 50
retry.backoff.base = "50ms"

[tenants.t2]
limits.per_host_concurrency = 70
"#;

fn resolver() -> SnapshotResolver {
    SnapshotResolver::new(PolicyDocument::from_toml_str(DOC).unwrap()).unwrap()
}

fn per_host(r: &SnapshotResolver, tenant: Option<&str>, host: &str) -> u32 {
    r.resolve(tenant, host).limits.per_host_concurrency
}

#[test]
fn host_patterns_exact_beats_wildcard_and_longest_wildcard_wins() {
    let r = resolver();
    assert_eq!(per_host(&r, None, "other.org"), 10);
    assert_eq!(per_host(&r, None, "a.example.com"), 20);
    assert_eq!(per_host(&r, None, "a.b.example.com"), 20);
    assert_eq!(per_host(&r, None, "api.example.com"), 20);
    assert_eq!(per_host(&r, None, "x.api.example.com"), 30);
    assert_eq!(per_host(&r, None, "v1.api.example.com"), 40);
    assert_eq!(per_host(&r, None, "example.com"), 10);
    assert_eq!(per_host(&r, None, "evilexample.com"), 10);
    assert_eq!(per_host(&r, None, "example.com.evil.org"), 10);
}

#[test]
fn hosts_are_normalised() {
    let r = resolver();
    assert_eq!(per_host(&r, None, "V1.API.Example.COM."), 40);
    assert_eq!(per_host(&r, None, "X.Api.Example.Com"), 30);
    assert_eq!(per_host(&r, None, "shop.BÜCHER.example"), 60);
    assert_eq!(per_host(&r, None, "shop.xn--bcher-kva.example"), 60);
    assert_eq!(per_host(&r, None, "xn--bcher-kva.example"), 10);
}

#[test]
fn tenant_plus_host_beats_tenant_beats_host_beats_default() {
    let r = resolver();
    // tenant + host override beats even an exact global host override
    assert_eq!(per_host(&r, Some("t1"), "v1.api.example.com"), 50);
    assert_eq!(per_host(&r, Some("t1"), "a.example.com"), 50);
    // the tenant alone: its fields win over the host pattern's
    assert_eq!(per_host(&r, Some("t2"), "a.example.com"), 70);
    assert_eq!(per_host(&r, Some("t2"), "other.org"), 70);
    // a tenant that states nothing about a field keeps the host pattern's
    assert_eq!(per_host(&r, Some("t1"), "other.org"), 10);
    // unknown tenants get the host patterns and default
    assert_eq!(per_host(&r, Some("nobody"), "x.api.example.com"), 30);
    assert_eq!(per_host(&r, None, "a.example.com"), 20);
}

#[test]
fn every_layer_changes_only_what_it_states() {
    let r = resolver();
    let p = r.resolve(Some("t1"), "a.example.com");
    assert_eq!(p.retry.backoff.cap, Duration::from_secs(2)); // *.example.com
    assert_eq!(p.retry.backoff.base, Duration::from_millis(50)); // t1 + *.example.com
    assert_eq!(p.limits.per_tenant_concurrency, 7); // t1
    assert_eq!(p.redirect.max, 2); // t1
    assert_eq!(p.retry.backoff.factor, 2.0); // built-in
                                             // lists replace rather than merge
    assert_eq!(p.security.strip_headers, ["x-wild"]);
    assert_eq!(
        r.resolve(None, "other.org").security.strip_headers,
        ["x-default"]
    );
    // Only the best host override applies, not every matching one.
    let exact = r.resolve(None, "v1.api.example.com");
    assert_eq!(exact.retry.backoff.cap, Duration::from_secs(5));
    assert_eq!(exact.security.strip_headers, ["x-default"]);
}

#[test]
fn repeated_lookups_share_one_policy() {
    let r = resolver();
    let a = r.resolve(Some("t1"), "a.example.com");
    let b = r.resolve(Some("t1"), "a.example.com");
    let c = r.resolve(Some("t1"), "b.example.com");
    assert!(Arc::ptr_eq(&a, &b));
    assert!(Arc::ptr_eq(&a, &c), "one combination of layers, one policy");
}

#[test]
fn a_snapshot_is_a_consistent_view() {
    let r = resolver();
    let snap = r.snapshot();
    assert_eq!(snap.version(), 1);
    assert!(snap.combinations() >= 8);
    r.update(PolicyDocument::new()).unwrap();
    // The old snapshot still answers from the old document.
    assert_eq!(
        snap.resolve(None, "a.example.com")
            .limits
            .per_host_concurrency,
        20
    );
    assert_eq!(per_host(&r, None, "a.example.com"), 64);
    assert_eq!(r.version(), 2);
    assert_eq!(r.snapshot().document(), &PolicyDocument::new());
}

#[test]
fn from_policy_gives_the_policy_to_everyone() {
    let mut p = NetPolicy::default();
    p.limits.per_host_concurrency = 3;
    let r = SnapshotResolver::from_policy(p.clone()).unwrap();
    assert_eq!(*r.resolve(Some("t"), "any.example"), p);
    let mut bad = p;
    bad.tls.verify_cert = false;
    let e = SnapshotResolver::from_policy(bad).unwrap_err();
    assert_eq!(e.problems()[0].path, "default.tls.verify_cert");
}

#[test]
fn a_document_without_overrides_gives_everyone_its_one_policy() {
    let doc = PolicyDocument::from_toml_str("[default]\nlimits.per_host_concurrency = 9").unwrap();
    let r = SnapshotResolver::new(doc).unwrap();
    let a = r.resolve(None, "a.example");
    let b = r.resolve(Some("t1"), "b.example");
    assert_eq!(a.limits.per_host_concurrency, 9);
    assert!(Arc::ptr_eq(&a, &b), "one shared policy, not a copy per key");
    // An update with an override ends the shortcut for the hosts it names.
    r.update_toml_str("[overrides.\"a.example\"]\nlimits.per_host_concurrency = 3")
        .unwrap();
    assert_eq!(per_host(&r, None, "a.example"), 3);
    assert_eq!(per_host(&r, None, "b.example"), 64);
}

#[test]
fn named_policies_go_on_top_of_every_layer() {
    let doc = PolicyDocument::from_toml_str(
        r#"
        [default]
        retry.max_attempts = 3

        [overrides."*.example.com"]
        limits.per_host_concurrency = 20

        [tenants.t1]
        limits.per_tenant_concurrency = 7

        [keys.payments]
        retry.enabled = false
        limits.per_host_concurrency = 5
        "#,
    )
    .unwrap();
    let r = SnapshotResolver::new(doc).unwrap();
    let keyed = r
        .resolve_key(Some("t1"), "api.example.com", "payments")
        .unwrap();
    assert!(!keyed.retry.enabled);
    assert_eq!(
        keyed.limits.per_host_concurrency, 5,
        "the key wins over the host"
    );
    assert_eq!(
        keyed.limits.per_tenant_concurrency, 7,
        "the tenant's layer stays"
    );
    assert_eq!(keyed.retry.max_attempts, 3, "the default's layer stays");
    let plain = r.resolve(Some("t1"), "api.example.com");
    assert!(plain.retry.enabled);
    assert_eq!(plain.limits.per_host_concurrency, 20);
    assert!(r.resolve_key(None, "other.test", "nope").is_none());
    // The same answer twice (the second from the snapshot's cache).
    assert!(Arc::ptr_eq(
        &keyed,
        &r.resolve_key(Some("t1"), "api.example.com", "payments")
            .unwrap()
    ));
    // Through a view too.
    let view = PolicyResolver::view(&r).unwrap();
    assert!(
        !view
            .resolve_key(None, "x.test", "payments")
            .unwrap()
            .retry
            .enabled
    );
}

#[test]
fn named_policies_are_validated_alone_and_in_combination() {
    let err = PolicyDocument::from_toml_str(
        r#"
        [keys.payments]
        retry.max_attemps = 2

        [keys.short]
        timeout.total = "1s"

        [overrides."slow.example.com"]
        timeout.attempt = "5s"
        timeout.ttfb = "5s"
        "#,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("keys.payments.retry.max_attemps"), "{text}");
    // `short` cannot keep its 1 s deadline with the default's attempts, nor with the
    // override's: the key alone and the combination are both named.
    assert!(text.contains("keys.short"), "{text}");
    assert!(
        text.contains(r#"overrides."slow.example.com" + keys.short"#),
        "{text}"
    );
    let doc = PolicyDocument::from_toml_str("[keys.fine]\nretry.max_attempts = 2\n").unwrap();
    let back = PolicyDocument::from_toml_str(&doc.to_toml_string().unwrap()).unwrap();
    assert_eq!(doc, back);
}
