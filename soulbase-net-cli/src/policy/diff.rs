//! `soulbase-net policy diff OLD NEW`: both documents validated as `check` does, then every
//! setting that differs between what they say, by path — the review of a policy change.
//!
//! It compares the documents as written (a field set to its default in one and absent from the
//! other is a difference: the next default change would treat them differently). A URL's
//! userinfo and the value of a header that carries credentials are shown as `***`.

use std::collections::BTreeMap;

use serde_json::Value;
use soulbase_net_policy::{PolicyDocument, SnapshotResolver};

/// Diffs the two files.
pub(super) fn run(args: &[String]) -> Result<String, String> {
    let [old, new] = args else {
        return Err("policy diff needs OLD and NEW".to_owned());
    };
    let (a, b) = (read(old)?, read(new)?);
    let (mut a_leaves, mut b_leaves) = (BTreeMap::new(), BTreeMap::new());
    leaves(&a, String::new(), &mut a_leaves);
    leaves(&b, String::new(), &mut b_leaves);
    let mut out = String::new();
    for (path, was) in &a_leaves {
        match b_leaves.get(path) {
            None => out.push_str(&format!("- {path} = {}\n", shown(path, was))),
            Some(now) if now != was => out.push_str(&format!(
                "~ {path} = {} -> {}\n",
                shown(path, was),
                shown(path, now)
            )),
            Some(_) => {}
        }
    }
    for (path, now) in &b_leaves {
        if !a_leaves.contains_key(path) {
            out.push_str(&format!("+ {path} = {}\n", shown(path, now)));
        }
    }
    if out.is_empty() {
        out.push_str("no difference\n");
    }
    Ok(out)
}

/// A document, validated, as a JSON value.
fn read(file: &str) -> Result<Value, String> {
    PolicyDocument::from_path(file)
        .and_then(SnapshotResolver::new)
        .map_err(|e| {
            let problems: Vec<String> = e
                .problems()
                .iter()
                .map(|p| format!("  {}: {}", p.path, p.reason))
                .collect();
            format!("{file} is not valid:\n{}", problems.join("\n"))
        })?;
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {file}: {e}"))?;
    if file.ends_with(".json") {
        serde_json::from_str(&text).map_err(|e| format!("{file}: {e}"))
    } else {
        let doc: toml::Value = toml::from_str(&text).map_err(|e| format!("{file}: {e}"))?;
        serde_json::to_value(doc).map_err(|e| format!("{file}: {e}"))
    }
}

/// Every scalar (and every array, whole) under `v`, by its dotted path.
fn leaves(v: &Value, path: String, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if k.contains('.') || k.contains('*') {
                    format!("\"{k}\"")
                } else {
                    k.clone()
                };
                let sub = if path.is_empty() {
                    key
                } else {
                    format!("{path}.{key}")
                };
                leaves(v, sub, out);
            }
        }
        other => {
            out.insert(path, other.clone());
        }
    }
}

/// A value as printed: credentials hidden.
fn shown(path: &str, v: &Value) -> String {
    let last = path.rsplit('.').next().unwrap_or(path).trim_matches('"');
    let sensitive = [
        "authorization",
        "cookie",
        "token",
        "secret",
        "password",
        "api-key",
    ]
    .iter()
    .any(|s| last.to_ascii_lowercase().contains(s));
    match v {
        Value::String(_) if sensitive => "\"***\"".to_owned(),
        Value::String(s) => Value::String(redact_url(s)).to_string(),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|i| match i {
                    Value::String(s) => Value::String(redact_url(s)),
                    other => other.clone(),
                })
                .collect(),
        )
        .to_string(),
        other => other.to_string(),
    }
}

/// A URL with userinfo as [`redact_url`](soulbase_net_core::redact_url) shows it; anything
/// else as it is.
fn redact_url(s: &str) -> String {
    if s.contains("://") && s.contains('@') {
        soulbase_net_core::redact_url(s)
    } else {
        s.to_owned()
    }
}
