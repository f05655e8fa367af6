//! Throwaway Redis deployments on free loopback ports, for tests of state shared by a fleet:
//! [`RedisServer`] (one server: TCP, TLS, a Unix socket), [`RedisCluster`] (three masters) and
//! [`RedisSentinel`] (a master watched by a sentinel). All are stopped by PID when dropped.

mod cluster;
mod resp;
mod sentinel;

use std::{
    io,
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::process::{self, free_port, Installed};

pub use self::cluster::RedisCluster;
pub use self::sentinel::RedisSentinel;

/// The environment variable that makes a missing `redis-server` an error instead of a skip
/// (CI sets it: CI never skips these tests).
pub const REQUIRE_REDIS: &str = "SOULBASE_REQUIRE_REDIS";

/// A `redis-server` of its own: loopback only, no persistence, a free port; stopped (by its
/// PID) when dropped, also when the test fails.
///
/// # Examples
/// ```no_run
/// use soulbase_net_testkit::RedisServer;
///
/// let Some(redis) = RedisServer::start_or_skip("my_test") else { return };
/// let url = redis.url(); // redis://127.0.0.1:<port>/
/// # let _ = url;
/// ```
#[derive(Debug)]
pub struct RedisServer {
    addr: SocketAddr,
    child: Option<Child>,
    program: PathBuf,
    /// With TLS: its port, and the directory holding the certificate files.
    tls: Option<(SocketAddr, PathBuf)>,
    /// With a Unix socket: its path.
    unix: Option<PathBuf>,
    /// What else it is: a cluster node or a sentinel.
    role: Role,
}

/// The part a server plays beyond a plain Redis, with the files that part needs.
#[derive(Debug)]
enum Role {
    Plain,
    /// A cluster node: its cluster bus port, and the directory of its `nodes.conf`.
    ClusterNode {
        bus: SocketAddr,
        dir: PathBuf,
    },
    /// A sentinel, run from this configuration file (which it rewrites).
    Sentinel {
        conf: PathBuf,
    },
}

impl RedisServer {
    /// Starts one, or — when `redis-server` is not installed — prints a line saying that
    /// `test` is skipped and returns `None`. With [`REQUIRE_REDIS`] set, a missing or failing
    /// server panics instead (CI never skips).
    ///
    /// # Panics
    /// As said, with [`REQUIRE_REDIS`] set; and when the server is installed but does not
    /// start (a broken install must not pass as a skip).
    pub fn start_or_skip(test: &str) -> Option<Self> {
        REDIS.start_or_skip(test, "redis-server did not start", Self::start)
    }

    /// Starts one; `Ok(None)` when `redis-server` is not installed (the caller says why it
    /// goes on without). For a demo or a tool; tests use [`start_or_skip`](Self::start_or_skip).
    ///
    /// # Errors
    /// The server is installed but did not start.
    pub fn try_start() -> io::Result<Option<Self>> {
        REDIS.try_start(Self::start)
    }

    fn start(program: PathBuf) -> io::Result<Self> {
        Self::start_as(program, Role::Plain)
    }

    /// Starts one on a free port, playing `role`.
    fn start_as(program: PathBuf, role: Role) -> io::Result<Self> {
        let mut server = Self {
            addr: free_port()?,
            child: None,
            program,
            tls: None,
            unix: None,
            role,
        };
        server.restart()?;
        Ok(server)
    }

    /// Like [`start_or_skip`](Self::start_or_skip), also listening on a Unix socket of its
    /// own; [`unix_url`](Self::unix_url) is `redis+unix://<path>`.
    ///
    /// # Panics
    /// As [`start_or_skip`](Self::start_or_skip).
    #[allow(clippy::panic, reason = "a test's setup: failing loudly is the point")]
    pub fn start_unix_or_skip(test: &str) -> Option<Self> {
        let mut server = Self::start_or_skip(test)?;
        let path = std::env::temp_dir().join(format!(
            "soulbase-redis-{}-{}.sock",
            std::process::id(),
            server.addr.port()
        ));
        server.unix = Some(path);
        if let Err(e) = server.restart() {
            panic!("{test}: redis-server on a Unix socket did not start: {e}");
        }
        Some(server)
    }

    /// `redis+unix://<path>` when started with a Unix socket.
    pub fn unix_url(&self) -> Option<String> {
        self.unix
            .as_ref()
            .map(|p| format!("redis+unix://{}", p.display()))
    }

    /// Like [`start_or_skip`](Self::start_or_skip), also serving TLS on a second port with
    /// the PEM certificate chain `cert_pem` and key `key_pem` (e.g. a `CertKit` leaf for
    /// `localhost`); [`tls_url`](Self::tls_url) is `rediss://localhost:<port>/`.
    ///
    /// # Panics
    /// As [`start_or_skip`](Self::start_or_skip).
    pub fn start_tls_or_skip(test: &str, cert_pem: &str, key_pem: &str) -> Option<Self> {
        REDIS.start_or_skip(test, "redis-server with TLS did not start", |program| {
            let dir = std::env::temp_dir().join(format!(
                "soulbase-redis-tls-{}-{}",
                std::process::id(),
                free_port()?.port()
            ));
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("cert.pem"), cert_pem)?;
            std::fs::write(dir.join("key.pem"), key_pem)?;
            let mut server = Self {
                addr: free_port()?,
                child: None,
                program,
                tls: Some((free_port()?, dir)),
                unix: None,
                role: Role::Plain,
            };
            server.restart()?;
            Ok(server)
        })
    }

    /// `rediss://localhost:<tls port>/` when started with TLS.
    pub fn tls_url(&self) -> Option<String> {
        self.tls
            .as_ref()
            .map(|(addr, _)| format!("rediss://localhost:{}/", addr.port()))
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Kills the server (SIGKILL, by PID): connections drop, the port refuses.
    pub fn stop(&mut self) {
        process::stop(&mut self.child, &[], false);
    }

    /// Starts the server again on the same port (empty: no persistence), after [`stop`]
    /// (or stops it first). Returns once it answers `PING`.
    ///
    /// # Errors
    /// The server did not start or answer within 10 s.
    ///
    /// [`stop`]: Self::stop
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        let mut cmd = Command::new(&self.program);
        if let Role::Sentinel { conf } = &self.role {
            // The configuration file comes first; the rest of the line overrides it.
            cmd.arg(conf).arg("--sentinel");
        }
        cmd.args([
            "--bind",
            "127.0.0.1",
            "--port",
            &self.addr.port().to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
        ]);
        if let Some((tls, dir)) = &self.tls {
            cmd.arg("--tls-port")
                .arg(tls.port().to_string())
                .arg("--tls-cert-file")
                .arg(dir.join("cert.pem"))
                .arg("--tls-key-file")
                .arg(dir.join("key.pem"))
                .args(["--tls-auth-clients", "no"]);
        }
        if let Some(path) = &self.unix {
            cmd.arg("--unixsocket")
                .arg(path)
                .args(["--unixsocketperm", "700"]);
        }
        if !matches!(self.role, Role::ClusterNode { .. }) {
            // Nothing is saved (`--save ""`), but a replica's full sync writes an RDB file:
            // into the temp directory, named by port, never into the test's working directory.
            cmd.arg("--dir")
                .arg(std::env::temp_dir())
                .arg("--dbfilename")
                .arg(format!("soulbase-redis-{}.rdb", self.addr.port()));
        }
        if let Role::ClusterNode { bus, dir } = &self.role {
            cmd.args(["--cluster-enabled", "yes", "--cluster-port"])
                .arg(bus.port().to_string())
                .arg("--cluster-config-file")
                .arg(dir.join(format!("nodes-{}.conf", self.addr.port())))
                .args(["--cluster-node-timeout", "5000", "--dir"])
                .arg(dir);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if ping(self.addr).is_ok() {
                return Ok(());
            }
            if tokio::time::Instant::now() > until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("redis-server on {} did not answer PING", self.addr),
                ));
            }
            // Polling a process that has no readiness signal of its own.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing answers — a Redis that
    /// is slow rather than gone. [`resume`](Self::resume) thaws it.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn pause(&self) -> io::Result<()> {
        self.signal("-STOP")
    }

    /// Thaws a paused server (SIGCONT).
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn resume(&self) -> io::Result<()> {
        self.signal("-CONT")
    }

    fn signal(&self, sig: &str) -> io::Result<()> {
        process::signal(self.child.as_ref(), sig, false)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A paused server must be thawed to die cleanly; SIGKILL works on stopped ones too.
        let _ = self.resume();
        self.stop();
        if let Some((_, dir)) = &self.tls {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some(path) = &self.unix {
            let _ = std::fs::remove_file(path);
        }
        // A replica's full sync may have written one.
        let _ = std::fs::remove_file(
            std::env::temp_dir().join(format!("soulbase-redis-{}.rdb", self.addr.port())),
        );
    }
}

/// `redis-server`: missing is a skip, or an error with [`REQUIRE_REDIS`] set.
const REDIS: Installed = Installed {
    name: "redis-server",
    require: REQUIRE_REDIS,
    find: || process::find("redis-server"),
};

/// One `PING`, answered `PONG`.
fn ping(addr: SocketAddr) -> io::Result<()> {
    match resp::command(addr, &["PING"])? {
        resp::Reply::Simple(pong) if pong == "PONG" => Ok(()),
        other => Err(io::Error::other(format!(
            "unexpected answer to PING: {other:?}"
        ))),
    }
}
