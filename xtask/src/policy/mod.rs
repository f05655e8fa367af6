//! `cargo xtask policy explain | check | schema`: what a policy document means for one request,
//! whether a document is valid, and the JSON Schema editors use to complete and check one.
//!
//! Every command reads and prints; none sends a request. `explain` resolves a name only when
//! given `--dns ADDR`, and then asks that server alone (never the system resolver).

mod check;
mod explain;
mod schema;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod validator;

use std::path::PathBuf;

pub(crate) const USAGE: &str = "\
usage: cargo xtask policy <command>

commands:
  explain --policy FILE [--tenant T] [--key NAME] [--timeout connect=1s,total=5s]
          [--dns ADDR[:PORT]] [--changed] URL
          the effective policy of a request to URL: each field with the layer it comes from
          (built-in, default, host override, tenant, tenant+host, request); with --dns, the
          addresses the host resolves to on that name server and the address guard's verdict
          on each; whether the deadline closes. --changed lists only the fields a layer sets
  check FILE...
          validates documents (.toml or .json) and lists every problem with its path;
          exits non-zero when one has any
  schema [--write]
          the JSON Schema of a policy document (docs/policy.schema.json with --write)
";

/// Runs `cargo xtask policy ARGS`.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let out = match args.first().map(String::as_str) {
        Some("explain") => explain::run(&explain::Options::parse(&args[1..])?)?,
        Some("check") => check::run(&args[1..])?,
        Some("schema") => match args.get(1).map(String::as_str) {
            None => schema::generate()?,
            Some("--write") => {
                let path = schema_path();
                std::fs::write(&path, schema::generate()?)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                format!("wrote {}\n", path.display())
            }
            Some(other) => return Err(format!("unknown option `{other}`\n\n{USAGE}")),
        },
        Some("help" | "-h" | "--help") | None => USAGE.to_owned(),
        Some(other) => return Err(format!("unknown policy command `{other}`\n\n{USAGE}")),
    };
    #[allow(clippy::print_stdout, reason = "the command's output")]
    {
        print!("{out}");
    }
    Ok(())
}

/// Where the checked-in schema lives.
pub(crate) fn schema_path() -> PathBuf {
    crate::project_root().join("docs/policy.schema.json")
}
