//! The `soulbase-net` command-line tool, as a library: what the binary runs, and what
//! `cargo xtask` calls inside this repository.
//!
//! Installed with `cargo install --path soulbase-net-cli` (add `--features postgres` for
//! `postgres://` stores), it needs nothing else: no checkout of this repository, no xtask.
//!
//! ```text
//! soulbase-net policy check FILE...          every problem of each document, with its path
//! soulbase-net policy explain --policy FILE [--tenant T] [--key NAME] [--dns ADDR] URL
//!                                             the effective policy of one request, field by field
//! soulbase-net policy schema [--write FILE]   the JSON Schema of a policy document
//! soulbase-net policy diff OLD NEW            what changes between two documents, by path
//! soulbase-net outbox --db STORE [--table NAME] list | requeue ID | purge
//! soulbase-net delay --store STORE [--table NAME] pending | get ID | cancel ID
//! ```
//!
//! Every command reads and prints; none sends a request (`explain --dns` asks that one name
//! server, never the system resolver). Credentials never appear in the output.
//!
//! # Examples
//! ```
//! let dir = std::env::temp_dir().join(format!("cli-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let file = dir.join("policy.toml");
//! std::fs::write(&file, "[default.retry]\nmax_attempts = 3\n").unwrap();
//! let args = ["policy", "check", file.to_str().unwrap()].map(String::from);
//! let out = soulbase_net_cli::run(&args).unwrap();
//! assert!(out.contains(": ok"), "{out}");
//! ```

pub mod delay;
pub mod outbox;
pub mod policy;

/// How to call the tool.
pub const USAGE: &str = "\
usage: soulbase-net <command> ...

commands:
  policy   check | explain | schema | diff: policy documents (`soulbase-net policy help`)
  outbox   --db STORE [--table NAME] list | requeue ID | purge: an outbox's dead letters
  delay    --store STORE [--table NAME] pending | get ID | cancel ID: a delay server's tasks
";

/// Runs one command (the words after the program's name) and returns what it prints.
///
/// # Errors
/// The usage for an unknown command, or what failed (with every problem of an invalid
/// document, each with its path).
pub fn run(args: &[String]) -> Result<String, String> {
    match args.first().map(String::as_str) {
        Some("policy") => policy::run(&args[1..]),
        Some("outbox") => block_on(outbox::run(&args[1..])),
        Some("delay") => block_on(delay::run(&args[1..])),
        Some("help" | "-h" | "--help") | None => Ok(USAGE.to_owned()),
        Some(other) => Err(format!("unknown command `{other}`\n\n{USAGE}")),
    }
}

/// Runs an async command on a runtime of its own.
fn block_on<F: std::future::Future<Output = Result<String, String>>>(
    f: F,
) -> Result<String, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?
        .block_on(f)
}
