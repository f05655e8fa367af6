//! `cargo xtask ci`: every check CI runs, in order, stopping at the first failure. The interop
//! suite (root, package registries) runs last; `XTASK_SKIP_INTEROP=1` skips it on a machine
//! that cannot install packages.
//!
//! After the tests, the instruction budget: `cargo xtask bench --instructions` counts each
//! client's instructions per request under callgrind and fails more than 3 % above
//! `docs/bench-budget.json`; then the price list (`bench --instructions --price-list`) fails
//! when a feature's price is more than 5 % (and more than its floor) above its budget.
//!
//! After the workspace clippy, the "features alone" step lints each library crate on its own
//! (so no other crate's feature requests are unified into it) without default features, and
//! each feature of a crate alone: "depend only on what you need" holds only if every such
//! build compiles warning-free. The features are read from each member's `Cargo.toml`, so a
//! new feature is checked without touching this file.
#![allow(
    clippy::disallowed_types,
    reason = "xtask has no tokio runtime; std Instant only times the steps"
)]

use std::{fs, path::Path, process::Command, time::Instant};

use crate::{project_root, tidy};

/// One step: a title and the cargo arguments, with extra environment.
struct Step {
    title: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const STEPS: &[Step] = &[
    Step {
        title: "format",
        args: &["fmt", "--all", "--check"],
        env: &[],
    },
    Step {
        title: "clippy",
        args: &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ],
        env: &[],
    },
    Step {
        title: "tests",
        args: &["test", "--workspace", "--all-features"],
        // Tests of state a fleet shares start their own redis-server and PostgreSQL; in CI
        // they never skip.
        env: &[
            ("SOULBASE_REQUIRE_REDIS", "1"),
            ("SOULBASE_REQUIRE_POSTGRES", "1"),
            ("SOULBASE_REQUIRE_GO", "1"),
        ],
    },
    Step {
        title: "docs",
        args: &["doc", "--workspace", "--no-deps", "--all-features"],
        env: &[("RUSTDOCFLAGS", "-D warnings")],
    },
    // What a dependent's `cargo doc` sees: links to feature-gated items must not break.
    Step {
        title: "docs (default features)",
        args: &["doc", "--workspace", "--no-deps"],
        env: &[("RUSTDOCFLAGS", "-D warnings")],
    },
];

/// Where the "guides" step goes: after the last docs step.
const GUIDES_AFTER: &str = "docs (default features)";

/// Where the "features alone" step goes: after this step of [`STEPS`], whose artifacts it
/// shares.
const FEATURES_ALONE_AFTER: &str = "clippy";

/// Where the instruction budget's check goes: after this step of [`STEPS`]. It counts the
/// clients of the xtask running this (a debug build: the `debug` section of
/// `docs/bench-budget.json`), so it needs no build of its own.
const INSTRUCTIONS_AFTER: &str = "tests";

/// Servers the tests start throwaway instances of, and the tools they build with (Debian
/// package, program).
const SERVERS: &[(&str, &str)] = &[
    ("redis-server", "redis-server"),
    // Debian keeps PostgreSQL's programs out of PATH, in a directory per major version.
    ("postgresql", "/usr/lib/postgresql/*/bin/initdb"),
    // The instruction budget's counts (callgrind).
    ("valgrind", "valgrind"),
    // The delay server's interop with seed 003's own Go client.
    ("golang-go", "go"),
    // The agent's ping and trace tests build network namespaces and veth pairs with `ip`.
    ("iproute2", "ip"),
    // The agent's DNS forwarder tests start a real dnsmasq on loopback. The executable only
    // (`dnsmasq-base`): the `dnsmasq` package also installs a system service on port 53.
    ("dnsmasq-base", "dnsmasq"),
];

/// The chaos run of CI: short, with the default seed.
const CHAOS_ARGS: [&str; 2] = ["--secs", "5"];

/// Runs the steps; an error names the step that failed.
pub(crate) fn run() -> Result<(), String> {
    let root = project_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let started = Instant::now();
    step_banner("repository rules");
    tidy::check(&root).map_err(|problems| format!("tidy failed:\n{}", problems.join("\n")))?;
    step_banner("servers");
    crate::interop::install::ensure_debs(SERVERS)?;
    for step in STEPS {
        run_cargo(&cargo, &root, step.title, step.args, step.env)?;
        if step.title == GUIDES_AFTER {
            step_banner("guides");
            crate::guides::run()?;
        }
        if step.title == FEATURES_ALONE_AFTER {
            run_features_alone(&cargo, &root)?;
        }
        if step.title == INSTRUCTIONS_AFTER {
            step_banner("instructions");
            let t = Instant::now();
            crate::bench::run(&["--instructions".to_owned()])?;
            eprintln!(
                "xtask: instructions ok in {:.1}s",
                t.elapsed().as_secs_f64()
            );
            step_banner("price list");
            let t = Instant::now();
            crate::bench::run(&["--instructions", "--price-list"].map(str::to_owned))?;
            eprintln!("xtask: price list ok in {:.1}s", t.elapsed().as_secs_f64());
        }
    }
    step_banner("contract");
    let t = Instant::now();
    crate::contract::run(&[])?;
    eprintln!("xtask: contract ok in {:.1}s", t.elapsed().as_secs_f64());
    step_banner("chaos");
    let t = Instant::now();
    crate::chaos::run(&CHAOS_ARGS.map(str::to_owned))?;
    eprintln!("xtask: chaos ok in {:.1}s", t.elapsed().as_secs_f64());
    step_banner("interop");
    if std::env::var_os("XTASK_SKIP_INTEROP").is_some() {
        eprintln!("xtask: interop SKIPPED (XTASK_SKIP_INTEROP is set)");
    } else {
        let t = Instant::now();
        crate::interop::run(&[])?;
        eprintln!("xtask: interop ok in {:.1}s", t.elapsed().as_secs_f64());
    }
    eprintln!(
        "xtask: ci passed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Runs one step: `cargo <args>` in the workspace root, timed; an error names the step.
fn run_cargo(
    cargo: &str,
    root: &Path,
    title: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<(), String> {
    step_banner(title);
    let t = Instant::now();
    let status = Command::new(cargo)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(root)
        .status()
        .map_err(|e| format!("could not run cargo for step `{title}`: {e}"))?;
    if !status.success() {
        return Err(format!(
            "step `{title}` failed ({status}): cargo {}",
            args.join(" ")
        ));
    }
    eprintln!("xtask: {title} ok in {:.1}s", t.elapsed().as_secs_f64());
    Ok(())
}

/// `cargo xtask features`: the "features alone" step by itself.
pub(crate) fn features() -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    run_features_alone(&cargo, &project_root())
}

/// The "features alone" step: every build of [`features_alone`], stopping at the first failure.
fn run_features_alone(cargo: &str, root: &Path) -> Result<(), String> {
    step_banner("features alone");
    let t = Instant::now();
    let plan = features_alone(root)?;
    for args in &plan {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_build(cargo, root, "features alone", &args)?;
    }
    eprintln!(
        "xtask: features alone ok ({} builds) in {:.1}s",
        plan.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Runs `cargo <args>` as one build of a step, announced on a line of its own.
fn run_build(cargo: &str, root: &Path, title: &str, args: &[&str]) -> Result<(), String> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(cargo)
        .args(args)
        .current_dir(root)
        .status()
        .map_err(|e| format!("could not run cargo for step `{title}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "step `{title}` failed ({status}): cargo {}",
            args.join(" ")
        ))
    }
}

/// The builds of the "features alone" step, as cargo arguments: for each library member of
/// the workspace (every member but `xtask`), its lib linted alone without default features,
/// then with each of its features alone (`default` excepted).
fn features_alone(root: &Path) -> Result<Vec<Vec<String>>, String> {
    let mut plan = Vec::new();
    for (package, features) in member_features(root)? {
        let mut one = |features: Option<&str>| {
            let mut args: Vec<String> =
                ["clippy", "-p", &package, "--lib", "--no-default-features"]
                    .map(str::to_owned)
                    .to_vec();
            if let Some(f) = features {
                args.extend(["--features".to_owned(), f.to_owned()]);
            }
            args.extend(["--", "-D", "warnings"].map(str::to_owned));
            plan.push(args);
        };
        one(None);
        for feature in &features {
            one(Some(feature));
        }
    }
    Ok(plan)
}

/// Each library member's package name and features (`default` excepted, sorted), in the
/// order of `workspace.members`.
fn member_features(root: &Path) -> Result<Vec<(String, Vec<String>)>, String> {
    let workspace = read_manifest(&root.join("Cargo.toml"))?;
    let members = workspace
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(toml::Value::as_array)
        .ok_or("Cargo.toml: no workspace.members")?;
    let mut out = Vec::new();
    for member in members {
        let dir = member
            .as_str()
            .ok_or("Cargo.toml: a workspace member is not a string")?;
        if dir == "xtask" {
            continue;
        }
        let path = root.join(dir).join("Cargo.toml");
        let manifest = read_manifest(&path)?;
        let name = manifest
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(toml::Value::as_str)
            .ok_or_else(|| format!("{}: no package.name", path.display()))?;
        let mut features: Vec<String> = manifest
            .get("features")
            .and_then(toml::Value::as_table)
            .map(|t| t.keys().filter(|k| *k != "default").cloned().collect())
            .unwrap_or_default();
        features.sort();
        out.push((name.to_owned(), features));
    }
    Ok(out)
}

fn read_manifest(path: &Path) -> Result<toml::Table, String> {
    let text =
        fs::read_to_string(path).map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
    text.parse()
        .map_err(|e| format!("{}: is not valid TOML: {e}", path.display()))
}

fn step_banner(title: &str) {
    eprintln!("\nxtask: == {title} ==");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The step reads the real manifests: every library crate is linted alone, and each
    /// interceptor feature alone (the list below is the interceptors' own `[features]`).
    #[test]
    fn features_alone_covers_every_crate_and_interceptor_feature() {
        let plan = features_alone(&project_root()).expect("manifests parse");
        let lines: Vec<String> = plan.iter().map(|a| a.join(" ")).collect();
        for crate_name in [
            "soulbase-net-core",
            "soulbase-net-policy",
            "soulbase-net-runtime",
            "soulbase-net-interceptors",
            "soulbase-net-observe",
            "soulbase-net-testkit",
        ] {
            let bare = format!("clippy -p {crate_name} --lib --no-default-features -- -D warnings");
            assert!(lines.contains(&bare), "missing `{bare}` in {lines:#?}");
        }
        for feature in [
            "bearer",
            "cache",
            "crypto",
            "idempotency",
            "qos",
            "sandbox",
            "trace",
        ] {
            let alone = format!(
                "clippy -p soulbase-net-interceptors --lib --no-default-features \
                 --features {feature} -- -D warnings"
            );
            assert!(lines.contains(&alone), "missing `{alone}` in {lines:#?}");
        }
        assert!(
            !lines.iter().any(|l| l.contains("-p xtask")),
            "xtask is not a library: {lines:#?}"
        );
        assert!(
            !lines.iter().any(|l| l.contains("--features default")),
            "`default` is not a feature of its own: {lines:#?}"
        );
    }
}
