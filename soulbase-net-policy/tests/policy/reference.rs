//! The policy reference (`docs/policy.md`) against the code: one row per field the code
//! accepts and no row for a field it does not, the default column equal to what
//! `NetPolicy::default()` serialises to, every example document loading, and every refused
//! example refused with exactly the problems the page shows.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};
use soulbase_net_policy::*;

const REFERENCE: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/policy.md"));

/// The header of a field table in the reference.
const FIELD_TABLE: &str = "| field | type | default | meaning and rules |";

/// A key no policy struct has: probing with it makes serde list the fields a struct has.
const PROBE: &str = "zz_not_a_field";

/// One row of a field table: the path, the default cell, and the line (1-based) it is on.
struct Row {
    path: String,
    default: String,
    line: usize,
}

/// The rows of every field table, in page order.
fn rows() -> Vec<Row> {
    let mut out = Vec::new();
    let mut in_table = false;
    for (i, line) in REFERENCE.lines().enumerate() {
        let line_no = i + 1;
        if line.trim() == FIELD_TABLE {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if line.starts_with("| ---") {
            continue;
        }
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        assert_eq!(
            cells.len(),
            4,
            "docs/policy.md:{line_no}: a field row has 4 cells (no `|` inside a cell)"
        );
        let path = cells[0]
            .strip_prefix('`')
            .and_then(|c| c.strip_suffix('`'))
            .unwrap_or_else(|| panic!("docs/policy.md:{line_no}: the field is written `a.b`"));
        out.push(Row {
            path: path.to_owned(),
            default: cells[2].to_owned(),
            line: line_no,
        });
    }
    out
}

/// `value` with `leaf` placed at `path`, creating the tables on the way.
fn with_at(value: &Value, path: &[String], leaf: Value) -> Value {
    let mut root = value.clone();
    let mut node = &mut root;
    for key in path {
        let Value::Object(map) = node else {
            unreachable!("only tables are descended into")
        };
        node = map
            .entry(key.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
    }
    if let Value::Object(map) = node {
        map.insert(PROBE.to_owned(), leaf);
    }
    root
}

/// The fields of the struct at `path` as serde lists them when it meets an unknown one, or
/// `None` when the value at `path` is not a struct.
fn struct_fields(base: &Value, path: &[String]) -> Option<Vec<String>> {
    let probe = with_at(base, path, Value::from(0));
    let err = serde_json::from_value::<NetPolicy>(probe)
        .err()?
        .to_string();
    let expected = err
        .strip_prefix(&format!("unknown field `{PROBE}`, "))?
        .to_owned();
    Some(
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// Every leaf field path the code accepts (`retry.backoff.base`), and every struct path
/// (`retry.backoff`), found by asking serde rather than by a list that could fall behind.
fn code_fields() -> (BTreeSet<String>, BTreeSet<String>) {
    let base = serde_json::to_value(NetPolicy::default()).unwrap();
    let (mut leaves, mut structs) = (BTreeSet::new(), BTreeSet::new());
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let fields = struct_fields(&base, &path).expect("NetPolicy is a struct");
        for f in fields {
            let mut child = path.clone();
            child.push(f);
            if struct_fields(&base, &child).is_some() {
                structs.insert(child.join("."));
                todo.push(child);
            } else {
                leaves.insert(child.join("."));
            }
        }
    }
    (leaves, structs)
}

/// The built-in defaults as a value tree, with the optional sections (absent by default)
/// filled in with the defaults their fields take when the section is written.
fn defaults(structs: &BTreeSet<String>) -> Value {
    let optional: BTreeMap<&str, Value> = [
        (
            "proxy",
            serde_json::to_value(ProxyPolicy::default()).unwrap(),
        ),
        (
            "tls.mtls",
            serde_json::to_value(MtlsCfg::default()).unwrap(),
        ),
        (
            "cbreaker.slow_call",
            serde_json::to_value(SlowCallCfg::default()).unwrap(),
        ),
        (
            "limits.global",
            serde_json::to_value(GlobalLimit::default()).unwrap(),
        ),
    ]
    .into();
    let mut tree = serde_json::to_value(NetPolicy::default()).unwrap();
    for s in structs {
        if lookup(&tree, s).is_some() {
            continue;
        }
        let Some(section) = optional.get(s.as_str()) else {
            panic!("`{s}` is absent from the defaults: add its Default to this test");
        };
        let (parent, key) = s.rsplit_once('.').unwrap_or(("", s));
        let slot = if parent.is_empty() {
            &mut tree
        } else {
            lookup_mut(&mut tree, parent).unwrap()
        };
        slot.as_object_mut()
            .unwrap()
            .insert(key.to_owned(), section.clone());
    }
    tree
}

fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |node, k| node.get(k))
}

fn lookup_mut<'a>(v: &'a mut Value, path: &str) -> Option<&'a mut Value> {
    path.split('.').try_fold(v, |node, k| node.get_mut(k))
}

/// The code blocks of the page: (info string, body, line of the opening fence).
fn blocks() -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String, usize)> = None;
    for (i, line) in REFERENCE.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), String::new(), i + 1)),
            (Some(_), Some(_)) => out.extend(open.take()),
            (Some((_, body, _)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "docs/policy.md: a code block is not closed");
    out
}

#[test]
fn every_field_has_a_row_and_every_row_is_a_field() {
    let (leaves, _) = code_fields();
    assert!(leaves.len() > 100, "found only {} fields", leaves.len());
    let rows = rows();
    let mut documented = BTreeSet::new();
    for r in &rows {
        assert!(
            documented.insert(r.path.clone()),
            "docs/policy.md:{}: `{}` has two rows",
            r.line,
            r.path
        );
    }
    // A field's older name (a serde alias, so old documents still load) is documented in its
    // row as "Old name `x`".
    let aliases: BTreeSet<String> = REFERENCE
        .lines()
        .filter_map(|line| {
            let path = line.strip_prefix("| `")?.split('`').next()?;
            let old = line.split("Old name `").nth(1)?.split('`').next()?;
            let parent = path.rsplit_once('.').map_or("", |(p, _)| p);
            Some(format!("{parent}.{old}"))
        })
        .collect();
    let missing: Vec<_> = leaves
        .difference(&documented)
        .filter(|f| !aliases.contains(*f))
        .collect();
    let unknown: Vec<_> = documented.difference(&leaves).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/policy.md is out of date:\n  fields without a row: {missing:?}\n  rows without a field: {unknown:?}"
    );
}

#[test]
fn the_default_column_is_the_code_default() {
    let (_, structs) = code_fields();
    let tree = defaults(&structs);
    let mut wrong = Vec::new();
    for r in rows() {
        let code = lookup(&tree, &r.path);
        let ok = match (code, r.default.as_str()) {
            (None, "unset") => true,
            (Some(_), "unset") | (None, _) => false,
            (Some(v), cell) => {
                let literal = cell.strip_prefix('`').and_then(|c| c.strip_suffix('`'));
                let parsed = literal
                    .and_then(|l| toml::from_str::<Value>(&format!("v = {l}")).ok())
                    .and_then(|t| t.get("v").cloned());
                parsed.as_ref() == Some(v)
            }
        };
        if !ok {
            let code = code.map_or("unset".to_owned(), |v| format!("`{v}`"));
            wrong.push(format!(
                "docs/policy.md:{}: `{}` says {}, the code says {code}",
                r.line, r.path, r.default
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_example_document_loads_and_validates() {
    let mut seen = 0;
    for (info, body, line) in blocks() {
        let loaded = match info.as_str() {
            "toml" => PolicyDocument::from_toml_str(&body),
            "json" => PolicyDocument::from_json_str(&body),
            _ => continue,
        };
        let doc = loaded.unwrap_or_else(|e| panic!("docs/policy.md:{line}: refused:\n{e}"));
        SnapshotResolver::new(doc).unwrap();
        seen += 1;
    }
    assert!(
        seen >= 2,
        "the reference shows at least a TOML and a JSON document"
    );
}

#[test]
fn every_refused_example_reports_the_problems_shown() {
    let blocks = blocks();
    let mut seen = 0;
    for (i, (info, body, line)) in blocks.iter().enumerate() {
        if info != "toml reject" {
            continue;
        }
        let err = match PolicyDocument::from_toml_str(body) {
            Ok(_) => panic!("docs/policy.md:{line}: the example is meant to be refused"),
            Err(e) => e.to_string(),
        };
        let shown = match blocks.get(i + 1) {
            Some((info, text, _)) if info == "text" => text.trim_end(),
            _ => panic!("docs/policy.md:{line}: a refused example is followed by a ```text block of its problems"),
        };
        assert_eq!(err, shown, "docs/policy.md:{line}");
        seen += 1;
    }
    assert!(seen >= 1);
}

#[test]
fn the_annotated_document_resolves_as_its_comments_say() {
    let (_, body, _) = blocks()
        .into_iter()
        .find(|(info, body, _)| info == "toml" && body.contains("[tenants.batch]"))
        .expect("the annotated document");
    let r = SnapshotResolver::new(PolicyDocument::from_toml_str(&body).unwrap()).unwrap();
    let ms = std::time::Duration::from_millis;
    assert_eq!(
        r.resolve(None, "www.example.com").worst_case_latency(),
        ms(18_300)
    );
    let files = r.resolve(Some("batch"), "files.partner.net");
    assert_eq!(files.worst_case_latency(), ms(30_100));
    assert_eq!(files.limits.per_tenant_concurrency, 16);
    assert!(files.proxy.is_some());
    assert!(r.resolve(None, "files.partner.net").proxy.is_none());
    let pay = r.resolve(None, "api.payments.example.com");
    assert!(pay.hedge.enabled);
    assert_eq!(pay.tls.pins().len(), 1);
    assert!(!pay.retry.retry_on.timeout_read);
    assert!(
        pay.retry.retry_on.status_5xx,
        "kept from the built-in default"
    );
}
