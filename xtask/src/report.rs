//! The table and JSON report shared by `cargo xtask contract` and `cargo xtask interop`: one
//! named row per check with what was expected and what was measured.
#![allow(clippy::print_stdout, reason = "a command-line report")]

use std::time::Duration;

/// One check: its id, what it promises, what was seen.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) id: String,
    pub(crate) expected: String,
    pub(crate) measured: String,
    pub(crate) passed: bool,
}

/// A row.
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

/// The `--json PATH` argument, if given.
pub(crate) fn json_arg(args: &[String]) -> Result<Option<String>, String> {
    match args.iter().position(|a| a == "--json") {
        Some(i) => Ok(Some(args.get(i + 1).ok_or("--json needs a path")?.clone())),
        None => Ok(None),
    }
}

/// Prints the table and the summary line (`what` names the rows, e.g. "contracts"), writes
/// the JSON report when asked; `Err` when a row failed.
pub(crate) fn finish(
    rows: &[Row],
    heading: &str,
    what: &str,
    took: Duration,
    json_path: Option<&str>,
) -> Result<(), String> {
    print_table(rows, heading);
    let failed = rows.iter().filter(|r| !r.passed).count();
    println!(
        "\n{} {what}, {} passed, {failed} failed, in {:.1}s",
        rows.len(),
        rows.len() - failed,
        took.as_secs_f64()
    );
    if let Some(path) = json_path {
        let json = serde_json::json!({
            "rows": rows.iter().map(|r| serde_json::json!({
                "id": r.id, "expected": r.expected, "measured": r.measured, "passed": r.passed,
            })).collect::<Vec<_>>(),
            "passed": rows.len() - failed,
            "failed": failed,
        });
        let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {path}: {e}"))?;
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} {what} failed"))
    }
}

fn print_table(rows: &[Row], heading: &str) {
    let w = rows
        .iter()
        .map(|r| r.id.len())
        .max()
        .unwrap_or(8)
        .max(heading.len());
    let e = rows
        .iter()
        .map(|r| r.expected.len())
        .max()
        .unwrap_or(8)
        .clamp(8, 48);
    println!(
        "{heading:<w$}  {:<e$}  {:<40}  pass",
        "expected", "measured"
    );
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
