//! The README's error-code table against the code: every row's codes are what `code()` and
//! `public_code()` give, every kind and every HTTP status has exactly one row.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use soulbase_net_core::{ErrorCode, ErrorKind, Phase};

const README: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));

/// What the first cell of a row names.
enum Spec {
    Kind(ErrorKind),
    /// `Status(5xx)`, `Status(429)`: these statuses.
    Statuses(u16, u16),
    /// `Status(other 4xx)`: the statuses of the range no other row names.
    Other(u16, u16),
}

struct Row {
    line: usize,
    specs: Vec<Spec>,
    code: String,
    public: String,
    public_qos: String,
}

/// The texts between backticks in `cell`.
fn ticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

fn code_named(s: &str, line: usize) -> ErrorCode {
    ErrorCode::ALL
        .into_iter()
        .find(|c| c.as_str() == s)
        .unwrap_or_else(|| panic!("README.md:{line}: `{s}` is not an error code"))
}

fn status_range(part: &str, line: usize) -> (u16, u16) {
    let part = part.trim();
    if let Some(class) = part.strip_suffix("xx") {
        let c: u16 = class.parse().unwrap();
        return (c * 100, c * 100 + 99);
    }
    let s: u16 = part
        .parse()
        .unwrap_or_else(|_| panic!("README.md:{line}: cannot read the status `{part}`"));
    (s, s)
}

fn specs(cell: &str, line: usize) -> Vec<Spec> {
    let mut out = Vec::new();
    for t in ticked(cell) {
        if t.starts_with("Timeout(") {
            out.extend(Phase::ALL.map(|p| Spec::Kind(ErrorKind::Timeout(p))));
        } else if let Some(inner) = t.strip_prefix("Status(").and_then(|r| r.strip_suffix(')')) {
            for part in inner.split('/') {
                match part.strip_prefix("other ") {
                    Some(range) => {
                        let (lo, hi) = status_range(range, line);
                        out.push(Spec::Other(lo, hi));
                    }
                    None => {
                        let (lo, hi) = status_range(part, line);
                        out.push(Spec::Statuses(lo, hi));
                    }
                }
            }
        } else {
            let kind = ErrorKind::ALL_SIMPLE
                .into_iter()
                .find(|k| format!("{k:?}") == t)
                .unwrap_or_else(|| panic!("README.md:{line}: `{t}` is not an ErrorKind"));
            out.push(Spec::Kind(kind));
        }
    }
    out
}

fn rows() -> Vec<Row> {
    let start = README
        .lines()
        .position(|l| l.trim() == "## Error codes")
        .expect("README.md has a section `## Error codes`");
    let mut out = Vec::new();
    for (i, line) in README.lines().enumerate().skip(start) {
        if i > start && line.starts_with("## ") {
            break;
        }
        if !line.starts_with("| `") {
            continue;
        }
        let line_no = i + 1;
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        assert_eq!(cells.len(), 3, "README.md:{line_no}: a row has 3 cells");
        let code = ticked(cells[1]);
        let public = ticked(cells[2]);
        assert_eq!(code.len(), 1, "README.md:{line_no}: one code per row");
        let public_qos = if cells[2].contains("with QoS on") {
            public[1]
        } else {
            public[0]
        };
        out.push(Row {
            line: line_no,
            specs: specs(cells[0], line_no),
            code: code[0].to_owned(),
            public: public[0].to_owned(),
            public_qos: public_qos.to_owned(),
        });
    }
    assert!(!out.is_empty(), "README.md: the error-code table has rows");
    out
}

/// The kind of an error status, by number.
fn status(n: u16) -> ErrorKind {
    ErrorKind::Status(http::StatusCode::from_u16(n).unwrap())
}

/// Checks `kind` against the row and records which row named it.
fn check(kind: ErrorKind, row: &Row, seen: &mut BTreeMap<String, usize>) {
    let code = kind.code();
    assert_eq!(
        code,
        code_named(&row.code, row.line),
        "README.md:{}: code of {kind:?}",
        row.line
    );
    assert_eq!(
        code.public_view(),
        code_named(&row.public, row.line),
        "README.md:{}: public code of {kind:?}",
        row.line
    );
    assert_eq!(
        code.public_view_with(true),
        code_named(&row.public_qos, row.line),
        "README.md:{}: public code of {kind:?} with QoS on",
        row.line
    );
    let key = format!("{kind:?}");
    if let Some(first) = seen.insert(key.clone(), row.line) {
        panic!(
            "README.md:{}: {key} already has a row (line {first})",
            row.line
        );
    }
}

#[test]
fn the_readme_error_table_is_the_code_table() {
    let rows = rows();
    let named: Vec<u16> = rows
        .iter()
        .flat_map(|r| &r.specs)
        .filter_map(|s| match s {
            Spec::Statuses(lo, hi) => Some(*lo..=*hi),
            _ => None,
        })
        .flatten()
        .collect();
    let mut seen = BTreeMap::new();
    for row in &rows {
        for spec in &row.specs {
            match *spec {
                Spec::Kind(kind) => check(kind, row, &mut seen),
                Spec::Statuses(lo, hi) => {
                    for s in lo..=hi {
                        check(status(s), row, &mut seen);
                    }
                }
                Spec::Other(lo, hi) => {
                    for s in (lo..=hi).filter(|s| !named.contains(s)) {
                        check(status(s), row, &mut seen);
                    }
                }
            }
        }
    }
    let mut missing: Vec<String> = ErrorKind::ALL_SIMPLE
        .into_iter()
        .filter(|k| !matches!(k, ErrorKind::Status(_) | ErrorKind::Timeout(_)))
        .chain(Phase::ALL.map(ErrorKind::Timeout))
        // A 2xx is never an error; every other status can be.
        .chain((100..=199).chain(300..=599).map(status))
        .map(|k| format!("{k:?}"))
        .filter(|k| !seen.contains_key(k))
        .collect();
    missing.truncate(10);
    assert!(missing.is_empty(), "README.md: no row for {missing:?}");
}
