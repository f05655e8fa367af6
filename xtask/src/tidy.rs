//! Repository rules, checked by `#[test] fn tidy()` (so plain `cargo test` catches them) and
//! by `cargo xtask tidy`. Each problem is reported as `path[:line]: rule`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

mod modules;

/// The crate layering: what each library crate may depend on (normal and build
/// dependencies). `xtask` may depend on everything; nothing may depend on `xtask`.
/// `docs/architecture.md` states the same in its `layering` block, and
/// [`check_architecture`] keeps the two equal.
const LAYERS: &[(&str, &[&str])] = &[
    ("soulbase-net-core", &[]),
    ("soulbase-net-policy", &["soulbase-net-core"]),
    (
        "soulbase-net-store",
        &["soulbase-net-core", "soulbase-net-policy"],
    ),
    (
        "soulbase-net-runtime",
        &[
            "soulbase-net-core",
            "soulbase-net-policy",
            "soulbase-net-store",
        ],
    ),
    (
        "soulbase-net-interceptors",
        &[
            "soulbase-net-core",
            "soulbase-net-policy",
            "soulbase-net-store",
        ],
    ),
    ("soulbase-net-observe", &["soulbase-net-core"]),
    ("soulbase-net-testkit", &[]),
    (
        "soulbase-net-outbox",
        &["soulbase-net-core", "soulbase-net-store"],
    ),
    (
        "soulbase-net-delay",
        &[
            "soulbase-net-core",
            "soulbase-net-policy",
            "soulbase-net-store",
            "soulbase-net-runtime",
            "soulbase-net-outbox",
        ],
    ),
    (
        "soulbase-net-agent",
        &[
            "soulbase-net-core",
            "soulbase-net-policy",
            "soulbase-net-store",
            "soulbase-net-runtime",
            "soulbase-net-observe",
        ],
    ),
    (
        "soulbase-net",
        &[
            "soulbase-net-core",
            "soulbase-net-runtime",
            "soulbase-net-interceptors",
            "soulbase-net-observe",
        ],
    ),
    (
        "soulbase-net-cli",
        &[
            "soulbase-net-core",
            "soulbase-net-policy",
            "soulbase-net-runtime",
            "soulbase-net-store",
            "soulbase-net-outbox",
        ],
    ),
];

/// The example services, each a workspace member in `examples/<name>/` written as a
/// downstream service would be, so that its own tests run in `cargo test`: what each may
/// depend on (the crates a service builds on; the testkit as a dev-dependency only, as for any
/// crate). They are held to the members' manifest and source rules, must not be published, and
/// `docs/architecture.md` states their layer too.
const EXAMPLES: &[(&str, &[&str])] = &[("shop", &["soulbase-net"])];

/// Where the example services live.
const EXAMPLES_DIR: &str = "examples";

/// Crates that must never be in the dependency tree (one crypto provider: ring).
const FORBIDDEN_PACKAGES: &[&str] = &["aws-lc-rs", "aws-lc-sys", "aws-lc-fips-sys"];

/// The only file allowed to call rustls' `dangerous()` (certificate pinning).
const DANGEROUS_ALLOWED: &str = "soulbase-net-runtime/src/tls/pin.rs";

/// The call the rule looks for, spelled so that this file does not match itself.
const DANGEROUS_CALL: &str = concat!(".danger", "ous()");

/// The repository's architecture document, checked by [`check_architecture`].
const ARCHITECTURE: &str = "docs/architecture.md";

/// The opening line of the fenced block in [`ARCHITECTURE`] that states the layering.
const LAYERING_FENCE: &str = "```layering";

/// The crate prefix the layering block leaves out (`runtime` is `soulbase-net-runtime`).
const CRATE_PREFIX: &str = "soulbase-net-";

/// What a path named in backticks in [`ARCHITECTURE`] may end with: a file of one of these
/// kinds, or `/` for a directory. Anything else in backticks (`gzip/br`) is not a path.
const PATH_ENDINGS: &[&str] = &[".rs", ".md", ".toml", ".json", "/"];

/// Runs every rule; `Err` lists every problem found.
pub(crate) fn check(root: &Path) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let meta = match cargo_metadata(root) {
        Ok(meta) => {
            check_layering(&meta, &mut problems);
            check_forbidden_packages(&meta, &mut problems);
            Some(meta)
        }
        Err(e) => {
            problems.push(format!("Cargo.toml: cargo metadata failed: {e}"));
            None
        }
    };
    let members = member_dirs(root);
    for dir in &members {
        check_manifest(root, dir, &mut problems);
    }
    for file in rust_files(root) {
        check_source(root, &file, &mut problems);
    }
    modules::check_module_cycles(root, &mut problems);
    check_error_codes(&mut problems);
    check_architecture(root, meta.as_ref(), &mut problems);
    if problems.is_empty() {
        Ok(())
    } else {
        problems.sort();
        Err(problems)
    }
}

fn cargo_metadata(root: &Path) -> Result<Value, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(root)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

fn workspace_packages(meta: &Value) -> Vec<&Value> {
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(id)))
        .collect()
}

fn check_layering(meta: &Value, problems: &mut Vec<String>) {
    let layers: BTreeMap<&str, &[&str]> = LAYERS.iter().chain(EXAMPLES).copied().collect();
    let packages = workspace_packages(meta);
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    for expected in layers.keys().chain(std::iter::once(&"xtask")) {
        if !names.contains(expected) {
            problems.push(format!(
                "Cargo.toml: workspace member `{expected}` is missing"
            ));
        }
    }
    for pkg in packages {
        let Some(name) = pkg["name"].as_str() else {
            continue;
        };
        for dep in pkg["dependencies"].as_array().into_iter().flatten() {
            let Some(dep_name) = dep["name"].as_str() else {
                continue;
            };
            if !names.contains(dep_name) {
                continue;
            }
            let kind = dep["kind"].as_str().unwrap_or("normal");
            let manifest = manifest_path(name);
            if dep_name == "xtask" {
                problems.push(format!("{manifest}: depends on xtask, a dev tool"));
                continue;
            }
            if name == "xtask" {
                continue;
            }
            let allowed = layers.get(name).copied().unwrap_or(&[]);
            if name == "soulbase-net-testkit" && !allowed.contains(&dep_name) {
                problems.push(format!(
                    "{manifest}: testkit depends on `{dep_name}` ({kind}); it is the other side of the wire and may use only {allowed:?}, dev-dependencies included"
                ));
                continue;
            }
            if kind == "dev" {
                continue;
            }
            if !allowed.contains(&dep_name) {
                problems.push(format!(
                    "{manifest}: depends on `{dep_name}`, which the layering of {ARCHITECTURE} forbids (allowed: {allowed:?})"
                ));
            }
        }
    }
}

fn check_forbidden_packages(meta: &Value, problems: &mut Vec<String>) {
    for pkg in meta["packages"].as_array().into_iter().flatten() {
        let name = pkg["name"].as_str().unwrap_or_default();
        if FORBIDDEN_PACKAGES.contains(&name) {
            problems.push(format!(
                "Cargo.lock: `{name}` is in the dependency tree; ring is the only crypto provider ({ARCHITECTURE})"
            ));
        }
    }
}

/// A member's manifest, relative to the repository root.
fn manifest_path(name: &str) -> String {
    if EXAMPLES.iter().any(|(example, _)| *example == name) {
        format!("{EXAMPLES_DIR}/{name}/Cargo.toml")
    } else {
        format!("{name}/Cargo.toml")
    }
}

fn member_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = LAYERS
        .iter()
        .map(|(name, _)| root.join(name))
        .chain(std::iter::once(root.join("xtask")))
        .chain(
            EXAMPLES
                .iter()
                .map(|(name, _)| root.join(EXAMPLES_DIR).join(name)),
        )
        .collect();
    dirs.sort();
    dirs
}

fn check_manifest(root: &Path, dir: &Path, problems: &mut Vec<String>) {
    let path = dir.join("Cargo.toml");
    let shown = rel(root, &path);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            problems.push(format!("{shown}: cannot be read: {e}"));
            return;
        }
    };
    let manifest: toml::Table = match text.parse() {
        Ok(m) => m,
        Err(e) => {
            problems.push(format!("{shown}: is not valid TOML: {e}"));
            return;
        }
    };
    let lints_inherited = manifest
        .get("lints")
        .and_then(|l| l.get("workspace"))
        .and_then(toml::Value::as_bool)
        .unwrap_or(false);
    if !lints_inherited {
        problems.push(format!("{shown}: must have `[lints] workspace = true`"));
    }
    let publishable = manifest
        .get("package")
        .and_then(|p| p.get("publish"))
        .and_then(toml::Value::as_bool)
        .unwrap_or(true);
    if dir.starts_with(root.join(EXAMPLES_DIR)) && publishable {
        problems.push(format!(
            "{shown}: an example service must have `publish = false`"
        ));
    }
    for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
        let Some(deps) = manifest.get(section).and_then(toml::Value::as_table) else {
            continue;
        };
        for (dep, spec) in deps {
            let inherited = spec
                .get("workspace")
                .and_then(toml::Value::as_bool)
                .unwrap_or(false);
            if !inherited {
                problems.push(format!(
                    "{shown}: [{section}] `{dep}` must come from [workspace.dependencies] (`{dep}.workspace = true`)"
                ));
            }
        }
    }
}

/// Every `.rs` file under a member's `src/`, `tests/`, `benches/` and `examples/`.
fn rust_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in member_dirs(root) {
        for sub in ["src", "tests", "benches", "examples"] {
            collect_rs(&dir.join(sub), &mut files);
        }
    }
    files.sort();
    files
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn check_source(root: &Path, file: &Path, problems: &mut Vec<String>) {
    let shown = rel(root, file);
    let Ok(text) = fs::read_to_string(file) else {
        problems.push(format!("{shown}: cannot be read"));
        return;
    };
    let in_src = shown.contains("/src/");
    // A module of a test binary (tests/area/x.rs) may skip `//!`; its root may not.
    let is_test_root = shown.ends_with("/main.rs") || shown.matches('/').count() == 2;
    let is_test_module = !(in_src || is_test_root);
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let is_unit_test_file = shown.ends_with("/tests.rs");
    if !first.starts_with("//!") && !is_test_module && !is_unit_test_file {
        problems.push(format!(
            "{shown}:1: a crate root or module must start with a `//!` doc line"
        ));
    }
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        if code.contains(DANGEROUS_CALL) && shown != DANGEROUS_ALLOWED {
            problems.push(format!(
                "{shown}:{line_no}: rustls `dangerous()` is only allowed in {DANGEROUS_ALLOWED}"
            ));
        }
        if code.starts_with("#[ignore") {
            problems.push(format!(
                "{shown}:{line_no}: no ignored tests are left behind"
            ));
        }
        if code.starts_with("#[should_panic") {
            problems.push(format!(
                "{shown}:{line_no}: assert on an error's kind or code instead of #[should_panic]"
            ));
        }
    }
}

fn check_error_codes(problems: &mut Vec<String>) {
    use soulbase_net_core::{ErrorCode, ErrorKind, Phase};
    let mut seen = BTreeSet::new();
    for code in ErrorCode::ALL {
        if !seen.insert(code.as_str()) {
            problems.push(format!(
                "soulbase-net-core/src/error/code.rs: error code `{}` is not unique",
                code.as_str()
            ));
        }
        let shape_ok = code.as_str().split_once('.').is_some_and(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && code
                    .as_str()
                    .bytes()
                    .all(|c| c.is_ascii_uppercase() || c == b'.' || c == b'_')
        });
        if !shape_ok {
            problems.push(format!(
                "soulbase-net-core/src/error/code.rs: error code `{}` is not of the form DOMAIN.NAME",
                code.as_str()
            ));
        }
    }
    let mut labels = BTreeSet::new();
    let kinds = ErrorKind::ALL_SIMPLE
        .into_iter()
        .filter(|k| !k.is_timeout())
        .chain(Phase::ALL.into_iter().map(ErrorKind::Timeout));
    for kind in kinds {
        if !labels.insert(kind.label()) {
            problems.push(format!(
                "soulbase-net-core/src/error/kind.rs: error label `{}` is not unique",
                kind.label()
            ));
        }
    }
}

/// `docs/architecture.md` must state the layering tidy enforces, in its `layering` block, and
/// every path it names in backticks must exist in the repository, so the document cannot go
/// stale without tidy saying so. With the workspace's metadata, the block must also name every
/// workspace member and nothing else, and each of its arrows must be a declared dependency.
fn check_architecture(root: &Path, meta: Option<&Value>, problems: &mut Vec<String>) {
    let text = match fs::read_to_string(root.join(ARCHITECTURE)) {
        Ok(text) => text,
        Err(e) => {
            problems.push(format!("{ARCHITECTURE}: cannot be read: {e}"));
            return;
        }
    };
    check_architecture_text(&text, &|path| root.join(path).exists(), problems);
    // A block that does not parse was reported above.
    if let (Some(meta), Some(layering)) = (meta, parse_layering(&text, &mut Vec::new())) {
        check_block_against_workspace(&layering, &Workspace::from_metadata(meta), problems);
    }
}

/// A crate's name in the layering block's terms: `runtime` for `soulbase-net-runtime`.
fn short_name(name: &str) -> &str {
    name.strip_prefix(CRATE_PREFIX).unwrap_or(name)
}

/// The layering as tidy enforces it, in the block's terms: short crate names, and `*` for
/// "everything" (xtask).
fn enforced_layering() -> BTreeMap<String, BTreeSet<String>> {
    let short = |name: &str| short_name(name).to_owned();
    LAYERS
        .iter()
        .chain(EXAMPLES)
        .map(|(name, deps)| (short(name), deps.iter().map(|d| short(d)).collect()))
        .chain(std::iter::once((
            "xtask".to_owned(),
            BTreeSet::from(["*".to_owned()]),
        )))
        .collect()
}

/// The checks of [`check_architecture`] on the document's `text`; `exists` answers for a path
/// relative to the repository root.
fn check_architecture_text(text: &str, exists: &dyn Fn(&str) -> bool, problems: &mut Vec<String>) {
    check_layering_block(text, problems);
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // The odd pieces between backticks are code spans.
        for span in line.split('`').skip(1).step_by(2) {
            if !is_path(span) {
                continue;
            }
            let line_no = n + 1;
            if span.starts_with('/') || span.split('/').any(|seg| seg == "..") {
                problems.push(format!(
                    "{ARCHITECTURE}:{line_no}: `{span}` is outside the repository; name files in it"
                ));
            } else if !exists(span.trim_end_matches('/')) {
                problems.push(format!(
                    "{ARCHITECTURE}:{line_no}: names `{span}`, which does not exist"
                ));
            }
        }
    }
}

/// Whether a code span is a path (`soulbase-net-runtime/src/pool.rs`, `docs/`): no spaces,
/// a `/`, and a file kind of [`PATH_ENDINGS`].
fn is_path(span: &str) -> bool {
    span.contains('/')
        && span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        && PATH_ENDINGS.iter().any(|end| span.ends_with(end))
}

/// The document's `layering` block as written.
#[derive(Debug)]
struct Layering {
    /// The 1-based line of the block's opening fence.
    fence: usize,
    /// Each crate the block states, with its 1-based line and what it may depend on.
    stated: BTreeMap<String, (usize, BTreeSet<String>)>,
}

/// Parses the document's one `layering` block (`crate -> dep, dep`, `#` comments). `None`
/// when there is no usable block; what is wrong with it goes to `problems`.
fn parse_layering(text: &str, problems: &mut Vec<String>) -> Option<Layering> {
    let lines: Vec<&str> = text.lines().collect();
    let starts: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim() == LAYERING_FENCE)
        .map(|(i, _)| i)
        .collect();
    let start = match starts.as_slice() {
        [start] => *start,
        [] => {
            problems.push(format!(
                "{ARCHITECTURE}: has no {LAYERING_FENCE} block stating the crate layering"
            ));
            return None;
        }
        [_, second, ..] => {
            problems.push(format!(
                "{ARCHITECTURE}:{}: a second {LAYERING_FENCE} block; state the layering once",
                second + 1
            ));
            return None;
        }
    };
    let mut stated: BTreeMap<String, (usize, BTreeSet<String>)> = BTreeMap::new();
    let mut closed = false;
    for (i, raw) in lines.iter().enumerate().skip(start + 1) {
        let line_no = i + 1;
        if raw.trim_start().starts_with("```") {
            closed = true;
            break;
        }
        let line = raw.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let Some((name, deps)) = line.split_once("->") else {
            problems.push(format!(
                "{ARCHITECTURE}:{line_no}: `{line}` is not of the form `crate -> crate, crate`"
            ));
            continue;
        };
        let deps: BTreeSet<String> = deps
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(str::to_owned)
            .collect();
        if stated
            .insert(name.trim().to_owned(), (line_no, deps))
            .is_some()
        {
            problems.push(format!(
                "{ARCHITECTURE}:{line_no}: `{}` is stated twice in the layering",
                name.trim()
            ));
        }
    }
    if !closed {
        problems.push(format!(
            "{ARCHITECTURE}:{}: the {LAYERING_FENCE} block is not closed",
            start + 1
        ));
        return None;
    }
    Some(Layering {
        fence: start + 1,
        stated,
    })
}

/// Compares the document's `layering` block with [`enforced_layering`].
fn check_layering_block(text: &str, problems: &mut Vec<String>) {
    let Some(Layering { fence, stated }) = parse_layering(text, problems) else {
        return;
    };
    // `core ->` for a crate that may depend on nothing, `policy -> core` otherwise.
    let arrow = |name: &str, deps: &BTreeSet<String>| {
        let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
        format!("{name} -> {}", deps.join(", "))
            .trim_end()
            .to_owned()
    };
    let enforced = enforced_layering();
    for (name, deps) in &enforced {
        match stated.get(name) {
            None => problems.push(format!(
                "{ARCHITECTURE}:{fence}: the layering has no line for `{name}`; tidy enforces `{}`",
                arrow(name, deps)
            )),
            Some((line_no, said)) if said != deps => problems.push(format!(
                "{ARCHITECTURE}:{line_no}: states `{}`; tidy enforces `{}`",
                arrow(name, said),
                arrow(name, deps)
            )),
            Some(_) => {}
        }
    }
    for (name, (line_no, _)) in &stated {
        if !enforced.contains_key(name) {
            problems.push(format!(
                "{ARCHITECTURE}:{line_no}: states a layer for `{name}`, a crate tidy does not know"
            ));
        }
    }
}

/// The workspace as `cargo metadata` declares it, in the layering block's terms (short names).
#[derive(Debug, Default)]
struct Workspace {
    /// Every workspace member: library crates, binaries, examples and xtask.
    members: BTreeSet<String>,
    /// What each member declares on other members as a normal or build dependency, optional
    /// (behind a feature) or not. Dev-dependencies are not edges of the layering.
    deps: BTreeMap<String, BTreeSet<String>>,
}

impl Workspace {
    fn from_metadata(meta: &Value) -> Self {
        let packages = workspace_packages(meta);
        let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
        let mut ws = Workspace::default();
        for pkg in packages {
            let Some(name) = pkg["name"].as_str() else {
                continue;
            };
            ws.members.insert(short_name(name).to_owned());
            let deps = ws.deps.entry(short_name(name).to_owned()).or_default();
            for dep in pkg["dependencies"].as_array().into_iter().flatten() {
                let Some(dep_name) = dep["name"].as_str() else {
                    continue;
                };
                if names.contains(dep_name) && dep["kind"].as_str() != Some("dev") {
                    deps.insert(short_name(dep_name).to_owned());
                }
            }
        }
        ws
    }
}

/// Keeps the block true to the workspace: every crate it names (on either side of an arrow)
/// is a workspace member, every member has a line, and every arrow is a dependency the crate
/// declares (`*`, "everything", is exempt). An arrow that no manifest uses is a sentence of
/// the document that is not true.
fn check_block_against_workspace(layering: &Layering, ws: &Workspace, problems: &mut Vec<String>) {
    for (name, (line_no, deps)) in &layering.stated {
        if !ws.members.contains(name) {
            problems.push(format!(
                "{ARCHITECTURE}:{line_no}: the layering names `{name}`, which is not a workspace member"
            ));
            continue;
        }
        let declared = ws.deps.get(name);
        for dep in deps.iter().filter(|d| *d != "*") {
            if !ws.members.contains(dep) {
                problems.push(format!(
                    "{ARCHITECTURE}:{line_no}: the layering allows `{name} -> {dep}`, but `{dep}` is not a workspace member"
                ));
            } else if !declared.is_some_and(|d| d.contains(dep)) {
                problems.push(format!(
                    "{ARCHITECTURE}:{line_no}: the layering allows `{name} -> {dep}` but {name} does not depend on {dep} (normal or build, optional or not); remove the arrow"
                ));
            }
        }
    }
    for member in &ws.members {
        if !layering.stated.contains_key(member) {
            problems.push(format!(
                "{ARCHITECTURE}:{}: workspace member `{member}` has no line in the layering",
                layering.fence
            ));
        }
    }
}

fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tidy() {
        if let Err(problems) = check(&crate::project_root()) {
            panic!("repository rules broken:\n{}", problems.join("\n"));
        }
    }

    #[test]
    fn layering_violations_are_reported() {
        let meta = serde_json::json!({
            "workspace_members": ["a", "b", "c"],
            "packages": [
                {"id": "a", "name": "soulbase-net-core", "dependencies": [
                    {"name": "soulbase-net-runtime", "kind": null}]},
                {"id": "b", "name": "soulbase-net-testkit", "dependencies": [
                    {"name": "soulbase-net-runtime", "kind": "dev"}]},
                {"id": "c", "name": "soulbase-net-runtime", "dependencies": [
                    {"name": "soulbase-net-testkit", "kind": "dev"},
                    {"name": "soulbase-net-policy", "kind": null}]},
            ]
        });
        let mut problems = Vec::new();
        check_layering(&meta, &mut problems);
        let text = problems.join("\n");
        assert!(
            text.contains("soulbase-net-core/Cargo.toml: depends on `soulbase-net-runtime`"),
            "{text}"
        );
        assert!(
            text.contains("testkit depends on `soulbase-net-runtime` (dev)"),
            "{text}"
        );
        // runtime -> testkit as a dev-dependency is how runtime tests reach real servers.
        assert!(!text.contains("soulbase-net-runtime/Cargo.toml"), "{text}");
    }

    #[test]
    fn an_example_depends_on_what_a_service_would() {
        let meta = serde_json::json!({
            "workspace_members": ["s", "t", "r", "o", "x"],
            "packages": [
                {"id": "s", "name": "shop", "dependencies": [
                    {"name": "soulbase-net", "kind": null},
                    {"name": "soulbase-net-testkit", "kind": "dev"},
                    {"name": "soulbase-net-outbox", "kind": null},
                    {"name": "xtask", "kind": "dev"}]},
                {"id": "t", "name": "soulbase-net-testkit", "dependencies": []},
                {"id": "r", "name": "soulbase-net", "dependencies": []},
                {"id": "o", "name": "soulbase-net-outbox", "dependencies": []},
                {"id": "x", "name": "xtask", "dependencies": []},
            ]
        });
        let mut problems = Vec::new();
        check_layering(&meta, &mut problems);
        let text = problems.join("\n");
        let shop: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("examples/shop/"))
            .collect();
        assert_eq!(shop.len(), 2, "{text}");
        assert!(
            text.contains("examples/shop/Cargo.toml: depends on `soulbase-net-outbox`"),
            "{text}"
        );
        assert!(
            text.contains("examples/shop/Cargo.toml: depends on xtask"),
            "{text}"
        );
    }

    /// A document with `layering` in its block, naming `soulbase-net-runtime/src/pool.rs`
    /// before it and `extra` after it (on the last line).
    fn architecture_doc(layering: &str, extra: &str) -> String {
        format!(
            "The pool: `soulbase-net-runtime/src/pool.rs`.\n\n{LAYERING_FENCE}\n{layering}```\n\n{extra}\n"
        )
    }

    fn enforced_block() -> String {
        enforced_layering()
            .iter()
            .map(|(name, deps)| {
                let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
                format!("{name} -> {}   # a comment\n", deps.join(", "))
            })
            .collect()
    }

    fn architecture_problems(text: &str) -> Vec<String> {
        let exists = |path: &str| {
            [
                "soulbase-net-runtime/src/pool.rs",
                "soulbase-net-runtime/src",
            ]
            .contains(&path)
        };
        let mut problems = Vec::new();
        check_architecture_text(text, &exists, &mut problems);
        problems
    }

    #[test]
    fn tidy_architecture_doc_that_matches_passes() {
        let extra = "Code in `soulbase-net-runtime/src/` and `Call::view`; `gzip/br` is no path.\n\
                     ```\n`missing/in/a/block.rs`\n```";
        let problems = architecture_problems(&architecture_doc(&enforced_block(), extra));
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn tidy_architecture_doc_naming_a_missing_file_fails() {
        let extra = "Moved: `soulbase-net-runtime/src/client/gone.rs`, `../shared/DESIGN.md`.";
        let text = architecture_doc(&enforced_block(), extra);
        let problems = architecture_problems(&text).join("\n");
        let line = text.lines().count();
        assert!(
            problems.contains(&format!(
                "docs/architecture.md:{line}: names `soulbase-net-runtime/src/client/gone.rs`, which does not exist"
            )),
            "{problems}"
        );
        assert!(
            problems.contains("`../shared/DESIGN.md` is outside the repository"),
            "{problems}"
        );
    }

    #[test]
    fn tidy_architecture_doc_with_another_layering_fails() {
        // observe gains policy, outbox is left out, testkit gains core, and a crate tidy does
        // not know appears.
        let layering = enforced_block()
            .replace("observe -> core", "observe -> core, policy")
            .lines()
            .filter(|l| !l.starts_with("outbox"))
            .map(|l| {
                if l.starts_with("testkit") {
                    "testkit -> core"
                } else {
                    l
                }
            })
            .chain(["mailer -> core, policy"])
            .collect::<Vec<_>>()
            .join("\n")
            + "\n";
        let problems = architecture_problems(&architecture_doc(&layering, "")).join("\n");
        assert!(
            problems.contains("states `observe -> core, policy`; tidy enforces `observe -> core`"),
            "{problems}"
        );
        assert!(
            problems.contains(
                "the layering has no line for `outbox`; tidy enforces `outbox -> core, store`"
            ),
            "{problems}"
        );
        assert!(
            problems.contains("states `testkit -> core`; tidy enforces `testkit ->`"),
            "{problems}"
        );
        assert!(
            problems.contains("states a layer for `mailer`, a crate tidy does not know"),
            "{problems}"
        );
        let none = architecture_problems("no block here\n").join("\n");
        assert!(none.contains("has no ```layering block"), "{none}");
    }

    /// A workspace of `members`, each with the normal dependencies listed.
    fn workspace(members: &[(&str, &[&str])]) -> Workspace {
        Workspace {
            members: members.iter().map(|(m, _)| (*m).to_owned()).collect(),
            deps: members
                .iter()
                .map(|(m, deps)| {
                    let deps = deps.iter().map(|d| (*d).to_owned()).collect();
                    ((*m).to_owned(), deps)
                })
                .collect(),
        }
    }

    fn block_problems(block: &str, ws: &Workspace) -> String {
        let text = architecture_doc(block, "");
        let mut problems = Vec::new();
        let layering = parse_layering(&text, &mut problems).expect("the block parses");
        assert!(problems.is_empty(), "{problems:?}");
        check_block_against_workspace(&layering, ws, &mut problems);
        problems.join("\n")
    }

    #[test]
    fn tidy_layering_block_parses_crates_arrows_and_comments() {
        let text = architecture_doc(
            "core ->\npolicy -> core   # a comment, core\n\nx -> *\n",
            "",
        );
        let mut problems = Vec::new();
        let layering = parse_layering(&text, &mut problems).expect("the block parses");
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(layering.fence, 3);
        let stated: Vec<(&str, usize, Vec<&str>)> = layering
            .stated
            .iter()
            .map(|(name, (line, deps))| {
                (
                    name.as_str(),
                    *line,
                    deps.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            stated,
            [
                ("core", 4, vec![]),
                ("policy", 5, vec!["core"]),
                ("x", 7, vec!["*"])
            ]
        );
        let unclosed = format!("{LAYERING_FENCE}\ncore ->\n");
        assert!(parse_layering(&unclosed, &mut problems).is_none());
        assert!(
            problems.join("\n").contains("is not closed"),
            "{problems:?}"
        );
    }

    #[test]
    fn tidy_layering_block_names_every_member_and_nothing_else() {
        let ws = workspace(&[
            ("core", &[]),
            ("policy", &["core"]),
            ("observe", &["core"]),
            ("xtask", &["core", "policy", "observe"]),
        ]);
        let full = "core ->\npolicy -> core\nobserve -> core\nxtask -> *\n";
        assert_eq!(block_problems(full, &ws), "");
        // observe is left out, mailer is no member, and policy may use a crate that is none.
        let block = "core ->\npolicy -> core, ghost\nmailer -> core\nxtask -> *\n";
        let problems = block_problems(block, &ws);
        assert!(
            problems.contains("docs/architecture.md:3: workspace member `observe` has no line"),
            "{problems}"
        );
        assert!(
            problems.contains("docs/architecture.md:6: the layering names `mailer`, which is not a workspace member"),
            "{problems}"
        );
        assert!(
            problems.contains("allows `policy -> ghost`, but `ghost` is not a workspace member"),
            "{problems}"
        );
        assert_eq!(problems.lines().count(), 3, "{problems}");
    }

    #[test]
    fn tidy_layering_block_arrow_without_a_dependency_fails() {
        let ws = workspace(&[("core", &[]), ("policy", &[]), ("outbox", &["core"])]);
        let problems = block_problems("core ->\npolicy ->\noutbox -> core, policy\n", &ws);
        assert_eq!(
            problems,
            "docs/architecture.md:6: the layering allows `outbox -> policy` but outbox does not depend on policy (normal or build, optional or not); remove the arrow"
        );
    }

    #[test]
    fn tidy_workspace_edges_count_optional_and_build_dependencies_not_dev_ones() {
        let meta = serde_json::json!({
            "workspace_members": ["c", "p", "r", "i"],
            "packages": [
                {"id": "c", "name": "soulbase-net-core", "dependencies": []},
                {"id": "p", "name": "soulbase-net-policy", "dependencies": [
                    {"name": "soulbase-net-core", "kind": "build", "optional": false}]},
                {"id": "r", "name": "soulbase-net-runtime", "dependencies": [
                    {"name": "soulbase-net-interceptors", "kind": null, "optional": true},
                    {"name": "soulbase-net-policy", "kind": "dev", "optional": false},
                    {"name": "serde", "kind": null, "optional": false}]},
                {"id": "i", "name": "soulbase-net-interceptors", "dependencies": []},
                {"id": "elsewhere", "name": "not-a-member", "dependencies": []},
            ]
        });
        let ws = Workspace::from_metadata(&meta);
        let members: Vec<&str> = ws.members.iter().map(String::as_str).collect();
        assert_eq!(members, ["core", "interceptors", "policy", "runtime"]);
        let block = "core ->\npolicy -> core\nruntime -> interceptors, policy\ninterceptors ->\n";
        let problems = block_problems(block, &ws);
        assert_eq!(
            problems,
            "docs/architecture.md:6: the layering allows `runtime -> policy` but runtime does not depend on policy (normal or build, optional or not); remove the arrow"
        );
    }

    #[test]
    fn forbidden_crypto_provider_is_reported() {
        let meta = serde_json::json!({"packages": [{"name": "aws-lc-rs"}, {"name": "ring"}]});
        let mut problems = Vec::new();
        check_forbidden_packages(&meta, &mut problems);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("aws-lc-rs"));
    }

    #[test]
    fn source_rules_report_path_and_line() {
        let dir = std::env::temp_dir().join(format!("xtask-tidy-{}", std::process::id()));
        let src = dir.join("soulbase-net-core/src");
        fs::create_dir_all(&src).unwrap();
        let file = src.join("bad.rs");
        let text = format!("use x;\n#[ignore]\nfn f() {{ cfg{DANGEROUS_CALL}; }}\n");
        fs::write(&file, text).unwrap();
        let mut problems = Vec::new();
        check_source(&dir, &file, &mut problems);
        fs::remove_dir_all(&dir).unwrap();
        let text = problems.join("\n");
        assert!(
            text.contains(
                "soulbase-net-core/src/bad.rs:1: a crate root or module must start with a `//!`"
            ),
            "{text}"
        );
        assert!(
            text.contains("soulbase-net-core/src/bad.rs:2: no ignored tests"),
            "{text}"
        );
        assert!(
            text.contains("soulbase-net-core/src/bad.rs:3: rustls `dangerous()`"),
            "{text}"
        );
    }
}
