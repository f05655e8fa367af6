//! [`RedisSentinel`]: a `redis-server` master and a sentinel watching it, on free loopback
//! ports: what a client that finds its Redis through Sentinel is tested against.

use std::{io, path::PathBuf, time::Duration};

use super::{resp, RedisServer, Role, REDIS};
use crate::process::free_port;

/// A master and one sentinel of its own (quorum 1), loopback only, no persistence; the
/// sentinel names the master [`MASTER_NAME`](Self::MASTER_NAME). Both are stopped by PID
/// when dropped, also when the test fails. Failover is not staged: there is no replica.
///
/// # Examples
/// ```no_run
/// use soulbase_net_testkit::RedisSentinel;
///
/// let Some(sentinel) = RedisSentinel::start_or_skip("my_test") else { return };
/// let nodes = vec![sentinel.url()]; // redis://127.0.0.1:<sentinel port>/
/// let master = RedisSentinel::MASTER_NAME;
/// # let _ = (nodes, master);
/// ```
#[derive(Debug)]
pub struct RedisSentinel {
    master: RedisServer,
    sentinel: RedisServer,
    /// The sentinel's configuration file (which it rewrites).
    dir: PathBuf,
}

impl RedisSentinel {
    /// The name the sentinel knows the master by.
    pub const MASTER_NAME: &'static str = "mymaster";

    /// Starts both and waits until the sentinel reports the master up, or — when
    /// `redis-server` is not installed — prints a line saying that `test` is skipped and
    /// returns `None`. With [`REQUIRE_REDIS`](super::REQUIRE_REDIS) set, a missing server
    /// panics instead (CI never skips).
    ///
    /// # Panics
    /// As said, and when the servers are installed but the sentinel does not see its master
    /// within 10 s.
    pub fn start_or_skip(test: &str) -> Option<Self> {
        REDIS.start_or_skip(test, "the sentinel did not start", Self::start)
    }

    /// Starts both; `Ok(None)` when `redis-server` is not installed. For a demo or a tool;
    /// tests use [`start_or_skip`](Self::start_or_skip).
    ///
    /// # Errors
    /// The servers are installed but the sentinel did not see its master within 10 s.
    pub fn try_start() -> io::Result<Option<Self>> {
        REDIS.try_start(Self::start)
    }

    fn start(program: PathBuf) -> io::Result<Self> {
        let master = RedisServer::start_as(program.clone(), Role::Plain)?;
        let dir = std::env::temp_dir().join(format!(
            "soulbase-redis-sentinel-{}-{}",
            std::process::id(),
            free_port()?.port()
        ));
        std::fs::create_dir_all(&dir)?;
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "sentinel monitor {name} 127.0.0.1 {port} 1\n\
                 sentinel down-after-milliseconds {name} 5000\n",
                name = Self::MASTER_NAME,
                port = master.addr().port(),
            ),
        )?;
        let sentinel = match RedisServer::start_as(program, Role::Sentinel { conf }) {
            Ok(sentinel) => sentinel,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let this = Self {
            master,
            sentinel,
            dir,
        };
        this.wait_for_master()?;
        Ok(this)
    }

    /// Waits until the sentinel flags the master as an up master (not yet `disconnected`
    /// or `s_down`, as it may be in its first moments).
    fn wait_for_master(&self) -> io::Result<()> {
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let up = resp::command(
                self.sentinel.addr(),
                &["SENTINEL", "MASTER", Self::MASTER_NAME],
            )
            .is_ok_and(|reply| flags(&reply).as_deref() == Some("master"));
            if up {
                return Ok(());
            }
            if tokio::time::Instant::now() > until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the sentinel did not report its master up",
                ));
            }
            // The sentinel has no readiness signal of its own.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis://127.0.0.1:<port>/` of the sentinel (not of the master).
    pub fn url(&self) -> String {
        self.sentinel.url()
    }

    /// The master the sentinel names.
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// The master, to stop, pause or restart it.
    pub fn master_mut(&mut self) -> &mut RedisServer {
        &mut self.master
    }

    /// The sentinel itself.
    pub fn sentinel(&self) -> &RedisServer {
        &self.sentinel
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        // The servers stop by their own drops (after this); the configuration file goes now:
        // a sentinel still running only rewrites it on a change, and there is none.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `flags` field of a `SENTINEL MASTER` reply (a flat list of names and values).
fn flags(reply: &resp::Reply) -> Option<String> {
    let resp::Reply::Array(Some(fields)) = reply else {
        return None;
    };
    fields
        .chunks(2)
        .find(|kv| kv.first().and_then(resp::Reply::text) == Some("flags"))
        .and_then(|kv| kv.get(1)?.text().map(str::to_owned))
}
