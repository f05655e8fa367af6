//! `cargo xtask guides`: each guide built as a reader would copy it. A doctest is not enough
//! for that: it sees every dependency of the workspace, so a guide whose `Cargo.toml` snippet
//! forgot a crate still passes. Here each guide's manifest block (the one fenced
//! ```` ```toml cargo ````) becomes the manifest of a crate of its own, outside the workspace,
//! and each of its Rust snippets an example of that crate, un-hidden as rustdoc shows it to
//! the compiler; the crate must compile (`cargo check`: types and names, no binaries to link
//! and store — the doctests run the snippets) with nothing but what the guide lists. The project's
//! crates, which a reader takes from git, are taken from this checkout (the same versions);
//! the workspace's `Cargo.lock` seeds the crate's, so registry crates resolve as the
//! workspace's do and their builds are shared with it.
//!
//! Then what a downstream team does in its first week, outside this workspace: the example
//! service `examples/shop` built as a crate of its own (its `workspace = true` dependencies
//! written out as a downstream manifest has them, so nothing comes from the workspace but
//! what it names), and the command-line tool installed with `cargo install --path
//! soulbase-net-cli` and run against the shop's policy file.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use tokio::time::Instant;

/// The guides, each with the manifest block a reader copies.
const GUIDES: &[&str] = &[
    "docs/from-reqwest.md",
    "docs/testing.md",
    "docs/fleet.md",
    "docs/observability.md",
];

/// The fence of a guide's manifest block.
const MANIFEST_FENCE: &str = "```toml cargo";

/// Runs the check for every guide.
pub(crate) fn run() -> Result<(), String> {
    let root = crate::project_root();
    let started = Instant::now();
    let mut failed = Vec::new();
    for guide in GUIDES {
        let text = std::fs::read_to_string(root.join(guide))
            .map_err(|e| format!("cannot read {guide}: {e}"))?;
        let name = Path::new(guide)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("guide")
            .replace('-', "_");
        let dir = root.join("target/guides").join(&name);
        let (manifest, snippets) = parse(&text).map_err(|e| format!("{guide}: {e}"))?;
        write_crate(&root, &dir, &name, &manifest, &snippets)
            .map_err(|e| format!("{guide}: {e}"))?;
        eprintln!(
            "xtask: guides: {guide}: {} snippets with its own dependencies only",
            snippets.len()
        );
        let status = cargo(&root)
            .args(["check", "--examples", "--manifest-path"])
            .arg(dir.join("Cargo.toml"))
            .status()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !status.success() {
            failed.push(*guide);
        }
    }
    if let Err(e) = shop(&root) {
        eprintln!("xtask: guides: {e}");
        failed.push("examples/shop outside the workspace");
    }
    if let Err(e) = install_cli(&root) {
        eprintln!("xtask: guides: {e}");
        failed.push("cargo install --path soulbase-net-cli");
    }
    if !failed.is_empty() {
        return Err(format!(
            "these do not compile as a downstream team would: {} (the crates are in target/guides/)",
            failed.join(", ")
        ));
    }
    eprintln!(
        "xtask: guides ok ({} guides) in {:.1}s",
        GUIDES.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `cargo` with the workspace's target directory (so builds are shared).
fn cargo(root: &Path) -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.env("CARGO_TARGET_DIR", root.join("target"));
    c
}

/// Builds `examples/shop` (library, binary and tests) as a crate outside the workspace.
fn shop(root: &Path) -> Result<(), String> {
    let from = root.join("examples/shop");
    let dir = root.join("target/guides/shop");
    let text = std::fs::read_to_string(from.join("Cargo.toml")).map_err(|e| e.to_string())?;
    let mut manifest: toml::Table = toml::from_str(&text).map_err(|e| e.to_string())?;
    let workspace: toml::Table = toml::from_str(
        &std::fs::read_to_string(root.join("Cargo.toml")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let shared = workspace
        .get("workspace")
        .and_then(|w| w.get("dependencies"))
        .and_then(toml::Value::as_table)
        .ok_or("the workspace has no [workspace.dependencies]")?;
    manifest.remove("lints");
    if let Some(package) = manifest
        .get_mut("package")
        .and_then(toml::Value::as_table_mut)
    {
        for (key, value) in [("version", "0.0.0"), ("edition", "2021")] {
            package.insert(key.into(), value.into());
        }
        package.remove("rust-version");
        package.remove("license");
    }
    for table in ["dependencies", "dev-dependencies"] {
        let Some(deps) = manifest.get_mut(table).and_then(toml::Value::as_table_mut) else {
            continue;
        };
        for (dep, spec) in deps.iter_mut() {
            let own = spec.as_table().cloned().unwrap_or_default();
            let mut written = match shared.get(dep) {
                Some(toml::Value::Table(t)) => t.clone(),
                Some(toml::Value::String(v)) => {
                    let mut t = toml::Table::new();
                    t.insert("version".into(), v.clone().into());
                    t
                }
                _ => return Err(format!("shop: `{dep}` is not a workspace dependency")),
            };
            if let Some(path) = written.get("path").and_then(toml::Value::as_str) {
                let path = root.join(path).display().to_string();
                written.insert("path".into(), path.into());
                written.remove("version");
            }
            if let Some(extra) = own.get("features").and_then(toml::Value::as_array) {
                let mut features = written
                    .get("features")
                    .and_then(toml::Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                features.extend(extra.iter().cloned());
                written.insert("features".into(), features.into());
            }
            *spec = toml::Value::Table(written);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["src", "tests"] {
        copy_dir(&from.join(sub), &dir.join(sub))?;
    }
    std::fs::copy(from.join("policy.toml"), dir.join("policy.toml"))
        .map_err(|e| format!("shop: {e}"))?;
    let text = format!(
        "# Generated by `cargo xtask guides` from examples/shop/Cargo.toml, written out.\n\
         [workspace]\n\n{}",
        toml::to_string(&manifest).map_err(|e| e.to_string())?
    );
    std::fs::write(dir.join("Cargo.toml"), text).map_err(|e| format!("shop: {e}"))?;
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock"))
        .map_err(|e| format!("shop: {e}"))?;
    eprintln!("xtask: guides: examples/shop as a crate outside the workspace");
    let status = cargo(root)
        .args(["check", "--all-targets", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err("examples/shop does not build outside the workspace".into())
    }
}

/// Copies a directory tree.
fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let entries = std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()))?;
        } else {
            std::fs::copy(&path, to.join(entry.file_name()))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// `cargo install --path soulbase-net-cli` (a debug build, into `target/cli-install`), then
/// the installed tool checks and explains the shop's policy file.
fn install_cli(root: &Path) -> Result<(), String> {
    let prefix = root.join("target/cli-install");
    eprintln!("xtask: guides: cargo install --path soulbase-net-cli");
    let status = cargo(root)
        .args(["install", "--debug", "--force", "--path"])
        .arg(root.join("soulbase-net-cli"))
        .arg("--root")
        .arg(&prefix)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err("cargo install --path soulbase-net-cli failed".into());
    }
    let tool = prefix.join("bin/soulbase-net");
    let policy = root.join("examples/shop/policy.toml");
    let run = |args: &[&str]| -> Result<String, String> {
        let out = Command::new(&tool)
            .args(args)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", tool.display()))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!(
                "soulbase-net {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    let policy = policy.display().to_string();
    let checked = run(&["policy", "check", &policy])?;
    if !checked.contains(": ok") {
        return Err(format!("soulbase-net policy check: {checked}"));
    }
    let explained = run(&[
        "policy",
        "explain",
        "--policy",
        &policy,
        "http://pricing.example.com/",
    ])?;
    if !explained.contains("effective policy") {
        return Err(format!("soulbase-net policy explain: {explained}"));
    }
    eprintln!(
        "xtask: guides: the installed soulbase-net checked and explained examples/shop/policy.toml"
    );
    Ok(())
}

/// The guide's manifest block and its Rust snippets (as the compiler sees them).
fn parse(text: &str) -> Result<(String, Vec<String>), String> {
    let mut manifest = None;
    let mut snippets = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else {
            continue;
        };
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        if line.trim_end() == MANIFEST_FENCE {
            if manifest.is_some() {
                return Err(format!("more than one {MANIFEST_FENCE} block"));
            }
            manifest = Some(body.join("\n"));
        } else if is_rust(info) {
            snippets.push(unhide(&body));
        }
    }
    let manifest = manifest.ok_or_else(|| format!("no {MANIFEST_FENCE} block"))?;
    Ok((manifest, snippets))
}

/// Whether rustdoc compiles a block with this info string (and this check builds it).
fn is_rust(info: &str) -> bool {
    let words: Vec<&str> = info
        .split([',', ' '])
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .collect();
    if words
        .iter()
        .any(|w| matches!(*w, "ignore" | "compile_fail" | "text"))
    {
        return false;
    }
    words
        .iter()
        .all(|w| matches!(*w, "rust" | "no_run" | "should_panic") || w.starts_with("edition"))
}

/// A snippet as rustdoc compiles it: hidden lines shown, wrapped in a `main` when it has none.
fn unhide(body: &[&str]) -> String {
    let code: Vec<String> = body
        .iter()
        .map(|l| {
            let t = l.trim_start();
            if t == "#" {
                String::new()
            } else if let Some(rest) = t.strip_prefix("# ") {
                let indent = &l[..l.len() - t.len()];
                format!("{indent}{rest}")
            } else if let Some(rest) = t.strip_prefix("##") {
                let indent = &l[..l.len() - t.len()];
                format!("{indent}#{rest}")
            } else {
                (*l).to_owned()
            }
        })
        .collect();
    let code = code.join("\n");
    if code.contains("fn main") {
        format!("#![allow(dead_code, unused)]\n{code}\n")
    } else {
        format!(
            "#![allow(dead_code, unused)]\nfn main() -> Result<(), Box<dyn std::error::Error>> {{\n{code}\n;\nOk(())\n}}\n"
        )
    }
}

/// Writes the guide's crate: its manifest (the project's crates from this checkout), the
/// workspace's lock file, and one example per snippet.
fn write_crate(
    root: &Path,
    dir: &Path,
    name: &str,
    manifest: &str,
    snippets: &[String],
) -> Result<(), String> {
    let mut doc: toml::Table =
        toml::from_str(manifest).map_err(|e| format!("its {MANIFEST_FENCE} block: {e}"))?;
    for table in ["dependencies", "dev-dependencies"] {
        let Some(deps) = doc.get_mut(table).and_then(toml::Value::as_table_mut) else {
            continue;
        };
        for (dep, spec) in deps.iter_mut() {
            if !dep.starts_with("soulbase-net") {
                continue;
            }
            let mut local = match spec {
                toml::Value::Table(t) => t.clone(),
                _ => toml::Table::new(),
            };
            for key in ["git", "version", "branch", "tag", "rev"] {
                local.remove(key);
            }
            let path: PathBuf = root.join(dep);
            if !path.join("Cargo.toml").exists() {
                return Err(format!(
                    "it lists `{dep}`, which is not a crate of this project"
                ));
            }
            local.insert("path".into(), path.display().to_string().into());
            *spec = toml::Value::Table(local);
        }
    }
    let deps = toml::to_string(&doc).map_err(|e| e.to_string())?;
    let examples = dir.join("examples");
    let _ = std::fs::remove_dir_all(&examples);
    std::fs::create_dir_all(&examples).map_err(|e| format!("{}: {e}", examples.display()))?;
    let cargo_toml = format!(
        "# Generated by `cargo xtask guides` from the guide's manifest block.\n\
         [package]\nname = \"guide-{}\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
         [workspace]\n\n{deps}",
        name.replace('_', "-")
    );
    let write = |path: PathBuf, text: &str| {
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    write(dir.join("Cargo.toml"), &cargo_toml)?;
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock"))
        .map_err(|e| format!("copying Cargo.lock: {e}"))?;
    let src = dir.join("src");
    std::fs::create_dir_all(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    write(src.join("lib.rs"), "")?;
    for (i, snippet) in snippets.iter().enumerate() {
        write(examples.join(format!("{name}_{:02}.rs", i + 1)), snippet)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippets_are_unhidden_and_wrapped_as_rustdoc_does() {
        let text = "intro\n```toml cargo\n[dependencies]\nx = \"1\"\n```\n\
                    ```rust\n# use a::b;\nlet x = 1;\n#\n## not hidden\n```\n\
                    ```rust,no_run\nfn main() {}\n```\n```text\nno\n```\n```rust,ignore\nno\n```\n";
        let (manifest, snippets) = parse(text).unwrap();
        assert_eq!(manifest, "[dependencies]\nx = \"1\"");
        assert_eq!(snippets.len(), 2);
        assert!(snippets[0].contains("use a::b;\nlet x = 1;\n\n# not hidden"));
        assert!(snippets[0].contains("fn main() -> Result<"));
        assert!(!snippets[1].contains("Result<"), "{}", snippets[1]);
        assert!(
            parse("```rust\nx\n```\n").is_err(),
            "a guide without a manifest"
        );
    }
}
