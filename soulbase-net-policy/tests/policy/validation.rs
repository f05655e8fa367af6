//! Every validation rule has a failing example, asserting the path and a piece of the reason.

use std::time::Duration;

use soulbase_net_policy::*;

/// The problems of a document whose `[default]` section is `body`.
fn problems(body: &str) -> Vec<Problem> {
    match PolicyDocument::from_toml_str(&format!("[default]\n{body}\n")) {
        Ok(_) => panic!("expected problems for:\n{body}"),
        Err(e) => e.into_problems(),
    }
}

/// `body` (under `[default]`) fails at `path` with a reason containing `reason`.
#[track_caller]
fn fails(body: &str, path: &str, reason: &str) {
    let got = problems(body);
    assert!(
        got.iter()
            .any(|p| p.path == path && p.reason.contains(reason)),
        "expected `{path}: …{reason}…` for\n{body}\ngot:\n{}",
        PolicyError::new(got.clone())
    );
}

#[track_caller]
fn passes(body: &str) {
    if let Err(e) = PolicyDocument::from_toml_str(&format!("[default]\n{body}\n")) {
        panic!("expected no problem for\n{body}\ngot:\n{e}");
    }
}

#[test]
fn retry_rules() {
    fails(
        "retry.max_attempts = 0",
        "default.retry.max_attempts",
        "at least 1",
    );
    fails(
        "retry.backoff.jitter = 1.5",
        "default.retry.backoff.jitter",
        "between 0 and 1",
    );
    fails(
        "retry.backoff.jitter = -0.1",
        "default.retry.backoff.jitter",
        "between 0 and 1",
    );
    fails(
        "retry.backoff.factor = 0.5",
        "default.retry.backoff.factor",
        "≥ 1",
    );
    // TOML `inf`/`nan` cannot be carried as JSON numbers: refused as a type error.
    fails(
        "retry.backoff.factor = inf",
        "default.retry.backoff.factor",
        "invalid type",
    );
    fails(
        r#"retry.backoff.cap = "50ms""#,
        "default.retry.backoff.cap",
        "must not be less than base (50ms < 100ms)",
    );
    fails(
        "retry.budget.retry_ratio = 1.5",
        "default.retry.budget.retry_ratio",
        "between 0 and 1",
    );
    fails(
        r#"retry.budget.window = "0s""#,
        "default.retry.budget.window",
        "greater than 0s",
    );
    passes("retry.enabled = false\nretry.max_attempts = 1");
}

#[test]
fn non_finite_factor_is_refused_in_code_too() {
    let mut p = NetPolicy::default();
    p.retry.backoff.factor = f64::INFINITY;
    let e = p.validate().unwrap_err();
    assert_eq!(e.problems()[0].path, "retry.backoff.factor");
    assert!(e.problems()[0].reason.contains("finite"), "{e}");
    p.retry.backoff.factor = f64::NAN;
    assert!(p.validate().is_err());
}

#[test]
fn tls_rules() {
    fails(
        r#"tls.min_tls = "1.1""#,
        "default.tls.min_tls",
        "minimum is TLS 1.2",
    );
    fails(
        "tls.min_tls = 1.0",
        "default.tls.min_tls",
        "minimum is TLS 1.2",
    );
    fails(
        r#"tls.min_tls = "SSLv3""#,
        "default.tls.min_tls",
        "minimum is TLS 1.2",
    );
    fails(
        "tls.verify_cert = false",
        "default.tls.verify_cert",
        "certificate verification cannot be turned off",
    );
    fails(
        r#"tls.pinset_sha256 = ["abc"]"#,
        "default.tls.pinset_sha256[0]",
        "32-byte SHA-256",
    );
    fails(
        r#"tls.pinset_sha256 = ["AAAA"]"#,
        "default.tls.pinset_sha256[0]",
        "32-byte SHA-256",
    );
    fails(
        "tls.pinset_sha256 = []",
        "default.tls.pinset_sha256",
        "empty pin set",
    );
    let bad_pem = r#"tls.mtls = { client_cert_pem = "MIIB", client_key_pem = "secret" }"#;
    fails(bad_pem, "default.tls.mtls.client_cert_pem", "PEM");
    fails(
        bad_pem,
        "default.tls.mtls.client_key_pem",
        "PEM private key",
    );
    fails(
        r#"tls.extra_roots_pem = ["nope"]"#,
        "default.tls.extra_roots_pem[0]",
        "PEM",
    );
    passes(&format!(
        r#"tls.pinset_sha256 = ["{}"]"#,
        super::roundtrip::PIN
    ));
    passes("tls.min_tls = 1.3");
}

#[test]
fn http3_needs_tls_1_3() {
    fails(
        "tls.min_tls = \"1.3\"\ntls.max_tls = \"1.2\"",
        "default.tls.max_tls",
        "below min_tls",
    );
    for version in ["h3", "h3-or-tcp"] {
        fails(
            &format!("tls.max_tls = \"1.2\"\nhttp.version = \"{version}\""),
            "default.http.version",
            "TLS 1.3 only",
        );
        passes(&format!("http.version = \"{version}\""));
    }
    // `auto` under TLS 1.2 is TCP only, not an error.
    passes("tls.max_tls = \"1.2\"\nhttp.version = \"auto\"");
    fails(
        "http.version = \"h2\"",
        "default.http.version",
        "unknown variant",
    );

    // Layered per host: the default caps TLS at 1.2 and a host asks for HTTP/3.
    let err = PolicyDocument::from_toml_str(
        "[default]\ntls.max_tls = \"1.2\"\n[overrides.\"h3.example.com\"]\nhttp.version = \"h3\"\n",
    )
    .unwrap_err();
    assert!(
        err.problems()
            .iter()
            .any(|p| p.path.ends_with("http.version") && p.path.contains("h3.example.com")),
        "{err}"
    );
    // And a host may ask for it where the default allows TLS 1.3.
    let doc = PolicyDocument::from_toml_str(
        "[overrides.\"h3.example.com\"]\nhttp.version = \"h3-or-tcp\"\n",
    )
    .unwrap();
    let r = SnapshotResolver::new(doc).unwrap();
    assert_eq!(
        r.resolve(None, "h3.example.com").http.version,
        HttpVersionPolicy::H3OrTcp
    );
    assert_eq!(
        r.resolve(None, "other.example.com").http.version,
        HttpVersionPolicy::Auto
    );
}

#[test]
fn breaker_rules_apply_when_enabled() {
    let on = "cbreaker.enabled = true\n";
    fails(
        &format!("{on}cbreaker.failure_ratio = 0.0"),
        "default.cbreaker.failure_ratio",
        "(0, 1]",
    );
    fails(
        &format!("{on}cbreaker.failure_ratio = 1.5"),
        "default.cbreaker.failure_ratio",
        "(0, 1]",
    );
    fails(
        &format!("{on}cbreaker.min_samples = 0"),
        "default.cbreaker.min_samples",
        "at least 1",
    );
    fails(
        &format!("{on}cbreaker.half_open_probes = 0"),
        "default.cbreaker.half_open_probes",
        "at least 1",
    );
    fails(
        &format!("{on}cbreaker.half_open_success_ratio = 0.0"),
        "default.cbreaker.half_open_success_ratio",
        "(0, 1]",
    );
    fails(
        &format!("{on}cbreaker.window = \"0s\""),
        "default.cbreaker.window",
        "greater than 0s",
    );
    fails(
        &format!("{on}cbreaker.cooldown = \"0s\""),
        "default.cbreaker.cooldown",
        "greater than 0s",
    );
    fails(
        &format!("{on}cbreaker.max_keys = 0"),
        "default.cbreaker.max_keys",
        "at least 1",
    );
    fails(
        &format!("{on}cbreaker.slow_call.ratio = 0.0"),
        "default.cbreaker.slow_call.ratio",
        "(0, 1]",
    );
    fails(
        &format!("{on}cbreaker.slow_call.ratio = 2.0"),
        "default.cbreaker.slow_call.ratio",
        "(0, 1]",
    );
    fails(
        &format!("{on}cbreaker.slow_call.threshold = \"0s\""),
        "default.cbreaker.slow_call.threshold",
        "greater than 0s",
    );
    passes("cbreaker.enabled = false\ncbreaker.min_samples = 0");
    passes(&format!(
        "{on}cbreaker.failure_ratio = 1.0\ncbreaker.key_by = \"host_tenant\""
    ));
}

#[test]
fn redirect_and_security_rules() {
    fails("redirect.max = 21", "default.redirect.max", "at most 20");
    fails(
        "security.max_redirects = 21",
        "default.security.max_redirects",
        "at most 20",
    );
    fails(
        "security.max_resp_bytes = 0",
        "default.security.max_resp_bytes",
        "at least 1",
    );
    fails(
        r#"security.max_req_bytes = "0B""#,
        "default.security.max_req_bytes",
        "at least 1",
    );
    fails(
        r#"security.max_req_bytes = "12 parsecs""#,
        "default.security.max_req_bytes",
        "unknown unit",
    );
    fails(
        r#"security.allow_hosts = ["api.example.com", "*foo.com"]"#,
        "default.security.allow_hosts[1]",
        "whole first label",
    );
    fails(
        r#"security.allow_hosts = [""]"#,
        "default.security.allow_hosts[0]",
        "empty",
    );
    fails(
        r#"security.grants.hosts = ["a.*.com"]"#,
        "default.security.grants.hosts[0]",
        "whole first label",
    );
    fails(
        r#"security.grants.cidrs = ["10.0.0.0/33"]"#,
        "default.security.grants.cidrs[0]",
        "invalid",
    );
    fails(
        r#"security.strip_headers = ["x-ok", "bad header"]"#,
        "default.security.strip_headers[1]",
        "not a valid header name",
    );
    passes(r#"security.allow_hosts = ["*.example.com", "10.0.0.7"]"#);
    passes(r#"security.max_resp_bytes = "64MiB""#);
}

#[test]
fn limits_rules() {
    fails(
        "limits.per_host_concurrency = 0",
        "default.limits.per_host_concurrency",
        "at least 1",
    );
    fails(
        "limits.per_tenant_concurrency = 0",
        "default.limits.per_tenant_concurrency",
        "at least 1",
    );
    fails(
        "limits.per_host_rate_rps = 0",
        "default.limits.per_host_rate_rps",
        "at least 1",
    );
    fails(
        "limits.rate_burst = 0",
        "default.limits.rate_burst",
        "at least 1",
    );
    fails(
        "limits.aimd.min = 0",
        "default.limits.aimd.min",
        "at least 1",
    );
    fails(
        "limits.aimd.initial = 300",
        "default.limits.aimd.initial",
        "min ≤ initial ≤ max",
    );
    fails(
        "limits.aimd.min = 20",
        "default.limits.aimd.initial",
        "min ≤ initial ≤ max",
    );
    fails(
        "limits.aimd.decrease_factor = 1.0",
        "default.limits.aimd.decrease_factor",
        "(0, 1)",
    );
    fails(
        "limits.aimd.decrease_factor = 0.0",
        "default.limits.aimd.decrease_factor",
        "(0, 1)",
    );
    fails(
        "limits.aimd.enabled = true\nlimits.aimd.increase = 0",
        "default.limits.aimd.increase",
        "at least 1",
    );
    fails(
        "limits.per_host_concurrency = -1",
        "default.limits.per_host_concurrency",
        "invalid value",
    );
}

#[test]
fn hedge_cache_and_endpoint_rules() {
    fails(
        "hedge.enabled = true\nhedge.max_hedges = 0",
        "default.hedge.max_hedges",
        "at least 1",
    );
    fails(
        "hedge.enabled = true\nhedge.delay = \"0s\"",
        "default.hedge.delay",
        "greater than 0s",
    );
    passes("hedge.enabled = false\nhedge.max_hedges = 0");
    fails(
        "cache.max_entries = 0",
        "default.cache.max_entries",
        "at least 1",
    );
    fails(
        r#"endpoints.frozen_duration = "0s""#,
        "default.endpoints.frozen_duration",
        "greater than 0s",
    );
    fails(
        r#"endpoints.urls = ["ftp://mirror.example.com"]"#,
        "default.endpoints.urls[0]",
        "http://",
    );
    passes(r#"endpoints.urls = ["https://eu.api.example.com", "http://10.0.0.7:8080"]"#);
}

#[test]
fn dns_rules() {
    fails(
        r#"dns.timeout = "0s""#,
        "default.dns.timeout",
        "greater than 0s",
    );
    fails(
        r#"dns.min_ttl = "2h""#,
        "default.dns.min_ttl",
        "must not exceed cache_ttl (7200s > 3600s)",
    );
    fails(
        r#"dns.refresh_interval = "0s""#,
        "default.dns.refresh_interval",
        "\"off\"",
    );
    fails(
        r#"dns.prefetch = ["bad host"]"#,
        "default.dns.prefetch[0]",
        "invalid host",
    );
    fails(
        r#"dns.static_hosts."*.internal" = ["10.0.0.1"]"#,
        r#"default.dns.static_hosts."*.internal""#,
        "not a wildcard",
    );
    fails(
        r#"dns.static_hosts."db.internal" = []"#,
        r#"default.dns.static_hosts."db.internal""#,
        "at least one address",
    );
    fails(
        r#"dns.static_hosts."db.internal" = ["10.0.0.256"]"#,
        r#"default.dns.static_hosts."db.internal"[0]"#,
        "invalid",
    );
    fails(
        r#"dns.nameservers = ["127.0.0.1"]"#,
        "default.dns.nameservers[0]",
        "invalid",
    );
    fails(r#"dns.timeout = "soon""#, "default.dns.timeout", "");
    passes(r#"dns.refresh_interval = "off""#);
}

#[test]
fn proxy_rules() {
    fails(
        r#"proxy.http_proxy = "socks5://proxy:1080""#,
        "default.proxy.http_proxy",
        "must be an http:// or https:// URL",
    );
    fails(
        r#"proxy.https_proxy = "https://""#,
        "default.proxy.https_proxy",
        "",
    );
    fails(
        r#"proxy.https_proxy = "proxy:3128""#,
        "default.proxy.https_proxy",
        "",
    );
    fails(
        r#"proxy.https_proxy = "not a url""#,
        "default.proxy.https_proxy",
        "not an absolute URL",
    );
    fails(
        r#"proxy.no_proxy = ["a b"]"#,
        "default.proxy.no_proxy[0]",
        "not a host",
    );
    passes(r#"proxy.https_proxy = "http://proxy.internal:3128""#);
    // TLS to the proxy itself.
    passes(r#"proxy.https_proxy = "https://proxy.internal:3129""#);
}

#[test]
fn timeout_rules() {
    for field in ["connect", "ttfb", "read", "write", "attempt", "total"] {
        fails(
            &format!("timeout.{field} = \"0s\""),
            &format!("default.timeout.{field}"),
            "greater than 0s",
        );
    }
    for field in ["connect", "ttfb", "read", "write"] {
        fails(
            &format!("timeout.{field} = \"10s\""),
            &format!("default.timeout.{field}"),
            "must not exceed attempt (10s > 9s)",
        );
    }
    fails(
        r#"timeout.attempt = "40s""#,
        "default.timeout.attempt",
        "must not exceed total (40s > 30s)",
    );
    fails(
        r#"timeout.margin = "30s""#,
        "default.timeout.margin",
        "less than total",
    );
    fails(
        "timeout.dynamic.percentile = 1.0",
        "default.timeout.dynamic.percentile",
        "(0, 1)",
    );
    fails(
        "timeout.dynamic.percentile = 0.0",
        "default.timeout.dynamic.percentile",
        "(0, 1)",
    );
    fails(
        "timeout.dynamic.factor = 0.5",
        "default.timeout.dynamic.factor",
        "≥ 1",
    );
    fails(
        r#"timeout.dynamic.min = "10s""#,
        "default.timeout.dynamic.min",
        "must not exceed max",
    );
    fails(
        "timeout.dynamic.enabled = true\ntimeout.dynamic.max = \"20s\"",
        "default.timeout.dynamic.max",
        "timeout.attempt",
    );
}

#[test]
fn deadline_closure() {
    fails(
        r#"timeout.total = "27s""#,
        "default.retry",
        "worst case 3×9s + 300ms backoff = 27.3s exceeds timeout.total − margin = 26.9s",
    );
    fails(
        "retry.max_attempts = 4",
        "default.retry",
        "worst case 4×9s + 700ms backoff = 36.7s exceeds timeout.total − margin = 29.9s",
    );
    // Turning retries off closes the deadline: one attempt of 9s.
    passes("retry.enabled = false\nretry.max_attempts = 10");
    // Exactly at the bound is fine: 3 × 9s + 300ms = 27.3s = 27.4s − 100ms.
    passes(r#"timeout.total = "27.4s""#);

    let mut p = NetPolicy::default();
    p.retry.max_attempts = 5;
    p.timeout.attempt = Duration::from_secs(5);
    p.timeout.connect = Duration::from_secs(1);
    p.timeout.ttfb = Duration::from_secs(4);
    p.timeout.read = Duration::from_secs(4);
    p.timeout.write = Duration::from_secs(4);
    // 5 × 5s + (100 + 200 + 400 + 800)ms = 26.5s
    assert_eq!(p.worst_case_latency(), Duration::from_millis(26_500));
    p.validate().unwrap();
}

#[test]
fn problems_within_one_section_are_all_reported() {
    let got = problems(
        "retry.max_attempts = 0\nretry.retyr = 1\nlimits.per_host_concurrency = \"many\"\ntls.verify_cert = false",
    );
    let paths: Vec<_> = got.iter().map(|p| p.path.as_str()).collect();
    for want in [
        "default.retry.retyr",
        "default.limits.per_host_concurrency",
        "default.retry.max_attempts",
        "default.tls.verify_cert",
    ] {
        assert!(paths.contains(&want), "{want} missing from {paths:?}");
    }
    assert_eq!(got.len(), 4, "{paths:?}");
}

#[test]
fn delivery_semantics_follow_the_compatibility_matrix() {
    // P75-4: a promise of at least once needs its dedup window.
    fails(
        "delivery.sem = \"at_least_once\"",
        "default.delivery.dedup_window",
        "P75-4",
    );
    fails(
        "delivery.sem = \"exactly_once*\"\ndelivery.dedup_window = \"5m\"",
        "default.delivery.reorder_span",
        "P75-5",
    );
    // P75-5: the window covers the reorder span.
    fails(
        "delivery.dedup_window = \"1m\"\ndelivery.reorder_span = \"2m\"",
        "default.delivery.reorder_span",
        "at most dedup_window (60s)",
    );
    fails(
        "delivery.dedup_window = \"0s\"",
        "default.delivery.dedup_window",
        "",
    );
    // At most once: no hedging, zero or few retries.
    fails(
        "delivery.sem = \"at_most_once\"\nhedge.enabled = true",
        "default.delivery.sem",
        "cannot be hedged",
    );
    fails(
        "delivery.sem = \"at_most_once\"\nretry.max_attempts = 3",
        "default.delivery.sem",
        "zero or few retries",
    );
    fails(
        "delivery.sem = \"twice\"",
        "default.delivery.sem",
        "unknown variant",
    );
    passes("delivery.sem = \"at_most_once\"\nretry.max_attempts = 2");
    passes("delivery.sem = \"at_most_once\"\nretry.enabled = false\nretry.max_attempts = 5");
    passes("delivery.sem = \"at_least_once\"\ndelivery.dedup_window = \"10m\"");
    passes(
        "delivery.sem = \"exactly_once\"\ndelivery.dedup_window = \"10m\"\ndelivery.reorder_span = \"10m\"",
    );
}

#[test]
fn delivery_is_declared_per_host_and_per_key_with_document_paths() {
    let err = PolicyDocument::from_toml_str(
        r#"
        [overrides."payments.example.com".delivery]
        sem = "at_least_once"
        [keys.charge.delivery]
        sem = "exactly_once*"
        dedup_window = "1m"
        "#,
    )
    .unwrap_err();
    let paths: Vec<&str> = err.problems().iter().map(|p| p.path.as_str()).collect();
    assert!(
        paths.contains(&"overrides.\"payments.example.com\".delivery.dedup_window"),
        "{paths:?}"
    );
    assert!(
        paths.contains(&"keys.charge.delivery.reorder_span"),
        "{paths:?}"
    );
    let doc = PolicyDocument::from_toml_str(
        r#"
        [overrides."payments.example.com".delivery]
        sem = "at_least_once"
        dedup_window = "10m"
        "#,
    )
    .unwrap();
    let resolver = SnapshotResolver::new(doc).unwrap();
    let payments = resolver.resolve(None, "payments.example.com");
    assert_eq!(payments.delivery.sem, Some(Semantics::AtLeastOnce));
    assert_eq!(
        payments.delivery.dedup_window,
        Some(Duration::from_secs(600))
    );
    assert_eq!(
        resolver.resolve(None, "other.example.com").delivery.sem,
        None
    );
}
