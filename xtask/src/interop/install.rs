//! Installing the peers: Debian packages through apt, httpbin, gunicorn, Hypercorn and aioquic
//! through pip into a
//! virtual environment kept next to the build (`target/interop/venv`). Runs outside the
//! network namespace, since the registries are not on loopback; each step is skipped when
//! what it installs is already there.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// Debian packages and a program each one provides.
const DEBS: &[(&str, &str)] = &[
    ("nginx-light", "nginx"),
    ("tinyproxy", "tinyproxy"),
    // A TLS front for tinyproxy: the https:// proxy.
    ("stunnel4", "stunnel4"),
    ("squid", "squid"),
    ("dnsmasq", "dnsmasq"),
    ("dnsutils", "dig"),
    // Tools the suite itself runs: the PKI, namespaces' `lo`, signals to daemons.
    ("openssl", "openssl"),
    ("iproute2", "ip"),
    ("procps", "kill"),
];

/// PyPI packages, pinned so every run drives the same peers: httpbin under gunicorn, and
/// under Hypercorn with aioquic for HTTP/3.
const PIP: &[&str] = &[
    "httpbin==0.10.4",
    "gunicorn==27.0.1",
    "hypercorn==0.18.0",
    "aioquic==1.7.2",
];

/// Installs the Debian packages of `debs` (package, a program it provides) that are missing,
/// then checks each program is there: a name is looked up on PATH, an absolute path may hold
/// one `*` for a directory name (`/usr/lib/postgresql/*/bin/initdb`: Debian keeps PostgreSQL's
/// programs out of PATH, in a directory per version).
pub(crate) fn ensure_debs(debs: &[(&str, &str)]) -> Result<(), String> {
    let missing: Vec<&str> = debs
        .iter()
        .filter(|(pkg, _)| !deb_installed(pkg))
        .map(|(pkg, _)| *pkg)
        .collect();
    if !missing.is_empty() {
        eprintln!("xtask: installing {}", missing.join(" "));
        if apt_install(&missing).is_err() {
            run(
                Command::new("apt-get").args(["update", "-q", LOCK_WAIT]),
                "apt-get update",
            )?;
            apt_install(&missing)?;
        }
    }
    for (pkg, program) in debs {
        let found = if program.starts_with('/') {
            path_matches(program)
        } else {
            find_program(program).is_some()
        };
        if !found {
            return Err(format!("{pkg} is installed but `{program}` is not there"));
        }
    }
    Ok(())
}

/// Installs what is missing; returns the virtual environment holding gunicorn, Hypercorn
/// and httpbin.
pub(crate) fn ensure(target_dir: &Path) -> Result<PathBuf, String> {
    ensure_debs(DEBS)?;
    let venv = target_dir.join("interop").join("venv");
    let gunicorn = venv.join("bin").join("gunicorn");
    let ready = gunicorn.exists()
        && Command::new(venv.join("bin").join("python"))
            .args(["-c", "import httpbin, gunicorn, hypercorn, aioquic"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !ready {
        eprintln!(
            "interop: installing {} into {}",
            PIP.join(" "),
            venv.display()
        );
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
        run(
            Command::new(&python).arg("-m").arg("venv").arg(&venv),
            "python3 -m venv",
        )?;
        run(
            Command::new(venv.join("bin").join("pip"))
                .args(["install", "-q", "--disable-pip-version-check"])
                .args(PIP),
            "pip install",
        )?;
    }
    Ok(venv)
}

/// Whether a file matches `pattern`: an absolute path, with at most one `*` standing for one
/// directory name.
fn path_matches(pattern: &str) -> bool {
    let Some((dir, rest)) = pattern.split_once("/*/") else {
        return Path::new(pattern).is_file();
    };
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .any(|entry| entry.path().join(rest).is_file())
}

fn deb_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// apt waits up to five minutes for another process holding the dpkg lock (an unattended
/// upgrade, another job's install) instead of failing at once.
const LOCK_WAIT: &str = "-oDPkg::Lock::Timeout=300";

fn apt_install(pkgs: &[&str]) -> Result<(), String> {
    run(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends", LOCK_WAIT])
            .args(pkgs)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install",
    )
}

/// The full path of `program` on PATH or in the sbin directories (where daemons live).
pub(crate) fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin"])
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file());
    found
}

/// Runs a command to completion; its output goes to the terminal.
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

#[cfg(test)]
mod tests {
    use super::path_matches;

    #[test]
    fn a_star_in_a_path_stands_for_one_directory_name() {
        let root = std::env::temp_dir().join(format!("xtask-path-matches-{}", std::process::id()));
        std::fs::create_dir_all(root.join("15").join("bin")).unwrap();
        std::fs::write(root.join("15").join("bin").join("initdb"), "").unwrap();
        let root_s = root.display();
        assert!(path_matches(&format!("{root_s}/*/bin/initdb")));
        assert!(path_matches(&format!("{root_s}/15/bin/initdb")));
        assert!(!path_matches(&format!("{root_s}/*/bin/postgres")));
        assert!(!path_matches(&format!("{root_s}/*/initdb")));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
