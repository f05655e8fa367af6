//! `cargo xtask interop [--json PATH]`: the client against real servers nobody here wrote —
//! nginx, httpbin (gunicorn, and Hypercorn with aioquic for HTTP/3), tinyproxy (also behind
//! stunnel, as an https:// proxy), squid and dnsmasq — on loopback.
//!
//! Outside any namespace it installs what is missing (Debian packages, a Python virtual
//! environment), then runs itself again as `unshare -n -p -f --mount-proc --kill-child --
//! <exe> interop --inside`: a network namespace whose only interface is `lo`, so neither a
//! peer nor a guard bug can send traffic off the machine, and a PID namespace whose first
//! process is the suite, so that when it dies — even by SIGKILL, or when `unshare` itself is
//! killed — the kernel kills every peer with it. Inside, it makes a throwaway PKI, writes each
//! peer's config under a temp directory, starts the peers, runs the scenarios and stops every
//! peer by its process group. Where a PID namespace is unavailable it uses the network
//! namespace alone (peers then outlive a killed run); where namespaces are unavailable at all it
//! runs on the host's loopback and skips the scenarios that name private addresses, saying so.
#![allow(clippy::print_stdout, reason = "a command-line report")]
#![allow(
    clippy::disallowed_types,
    reason = "std Instant times the install and the run for the report"
)]

mod dns;
mod h3;
mod httpbin;
pub(crate) mod install;
mod lifecycle;
mod nginx;
mod peers;
mod pki;
mod proxies;
mod scenario;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use crate::table;

/// Installs, then runs the suite in a loopback-only namespace (or, failing that, on the
/// host's loopback without the private-address rows).
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "--inside") {
        return inside(args);
    }
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let target_dir = target_dir(&exe);
    let t = Instant::now();
    let venv = install::ensure(&target_dir)?;
    eprintln!(
        "interop: peers installed in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    // The suite runs this program again inside the namespaces. `cargo test` may have rebuilt
    // the file it was started from meanwhile (another feature set), so a copy of the running
    // program (`/proc/self/exe` reads it even then) is what runs inside.
    let exe = stable_copy(&exe, &target_dir)?;
    let mut inner: Vec<String> = vec!["interop".into(), "--inside".into()];
    inner.extend(["--venv".into(), venv.display().to_string()]);
    inner.extend(args.iter().cloned());
    let works = |flags: &[&str]| {
        Command::new("unshare")
            .args(flags)
            .arg("true")
            .status()
            .is_ok_and(|s| s.success())
    };
    let flags: Option<&[&str]> = if works(PID_AND_NET) {
        Some(PID_AND_NET)
    } else if works(&["-n"]) {
        eprintln!("interop: no PID namespace here; peers of a run that is killed may outlive it");
        Some(&["-n"])
    } else {
        None
    };
    let status = if let Some(flags) = flags {
        Command::new("unshare")
            .args(flags)
            .arg("--")
            .arg(&exe)
            .args(&inner)
            .status()
    } else {
        eprintln!(
            "interop: no network namespace here (`unshare -n` failed); running on the host's \
             loopback and SKIPPING the private-address scenarios"
        );
        inner.push("--no-namespace".into());
        Command::new(&exe).args(&inner).status()
    }
    .map_err(|e| format!("running the suite: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("interop suite failed ({status})"))
    }
}

/// `unshare` flags for the suite: its own network namespace (only `lo`) and PID namespace
/// (the suite is its first process, `/proc` shows only its processes, and the whole namespace
/// is killed when the suite or `unshare` dies).
const PID_AND_NET: &[&str] = &["-n", "-p", "-f", "--mount-proc", "--kill-child"];

/// What the scenarios are given besides the peers' layout.
#[derive(Debug)]
pub(crate) struct Setup {
    /// The PKI.
    pub(crate) pki: pki::Pki,
    /// Whether this runs in a namespace with only `lo` (private-address rows need it).
    pub(crate) isolated: bool,
}

/// Inside the namespace: PKI, peers, scenarios, report.
fn inside(args: &[String]) -> Result<(), String> {
    let json_path = table::json_arg(args)?;
    let venv = match args.iter().position(|a| a == "--venv") {
        Some(i) => PathBuf::from(args.get(i + 1).ok_or("--venv needs a path")?),
        None => return Err("--inside needs --venv".into()),
    };
    let isolated = if args.iter().any(|a| a == "--no-namespace") {
        false
    } else {
        install::run(
            Command::new("ip").args(["link", "set", "lo", "up"]),
            "ip link set lo up",
        )?;
        only_loopback()?
    };
    let started = Instant::now();
    let dir = run_dir()?;
    let _cleanup = RemoveDir(dir.clone());
    let pki = pki::make(&dir.join("pki"))?;
    // Inside the namespace port 53 is free, and squid can only ask name servers on 53.
    let dns_port = if isolated { 53 } else { 0 };
    let dns_port = if dns_port == 0 {
        free_udp_port()?
    } else {
        dns_port
    };
    let (mut peers, layout) = peers::start(&dir, &pki, &venv, dns_port)?;
    eprintln!(
        "interop: peers ready in {:.1}s (namespace with only lo: {isolated})",
        started.elapsed().as_secs_f64()
    );
    let setup = Setup { pki, isolated };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let mut rows = rt.block_on(all(&layout, &setup));
    drop(rt);
    let pids = peers.stop();
    let left: Vec<u32> = pids
        .iter()
        .flat_map(|p| {
            let mut v = peers::group_members(*p);
            if peers::alive(*p) {
                v.push(*p);
            }
            v
        })
        .collect();
    rows.push(table::row(
        "peers.stopped",
        format!("{} peers stopped by pid, none left", pids.len()),
        format!("{} stopped, left running: {left:?}", pids.len()),
        left.is_empty() && pids.len() == peers::STARTED,
    ));
    if !isolated {
        println!("interop: private-address scenarios SKIPPED (no network namespace)");
    }
    table::finish(
        &rows,
        "interop",
        "interop rows",
        started.elapsed(),
        json_path.as_deref(),
    )
}

/// Refuses to run the scenarios unless `lo` is the only interface (we are in the namespace).
fn only_loopback() -> Result<bool, String> {
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .map_err(|e| format!("ip link: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split(':').nth(1).map(str::trim))
        .collect();
    if names == ["lo"] {
        Ok(true)
    } else {
        Err(format!(
            "expected a namespace with only lo, found interfaces {names:?}"
        ))
    }
}

fn free_udp_port() -> Result<u16, String> {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free UDP port: {e}"))
}

/// A new directory for this run's configs, PKI and logs. Named by the clock, not the process
/// id: in its PID namespace the suite is always process 1, and a run that was killed leaves
/// its directory (and pid files naming processes of its namespace) behind.
fn run_dir() -> Result<PathBuf, String> {
    sweep_stale_run_dirs();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir =
        std::env::temp_dir().join(format!("soulbase-interop-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Removes the directories of earlier runs that were killed before they could (a run takes
/// well under a minute, so one untouched for an hour is nobody's).
fn sweep_stale_run_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(3600));
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("soulbase-interop-"));
        if ours && stale {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Removes the run's directory (configs, PKI, logs) when dropped, unless
/// `SOULBASE_INTEROP_KEEP` is set.
#[derive(Debug)]
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        if std::env::var_os("SOULBASE_INTEROP_KEEP").is_some() {
            eprintln!("interop: kept {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The target directory `exe` was built into (`target/debug/xtask` → `target`).
pub(crate) fn target_dir(exe: &Path) -> PathBuf {
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| crate::project_root().join("target"))
}

/// A copy of the running program under `target_dir/interop`, for the suite (and chaos's
/// outbox crash loop) to run again; falls back to `exe` where `/proc/self/exe` cannot be read.
pub(crate) fn stable_copy(exe: &Path, target_dir: &Path) -> Result<std::path::PathBuf, String> {
    let dir = target_dir.join("interop");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let copy = dir.join("xtask-running");
    // Replaced, not written in place: a run still executing an older copy keeps its file.
    let tmp = dir.join(format!("xtask-running.{}", std::process::id()));
    match std::fs::copy("/proc/self/exe", &tmp) {
        Ok(_) => {
            std::fs::rename(&tmp, &copy).map_err(|e| format!("{}: {e}", copy.display()))?;
            Ok(copy)
        }
        Err(_) => Ok(exe.to_path_buf()),
    }
}

/// Every scenario, in order.
///
/// `XTASK_INTEROP_ONLY=lifecycle,dns` runs only the named groups (nginx, httpbin, proxies,
/// dns, h3, lifecycle), for work on one of them; the suite runs them all.
async fn all(layout: &peers::Layout, setup: &Setup) -> Vec<crate::table::Row> {
    let only = std::env::var("XTASK_INTEROP_ONLY").ok();
    let wanted = |group: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|g| g.trim() == group))
    };
    let mut rows = Vec::new();
    if wanted("nginx") {
        rows.extend(nginx::rows(layout, setup).await);
    }
    if wanted("httpbin") {
        rows.extend(httpbin::rows(layout, setup).await);
    }
    if wanted("proxies") {
        rows.extend(proxies::rows(layout, setup).await);
    }
    if wanted("dns") {
        rows.extend(dns::rows(layout, setup).await);
    }
    if wanted("h3") {
        rows.extend(h3::rows(layout, setup).await);
    }
    if wanted("lifecycle") {
        rows.extend(lifecycle::rows(layout, setup).await);
    }
    rows
}
