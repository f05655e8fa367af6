//! A throwaway PostgreSQL cluster on a free loopback port, for tests of state a fleet keeps in
//! PostgreSQL (the outbox): [`PostgresServer`], stopped by PID when dropped.
//!
//! Why it switches user: `initdb` and `postgres` refuse to run as root, and CI runs as root. As
//! root, both run as the `postgres` user that Debian's package creates (`setuid`/`setgid` in the
//! child before `exec`, so the PID we hold is the server's own), in a directory owned by that
//! user. As anyone else, they run as we do.

use std::{
    ffi::OsStr,
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    net::{SocketAddr, TcpStream},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use crate::process::{self, free_port, Installed};

/// The environment variable that makes a missing PostgreSQL an error instead of a skip (CI sets
/// it: CI never skips these tests).
pub const REQUIRE_POSTGRES: &str = "SOULBASE_REQUIRE_POSTGRES";

/// The superuser `initdb` creates; it logs in without a password (trust, loopback only).
const USER: &str = "soulbase";

/// How long a start may take before it counts as failed.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// The server's log, in its directory; its tail goes into a failed start's error.
const LOG: &str = "postgres.log";

/// A PostgreSQL cluster of its own: `initdb` into a fresh temporary directory, then `postgres`
/// on a free loopback port with trust authentication for the superuser `soulbase`; stopped
/// (by its PID) and its directory deleted when dropped, also when the test fails.
///
/// Writes are not flushed to disk (`fsync=off`) unless the [builder](Self::builder) asks for
/// it; commits are still synchronous, so a stopped and restarted server keeps them. It takes up
/// to 200 connections (several pools, one per outbox instance of a test).
///
/// # Examples
/// ```no_run
/// use soulbase_net_testkit::PostgresServer;
///
/// # fn main() -> std::io::Result<()> {
/// let Some(pg) = PostgresServer::start_or_skip("my_test") else { return Ok(()) };
/// let url = pg.create_database("outbox")?; // postgres://soulbase@127.0.0.1:<port>/outbox
/// assert_eq!(pg.psql("outbox", "SELECT 1")?, "1");
/// # let _ = url;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PostgresServer {
    addr: SocketAddr,
    child: Option<Child>,
    /// The directory of `initdb`, `postgres`, `pg_isready`, `createdb` and `psql`.
    bin: PathBuf,
    /// The temporary directory: the cluster (`data/`), the Unix socket and the log.
    dir: PathBuf,
    /// The user and group `initdb` and `postgres` run as: the `postgres` user when we are root.
    run_as: Option<(u32, u32)>,
    fsync: bool,
}

/// How a [`PostgresServer`] runs; from [`PostgresServer::builder`].
///
/// # Examples
/// A server for a benchmark, flushing its writes as a production one does:
/// ```no_run
/// use soulbase_net_testkit::PostgresServer;
///
/// let Some(pg) = PostgresServer::builder().fsync(true).try_start()? else {
///     return Ok(()); // not installed
/// };
/// # let _ = pg;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct PostgresServerBuilder {
    fsync: bool,
}

impl PostgresServerBuilder {
    /// Whether PostgreSQL flushes its writes to disk (`fsync`), as a benchmark wants.
    ///
    /// Default is off: a test's cluster is thrown away, so surviving a power cut buys nothing,
    /// and without flushes tests run faster. `synchronous_commit` stays on either way.
    pub fn fsync(mut self, on: bool) -> Self {
        self.fsync = on;
        self
    }

    /// Starts one, or — when PostgreSQL is not installed — prints a line saying that `test` is
    /// skipped and returns `None`.
    ///
    /// # Panics
    /// When PostgreSQL is missing and [`REQUIRE_POSTGRES`] is set (CI never skips); and when it
    /// is installed but does not start (a broken install must not pass as a skip).
    pub fn start_or_skip(self, test: &str) -> Option<PostgresServer> {
        POSTGRES.start_or_skip(test, "PostgreSQL did not start", |bin| {
            PostgresServer::start(bin, self.fsync)
        })
    }

    /// Starts one; `Ok(None)` when PostgreSQL is not installed (the caller says why it goes on
    /// without). For a demo or a tool; tests use [`start_or_skip`](Self::start_or_skip).
    ///
    /// # Errors
    /// PostgreSQL is installed but did not start.
    pub fn try_start(self) -> io::Result<Option<PostgresServer>> {
        POSTGRES.try_start(|bin| PostgresServer::start(bin, self.fsync))
    }
}

impl PostgresServer {
    /// A builder, for a server that flushes its writes; the defaults are those of
    /// [`start_or_skip`](Self::start_or_skip).
    pub fn builder() -> PostgresServerBuilder {
        PostgresServerBuilder::default()
    }

    /// Starts one with the defaults, or — when PostgreSQL is not installed — prints a line
    /// saying that `test` is skipped and returns `None`; as
    /// [`PostgresServerBuilder::start_or_skip`].
    ///
    /// # Panics
    /// With [`REQUIRE_POSTGRES`] set and PostgreSQL missing; and when it is installed but does
    /// not start (a broken install must not pass as a skip).
    pub fn start_or_skip(test: &str) -> Option<Self> {
        Self::builder().start_or_skip(test)
    }

    /// Starts one with the defaults; `Ok(None)` when PostgreSQL is not installed. For a demo or
    /// a tool; as [`PostgresServerBuilder::try_start`].
    ///
    /// # Errors
    /// PostgreSQL is installed but did not start.
    pub fn try_start() -> io::Result<Option<Self>> {
        Self::builder().try_start()
    }

    /// Creates a cluster in a fresh directory and starts it on a free port.
    fn start(bin: PathBuf, fsync: bool) -> io::Result<Self> {
        static SERVERS: AtomicU32 = AtomicU32::new(0);
        let n = SERVERS.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("soulbase-postgres-{}-{n}", std::process::id()));
        // Built first, so that from here on its drop deletes the directory.
        let mut server = Self {
            addr: free_port()?,
            child: None,
            bin,
            dir,
            run_as: run_as()?,
            fsync,
        };
        if server.dir.exists() {
            // Left by an earlier process that had our PID and was killed.
            std::fs::remove_dir_all(&server.dir)?;
        }
        std::fs::create_dir_all(&server.dir)?;
        if let Some((uid, gid)) = server.run_as {
            std::os::unix::fs::chown(&server.dir, Some(uid), Some(gid))?;
        }
        let mut initdb = server.as_owner("initdb");
        initdb
            .arg("-D")
            .arg(server.dir.join("data"))
            .args(["-U", USER, "--auth=trust", "-E", "UTF8", "--no-locale"])
            .arg("--no-instructions");
        if !fsync {
            initdb.arg("--no-sync");
        }
        output(&mut initdb, "initdb")?;
        server.restart()?;
        Ok(server)
    }

    /// `postgres://soulbase@127.0.0.1:<port>/postgres`: the superuser, on the database that
    /// always exists.
    pub fn url(&self) -> String {
        self.url_of("postgres")
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Creates the database `name` (`createdb`) and returns its URL,
    /// `postgres://soulbase@127.0.0.1:<port>/<name>`.
    ///
    /// # Errors
    /// `name` is not 1 to 63 ASCII letters, digits and `_` (so the URL needs no escaping), or
    /// `createdb` failed (its message is in the error): the database exists, or the server is
    /// not running.
    pub fn create_database(&self, name: &str) -> io::Result<String> {
        let plain = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !plain || name.is_empty() || name.len() > 63 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("database name {name:?}: use 1 to 63 ASCII letters, digits and `_`"),
            ));
        }
        output(self.client("createdb").arg(name), "createdb")?;
        Ok(self.url_of(name))
    }

    /// Runs `sql` with `psql` on `database` and returns what it printed: unaligned, without
    /// headers, one line a row (`SELECT 1` gives `"1"`). For checks that need no driver.
    ///
    /// # Errors
    /// `psql` failed: a statement failed (its message is in the error), or the server is not
    /// running.
    pub fn psql(&self, database: &str, sql: &str) -> io::Result<String> {
        let mut psql = self.client("psql");
        psql.args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"])
            .args(["-d", database, "-c", sql]);
        let out = output(&mut psql, "psql")?;
        Ok(String::from_utf8_lossy(&out).trim_end().to_owned())
    }

    /// Stops the server by its PID: connections drop, the port refuses, the data stays. A
    /// fast shutdown (SIGINT), which ends open sessions at once where SIGTERM would wait for
    /// them; SIGQUIT after 5 s, SIGKILL after 2 s more. A paused server is thawed first.
    pub fn stop(&mut self) {
        // A frozen postmaster would not act on the signals; not running is not an error here.
        let _ = self.resume();
        process::stop(
            &mut self.child,
            &[
                ("-INT", Duration::from_secs(5)),
                ("-QUIT", Duration::from_secs(2)),
            ],
            true,
        );
    }

    /// Starts the server again on the same port and data (what was committed is there), after
    /// [`stop`] (or stops it first). Returns once it accepts connections.
    ///
    /// # Errors
    /// The server did not start, or did not accept connections within 30 s; the error ends
    /// with the tail of its log.
    ///
    /// [`stop`]: Self::stop
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join(LOG))?;
        let mut postgres = self.as_owner("postgres");
        postgres
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.addr.port().to_string(), "-k"])
            .arg(&self.dir)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "max_connections=200"])
            .args(["-c", if self.fsync { "fsync=on" } else { "fsync=off" }])
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group, so that `pause` freezes its backends too.
            .process_group(0);
        self.child = Some(postgres.spawn()?);
        self.wait_ready()
    }

    /// Freezes every process of the server (SIGSTOP to its process group): connections stay
    /// open and nothing answers — a database that is slow rather than gone.
    /// [`resume`](Self::resume) thaws it.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn pause(&self) -> io::Result<()> {
        process::signal(self.child.as_ref(), "-STOP", true)
    }

    /// Thaws a paused server (SIGCONT to its process group).
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn resume(&self) -> io::Result<()> {
        process::signal(self.child.as_ref(), "-CONT", true)
    }

    fn url_of(&self, database: &str) -> String {
        format!("postgres://{USER}@{}/{database}", self.addr)
    }

    /// `program` of the bin directory, run as the cluster's owner in its directory.
    fn as_owner(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        cmd.current_dir(&self.dir).stdin(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            // std drops the supplementary groups too, when root sets a uid.
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// A client `program` of the bin directory, pointed at this server as `soulbase` over TCP.
    fn client(&self, program: &str) -> Command {
        self.client_at(program, "127.0.0.1".as_ref())
    }

    /// A client `program` of the bin directory, pointed at this server as `soulbase` on `host`
    /// (an address, or the directory of its Unix socket).
    fn client_at(&self, program: &str, host: &OsStr) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        cmd.arg("-h")
            .arg(host)
            .args(["-p", &self.addr.port().to_string(), "-U", USER])
            .stdin(Stdio::null());
        cmd
    }

    /// Waits until the port takes connections and `pg_isready` says the server accepts them.
    fn wait_ready(&mut self) -> io::Result<()> {
        let until = tokio::time::Instant::now() + READY_WITHIN;
        loop {
            if let Some(child) = &mut self.child {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    return Err(self.failed(io::ErrorKind::Other, &format!("exited ({status})")));
                }
            }
            // Asked on its Unix socket, which only this server has: should another process
            // hold the port, this one fails to bind it and exits, and never passes as ready.
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
                && self
                    .client_at("pg_isready", self.dir.as_os_str())
                    .args(["-q", "-d", "postgres"])
                    .status()?
                    .success()
            {
                return Ok(());
            }
            if tokio::time::Instant::now() > until {
                self.stop();
                let what = format!("did not accept connections within {READY_WITHIN:?}");
                return Err(self.failed(io::ErrorKind::TimedOut, &what));
            }
            // Polling a process that has no readiness signal of its own.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// An error saying what went wrong with the server, with the tail of its log.
    fn failed(&self, kind: io::ErrorKind, what: &str) -> io::Error {
        let tail = log_tail(&self.dir.join(LOG)).unwrap_or_else(|e| format!("(no log: {e})"));
        io::Error::new(
            kind,
            format!("postgres on {} {what}; its log ends:\n{tail}", self.addr),
        )
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// PostgreSQL: missing is a skip, or an error with [`REQUIRE_POSTGRES`] set.
const POSTGRES: Installed = Installed {
    name: "PostgreSQL",
    require: REQUIRE_POSTGRES,
    find: bin_dir,
};

/// The directory holding `initdb`: Debian's `/usr/lib/postgresql/<version>/bin` (the highest
/// version; Debian keeps it out of PATH), else where PATH has it.
fn bin_dir() -> Option<PathBuf> {
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin);
    debian.or_else(|| process::find("initdb")?.parent().map(Path::to_path_buf))
}

/// Who runs `initdb` and `postgres`: we do (`None`), or — as they refuse root — the `postgres`
/// user and its group when we are root.
///
/// # Errors
/// We are root and there is no `postgres` user.
fn run_as() -> io::Result<Option<(u32, u32)>> {
    if id(&["-u"])? != 0 {
        return Ok(None);
    }
    let no_user = |e: io::Error| {
        let what = format!("as root, initdb and postgres need the `postgres` user: {e}");
        io::Error::new(e.kind(), what)
    };
    let uid = id(&["-u", "postgres"]).map_err(no_user)?;
    let gid = id(&["-g", "postgres"]).map_err(no_user)?;
    Ok(Some((uid, gid)))
}

/// A number `id` prints (a user or group id).
fn id(args: &[&str]) -> io::Result<u32> {
    let out = output(Command::new("id").args(args), "id")?;
    let text = String::from_utf8_lossy(&out);
    text.trim()
        .parse()
        .map_err(|e| io::Error::other(format!("id {}: {text:?}: {e}", args.join(" "))))
}

/// Runs `cmd` to completion and returns its stdout; an error, naming `what` and holding its
/// stderr, when it fails.
fn output(cmd: &mut Command, what: &str) -> io::Result<Vec<u8>> {
    let out = cmd.output()?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(io::Error::other(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The last few KiB of the log at `path`.
fn log_tail(path: &Path) -> io::Result<String> {
    const TAIL: u64 = 4096;
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL)))?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail)?;
    Ok(String::from_utf8_lossy(&tail).into_owned())
}
