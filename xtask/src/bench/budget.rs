//! The instruction budget (`docs/bench-budget.json`): per build profile, each client's
//! instructions per request; a count more than [`TOLERANCE`] above its budget fails.
//!
//! Two profiles, because they answer two questions: `release` holds the figures that mean
//! something (what the README reports; checked by `cargo run --release -p xtask -- bench
//! --instructions`), `debug` the ones `cargo xtask ci` checks on the xtask it is already
//! running — no release build of the workspace in CI (about 4 minutes of both cores here),
//! and unoptimised code makes added work per request show at least as clearly.
#![allow(
    clippy::print_stdout,
    reason = "a command a person runs: the table goes to stdout"
)]

use std::path::Path;

use serde_json::{json, Value};

use super::clients::Kind;

/// How far above its budget a client may go before the check fails.
pub(crate) const TOLERANCE: f64 = 0.03;
/// How far above its budget a price may go (and at least `price::floor`) before the check fails.
pub(crate) const PRICE_TOLERANCE: f64 = 0.05;

/// The least a price may go over its budget, as a share of the minimal client's count. A
/// count varies from run to run of the same client (by up to 0.8 % of the minimal client's
/// in release: hash seeds, the interleaving of the callers), and a price is the difference
/// of two counts: over three runs of the list, a price moved by up to 380 instructions, 1.3 %
/// of the minimal client's 28 700. The floor is 2 % of it.
pub(crate) const FLOOR_SHARE: f64 = 0.02;
/// Where the budget lives, from the workspace root.
pub(crate) const BUDGET_FILE: &str = "docs/bench-budget.json";

/// One client's count against its budget.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Verdict {
    pub(crate) kind: Kind,
    pub(crate) measured: f64,
    pub(crate) budget: Option<f64>,
    pub(crate) ok: bool,
}

/// Each measured client against the `profile` section of `budget`: over by more than
/// [`TOLERANCE`], or without a budget, fails.
pub(crate) fn judge(measured: &[(Kind, f64)], budget: &Value, profile: &str) -> Vec<Verdict> {
    let tolerance = Tolerance {
        share: TOLERANCE,
        floor: 0.0,
    };
    measured
        .iter()
        .map(|&(kind, m)| {
            let (b, ok) = check(budget, profile, kind.key(), m, tolerance);
            Verdict {
                kind,
                measured: m,
                budget: b,
                ok,
            }
        })
        .collect()
}

/// How far above its budget a figure may go: `share` of the budget's size, and at least
/// `floor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tolerance {
    /// The share of the budget's size: `0.03` for 3 %.
    pub(crate) share: f64,
    /// The least slack, in instructions: `0.0` for none.
    pub(crate) floor: f64,
}

/// The `key` row of the `section` of `budget`, and whether `figure` is within `tolerance`
/// of it; a figure without a row is not.
pub(crate) fn check(
    budget: &Value,
    section: &str,
    key: &str,
    figure: f64,
    tolerance: Tolerance,
) -> (Option<f64>, bool) {
    let b = budget["instructions_per_request"][section][key].as_f64();
    let ok = b.is_some_and(|b| figure <= b + (b.abs() * tolerance.share).max(tolerance.floor));
    (b, ok)
}

/// A row's verdict in a table; `updating` says the figures become the budget.
pub(crate) fn verdict(updating: bool, ok: bool) -> &'static str {
    match (updating, ok) {
        (true, _) => "new budget",
        (false, true) => "ok",
        (false, false) => "OVER BUDGET",
    }
}

/// The verdicts as a Markdown table; `updating` says the figures become the budget.
pub(crate) fn print_table(verdicts: &[Verdict], updating: bool) {
    println!(
        "\n| client | instructions / request | budget | change | verdict |\n\
         | --- | --- | --- | --- | --- |"
    );
    for v in verdicts {
        let (budget, change) = match v.budget {
            Some(b) => (
                format!("{b:.0}"),
                format!("{:+.2} %", (v.measured / b - 1.0) * 100.0),
            ),
            None => ("none".to_owned(), "—".to_owned()),
        };
        let verdict = verdict(updating, v.ok);
        println!(
            "| {} | {:.0} | {budget} | {change} | {verdict} |",
            v.kind.label(),
            v.measured
        );
    }
}

/// The budget document; `null` when there is no file yet.
pub(crate) fn read(path: &Path) -> Result<Value, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| format!("bench --instructions: {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Value::Null),
        Err(e) => Err(format!("bench --instructions: {}: {e}", path.display())),
    }
}

/// `old` with the figures of `measured` in its `profile` section (the section's other clients
/// and the other sections kept).
pub(crate) fn updated(old: &Value, profile: &str, measured: &[(Kind, f64)], what: &str) -> Value {
    let rows: Vec<(&str, f64)> = measured.iter().map(|&(k, m)| (k.key(), m)).collect();
    updated_rows(old, profile, &rows, what)
}

/// `old` with `rows` (key, figure; rounded, negative ones too) in its `section`, the
/// section's other rows and the other sections kept: `--update-budget --clients hyper`
/// re-records hyper alone.
pub(crate) fn updated_rows(old: &Value, section: &str, rows: &[(&str, f64)], what: &str) -> Value {
    let mut sections = match &old["instructions_per_request"] {
        Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    let mut figures = match &sections.get(section) {
        Some(Value::Object(m)) => m.clone(),
        _ => serde_json::Map::new(),
    };
    for &(key, m) in rows {
        figures.insert(key.to_owned(), json!(m.round() as i64));
    }
    sections.insert(section.to_owned(), Value::Object(figures));
    json!({
        "what": what,
        "check": "cargo run --release -p xtask -- bench --instructions [--h2c | --hosts N | \
                  --price-list] checks `release` [`-h2c`, `-hosts`, `-price`]; cargo xtask ci \
                  checks `debug` and `debug-price` (cargo xtask bench --instructions \
                  [--price-list]); --update-budget rewrites the rows it measured in the section \
                  it checks",
        "tolerance": TOLERANCE,
        "price_tolerance": PRICE_TOLERANCE,
        "price_floor_share_of_minimal": FLOOR_SHARE,
        "instructions_per_request": sections,
    })
}

/// How a check of one section of the budget ends (see [`conclude`]): where the budget lives
/// and how the check words its outcome.
#[derive(Clone, Debug)]
pub(crate) struct Outcome<'a> {
    /// The budget document's file.
    pub(crate) path: &'a Path,
    /// The section checked: `release`, `debug-price`, ….
    pub(crate) section: &'a str,
    /// The command a failure names: `bench --instructions`.
    pub(crate) command: &'a str,
    /// What a row is, in the singular: `client`.
    pub(crate) row: &'a str,
    /// What an update writes: `budget`.
    pub(crate) written: &'a str,
    /// The tolerance as the line of success states it: `3 %`.
    pub(crate) within: String,
    /// The tolerance as a failure states it: `+3 %`.
    pub(crate) allowed: String,
}

/// The end of a check: with `update` (the new budget document), that document written to
/// the file; else the keys in `over` fail the check, and none over passes it.
pub(crate) fn conclude(
    outcome: &Outcome<'_>,
    over: &[&str],
    update: Option<Value>,
) -> Result<(), String> {
    let Outcome { path, section, .. } = *outcome;
    if let Some(doc) = update {
        write(path, &doc)?;
        println!(
            "wrote the {section} {} to {}",
            outcome.written,
            path.display()
        );
        return Ok(());
    }
    if over.is_empty() {
        println!(
            "every {} within {} of its {section} budget",
            outcome.row, outcome.within
        );
        Ok(())
    } else {
        Err(format!(
            "{}: over the {section} budget ({} allowed): {}; if this is intended, run again \
             with --update-budget",
            outcome.command,
            outcome.allowed,
            over.join(", ")
        ))
    }
}

/// Writes `doc` to `path`, pretty-printed.
pub(crate) fn write(path: &Path, doc: &Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::clients::INSTRUCTION_CLIENTS;

    #[test]
    fn over_three_percent_or_without_a_budget_fails() {
        let budget = json!({ "instructions_per_request": {
            "release": { "hyper": 1000.0, "reqwest": 2000.0 },
            "debug": { "hyper": 1.0 },
        } });
        let v = judge(
            &[
                (Kind::Hyper, 1030.0),
                (Kind::Reqwest, 2061.0),
                (Kind::SoulbaseMin, 10.0),
            ],
            &budget,
            "release",
        );
        let ok: Vec<bool> = v.iter().map(|v| v.ok).collect();
        assert_eq!(ok, [true, false, false]);
        assert!(judge(&[(Kind::Hyper, 900.0)], &budget, "release")[0].ok);
        assert!(!judge(&[(Kind::Hyper, 900.0)], &budget, "debug")[0].ok);
    }

    #[test]
    fn an_update_keeps_the_other_profile() {
        let old = json!({ "instructions_per_request": { "debug": { "hyper": 5.0 } } });
        let new = updated(&old, "release", &[(Kind::Hyper, 1234.4)], "w");
        assert_eq!(new["instructions_per_request"]["debug"]["hyper"], 5.0);
        assert_eq!(new["instructions_per_request"]["release"]["hyper"], 1234);
        let fresh = updated(&Value::Null, "debug", &[(Kind::Reqwest, 2.0)], "w");
        assert_eq!(fresh["instructions_per_request"]["debug"]["reqwest"], 2);
    }

    #[test]
    fn an_update_keeps_the_sections_other_clients() {
        let old =
            json!({ "instructions_per_request": { "release": { "hyper": 5.0, "reqwest": 7.0 } } });
        let new = updated(&old, "release", &[(Kind::Hyper, 6.0)], "w");
        assert_eq!(new["instructions_per_request"]["release"]["hyper"], 6);
        assert_eq!(new["instructions_per_request"]["release"]["reqwest"], 7.0);
        let prices = updated_rows(&new, "release-price", &[("qos", -12.4)], "w");
        assert_eq!(
            prices["instructions_per_request"]["release-price"]["qos"],
            -12
        );
        assert_eq!(prices["instructions_per_request"]["release"]["hyper"], 6);
    }

    #[test]
    fn a_check_ends_in_its_own_words() {
        let path =
            std::env::temp_dir().join(format!("soulbase-budget-{}.json", std::process::id()));
        let outcome = Outcome {
            path: &path,
            section: "release",
            command: "bench --instructions",
            row: "client",
            written: "budget",
            within: "3 %".to_owned(),
            allowed: "+3 %".to_owned(),
        };
        assert_eq!(conclude(&outcome, &[], None), Ok(()));
        assert_eq!(
            conclude(&outcome, &["hyper", "reqwest"], None),
            Err(
                "bench --instructions: over the release budget (+3 % allowed): hyper, reqwest; \
                 if this is intended, run again with --update-budget"
                    .to_owned()
            )
        );
        let doc = updated(&Value::Null, "release", &[(Kind::Hyper, 7.0)], "w");
        assert_eq!(conclude(&outcome, &["hyper"], Some(doc.clone())), Ok(()));
        assert_eq!(read(&path), Ok(doc));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_price_tolerance_has_a_floor() {
        let budget = json!({ "instructions_per_request": { "s": { "a": 100.0, "b": -100.0 } } });
        let t = Tolerance {
            share: 0.05,
            floor: 20.0,
        };
        assert_eq!(check(&budget, "s", "a", 120.0, t), (Some(100.0), true));
        assert_eq!(check(&budget, "s", "a", 121.0, t), (Some(100.0), false));
        assert_eq!(check(&budget, "s", "b", -80.0, t), (Some(-100.0), true));
        assert_eq!(check(&budget, "s", "c", 0.0, t), (None, false));
        assert_eq!(verdict(true, false), "new budget");
        assert_eq!(verdict(false, false), "OVER BUDGET");
    }

    /// The checked-in budget names every client in both profiles.
    #[test]
    fn the_checked_in_budget_covers_every_client() {
        let budget = read(&crate::project_root().join(BUDGET_FILE)).unwrap();
        for profile in ["release", "debug"] {
            for kind in INSTRUCTION_CLIENTS {
                let b = budget["instructions_per_request"][profile][kind.key()].as_f64();
                assert!(
                    b.is_some_and(|b| b > 1000.0),
                    "{profile} {kind:?}: {budget}"
                );
            }
        }
        assert_eq!(budget["tolerance"].as_f64(), Some(TOLERANCE));
    }

    /// The checked-in budget names the many-hosts clients in both profiles.
    #[test]
    fn the_checked_in_budget_covers_many_hosts() {
        let budget = read(&crate::project_root().join(BUDGET_FILE)).unwrap();
        for section in ["release-hosts", "debug-hosts"] {
            for kind in crate::bench::clients::CLIENTS {
                let b = budget["instructions_per_request"][section][kind.key()].as_f64();
                assert!(b.is_some_and(|b| b > 1000.0), "{section} {kind:?}");
            }
        }
    }
}
