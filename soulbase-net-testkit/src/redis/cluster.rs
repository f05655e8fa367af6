//! [`RedisCluster`]: three `redis-server` masters on free loopback ports, joined into one Redis
//! Cluster that serves all 16 384 hash slots.

use std::{io, net::SocketAddr, path::PathBuf, time::Duration};

use super::{resp, RedisServer, Role, REDIS};
use crate::process::free_port;

/// The hash slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// A Redis Cluster of its own: three masters (no replicas), loopback only, no persistence,
/// each on a free port with its cluster bus on another; the slots split in three equal ranges.
/// Stopped (each node by its PID) when dropped, also when the test fails. Needs
/// `redis-server` 7 or later (`--cluster-port`, `CLUSTER ADDSLOTSRANGE`); `redis-cli` is not
/// used.
///
/// # Examples
/// ```no_run
/// use soulbase_net_testkit::RedisCluster;
///
/// let Some(cluster) = RedisCluster::start_or_skip("my_test") else { return };
/// let seeds = cluster.urls(); // redis://127.0.0.1:<port>/ for each master
/// # let _ = seeds;
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The nodes' `nodes.conf` files.
    dir: PathBuf,
}

impl RedisCluster {
    /// How many masters it has.
    pub const MASTERS: usize = 3;

    /// Starts one and waits until every node says `cluster_state:ok`, or — when
    /// `redis-server` is not installed — prints a line saying that `test` is skipped and
    /// returns `None`. With [`REQUIRE_REDIS`](super::REQUIRE_REDIS) set, a missing server
    /// panics instead (CI never skips).
    ///
    /// # Panics
    /// As said, and when the servers are installed but the cluster does not form within 10 s.
    pub fn start_or_skip(test: &str) -> Option<Self> {
        REDIS.start_or_skip(test, "the Redis Cluster did not form", Self::start)
    }

    /// Starts one; `Ok(None)` when `redis-server` is not installed. For a demo or a tool;
    /// tests use [`start_or_skip`](Self::start_or_skip).
    ///
    /// # Errors
    /// The servers are installed but the cluster did not form within 10 s.
    pub fn try_start() -> io::Result<Option<Self>> {
        REDIS.try_start(Self::start)
    }

    fn start(program: PathBuf) -> io::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "soulbase-redis-cluster-{}-{}",
            std::process::id(),
            free_port()?.port()
        ));
        std::fs::create_dir_all(&dir)?;
        // Made first, so that a failure below stops what was started and removes `dir`.
        let mut cluster = Self {
            nodes: Vec::new(),
            dir,
        };
        for _ in 0..Self::MASTERS {
            let role = Role::ClusterNode {
                bus: free_port()?,
                dir: cluster.dir.clone(),
            };
            cluster
                .nodes
                .push(RedisServer::start_as(program.clone(), role)?);
        }
        cluster.join()?;
        Ok(cluster)
    }

    /// Gives each node its third of the slots and a distinct config epoch, makes every node
    /// meet every other, and waits for the cluster to be whole.
    fn join(&self) -> io::Result<()> {
        let n = self.nodes.len();
        for (i, node) in self.nodes.iter().enumerate() {
            let (first, last) = (first_slot(i, n), first_slot(i + 1, n) - 1);
            ok(
                node.addr,
                &[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ],
            )?;
            ok(
                node.addr,
                &["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()],
            )?;
        }
        for a in &self.nodes {
            for b in self.nodes.iter().filter(|b| b.addr != a.addr) {
                let Role::ClusterNode { bus, .. } = &b.role else {
                    continue;
                };
                let (port, bus) = (b.addr.port().to_string(), bus.port().to_string());
                ok(a.addr, &["CLUSTER", "MEET", "127.0.0.1", &port, &bus])?;
            }
        }
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        let known = format!("cluster_known_nodes:{n}");
        loop {
            let whole = self.nodes.iter().all(|node| {
                resp::command(node.addr, &["CLUSTER", "INFO"]).is_ok_and(|info| {
                    info.text()
                        .is_some_and(|t| t.contains("cluster_state:ok") && t.contains(&known))
                })
            });
            if whole {
                return Ok(());
            }
            if tokio::time::Instant::now() > until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the nodes did not agree on cluster_state:ok",
                ));
            }
            // Gossip has no readiness signal of its own.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis://127.0.0.1:<port>/` of each master: the seed nodes a client is given.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The masters, in slot order (the first serves slots 0 to 5460).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The masters, to stop, pause or restart one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// How many keys each master holds (`DBSIZE`), in the order of [`nodes`](Self::nodes):
    /// where a test's keys landed.
    ///
    /// # Errors
    /// A node did not answer.
    pub fn key_counts(&self) -> io::Result<Vec<u64>> {
        self.nodes
            .iter()
            .map(|node| match resp::command(node.addr, &["DBSIZE"])? {
                resp::Reply::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
                other => Err(io::Error::other(format!("DBSIZE answered {other:?}"))),
            })
            .collect()
    }

    /// Which master (an index into [`nodes`](Self::nodes)) serves `key`'s hash slot.
    ///
    /// # Errors
    /// The first node did not answer `CLUSTER KEYSLOT`.
    pub fn node_of(&self, key: &str) -> io::Result<usize> {
        let first =
            self.nodes.first().map(|n| n.addr).ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, "the cluster has no node")
            })?;
        match resp::command(first, &["CLUSTER", "KEYSLOT", key])? {
            resp::Reply::Int(slot) => {
                let slot = usize::try_from(slot).unwrap_or(0);
                let n = self.nodes.len();
                Ok((0..n).rfind(|i| first_slot(*i, n) <= slot).unwrap_or(0))
            }
            other => Err(io::Error::other(format!(
                "CLUSTER KEYSLOT answered {other:?}"
            ))),
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        // Each node is stopped by its own drop; then their files go.
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The first slot of the `i`th of `n` nodes.
fn first_slot(i: usize, n: usize) -> usize {
    SLOTS * i / n
}

/// Sends a command that must answer `+OK`.
fn ok(addr: SocketAddr, args: &[&str]) -> io::Result<()> {
    match resp::command(addr, args)? {
        resp::Reply::Simple(s) if s == "OK" => Ok(()),
        other => Err(io::Error::other(format!(
            "{} answered {other:?}",
            args.join(" ")
        ))),
    }
}
