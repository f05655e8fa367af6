//! `cargo xtask ci`: every check CI runs, in order, stopping at the first failure. The interop
//! suite (root, package registries) runs last; `XTASK_SKIP_INTEROP=1` skips it on a machine
//! that cannot install packages.
#![allow(
    clippy::disallowed_types,
    reason = "xtask has no tokio runtime; std Instant only times the steps"
)]

use std::{process::Command, time::Instant};

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
        env: &[],
    },
    Step {
        title: "docs",
        args: &["doc", "--workspace", "--no-deps", "--all-features"],
        env: &[("RUSTDOCFLAGS", "-D warnings")],
    },
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
    for step in STEPS {
        step_banner(step.title);
        let t = Instant::now();
        let status = Command::new(&cargo)
            .args(step.args)
            .envs(step.env.iter().copied())
            .current_dir(&root)
            .status()
            .map_err(|e| format!("could not run cargo for step `{}`: {e}", step.title))?;
        if !status.success() {
            return Err(format!(
                "step `{}` failed ({status}): cargo {}",
                step.title,
                step.args.join(" ")
            ));
        }
        eprintln!(
            "xtask: {} ok in {:.1}s",
            step.title,
            t.elapsed().as_secs_f64()
        );
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

fn step_banner(title: &str) {
    eprintln!("\nxtask: == {title} ==");
}
