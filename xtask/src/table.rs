//! The pass/fail table that `contract`, `chaos` and `interop` print — one row per promise,
//! with what was expected, what was measured and whether they agree — and its JSON form.
#![allow(clippy::print_stdout, reason = "a command-line report")]

use serde_json::{json, Value};

/// One promise: its id, what it promises, what was seen, and the verdict.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) id: String,
    pub(crate) expected: String,
    pub(crate) measured: String,
    pub(crate) passed: bool,
}

/// A row; `passed` is the verdict of comparing `expected` with `measured`.
pub(crate) fn row(
    id: &str,
    expected: impl Into<String>,
    measured: impl Into<String>,
    passed: bool,
) -> Row {
    Row {
        id: id.to_owned(),
        expected: expected.into(),
        measured: measured.into(),
        passed,
    }
}

/// How many rows failed.
pub(crate) fn failed(rows: &[Row]) -> usize {
    rows.iter().filter(|r| !r.passed).count()
}

/// Prints the rows as a table whose first column is headed `first`.
pub(crate) fn print_table(first: &str, rows: &[Row]) {
    let w = rows
        .iter()
        .map(|r| r.id.len())
        .max()
        .unwrap_or(8)
        .max(first.len());
    let e = rows
        .iter()
        .map(|r| r.expected.len())
        .max()
        .unwrap_or(8)
        .clamp(8, 48);
    println!("{first:<w$}  {:<e$}  {:<40}  pass", "expected", "measured");
    for r in rows {
        println!(
            "{:<w$}  {:<e$}  {:<40}  {}",
            r.id,
            r.expected,
            r.measured,
            if r.passed { "yes" } else { "NO" }
        );
    }
}

/// `{"rows": [{id, expected, measured, passed}], "passed": n, "failed": n}`.
pub(crate) fn rows_json(rows: &[Row]) -> Value {
    let failed = failed(rows);
    json!({
        "rows": rows.iter().map(|r| json!({
            "id": r.id, "expected": r.expected, "measured": r.measured, "passed": r.passed,
        })).collect::<Vec<_>>(),
        "passed": rows.len() - failed,
        "failed": failed,
    })
}

/// Writes `value` as pretty JSON to `path`.
pub(crate) fn write_json(path: &str, value: &Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("writing {path}: {e}"))
}

/// The `--json PATH` argument, if given.
pub(crate) fn json_arg(args: &[String]) -> Result<Option<String>, String> {
    match args.iter().position(|a| a == "--json") {
        Some(i) => Ok(Some(args.get(i + 1).ok_or("--json needs a path")?.clone())),
        None => Ok(None),
    }
}

/// Prints the table and a summary line (`what` names the rows, e.g. "scenarios"), writes
/// the JSON report when asked; `Err` when a row failed.
pub(crate) fn finish(
    rows: &[Row],
    heading: &str,
    what: &str,
    took: std::time::Duration,
    json_path: Option<&str>,
) -> Result<(), String> {
    print_table(heading, rows);
    let failed = failed(rows);
    println!(
        "\n{} {what}, {} passed, {failed} failed, in {:.1}s",
        rows.len(),
        rows.len() - failed,
        took.as_secs_f64()
    );
    if let Some(path) = json_path {
        write_json(path, &rows_json(rows))?;
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} {what} failed"))
    }
}
