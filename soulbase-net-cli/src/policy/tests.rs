//! `soulbase-net policy`: explain against documents and a MockDns on loopback, check on good and
//! bad documents, and the schema against the checked-in file and real documents.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;
use soulbase_net_policy::{NetPolicy, PolicyDocument};
use soulbase_net_testkit::MockDns;

use super::explain::{self, Options};
use super::{check, schema, validator};

/// A policy file in the temp directory, removed when dropped.
struct TempPolicy(PathBuf);

impl TempPolicy {
    fn new(ext: &str, text: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let path =
            std::env::temp_dir().join(format!("xtask-policy-{}-{n}.{ext}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        TempPolicy(path)
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempPolicy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const DOC: &str = r#"
[default]
retry.max_attempts = 4
timeout.total = "40s"

[overrides."*.example.test"]
retry.max_attempts = 2

[tenants.sandbox]
security.grants.cidrs = ["127.0.0.0/8"]

[tenants.sandbox.overrides."api.example.test"]
timeout.ttfb = "4s"

[keys.payments]
retry.enabled = false
"#;

fn explain(policy: &TempPolicy, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["--policy".to_owned(), policy.path()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    explain::run(&Options::parse(&all)?)
}

/// The line of `out` that starts (after indentation) with `start`.
fn line<'a>(out: &'a str, start: &str) -> &'a str {
    out.lines()
        .map(str::trim)
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting with {start:?} in:\n{out}"))
}

#[test]
fn explain_names_the_layer_of_every_field() {
    let policy = TempPolicy::new("toml", DOC);
    let out = explain(
        &policy,
        &[
            "--tenant",
            "sandbox",
            "--key",
            "payments",
            "--timeout",
            "connect=500ms",
            "http://api.example.test/v1/x",
        ],
    )
    .unwrap();
    let layers = out.split("layers, applied in this order").nth(1).unwrap();
    let layers: Vec<&str> = layers
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(
        layers,
        [
            "built-in",
            "default",
            r#"host override  overrides."*.example.test""#,
            "tenant         tenants.sandbox",
            r#"tenant+host    tenants.sandbox.overrides."api.example.test""#,
            "request        keys.payments",
            "request        request timeouts",
        ]
    );
    let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        words(line(&out, "retry.max_attempts ")),
        [
            "retry.max_attempts",
            "2",
            r#"overrides."*.example.test""#,
            "(over",
            "default)"
        ]
    );
    assert_eq!(
        words(line(&out, "retry.enabled ")),
        ["retry.enabled", "false", "keys.payments"]
    );
    assert_eq!(
        words(line(&out, "timeout.ttfb ")),
        [
            "timeout.ttfb",
            "\"4s\"",
            r#"tenants.sandbox.overrides."api.example.test""#
        ]
    );
    assert_eq!(
        words(line(&out, "timeout.connect ")),
        ["timeout.connect", "\"500ms\"", "request", "timeouts"]
    );
    assert_eq!(
        words(line(&out, "tls.min_tls ")),
        ["tls.min_tls", "\"1.2\"", "built-in"]
    );
    // One attempt (retries off by key): 9s of attempt within 40s.
    assert!(
        line(&out, "worst case").contains(
            "1 attempts × 9s + 0ms backoff = 9s vs total 40s − margin 100ms = 39.9s: closes"
        ),
        "{out}"
    );
    assert!(
        line(&out, "one attempt").contains("connect 500ms + ttfb 4s = 4.5s vs attempt 9s: within")
    );
    assert!(out.contains("not resolved: pass --dns ADDR"), "{out}");

    // --changed leaves the built-in fields out.
    let changed = explain(&policy, &["--changed", "http://other.org/"]).unwrap();
    assert!(
        line(&changed, "effective policy").contains("(2 fields)"),
        "{changed}"
    );
}

#[test]
fn explain_asks_only_the_given_name_server_and_guards_each_address() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dns = rt.block_on(MockDns::start()).unwrap();
    let ips = ["127.0.0.1", "169.254.169.254", "93.184.215.14"].map(|i| i.parse().unwrap());
    dns.set_ips("api.example.test", &ips, 60);
    let server = dns.addr().to_string();
    let policy = TempPolicy::new("toml", DOC);

    let out = explain(&policy, &["--dns", &server, "http://api.example.test/"]).unwrap();
    assert!(
        line(&out, "asked ").starts_with(&format!("asked {server}: 3 in")),
        "{out}"
    );
    assert!(
        line(&out, "127.0.0.1 ").contains("denied (loopback)"),
        "{out}"
    );
    assert!(line(&out, "169.254.169.254 ").contains("denied (cloud_metadata)"));
    assert!(line(&out, "93.184.215.14 ").ends_with("allowed"));
    assert_eq!(
        line(&out, "verdict:"),
        "verdict: the client may dial 93.184.215.14"
    );
    assert!(dns.query_count("api.example.test") >= 1);

    // The sandbox tenant's grant opens loopback; metadata stays shut.
    let out = explain(
        &policy,
        &[
            "--dns",
            &server,
            "--tenant",
            "sandbox",
            "http://api.example.test/",
        ],
    )
    .unwrap();
    assert!(line(&out, "127.0.0.1 ").ends_with("allowed"), "{out}");
    assert!(line(&out, "169.254.169.254 ").contains("denied"));

    // A name the server does not know is an error naming it; an IP literal needs no lookup.
    let err = explain(&policy, &["--dns", &server, "http://nowhere.example.test/"]).unwrap_err();
    assert!(
        err.contains("nowhere.example.test did not resolve"),
        "{err}"
    );
    let out = explain(&policy, &["http://169.254.169.254/latest"]).unwrap();
    assert!(line(&out, "an IP literal").contains("no lookup"));
    assert!(
        line(&out, "verdict:").starts_with("verdict: refused (Blocked"),
        "{out}"
    );
}

#[test]
fn explain_says_when_a_request_breaks_the_deadline_closure() {
    let policy = TempPolicy::new("toml", DOC);
    let out = explain(
        &policy,
        &["--timeout", "total=5s", "http://a.example.test/"],
    )
    .unwrap();
    let worst = line(&out, "worst case");
    assert!(
        worst.contains("2 attempts × 9s + 100ms backoff = 18.1s vs total 5s − margin 100ms = 4.9s: does not close: the client clamps"),
        "{worst}"
    );
    for bad in [
        vec!["--timeout", "total=five", "http://a/"],
        vec!["--key", "nope", "http://a.example.test/"],
        vec!["--dns", "not-an-address", "http://a/"],
        vec![],
    ] {
        assert!(explain(&policy, &bad).is_err(), "{bad:?}");
    }
}

#[test]
fn check_lists_every_problem_with_its_path() {
    let good = TempPolicy::new("toml", DOC);
    let report = check::run(&[good.path()]).unwrap();
    assert!(
        report.starts_with(&format!("{}: ok (", good.path())),
        "{report}"
    );

    let bad = TempPolicy::new(
        "toml",
        r#"
        [default]
        retry.max_attempts = 0
        retry.backoff.jitter = 2.0
        [overrides."*.example.com"]
        tls.verify_cert = false
        [overrides."a.*.com"]
        "#,
    );
    let json = TempPolicy::new("json", r#"{"default": {"retry": {"max_attemps": 3}}}"#);
    let err = check::run(&[good.path(), bad.path(), json.path()]).unwrap_err();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines[0],
        format!("{}: ok (12 combinations of layers checked)", good.path())
    );
    assert_eq!(lines[1], format!("{}: 4 problems", bad.path()));
    assert!(lines[2].starts_with("  default.retry.max_attempts: must be at least 1"));
    assert!(lines[3].starts_with("  default.retry.backoff.jitter: "));
    assert!(lines[4].starts_with(r#"  overrides."*.example.com".tls.verify_cert: "#));
    assert!(
        lines[5].starts_with(r#"  overrides."a.*.com": invalid host"#),
        "{err}"
    );
    assert_eq!(lines[6], format!("{}: 1 problem", json.path()));
    assert!(
        lines[7].starts_with("  default.retry.max_attemps: unknown field"),
        "{err}"
    );

    let syntax = TempPolicy::new("toml", "[default\n");
    let err = check::run(&[syntax.path()]).unwrap_err();
    assert!(err.contains("(document): invalid TOML at line 1"), "{err}");
    assert!(check::run(&[]).is_err());
}

#[test]
fn the_checked_in_schema_is_the_generated_one() {
    let generated = schema::generate().unwrap();
    let on_disk =
        std::fs::read_to_string(root().join("docs/policy.schema.json")).unwrap_or_default();
    assert!(
        generated == on_disk,
        "docs/policy.schema.json is out of date: run `cargo xtask policy schema --write`"
    );
}

/// The TOML and JSON documents of the reference (not the refused ones) and the example.
fn repository_documents() -> Vec<(String, Value)> {
    let root = root();
    let mut docs = Vec::new();
    let example = std::fs::read_to_string(root.join("examples/policy.toml")).unwrap();
    docs.push((
        "examples/policy.toml".to_owned(),
        toml::from_str(&example).unwrap(),
    ));
    let reference = std::fs::read_to_string(root.join("docs/policy.md")).unwrap();
    let mut open: Option<(String, String, usize)> = None;
    for (i, line) in reference.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), String::new(), i + 1)),
            (Some((info, body, at)), Some(_)) => {
                let name = format!("docs/policy.md:{at}");
                match info.as_str() {
                    "toml" => docs.push((name, toml::from_str(body).unwrap())),
                    "json" => docs.push((name, serde_json::from_str(body).unwrap())),
                    _ => {}
                }
                open = None;
            }
            (Some((_, body, _)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    let full = PolicyDocument::from_policy(&NetPolicy::default()).to_value();
    docs.push(("the built-in defaults in full".to_owned(), full));
    docs
}

#[test]
fn every_document_of_the_repository_is_valid_under_the_schema() {
    let schema = schema::schema().unwrap();
    let docs = repository_documents();
    assert!(docs.len() >= 5, "{}", docs.len());
    for (name, doc) in docs {
        let errors = validator::validate(&schema, &doc);
        assert!(errors.is_empty(), "{name}:\n{}", errors.join("\n"));
    }
}

#[test]
fn the_schema_refuses_mistakes_at_their_path() {
    let schema = schema::schema().unwrap();
    let cases = [
        (
            r#"default.retry.max_attemps = 3"#,
            "default.retry.max_attemps: unknown field",
        ),
        (
            r#"default.timeout.total = 30"#,
            "default.timeout.total: expected string",
        ),
        (
            r#"default.retry.backoff.mode = "fast""#,
            "default.retry.backoff.mode: \"fast\" is not one of",
        ),
        (
            r#"overrides."*.a.com".retry.backoff.jitter = 1.5"#,
            "overrides.*.a.com.retry.backoff.jitter: 1.5 is above the maximum",
        ),
        (
            r#"tenants.t1.overrides."a.com".hedge.enabled = "yes""#,
            "tenants.t1.overrides.a.com.hedge.enabled: expected boolean",
        ),
        (
            r#"keys.k.limits.global.scope = "planet""#,
            "keys.k.limits.global.scope: \"planet\" is not one of",
        ),
        (
            r#"default.dns.static_hosts = { "db.internal" = "10.0.0.5" }"#,
            "default.dns.static_hosts.db.internal: expected array",
        ),
        (
            r#"store = { redis = "redis://a", redis_cluster = ["redis://b"] }"#,
            "store: at most 1 keys",
        ),
        (
            r#"store.redis_sentinel = { nodes = ["redis://a"] }"#,
            "store.redis_sentinel: `master` is required",
        ),
        (r#"policies.x = 1"#, "policies: unknown field"),
    ];
    for (toml_text, expected) in cases {
        let doc: Value = toml::from_str(toml_text).unwrap();
        let errors = validator::validate(&schema, &doc);
        assert!(
            errors.iter().any(|e| e.starts_with(expected)),
            "{toml_text}: expected `{expected}…`, got {errors:?}"
        );
    }
    // What the schema accepts, the policy crate accepts too, for these optional forms.
    let ok = r#"
        [default]
        dns.persist_interval = "off"
        security.max_resp_bytes = "16MiB"
        tls.min_tls = 1.3
        proxy.http_proxy = "http://proxy.internal:3128"
        limits.global = { rps = 10 }
    "#;
    let doc: Value = toml::from_str(ok).unwrap();
    assert_eq!(validator::validate(&schema, &doc), Vec::<String>::new());
    PolicyDocument::from_value(doc).unwrap();
}

/// The repository's root (this crate's parent directory).
fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}
