//! What the throwaway servers (Redis, PostgreSQL) share: finding an installed program, skipping
//! loudly when it is missing, a free loopback port, and signalling and stopping a child by PID.

use std::{
    io,
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Duration,
};

/// A server program the tests start: how to find it, and what to say when it is missing.
#[derive(Debug)]
pub(crate) struct Installed {
    /// How a skip names it: `redis-server`, `PostgreSQL`.
    pub(crate) name: &'static str,
    /// The environment variable that makes it missing an error instead of a skip (CI sets it).
    pub(crate) require: &'static str,
    /// Where it is installed, if it is.
    pub(crate) find: fn() -> Option<PathBuf>,
}

impl Installed {
    /// What `start` makes of the program; `None` after printing that `test` is skipped when it
    /// is not installed (a panic with [`require`](Self::require) set), and a panic saying
    /// `what` when it is installed but `start` fails (a broken install must not pass as a skip).
    #[allow(clippy::panic, reason = "a test's setup: failing loudly is the point")]
    pub(crate) fn start_or_skip<T>(
        &self,
        test: &str,
        what: &str,
        start: impl FnOnce(PathBuf) -> io::Result<T>,
    ) -> Option<T> {
        match start(self.or_skip(test)?) {
            Ok(started) => Some(started),
            Err(e) => panic!("{test}: {what}: {e}"),
        }
    }

    /// What `start` makes of the program; `Ok(None)` when it is not installed.
    pub(crate) fn try_start<T>(
        &self,
        start: impl FnOnce(PathBuf) -> io::Result<T>,
    ) -> io::Result<Option<T>> {
        (self.find)().map(start).transpose()
    }

    /// The program, or — when it is not installed — `None` after printing that `test` is
    /// skipped (a panic with [`require`](Self::require) set).
    #[allow(clippy::panic, reason = "a test's setup: failing loudly is the point")]
    fn or_skip(&self, test: &str) -> Option<PathBuf> {
        let found = (self.find)();
        if found.is_none() {
            let (name, require) = (self.name, self.require);
            if std::env::var_os(require).is_some() {
                panic!("{test}: {name} is not installed and {require} is set");
            }
            eprintln!("SKIPPED {test}: {name} is not installed (cargo xtask ci installs it)");
        }
        found
    }
}

/// A loopback port free right now.
pub(crate) fn free_port() -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    listener.local_addr()
}

/// `program` on PATH or in the sbin directories.
pub(crate) fn find(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin"])
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file());
    found
}

/// Sends `sig` (as `kill` spells it: `-STOP`) to `child`, or with `group` to its whole process
/// group (it must lead one).
///
/// # Errors
/// Not running, or the signal could not be sent.
pub(crate) fn signal(child: Option<&Child>, sig: &str, group: bool) -> io::Result<()> {
    let Some(child) = child else {
        return Err(io::Error::new(io::ErrorKind::NotFound, "not running"));
    };
    let target = if group {
        format!("-{}", child.id())
    } else {
        child.id().to_string()
    };
    let status = Command::new("kill").args([sig, "--", &target]).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "kill {sig} {target} failed: {status}"
        )))
    }
}

/// Stops `child` by its PID: each `(signal, grace)` of `gentle` in turn until it has exited,
/// then SIGKILL (to its process group too with `group`, for children it left behind); reaps it.
pub(crate) fn stop(child: &mut Option<Child>, gentle: &[(&str, Duration)], group: bool) {
    let Some(mut running) = child.take() else {
        return;
    };
    for (sig, grace) in gentle {
        if signal(Some(&running), sig, false).is_err() {
            break;
        }
        let until = tokio::time::Instant::now() + *grace;
        while tokio::time::Instant::now() < until {
            if let Ok(Some(_)) = running.try_wait() {
                return;
            }
            // Polling a child: std has no wait with a timeout.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if group {
        let _ = signal(Some(&running), "-KILL", true);
    }
    let _ = running.kill();
    let _ = running.wait();
}
