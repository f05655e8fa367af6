//! Documents: all mistakes reported at once with their paths, unknown fields, layer
//! combinations, shape and syntax errors, files.

use soulbase_net_policy::*;

fn err(toml: &str) -> PolicyError {
    match PolicyDocument::from_toml_str(toml) {
        Ok(_) => panic!("expected an error for:\n{toml}"),
        Err(e) => e,
    }
}

fn paths(e: &PolicyError) -> Vec<&str> {
    e.problems().iter().map(|p| p.path.as_str()).collect()
}

#[test]
fn three_mistakes_in_three_places_are_listed_together() {
    let e = err(r#"
        [default]
        retry.max_attempts = 0

        [overrides."*.example.com"]
        retry.backoff.cap = "50ms"

        [tenants.t1]
        limits.per_tenant_concurrency = 32

        [tenants.t1.overrides."api.example.com"]
        tls.min_tls = "1.1"
    "#);
    assert_eq!(
        paths(&e),
        [
            "default.retry.max_attempts",
            r#"overrides."*.example.com".retry.backoff.cap"#,
            r#"tenants.t1.overrides."api.example.com".tls.min_tls"#,
        ],
        "{e}"
    );
    let text = e.to_string();
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(
        text.contains(r#"overrides."*.example.com".retry.backoff.cap: must not be less than base"#),
        "{text}"
    );
    assert!(text.contains("minimum is TLS 1.2"), "{text}");
}

#[test]
fn unknown_fields_are_errors_with_their_path() {
    let e = err(r#"
        [overrides."*.example.com"]
        retry.backoff.capp = "2s"
        [tenants.t1]
        limitz.per_tenant_concurrency = 1
    "#);
    assert_eq!(
        paths(&e),
        [
            r#"overrides."*.example.com".retry.backoff.capp"#,
            "tenants.t1.limitz"
        ],
        "{e}"
    );
    assert!(
        e.problems()
            .iter()
            .all(|p| p.reason.contains("unknown field")),
        "{e}"
    );
}

#[test]
fn unknown_sections_are_errors() {
    let e = err("[defaults]\nretry.max_attempts = 2\n");
    assert_eq!(paths(&e), ["defaults"]);
    assert!(e.problems()[0].reason.contains("unknown section"), "{e}");
}

#[test]
fn sections_must_be_tables() {
    let e = err("overrides = 5\n");
    assert_eq!(paths(&e), ["overrides"]);
    let e = err("[overrides]\n\"x.example.com\" = 5\n[tenants]\nt1 = \"no\"\n");
    assert_eq!(
        paths(&e),
        [r#"overrides."x.example.com""#, "tenants.t1"],
        "{e}"
    );
    assert!(
        e.problems()
            .iter()
            .all(|p| p.reason.contains("expected a table")),
        "{e}"
    );
    let e = err("[tenants.t1]\noverrides = 1\n");
    assert_eq!(paths(&e), ["tenants.t1.overrides"], "{e}");
}

#[test]
fn invalid_and_duplicate_patterns_are_errors() {
    let e = err(r#"
        [overrides."*foo.com"]
        [overrides."a.*.com"]
        [overrides."API.example.com"]
        [overrides."api.example.com."]
        [tenants.t1.overrides.""]
    "#);
    assert_eq!(
        paths(&e),
        [
            r#"overrides."*foo.com""#,
            r#"overrides."a.*.com""#,
            r#"overrides."api.example.com.""#,
            r#"tenants.t1.overrides."""#,
        ],
        "{e}"
    );
    assert!(e.problems()[2].reason.contains("same pattern"), "{e}");
}

#[test]
fn problems_that_only_appear_when_layers_combine_name_the_layers() {
    // Each layer alone keeps its deadline; the host override's 3 attempts under the tenant's
    // 15s total do not.
    let e = err(r#"
        [default]
        retry.max_attempts = 1
        [overrides."*.example.com"]
        retry.max_attempts = 3
        [tenants.t1]
        timeout.total = "15s"
    "#);
    assert_eq!(
        paths(&e),
        [r#"overrides."*.example.com" + tenants.t1: retry"#],
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        r#"overrides."*.example.com" + tenants.t1: retry: worst case 3×9s + 300ms backoff = 27.3s exceeds timeout.total − margin = 14.9s"#
    );
}

#[test]
fn tenant_host_combinations_are_checked_only_where_a_host_can_reach_them() {
    let base = r#"
        [default]
        retry.max_attempts = 1
        [overrides."*.example.com"]
        retry.max_attempts = 3
        [tenants.t1.overrides."api.other.org"]
        timeout.total = "15s"
    "#;
    // `*.example.com` and `api.other.org` never match the same host.
    PolicyDocument::from_toml_str(base).unwrap();
    let reachable = base.replace("api.other.org", "api.example.com");
    let e = err(&reachable);
    assert_eq!(
        paths(&e),
        [r#"overrides."*.example.com" + tenants.t1.overrides."api.example.com": retry"#],
        "{e}"
    );
}

#[test]
fn a_mistake_is_reported_once_not_once_per_combination() {
    let e = err(r#"
        [default]
        tls.verify_cert = false
        [overrides."*.example.com"]
        [tenants.t1]
        [tenants.t1.overrides."api.example.com"]
    "#);
    assert_eq!(paths(&e), ["default.tls.verify_cert"], "{e}");
}

#[test]
fn type_errors_have_exact_paths() {
    let e = err(r#"
        [default]
        dns.static_hosts."db.internal" = ["10.0.0.7", "nope"]
        retry.backoff.base = 100
    "#);
    assert_eq!(
        paths(&e),
        [
            r#"default.dns.static_hosts."db.internal"[1]"#,
            "default.retry.backoff.base"
        ],
        "{e}"
    );
}

#[test]
fn syntax_errors_say_where() {
    let e = err("[default]\nretry.max_attempts = = 3\n");
    assert_eq!(e.problems().len(), 1);
    assert!(e.to_string().starts_with("invalid TOML at line 2"), "{e}");
    let e = PolicyDocument::from_json_str("{\"default\": ").unwrap_err();
    assert!(e.to_string().starts_with("invalid JSON"), "{e}");
    let e = PolicyDocument::from_json_str("[1, 2]").unwrap_err();
    assert!(e.to_string().contains("must be a table"), "{e}");
}

#[test]
fn json_documents_have_the_same_paths() {
    let e = PolicyDocument::from_json_str(
        r#"{"tenants": {"t1": {"overrides": {"*.example.com": {"hedge": {"enabled": true, "max_hedges": 0}}}}}}"#,
    )
    .unwrap_err();
    assert_eq!(
        paths(&e),
        [r#"tenants.t1.overrides."*.example.com".hedge.max_hedges"#],
        "{e}"
    );
}

#[test]
fn json_null_switches_an_option_off_again() {
    let doc = PolicyDocument::from_json_str(
        r#"{"default": {"proxy": {"https_proxy": "http://proxy:3128"}},
            "overrides": {"direct.example.com": {"proxy": null}}}"#,
    )
    .unwrap();
    let r = SnapshotResolver::new(doc).unwrap();
    assert!(r.resolve(None, "other.example.com").proxy.is_some());
    assert!(r.resolve(None, "direct.example.com").proxy.is_none());
}

#[test]
fn programmatic_documents_validate_the_same_way() {
    let mut doc = PolicyDocument::new();
    doc.set_override(
        "*.example.com",
        serde_json::json!({"retry": {"max_attempts": 0}}),
    )
    .set_tenant("t1", serde_json::json!(["not", "a", "table"]));
    let e = doc.validate().unwrap_err();
    assert_eq!(
        paths(&e),
        [
            r#"overrides."*.example.com".retry.max_attempts"#,
            "tenants.t1"
        ],
        "{e}"
    );
    assert_eq!(doc.overrides().count(), 1);
    assert_eq!(doc.tenants().collect::<Vec<_>>(), ["t1"]);
}

#[test]
fn files_are_read_by_extension() {
    let dir = std::env::temp_dir();
    let stem = format!("soulbase-policy-doc-{}", std::process::id());
    let toml_path = dir.join(format!("{stem}.toml"));
    let json_path = dir.join(format!("{stem}.JSON"));
    let txt_path = dir.join(format!("{stem}.txt"));
    std::fs::write(&toml_path, "[default]\nredirect.max = 2\n").unwrap();
    std::fs::write(&json_path, r#"{"default": {"redirect": {"max": 3}}}"#).unwrap();
    std::fs::write(&txt_path, "").unwrap();
    let t = PolicyDocument::from_path(&toml_path);
    let j = PolicyDocument::from_path(&json_path);
    let x = PolicyDocument::from_path(&txt_path);
    let missing = PolicyDocument::from_path(dir.join(format!("{stem}-missing.toml")));
    for p in [&toml_path, &json_path, &txt_path] {
        std::fs::remove_file(p).unwrap();
    }
    assert_eq!(t.unwrap().default_section()["redirect"]["max"], 2);
    assert_eq!(j.unwrap().default_section()["redirect"]["max"], 3);
    assert!(x.unwrap_err().to_string().contains(".toml or .json"));
    assert!(missing.unwrap_err().to_string().contains("cannot read"));
}

#[test]
fn the_store_section_is_checked_on_load_and_never_shows_its_credentials() {
    let doc =
        PolicyDocument::from_toml_str("[store]\nredis = \"redis://app:hunter2@10.0.0.5:6379/0\"\n")
            .unwrap();
    let store = doc.store().unwrap();
    assert_eq!(
        store.redis_url(),
        Some("redis://app:hunter2@10.0.0.5:6379/0")
    );
    let shown = format!("{doc:?}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("app:"),
        "{shown}"
    );
    // Written back as it was.
    let again = PolicyDocument::from_toml_str(&doc.to_toml_string().unwrap()).unwrap();
    assert_eq!(again.store(), doc.store());

    let err = PolicyDocument::from_toml_str(
        "[store]\nredis = \"http://app:hunter2@h:6380/\"\nmemcached = \"x\"\n",
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("store.redis") && text.contains("rediss"),
        "{text}"
    );
    assert!(text.contains("store.memcached"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[test]
fn a_cluster_or_a_sentinel_in_the_store_section_round_trips_without_showing_credentials() {
    for section in [
        r#"redis_cluster = ["redis://:hunter2@10.0.0.5:7000", "redis://:hunter2@10.0.0.6:7000"]"#,
        r#"redis_sentinel = { master = "mymaster", nodes = ["redis://:hunter2@10.0.0.8:26379"], username = "app", password = "hunter3", db = 4 }"#,
    ] {
        let doc = PolicyDocument::from_toml_str(&format!("[store]\n{section}\n")).unwrap();
        let store = doc.store().unwrap();
        assert!(store.redis_target().is_some() && store.redis_url().is_none());
        let shown = format!("{doc:?}");
        assert!(
            !shown.contains("hunter") && !shown.contains("app"),
            "{shown}"
        );
        let again = PolicyDocument::from_toml_str(&doc.to_toml_string().unwrap()).unwrap();
        assert_eq!(again.store(), doc.store(), "{section}");
        let json = PolicyDocument::from_json_str(&doc.to_json_string()).unwrap();
        assert_eq!(json.store(), doc.store(), "{section}");
    }
}
