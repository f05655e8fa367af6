//! The server's configuration: seed 003's `config.json` (or the file `HYPER_DELAY_CONFIG`
//! names), with its defaults, plus where the store is.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;
use soulbase_net_core::NetError;

/// The environment variable that names the configuration file (the seed's).
pub const CONFIG_ENV: &str = "HYPER_DELAY_CONFIG";

/// What the server runs with. Every field has the seed's default; unknown fields are refused
/// (a misspelt field would otherwise be silently ignored).
///
/// ```
/// use soulbase_net_delay::Config;
///
/// let c = Config::from_json(r#"{"bind_addr": "127.0.0.1:7100", "retry_delay_ms": 500}"#)?;
/// assert_eq!(c.bind_addr.port(), 7100);
/// assert_eq!(c.tick_ms, 10);
/// assert!(Config::from_json(r#"{"tick": 5}"#).is_err());
/// # Ok::<(), soulbase_net_core::NetError>(())
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the embedded store keeps its file (`delay.db` in it). Default `data` (the seed's
    /// `data/db` was a sled directory; this store is one SQLite file).
    pub data_dir: PathBuf,
    /// Where the server listens. Default `127.0.0.1:7000`.
    pub bind_addr: SocketAddr,
    /// Where its HTTP face listens (health, metrics, tasks over HTTP), if anywhere; the
    /// same `allowed_hosts` apply. Default: none.
    pub http_addr: Option<SocketAddr>,
    /// The scheduler's tick: the longest it sleeps before looking for due tasks. Default 10.
    pub tick_ms: u64,
    /// Due tasks claimed at most per look, and held in memory ahead of their time at most (the
    /// seed's is its wheel's ready-queue capacity). Default 2048.
    pub ready_channel_capacity: usize,
    /// Lines queued for one connection at most; past it, that client's deliveries wait in the
    /// store. Default 256.
    pub connection_write_channel: usize,
    /// How long after a failed or unacknowledged delivery the task is due again. Default 1000.
    pub retry_delay_ms: u64,
    /// How long a delivery waits for its `ack` before it counts as failed. Default 5000.
    pub ack_timeout_ms: u64,
    /// Peers allowed to connect; empty means loopback only (`127.0.0.1`, `::1`). A peer
    /// outside is refused at accept.
    pub allowed_hosts: Vec<IpAddr>,
    /// The store: a SQLite path or `postgres://…` (feature `postgres`). Default: `delay.db` in
    /// `data_dir`.
    pub store: Option<String>,
    /// The largest payload accepted, once decompressed (`lz4`, `zstd`): larger ones, and
    /// payloads that do not decompress, get an error line. Default 1 MiB.
    pub max_payload_bytes: usize,
    /// HTTP tasks: a `schedule` with a `target` becomes an HTTP call made through the
    /// soulbase-net client when due (the outbox's delivery path). Default: off.
    pub http_tasks: Option<HttpTasks>,
    /// Per-route tokens (the seed's 鉴权): a `register` or `schedule` for a route named here must
    /// carry its `token`, else it gets an `AUTH.FORBIDDEN` error line and the connection is
    /// closed. Routes not named need none. Default: none.
    pub tokens: std::collections::HashMap<String, String>,
}

/// Where HTTP tasks wait and with what policy they are made.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpTasks {
    /// The outbox's store: a SQLite path or `postgres://…`. Default: `outbox.db` in
    /// `data_dir`.
    pub outbox: Option<String>,
    /// A policy document (TOML or JSON) for the client that makes the calls: timeouts,
    /// retries, the address guard (private addresses are refused unless it grants them).
    /// Default: the policy's defaults.
    pub policy: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("data"),
            bind_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 7000)),
            http_addr: None,
            tick_ms: 10,
            ready_channel_capacity: 2048,
            connection_write_channel: 256,
            retry_delay_ms: 1000,
            ack_timeout_ms: 5000,
            allowed_hosts: Vec::new(),
            store: None,
            max_payload_bytes: 1 << 20,
            http_tasks: None,
            tokens: std::collections::HashMap::new(),
        }
    }
}

impl Config {
    /// A configuration from a JSON document.
    ///
    /// # Errors
    /// `SCHEMA.VALIDATION_FAILED` naming the field that is wrong.
    pub fn from_json(text: &str) -> Result<Self, NetError> {
        let c: Config = serde_json::from_str(text)
            .map_err(|e| NetError::invalid_request(format!("delay server config: {e}")))?;
        c.check()?;
        Ok(c)
    }

    /// The file `HYPER_DELAY_CONFIG` names, else `config.json` if it exists, else the
    /// defaults; and the file it came from.
    ///
    /// # Errors
    /// The file named cannot be read, or is not a valid configuration.
    pub fn load() -> Result<(Self, Option<PathBuf>), NetError> {
        let named = std::env::var_os(CONFIG_ENV).map(PathBuf::from);
        let path = match named {
            Some(p) => p,
            None if Path::new("config.json").exists() => PathBuf::from("config.json"),
            None => return Ok((Self::default(), None)),
        };
        let text = std::fs::read_to_string(&path).map_err(|e| {
            NetError::invalid_request(format!("delay server config {}: {e}", path.display()))
        })?;
        let c = Self::from_json(&text).map_err(|e| {
            NetError::invalid_request(format!(
                "{}: {}",
                path.display(),
                e.message().unwrap_or("invalid")
            ))
        })?;
        Ok((c, Some(path)))
    }

    fn check(&self) -> Result<(), NetError> {
        let positive = [
            ("tick_ms", self.tick_ms),
            ("ready_channel_capacity", self.ready_channel_capacity as u64),
            (
                "connection_write_channel",
                self.connection_write_channel as u64,
            ),
            ("ack_timeout_ms", self.ack_timeout_ms),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(NetError::invalid_request(format!(
                    "delay server config: `{name}` must be at least 1"
                )));
            }
        }
        Ok(())
    }

    /// Whether `peer` may connect.
    pub fn allows(&self, peer: IpAddr) -> bool {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        if self.allowed_hosts.is_empty() {
            return peer == IpAddr::V4(Ipv4Addr::LOCALHOST)
                || peer == IpAddr::V6(Ipv6Addr::LOCALHOST);
        }
        self.allowed_hosts.contains(&peer)
    }

    /// Whether `token` may use `route`: any for a route without a token, else the route's
    /// (compared in constant time).
    pub fn admits(&self, route: &str, token: Option<&str>) -> bool {
        match (self.tokens.get(route), token) {
            (None, _) => true,
            (Some(want), Some(given)) => {
                want.len() == given.len()
                    && want
                        .bytes()
                        .zip(given.bytes())
                        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                        == 0
            }
            (Some(_), None) => false,
        }
    }

    /// The store's URL: `store`, or the SQLite file in `data_dir`.
    pub fn store_url(&self) -> String {
        self.store
            .clone()
            .unwrap_or_else(|| self.data_dir.join("delay.db").display().to_string())
    }

    pub(crate) fn tick(&self) -> Duration {
        Duration::from_millis(self.tick_ms)
    }

    pub(crate) fn retry_delay(&self) -> Duration {
        Duration::from_millis(self.retry_delay_ms)
    }

    pub(crate) fn ack_timeout(&self) -> Duration {
        Duration::from_millis(self.ack_timeout_ms)
    }
}
