//! `Snapshot::explain`: the layers a call meets and the layer each field comes from, checked
//! against the resolver's own answers.

use std::time::Duration;

use serde_json::Value;
use soulbase_net_core::TimeoutCfg;
use soulbase_net_policy::*;

const DOC: &str = r#"
[default]
retry.max_attempts = 4
timeout.total = "40s"
dns.static_hosts = { "db.internal" = ["10.0.0.5"] }

[overrides."*.example.com"]
retry.max_attempts = 2
retry.backoff.cap = "2s"

[overrides."api.example.com"]
hedge.enabled = true

[tenants.t1]
limits.per_tenant_concurrency = 32
retry.backoff.cap = "3s"

[tenants.t1.overrides."*.example.com"]
timeout.ttfb = "4s"

[keys.payments]
retry.enabled = false
timeout.total = "10s"
"#;

fn snapshot() -> std::sync::Arc<Snapshot> {
    SnapshotResolver::new(PolicyDocument::from_toml_str(DOC).unwrap())
        .unwrap()
        .snapshot()
}

fn host(p: &str) -> PolicyLayer {
    PolicyLayer::Host { pattern: p.into() }
}

#[test]
fn each_field_names_the_layer_it_comes_from() {
    let why = snapshot()
        .explain(Some("t1"), "API.example.com.", Some("payments"))
        .unwrap();
    let tenant = PolicyLayer::Tenant {
        tenant: "t1".into(),
    };
    let tenant_host = PolicyLayer::TenantHost {
        tenant: "t1".into(),
        pattern: "*.example.com".into(),
    };
    let key = PolicyLayer::Key {
        key: "payments".into(),
    };
    // The exact pattern beats the wildcard for the host layer.
    assert_eq!(
        why.layers(),
        [
            PolicyLayer::BuiltIn,
            PolicyLayer::Default,
            host("api.example.com"),
            tenant.clone(),
            tenant_host.clone(),
            key.clone(),
        ]
    );
    let at = |p: &str| why.field(p).unwrap_or_else(|| panic!("no field {p}"));
    assert_eq!(at("retry.max_attempts").layer, PolicyLayer::Default);
    assert_eq!(at("retry.max_attempts").value, 4);
    assert_eq!(at("hedge.enabled").layer, host("api.example.com"));
    assert_eq!(at("retry.backoff.cap").layer, tenant);
    assert_eq!(at("retry.backoff.cap").value, "3s");
    assert_eq!(at("timeout.ttfb").layer, tenant_host);
    assert_eq!(at("timeout.total").layer, key);
    assert_eq!(at("timeout.total").overrides, [PolicyLayer::Default]);
    assert_eq!(at("retry.enabled").value, false);
    assert_eq!(at("tls.min_tls").layer, PolicyLayer::BuiltIn);
    assert_eq!(
        at(r#"dns.static_hosts."db.internal""#).layer,
        PolicyLayer::Default
    );
    assert_eq!(at("timeout.total").layer.kind(), "request");
    assert_eq!(
        tenant_host_display(&why),
        r#"tenants.t1.overrides."*.example.com""#
    );

    // Another host of the wildcard: its override decides the attempts, overriding default.
    let why = snapshot().explain(None, "www.example.com", None).unwrap();
    let attempts = why.field("retry.max_attempts").unwrap();
    assert_eq!(attempts.value, 2);
    assert_eq!(attempts.layer, host("*.example.com"));
    assert_eq!(attempts.overrides, [PolicyLayer::Default]);
    assert_eq!(why.layers().len(), 3, "built-in, default, the wildcard");
}

fn tenant_host_display(why: &Explanation) -> String {
    why.field("timeout.ttfb").unwrap().layer.to_string()
}

/// The value at `path` (`a.b."c.d"`) of a section, or of the built-in defaults.
fn value_at<'a>(tree: &'a Value, path: &str) -> Option<&'a Value> {
    let mut keys = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        let (key, after) = match rest.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"').unwrap();
                (&quoted[..end], &quoted[end + 1..])
            }
            None => rest.split_at(rest.find('.').unwrap_or(rest.len())),
        };
        keys.push(key);
        rest = after.strip_prefix('.').unwrap_or(after);
    }
    keys.iter().try_fold(tree, |node, k| node.get(*k))
}

fn section<'d>(doc: &'d PolicyDocument, layer: &PolicyLayer) -> &'d Value {
    match layer {
        PolicyLayer::Default => doc.default_section(),
        PolicyLayer::Host { pattern } => doc.overrides().find(|(p, _)| p == pattern).unwrap().1,
        PolicyLayer::Tenant { tenant } => doc.tenant_section(tenant).unwrap(),
        PolicyLayer::TenantHost { tenant, pattern } => {
            doc.tenant_overrides(tenant)
                .find(|(p, _)| p == pattern)
                .unwrap()
                .1
        }
        PolicyLayer::Key { key } => doc.keys().find(|(k, _)| k == key).unwrap().1,
        other => panic!("not a section: {other}"),
    }
}

#[test]
fn the_policy_is_the_resolvers_and_every_value_is_where_it_is_said_to_be() {
    let snap = snapshot();
    let doc = snap.document();
    let builtin = serde_json::to_value(NetPolicy::default()).unwrap();
    let calls: [(Option<&str>, &str, Option<&str>); 7] = [
        (None, "other.org", None),
        (None, "a.example.com", None),
        (None, "api.example.com", Some("payments")),
        (Some("t1"), "other.org", None),
        (Some("t1"), "x.y.example.com", None),
        (Some("t1"), "api.example.com", Some("payments")),
        (Some("unknown-tenant"), "api.example.com", None),
    ];
    for (tenant, h, key) in calls {
        let why = snap.explain(tenant, h, key).unwrap();
        let resolved = match key {
            None => snap.resolve(tenant, h),
            Some(k) => snap.resolve_key(tenant, h, k).unwrap(),
        };
        assert_eq!(why.policy(), &*resolved, "{tenant:?} {h} {key:?}");
        let effective = serde_json::to_value(&*resolved).unwrap();
        assert!(why.fields().len() > 80, "{}", why.fields().len());
        for f in why.fields() {
            assert_eq!(value_at(&effective, &f.path), Some(&f.value), "{}", f.path);
            let source = match &f.layer {
                PolicyLayer::BuiltIn => &builtin,
                layer => section(doc, layer),
            };
            assert_eq!(
                value_at(source, &f.path),
                Some(&f.value),
                "{tenant:?} {h} {key:?}: {} said to come from {}",
                f.path,
                f.layer
            );
        }
    }
}

#[test]
fn an_unknown_key_is_an_error_naming_it() {
    let err = snapshot()
        .explain(None, "a.example.com", Some("nope"))
        .unwrap_err();
    assert_eq!(err.problems()[0].path, "keys.nope");
}

#[test]
fn request_timeouts_come_last() {
    let why = snapshot()
        .explain(None, "a.example.com", Some("payments"))
        .unwrap()
        .with_request_timeouts(
            &TimeoutCfg::default()
                .with_total(Duration::from_secs(3))
                .with_connect(Duration::from_millis(500)),
        );
    assert_eq!(why.policy().timeout.total, Duration::from_secs(3));
    let total = why.field("timeout.total").unwrap();
    assert_eq!(total.value, "3s");
    assert_eq!(total.layer, PolicyLayer::RequestTimeouts);
    assert_eq!(
        total.overrides,
        [
            PolicyLayer::Default,
            PolicyLayer::Key {
                key: "payments".into()
            }
        ]
    );
    let connect = why.field("timeout.connect").unwrap();
    assert_eq!(
        (connect.value.as_str(), connect.overrides.len()),
        (Some("500ms"), 0)
    );
    assert_eq!(
        why.field("timeout.ttfb").unwrap().layer,
        PolicyLayer::BuiltIn
    );
    assert_eq!(why.layers().last(), Some(&PolicyLayer::RequestTimeouts));
}
