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
    /// A replica of the master, when started with one ([`RedisSentinel::failover`] promotes
    /// it).
    replica: Option<RedisServer>,
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

    /// Like [`start_or_skip`](Self::start_or_skip), with a replica of the master that the
    /// sentinel knows, so that [`failover`](Self::failover) can promote it.
    ///
    /// # Panics
    /// As [`start_or_skip`](Self::start_or_skip), and when the replica does not sync or the
    /// sentinel does not see it within 10 s.
    pub fn start_with_replica_or_skip(test: &str) -> Option<Self> {
        REDIS.start_or_skip(test, "the sentinel did not start", |program| {
            let master = RedisServer::start_as(program.clone(), Role::Plain)?;
            let replica = RedisServer::start_as(program.clone(), Role::Plain)?;
            let port = master.addr().port().to_string();
            expect_ok(resp::command(
                replica.addr(),
                &["REPLICAOF", "127.0.0.1", &port],
            )?)?;
            wait_until("the replica did not sync with the master", || {
                resp::command(replica.addr(), &["INFO", "replication"]).is_ok_and(|r| {
                    r.text()
                        .is_some_and(|t| t.contains("master_link_status:up"))
                })
            })?;
            let this = Self::watch(program, master, Some(replica))?;
            this.wait_for_replica()?;
            Ok(this)
        })
    }

    fn start(program: PathBuf) -> io::Result<Self> {
        let master = RedisServer::start_as(program.clone(), Role::Plain)?;
        Self::watch(program, master, None)
    }

    /// Starts a sentinel watching `master` (and so its `replica`).
    fn watch(
        program: PathBuf,
        master: RedisServer,
        replica: Option<RedisServer>,
    ) -> io::Result<Self> {
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
            replica,
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

    /// Waits until the sentinel lists the replica as a healthy one (it learns of replicas
    /// from the master's `INFO`).
    fn wait_for_replica(&self) -> io::Result<()> {
        wait_until("the sentinel did not see the replica", || {
            resp::command(
                self.sentinel.addr(),
                &["SENTINEL", "REPLICAS", Self::MASTER_NAME],
            )
            .is_ok_and(|reply| match reply {
                resp::Reply::Array(Some(replicas)) => replicas
                    .iter()
                    .any(|r| flags(r).as_deref() == Some("slave")),
                _ => false,
            })
        })
    }

    /// A failover, as an operator forces one (`SENTINEL FAILOVER`): the replica is promoted
    /// and the sentinel names it as the master. Returns once it does. Stop the master first
    /// to stage a master that died.
    ///
    /// # Errors
    /// Started without a replica, the sentinel refused the failover, or it did not name the
    /// replica within 20 s.
    pub fn failover(&self) -> io::Result<()> {
        let replica = self.replica.as_ref().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "started without a replica")
        })?;
        let port = replica.addr().port().to_string();
        let until = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            // Refused while the sentinel has just seen the replica or is busy (`-NOGOODSLAVE`,
            // `-INPROG`): asked again until it takes it.
            let asked = resp::command(
                self.sentinel.addr(),
                &["SENTINEL", "FAILOVER", Self::MASTER_NAME],
            )?;
            let named = resp::command(
                self.sentinel.addr(),
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", Self::MASTER_NAME],
            )
            .is_ok_and(|reply| match reply {
                resp::Reply::Array(Some(addr)) => {
                    addr.get(1).and_then(resp::Reply::text) == Some(port.as_str())
                }
                _ => false,
            });
            if named {
                return Ok(());
            }
            if tokio::time::Instant::now() > until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the sentinel did not promote the replica: {asked:?}"),
                ));
            }
            // The sentinel has no event to wait on.
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The replica, when started with one (the master after a [`failover`](Self::failover)).
    pub fn replica(&self) -> Option<&RedisServer> {
        self.replica.as_ref()
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

/// `Ok` for `+OK`, the error reply as an error otherwise.
fn expect_ok(reply: resp::Reply) -> io::Result<()> {
    match reply {
        resp::Reply::Simple(ok) if ok == "OK" => Ok(()),
        other => Err(io::Error::other(format!("redis answered {other:?}"))),
    }
}

/// Polls `ready` every 50 ms for up to 10 s (Redis has no readiness signal to wait on).
fn wait_until(what: &str, mut ready: impl FnMut() -> bool) -> io::Result<()> {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while !ready() {
        if tokio::time::Instant::now() > until {
            return Err(io::Error::new(io::ErrorKind::TimedOut, what.to_owned()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
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
