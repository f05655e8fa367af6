//! `soulbase-net policy check FILE...`: every problem of each document, with its path.

use soulbase_net_policy::{PolicyDocument, SnapshotResolver};

/// Checks each file; the report when all are valid, every problem of every file otherwise.
pub(super) fn run(files: &[String]) -> Result<String, String> {
    if files.is_empty() {
        return Err("policy check needs at least one FILE".to_owned());
    }
    let mut report = String::new();
    let mut failed = false;
    for file in files {
        match PolicyDocument::from_path(file).and_then(SnapshotResolver::new) {
            Ok(resolver) => {
                let combinations = resolver.snapshot().combinations();
                report.push_str(&format!(
                    "{file}: ok ({combinations} combinations of layers checked)\n"
                ));
            }
            Err(e) => {
                failed = true;
                let n = e.problems().len();
                let noun = if n == 1 { "problem" } else { "problems" };
                report.push_str(&format!("{file}: {n} {noun}\n"));
                for p in e.problems() {
                    let at = if p.path.is_empty() {
                        "(document)"
                    } else {
                        &p.path
                    };
                    report.push_str(&format!("  {at}: {}\n", p.reason));
                }
            }
        }
    }
    if failed {
        Err(report.trim_end().to_owned())
    } else {
        Ok(report)
    }
}
