//! The installed tool as a user runs it: the `soulbase-net` binary in a process of its own,
//! on files and stores in a temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::PathBuf, process::Command, sync::Arc};

use soulbase_net_store::delay::{DelayStore, DelayStoreOptions, DelayTask, SqliteDelayStore};

/// A directory of its own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("soulbase-cli-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the binary: whether it succeeded, its stdout, its stderr.
fn tool(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_soulbase-net"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn policy_diff_lists_each_change_by_path_and_hides_credentials() {
    let dir = TempDir::new("diff");
    let old = dir.file(
        "old.toml",
        "[default.retry]\nmax_attempts = 3\n\n[default.proxy]\nhttp_proxy = \"http://ops:PLANTED-old@proxy.internal:3128\"\n\n[overrides.\"api.example.com\".retry]\nmax_attempts = 1\n",
    );
    let new = dir.file(
        "new.toml",
        "[default.retry]\nmax_attempts = 2\n\n[default.proxy]\nhttp_proxy = \"http://ops:PLANTED-new@proxy.internal:3128\"\n\n[default.timeout]\nconnect = \"1s\"\n",
    );
    let (ok, out, err) = tool(&["policy", "diff", &old, &new]);
    assert!(ok, "{err}");
    assert!(
        out.contains("~ default.retry.max_attempts = 3 -> 2"),
        "{out}"
    );
    assert!(out.contains("+ default.timeout.connect = \"1s\""), "{out}");
    assert!(
        out.contains("- overrides.\"api.example.com\".retry.max_attempts = 1"),
        "{out}"
    );
    assert!(out.contains("http://***@proxy.internal:3128"), "{out}");
    assert!(!out.contains("PLANTED"), "a password printed: {out}");

    let (ok, out, _) = tool(&["policy", "diff", &old, &old]);
    assert!(ok);
    assert_eq!(out, "no difference\n");
}

#[test]
fn an_invalid_document_fails_with_each_problem_s_path() {
    let dir = TempDir::new("check");
    let bad = dir.file("bad.toml", "[default.retry]\nmax_attempts = \"many\"\n");
    let (ok, _, err) = tool(&["policy", "check", &bad]);
    assert!(!ok);
    assert!(err.contains("default.retry.max_attempts"), "{err}");
    let good = dir.file("good.toml", "[default.retry]\nmax_attempts = 2\n");
    let (ok, _, err) = tool(&["policy", "diff", &good, &bad]);
    assert!(!ok, "diff refuses an invalid document");
    assert!(err.contains("is not valid"), "{err}");
}

#[test]
fn an_unknown_command_prints_the_usage_and_fails() {
    let (ok, _, err) = tool(&["frobnicate"]);
    assert!(!ok);
    assert!(
        err.contains("unknown command `frobnicate`") && err.contains("usage:"),
        "{err}"
    );
    let (ok, out, _) = tool(&["help"]);
    assert!(ok && out.contains("policy") && out.contains("outbox") && out.contains("delay"));
}

#[test]
fn the_outbox_command_reads_an_outbox_store() {
    let dir = TempDir::new("outbox");
    let db = dir.0.join("outbox.db").display().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(soulbase_net_outbox::SqliteStore::open(&db))
        .unwrap();
    let (ok, out, err) = tool(&["outbox", "--db", &db, "list"]);
    assert!(ok, "{err}");
    assert_eq!(out, "0 pending, 0 dead\n");
}

#[test]
fn the_delay_command_reads_and_cancels_a_task_in_its_store() {
    let dir = TempDir::new("delay");
    let db = dir.0.join("delay.db");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = Arc::new(
        rt.block_on(SqliteDelayStore::open(&db, DelayStoreOptions::default()))
            .unwrap(),
    );
    let task = DelayTask {
        id: "t-1".to_owned(),
        route_key: "billing".to_owned(),
        fire_at: 1_900_000_000_000,
        compression: "none".to_owned(),
        payload: bytes::Bytes::from_static(b"hello"),
        attempts: 0,
        claim: 0,
        due_in: std::time::Duration::ZERO,
    };
    rt.block_on(store.write(&[task], &[])).unwrap();
    let db = db.display().to_string();
    let (ok, out, err) = tool(&["delay", "--store", &db, "pending"]);
    assert!(ok, "{err}");
    assert_eq!(out, "1 pending\n");
    let (ok, out, _) = tool(&["delay", "--store", &db, "get", "t-1"]);
    assert!(ok);
    assert!(
        out.contains("route=billing fire_at=1900000000000 attempts=0") && out.contains("5 bytes"),
        "{out}"
    );
    let (ok, out, _) = tool(&["delay", "--store", &db, "cancel", "t-1"]);
    assert!(ok && out == "cancelled t-1\n", "{out}");
    let (ok, _, err) = tool(&["delay", "--store", &db, "get", "t-1"]);
    assert!(!ok && err.contains("no task `t-1`"), "{err}");
    assert_eq!(rt.block_on(store.pending()).unwrap(), 0);

    let missing = dir.0.join("none.db").display().to_string();
    let (ok, _, err) = tool(&["delay", "--store", &missing, "pending"]);
    assert!(!ok && err.contains("no delay store at"), "{err}");
    assert!(!dir.0.join("none.db").exists(), "no empty store made");
}

#[test]
fn explain_says_when_a_host_s_retries_cannot_apply_to_a_request() {
    let dir = TempDir::new("explain-notes");
    let policy = dir.file(
        "policy.toml",
        "[default]\ncbreaker.enabled = true\n\n[overrides.\"pricing.internal\"]\nretry.max_attempts = 2\n",
    );
    let url = "http://pricing.internal/v1/price";
    let (ok, out, err) = tool(&[
        "policy", "explain", "--policy", &policy, "--method", "POST", url,
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("request   POST http://pricing.internal/v1/price"),
        "{out}"
    );
    assert!(
        out.contains("note: cannot apply to this request: POST is not idempotent"),
        "{out}"
    );
    assert!(
        out.contains("5 failed attempts in a row — attempts, not calls"),
        "the breaker's unit is stated: {out}"
    );
    let (ok, out, _) = tool(&[
        "policy", "explain", "--policy", &policy, "--method", "GET", url,
    ]);
    assert!(ok);
    assert!(!out.contains("cannot apply to this request"), "{out}");
    let (ok, _, err) = tool(&[
        "policy",
        "explain",
        "--policy",
        &policy,
        "--method",
        "BAD METHOD",
        url,
    ]);
    assert!(!ok && err.contains("not an HTTP method"), "{err}");
}
