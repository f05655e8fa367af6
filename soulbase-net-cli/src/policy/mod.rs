//! `soulbase-net policy explain | check | schema | diff`: what a policy document means for one
//! request, whether a document is valid, the JSON Schema editors use to complete and check
//! one, and what changes between two documents.
//!
//! Every command reads and prints; none sends a request. `explain` resolves a name only when
//! given `--dns ADDR`, and then asks that server alone (never the system resolver).

mod check;
mod diff;
mod explain;
mod schema;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod validator;

/// How to call `policy`.
pub const USAGE: &str = "\
usage: soulbase-net policy <command>

commands:
  explain --policy FILE [--tenant T] [--key NAME] [--timeout connect=1s,total=5s]
          [--dns ADDR[:PORT]] [--method M [--idempotent]] [--changed] URL
          the effective policy of a request to URL: each field with the layer it comes from
          (built-in, default, host override, tenant, tenant+host, request); with --dns, the
          addresses the host resolves to on that name server and the address guard's verdict
          on each; whether the deadline closes; notes where a setting cannot apply (with
          --method, whether retries can apply to that request). --changed lists only the
          fields a layer sets
  check FILE...
          validates documents (.toml or .json) and lists every problem with its path;
          exits non-zero when one has any
  schema [--write FILE]
          the JSON Schema of a policy document (written to FILE with --write)
  diff OLD NEW
          validates both documents, then lists every setting that differs, by path
          (`+` only in NEW, `-` only in OLD, `~` changed); credentials are never shown
";

/// Runs `policy ARGS`.
///
/// # Errors
/// The usage, or what failed (every problem of an invalid document, with its path).
pub fn run(args: &[String]) -> Result<String, String> {
    match args.first().map(String::as_str) {
        Some("explain") => explain::run(&explain::Options::parse(&args[1..])?),
        Some("check") => check::run(&args[1..]),
        Some("diff") => diff::run(&args[1..]),
        Some("schema") => match (args.get(1).map(String::as_str), args.get(2)) {
            (None, _) => schema::generate(),
            (Some("--write"), Some(path)) => {
                std::fs::write(path, schema::generate()?)
                    .map_err(|e| format!("cannot write {path}: {e}"))?;
                Ok(format!("wrote {path}\n"))
            }
            (Some(other), _) => Err(format!("schema: unexpected `{other}`\n\n{USAGE}")),
        },
        Some("help" | "-h" | "--help") | None => Ok(USAGE.to_owned()),
        Some(other) => Err(format!("unknown policy command `{other}`\n\n{USAGE}")),
    }
}

/// The JSON Schema of a policy document (draft-07), generated from the field tables of the
/// policy reference (`docs/policy.md`).
///
/// # Errors
/// When the reference holds a field type the generator does not know.
pub fn schema() -> Result<String, String> {
    schema::generate()
}
