//! [`AgentConfig`]: what an agent needs to start, from a struct or from the seed's
//! environment variables.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use soulbase_net_core::NetError;
use soulbase_net_policy::NetPolicy;

use super::limits::TargetLimits;
use crate::forwarder::ForwarderConfig;
use crate::protocol::TaskKind;

/// How an agent runs.
///
/// From the environment ([`from_env`](Self::from_env)), as the seed names it:
///
/// | variable | field | default |
/// | --- | --- | --- |
/// | `AGENT_CONTROL_PLANE` | [`control_plane`](Self::control_plane) | required |
/// | `AGENT_ID` | [`agent_id`](Self::agent_id) | required |
/// | `AGENT_AUTH_TOKEN` | [`token`](Self::token) | required |
/// | `AGENT_MAX_INFLIGHT` | [`max_inflight`](Self::max_inflight) | 64 |
/// | `AGENT_POOL_<KIND>_SIZE` (`DNS`, `HTTP`, `TCP`, `PING`, `TRACE`) | [`pools`](Self::pools) | 16, 8, 8, 2, 1 |
/// | `AGENT_DNS_SERVERS` (comma-separated `ip:port`) | [`dns_servers`](Self::dns_servers) | the system's |
/// | `AGENT_DNS_LISTEN`, `AGENT_DNS_UPSTREAM`, `AGENT_DNS_UPSTREAM_TIMEOUT` | [`dns_forwarder`](Self::dns_forwarder) (see [`ForwarderConfig::from_vars`]) | off |
/// | `AGENT_TARGET_MAX_INFLIGHT` | [`target_limits.max`](TargetLimits::max) | 32 |
/// | `AGENT_TRACE_RUNTIME_WORKERS` | [`trace_runtime_workers`](Self::trace_runtime_workers) | 2 |
/// | `AGENT_CONFIG` (a TOML file, read first; the variables above override it) | see [`from_toml_str`](Self::from_toml_str) | none |
///
/// Its `Debug` shows the token as `"<redacted>"`.
#[derive(Clone)]
#[non_exhaustive]
pub struct AgentConfig {
    /// The control plane's base URL (`http://host:port`).
    pub control_plane: String,
    /// The agent's id.
    pub agent_id: String,
    /// The agent's token (at least 8 bytes): bound to the id at its first registration.
    pub token: String,
    /// Probes running at once, all kinds together: the ceiling of the agent's global AIMD
    /// window (which starts there). Default is 64.
    pub max_inflight: u32,
    /// Probes running at once per kind — the ceiling of the kind's AIMD window, which starts
    /// there; a kind's queue holds as many again. Defaults are DNS 16, HTTP 8, TCP 8, ping 2,
    /// trace 1.
    pub pools: BTreeMap<TaskKind, u32>,
    /// The AIMD windows per target (a host, or a DNS task's name): where they start (8),
    /// their ceiling (32, `AGENT_TARGET_MAX_INFLIGHT`), how many targets keep one (4096,
    /// the idle ones forgotten beyond).
    pub target_limits: TargetLimits,
    /// The worker threads of the runtime that ping and trace probes run on, apart from the
    /// agent's own tasks (`AGENT_TRACE_RUNTIME_WORKERS`). Default is 2, the seed's minimum:
    /// a lower value is raised to 2. No such runtime is started when neither kind has a pool.
    pub trace_runtime_workers: usize,
    /// How often to send a heartbeat. Default is 5 seconds (the seed's); more often when the
    /// control plane asks for it at registration.
    pub heartbeat_every: Duration,
    /// How often to extend the leases held. Default is 2 seconds (the seed's), and never less
    /// often than a third of the control plane's lease.
    pub extend_every: Duration,
    /// The first wait after an empty claim or a failed call; it doubles (with jitter) up to
    /// [`claim_backoff_max`](Self::claim_backoff_max). Default is 100 ms.
    pub claim_backoff_min: Duration,
    /// The longest wait between claims while nothing comes. Default is 5 seconds.
    pub claim_backoff_max: Duration,
    /// The timeout of each call to the control plane. Default is 5 seconds.
    pub call_timeout: Duration,
    /// The name servers of DNS probes and of names in TCP and HTTP probes. Default is none:
    /// the system's configuration.
    pub dns_servers: Vec<SocketAddr>,
    /// The policy of HTTP probes (and its address guard). Default is
    /// [`AgentConfig::default_probe_policy`]: private and loopback addresses refused, one
    /// attempt per probe, the client's own per-host AIMD window off (the agent's per-target
    /// window, [`target_limits`](Self::target_limits), bounds every kind). `dns.nameservers` is
    /// set from [`dns_servers`](Self::dns_servers) when that is not empty.
    pub probe_policy: NetPolicy,
    /// The policy of the calls to the control plane. Default is [`NetPolicy::default`] with
    /// the control plane's host granted (a control plane usually lives on a private network).
    pub control_policy: Option<NetPolicy>,
    /// The UDP DNS forwarder the binary runs beside the agent ([`crate::forwarder`]), bounded
    /// by [`max_inflight`](Self::max_inflight). Default is none (off); from the environment,
    /// on when `AGENT_DNS_LISTEN` is set.
    pub dns_forwarder: Option<ForwarderConfig>,
}

/// The configuration file's shape (see [`AgentConfig::from_toml_str`]).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    control_plane: String,
    agent_id: String,
    token: String,
    #[serde(default)]
    max_inflight: Option<u32>,
    #[serde(default)]
    pools: BTreeMap<TaskKind, u32>,
    #[serde(default)]
    target_max_inflight: Option<u32>,
    #[serde(default)]
    trace_runtime_workers: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    heartbeat_every: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    extend_every: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    claim_backoff_min: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    claim_backoff_max: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    call_timeout: Option<Duration>,
    #[serde(default)]
    dns_servers: Option<Vec<SocketAddr>>,
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("control_plane", &self.control_plane)
            .field("agent_id", &self.agent_id)
            .field("token", &"<redacted>")
            .field("max_inflight", &self.max_inflight)
            .field("pools", &self.pools)
            .field("target_limits", &self.target_limits)
            .field("trace_runtime_workers", &self.trace_runtime_workers)
            .field("heartbeat_every", &self.heartbeat_every)
            .field("extend_every", &self.extend_every)
            .field("claim_backoff_min", &self.claim_backoff_min)
            .field("claim_backoff_max", &self.claim_backoff_max)
            .field("call_timeout", &self.call_timeout)
            .field("dns_servers", &self.dns_servers)
            .field("dns_forwarder", &self.dns_forwarder)
            .finish_non_exhaustive()
    }
}

impl AgentConfig {
    /// A configuration with the defaults, for the control plane at `control_plane`.
    pub fn new(
        control_plane: impl Into<String>,
        agent_id: impl Into<String>,
        token: impl Into<String>,
    ) -> Self {
        Self {
            control_plane: control_plane.into(),
            agent_id: agent_id.into(),
            token: token.into(),
            max_inflight: 64,
            pools: BTreeMap::from([
                (TaskKind::Dns, 16),
                (TaskKind::Http, 8),
                (TaskKind::Tcp, 8),
                (TaskKind::Ping, 2),
                (TaskKind::Trace, 1),
            ]),
            target_limits: TargetLimits::default(),
            trace_runtime_workers: 2,
            heartbeat_every: Duration::from_secs(5),
            extend_every: Duration::from_secs(2),
            claim_backoff_min: Duration::from_millis(100),
            claim_backoff_max: Duration::from_secs(5),
            call_timeout: Duration::from_secs(5),
            dns_servers: Vec::new(),
            probe_policy: Self::default_probe_policy(),
            control_policy: None,
            dns_forwarder: None,
        }
    }

    /// The default policy of HTTP probes: the workspace's defaults (the address guard
    /// refusing private and loopback addresses, TLS 1.2+, 30 s in total), with one attempt
    /// per probe — a probe measures its target, and a retry would hide what it saw — and a
    /// probe waiting up to 10 s for a slot of the client's per-host limits rather than
    /// failing at once. The client's own AIMD window (`limits.aimd`) is off: the agent keeps
    /// one per target for every kind of probe (see [`target_limits`](Self::target_limits)),
    /// and a second window on HTTP probes would halve twice for one overload.
    pub fn default_probe_policy() -> NetPolicy {
        let mut policy = NetPolicy::default();
        policy.retry.max_attempts = 1;
        policy.limits.aimd.enabled = false;
        policy.limits.max_wait = Duration::from_secs(10);
        policy
    }

    /// Reads the seed's variables (see the table above) through `var`.
    ///
    /// # Errors
    /// `InvalidRequest` naming the variable that is missing or does not read.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_agent::agent::AgentConfig;
    /// use soulbase_net_agent::protocol::TaskKind;
    ///
    /// let env = [
    ///     ("AGENT_CONTROL_PLANE", "http://127.0.0.1:7070"),
    ///     ("AGENT_ID", "probe-1"),
    ///     ("AGENT_AUTH_TOKEN", "s3cret-token"),
    ///     ("AGENT_POOL_DNS_SIZE", "4"),
    /// ];
    /// let config = AgentConfig::from_vars(|name| {
    ///     env.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    /// })?;
    /// assert_eq!(config.pools[&TaskKind::Dns], 4);
    /// assert_eq!(config.max_inflight, 64);
    /// # Ok::<(), soulbase_net_core::NetError>(())
    /// ```
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, NetError> {
        let need = |name: &str| {
            var(name)
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| NetError::invalid_request(format!("{name} is required")))
        };
        let mut config = match var("AGENT_CONFIG").filter(|p| !p.trim().is_empty()) {
            Some(path) => {
                let mut config = Self::from_file(path.trim())?;
                let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
                if let Some(v) = set("AGENT_CONTROL_PLANE") {
                    config.control_plane = v;
                }
                if let Some(v) = set("AGENT_ID") {
                    config.agent_id = v;
                }
                if let Some(v) = set("AGENT_AUTH_TOKEN") {
                    config.token = v;
                }
                config
            }
            None => Self::new(
                need("AGENT_CONTROL_PLANE")?,
                need("AGENT_ID")?,
                need("AGENT_AUTH_TOKEN")?,
            ),
        };
        let number = |name: &str| -> Result<Option<u32>, NetError> {
            match var(name) {
                None => Ok(None),
                Some(v) => v.trim().parse::<u32>().map(Some).map_err(|_| {
                    NetError::invalid_request(format!("{name} must be a whole number, not `{v}`"))
                }),
            }
        };
        if let Some(n) = number("AGENT_MAX_INFLIGHT")? {
            config.max_inflight = n;
        }
        if let Some(n) = number("AGENT_TARGET_MAX_INFLIGHT")? {
            config.target_limits.max = n;
        }
        if let Some(n) = number("AGENT_TRACE_RUNTIME_WORKERS")? {
            config.trace_runtime_workers = n as usize;
        }
        for kind in TaskKind::ALL {
            let name = format!("AGENT_POOL_{}_SIZE", kind.as_str().to_uppercase());
            if let Some(n) = number(&name)? {
                config.pools.insert(kind, n);
            }
        }
        if let Some(list) = var("AGENT_DNS_SERVERS") {
            config.dns_servers = list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse().map_err(|_| {
                        NetError::invalid_request(format!(
                            "AGENT_DNS_SERVERS: `{s}` is not an ip:port"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        config.dns_forwarder =
            ForwarderConfig::from_vars(&var, config.max_inflight, &config.dns_servers)?;
        config.validate()?;
        Ok(config)
    }

    /// A configuration from a TOML document: `control_plane`, `agent_id` and `token`
    /// required; `max_inflight`, `pools` (a table of kind to size), `target_max_inflight`,
    /// `trace_runtime_workers`, `heartbeat_every`,
    /// `extend_every`, `claim_backoff_min`, `claim_backoff_max`, `call_timeout` (durations
    /// as `"5s"`, `"250ms"`) and `dns_servers` (`["127.0.0.1:53"]`) optional, with the
    /// defaults of [`new`](Self::new). Unknown fields are refused.
    ///
    /// # Errors
    /// `InvalidRequest` naming what does not read, or what cannot work.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use soulbase_net_agent::agent::AgentConfig;
    /// use soulbase_net_agent::protocol::TaskKind;
    ///
    /// let config = AgentConfig::from_toml_str(r#"
    ///     control_plane = "http://10.0.0.5:7070"
    ///     agent_id = "probe-1"
    ///     token = "a-long-secret"
    ///     heartbeat_every = "3s"
    ///     pools = { dns = 32, trace = 0 }
    /// "#)?;
    /// assert_eq!(config.heartbeat_every, Duration::from_secs(3));
    /// assert_eq!(config.pools[&TaskKind::Dns], 32);
    /// assert_eq!(config.pools[&TaskKind::Http], 8);
    /// # Ok::<(), soulbase_net_core::NetError>(())
    /// ```
    pub fn from_toml_str(text: &str) -> Result<Self, NetError> {
        let file: FileConfig = toml::from_str(text)
            .map_err(|e| NetError::invalid_request(format!("agent configuration: {e}")))?;
        let mut config = Self::new(file.control_plane, file.agent_id, file.token);
        if let Some(n) = file.max_inflight {
            config.max_inflight = n;
        }
        config.pools.extend(file.pools);
        if let Some(n) = file.target_max_inflight {
            config.target_limits.max = n;
        }
        if let Some(n) = file.trace_runtime_workers {
            config.trace_runtime_workers = n;
        }
        let durations = [
            (file.heartbeat_every, &mut config.heartbeat_every),
            (file.extend_every, &mut config.extend_every),
            (file.claim_backoff_min, &mut config.claim_backoff_min),
            (file.claim_backoff_max, &mut config.claim_backoff_max),
            (file.call_timeout, &mut config.call_timeout),
        ];
        for (given, field) in durations {
            if let Some(d) = given {
                *field = d;
            }
        }
        if let Some(servers) = file.dns_servers {
            config.dns_servers = servers;
        }
        config.validate()?;
        Ok(config)
    }

    /// [`from_toml_str`](Self::from_toml_str) of the file at `path`.
    ///
    /// # Errors
    /// `InvalidRequest` when the file cannot be read, or as
    /// [`from_toml_str`](Self::from_toml_str).
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Self, NetError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            NetError::invalid_request(format!("agent configuration {}: {e}", path.display()))
        })?;
        Self::from_toml_str(&text)
    }

    /// [`from_vars`](Self::from_vars) over the process's environment.
    ///
    /// # Errors
    /// As [`from_vars`](Self::from_vars).
    pub fn from_env() -> Result<Self, NetError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Checks what cannot work, every problem listed.
    ///
    /// # Errors
    /// `InvalidRequest` with the problems.
    pub fn validate(&self) -> Result<(), NetError> {
        let mut problems = Vec::new();
        if !(self.control_plane.starts_with("http://")
            || self.control_plane.starts_with("https://"))
        {
            problems.push("control_plane must be an http:// or https:// URL".to_owned());
        }
        if self.agent_id.is_empty() || self.agent_id.len() > 200 {
            problems.push("agent_id must be 1 to 200 bytes".to_owned());
        }
        if self.token.len() < 8 {
            problems.push("the token must be at least 8 bytes".to_owned());
        }
        if self.max_inflight == 0 {
            problems.push("max_inflight must be at least 1".to_owned());
        }
        if self.target_limits.max == 0 || self.target_limits.max_targets == 0 {
            problems.push(
                "target_limits.max (AGENT_TARGET_MAX_INFLIGHT) and max_targets must be at least 1"
                    .to_owned(),
            );
        }
        if self.heartbeat_every.is_zero() || self.extend_every.is_zero() {
            problems.push("heartbeat_every and extend_every must not be zero".to_owned());
        }
        if self.claim_backoff_min.is_zero() || self.claim_backoff_max < self.claim_backoff_min {
            problems
                .push("claim_backoff_min must not be zero nor above claim_backoff_max".to_owned());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(NetError::invalid_request(format!(
                "agent configuration: {}",
                problems.join("; ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_leaves_the_token_out_and_validation_lists_every_problem() {
        let config = AgentConfig::new("http://127.0.0.1:1", "a1", "very-secret-token");
        assert!(!format!("{config:?}").contains("very-secret-token"));
        let mut bad = AgentConfig::new("ftp://x", "", "short");
        bad.max_inflight = 0;
        let text = bad
            .validate()
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        for problem in ["control_plane", "agent_id", "token", "max_inflight"] {
            assert!(text.contains(problem), "{problem} in {text}");
        }
    }

    #[test]
    fn a_missing_or_unreadable_variable_is_named() {
        let vars = |extra: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                [
                    ("AGENT_CONTROL_PLANE", "http://127.0.0.1:7070"),
                    ("AGENT_ID", "probe-1"),
                    ("AGENT_AUTH_TOKEN", "a-long-secret"),
                ]
                .iter()
                .chain(extra)
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
            }
        };
        let err = AgentConfig::from_vars(|n| vars(&[])(n).filter(|_| n != "AGENT_ID"))
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        assert!(err.contains("AGENT_ID"), "{err}");
        let err = AgentConfig::from_vars(vars(&[("AGENT_POOL_TCP_SIZE", "many")]))
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        assert!(err.contains("AGENT_POOL_TCP_SIZE"), "{err}");
        let ok = AgentConfig::from_vars(vars(&[
            ("AGENT_MAX_INFLIGHT", "8"),
            ("AGENT_DNS_SERVERS", "127.0.0.1:5353, [::1]:53"),
            ("AGENT_TARGET_MAX_INFLIGHT", "5"),
            ("AGENT_TRACE_RUNTIME_WORKERS", "3"),
        ]));
        assert!(
            matches!(ok, Ok(ref c) if c.max_inflight == 8 && c.dns_servers.len() == 2
            && c.target_limits.max == 5 && c.trace_runtime_workers == 3)
        );
        let err = AgentConfig::from_vars(vars(&[("AGENT_TRACE_RUNTIME_WORKERS", "two")]))
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        assert!(err.contains("AGENT_TRACE_RUNTIME_WORKERS"), "{err}");
    }

    #[test]
    fn a_file_read_first_and_the_variables_over_it() {
        let path = std::env::temp_dir().join(format!("agent-config-{}.toml", std::process::id()));
        let written = std::fs::write(
            &path,
            "control_plane = \"http://127.0.0.1:7070\"\nagent_id = \"from-file\"\n\
             token = \"a-long-secret\"\nmax_inflight = 4\ncall_timeout = \"750ms\"\n\
             dns_servers = [\"127.0.0.1:5353\"]\n",
        );
        assert!(written.is_ok());
        let file = path.display().to_string();
        let config = AgentConfig::from_vars(|name| match name {
            "AGENT_CONFIG" => Some(file.clone()),
            "AGENT_ID" => Some("from-env".to_owned()),
            _ => None,
        });
        let _ = std::fs::remove_file(&path);
        assert!(
            matches!(&config, Ok(c) if c.agent_id == "from-env" && c.max_inflight == 4
                && c.call_timeout == Duration::from_millis(750) && c.dns_servers.len() == 1),
            "{config:?}"
        );
        let unknown = AgentConfig::from_toml_str(
            "control_plane = \"http://x:1\"\nagent_id = \"a\"\ntoken = \"a-long-secret\"\ncolour = 1\n",
        );
        assert!(unknown.is_err());
    }

    #[test]
    fn the_dns_forwarder_is_on_with_agent_dns_listen_and_bounded_by_max_inflight() {
        let base = |name: &str| match name {
            "AGENT_CONTROL_PLANE" => Some("http://127.0.0.1:7070".to_owned()),
            "AGENT_ID" => Some("probe-1".to_owned()),
            "AGENT_AUTH_TOKEN" => Some("a-long-secret".to_owned()),
            "AGENT_MAX_INFLIGHT" => Some("12".to_owned()),
            "AGENT_DNS_SERVERS" => Some("127.0.0.1:5353".to_owned()),
            _ => None,
        };
        let off = AgentConfig::from_vars(base);
        assert!(
            matches!(off, Ok(ref c) if c.dns_forwarder.is_none()),
            "{off:?}"
        );
        let on = AgentConfig::from_vars(|name| match name {
            "AGENT_DNS_LISTEN" => Some("127.0.0.1:5300".to_owned()),
            _ => base(name),
        });
        let forwarder = on.ok().and_then(|c| c.dns_forwarder);
        assert!(
            matches!(&forwarder, Some(f) if f.max_inflight == 12
                && f.upstream == SocketAddr::from(([127, 0, 0, 1], 5353))),
            "{forwarder:?}"
        );
    }
}
