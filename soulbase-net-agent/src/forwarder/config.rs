//! [`ForwarderConfig`]: where the forwarder listens, where it forwards, how many queries it
//! keeps out at once and how long it waits for the upstream; from a struct or from the
//! agent's environment variables.

use std::net::SocketAddr;
use std::time::Duration;

use soulbase_net_core::NetError;

/// Queries out at once when nothing else is said: the agent's `AGENT_MAX_INFLIGHT` default.
const DEFAULT_MAX_INFLIGHT: u32 = 64;

/// How long a query waits for the upstream when nothing else is said. Why 2 s: under the
/// usual stub resolvers' retry interval (glibc and hickory wait 5 s), so a lost query frees
/// its slot before its client asks again.
const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// How the [`Forwarder`](super::Forwarder) runs.
///
/// From the environment ([`from_vars`](Self::from_vars)), as the agent names it:
///
/// | variable | field | default |
/// | --- | --- | --- |
/// | `AGENT_DNS_LISTEN` (`ip:port`; the forwarder runs only when it is set) | [`listen`](Self::listen) | none |
/// | `AGENT_DNS_UPSTREAM` (`ip:port`) | [`upstream`](Self::upstream) | the first of `AGENT_DNS_SERVERS` |
/// | `AGENT_DNS_UPSTREAM_TIMEOUT` (`"2s"`, `"250ms"`) | [`upstream_timeout`](Self::upstream_timeout) | 2 s |
/// | `AGENT_MAX_INFLIGHT` | [`max_inflight`](Self::max_inflight) | 64 |
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use soulbase_net_agent::forwarder::ForwarderConfig;
///
/// let config = ForwarderConfig::new("127.0.0.1:5300".parse()?, "127.0.0.1:53".parse()?)
///     .max_inflight(16)
///     .upstream_timeout(Duration::from_millis(500));
/// assert!(config.validate().is_ok());
/// assert_eq!(config.max_inflight, 16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForwarderConfig {
    /// The UDP address queries arrive on. Port 0 takes a free port (see
    /// [`Forwarder::local_addr`](super::Forwarder::local_addr)). No default: given to
    /// [`new`](Self::new).
    pub listen: SocketAddr,
    /// The name server every query is forwarded to. No default: given to [`new`](Self::new).
    pub upstream: SocketAddr,
    /// Queries forwarded and not yet answered or timed out, at most. When all are out, the
    /// forwarder stops reading until one ends. Default is 64 (`AGENT_MAX_INFLIGHT`'s).
    pub max_inflight: u32,
    /// How long a query waits for its answer; past it the client gets none and a warning is
    /// logged. Default is 2 seconds.
    pub upstream_timeout: Duration,
}

impl ForwarderConfig {
    /// Forwards what arrives on `listen` to `upstream`, with the defaults.
    pub fn new(listen: SocketAddr, upstream: SocketAddr) -> Self {
        Self {
            listen,
            upstream,
            max_inflight: DEFAULT_MAX_INFLIGHT,
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
        }
    }

    /// Sets [`max_inflight`](Self::max_inflight). Default is 64.
    pub fn max_inflight(mut self, n: u32) -> Self {
        self.max_inflight = n;
        self
    }

    /// Sets [`upstream_timeout`](Self::upstream_timeout). Default is 2 seconds.
    pub fn upstream_timeout(mut self, timeout: Duration) -> Self {
        self.upstream_timeout = timeout;
        self
    }

    /// Reads the forwarder's variables (see the table above) through `var`: `None` when
    /// `AGENT_DNS_LISTEN` is not set (the forwarder is off). `max_inflight` is the agent's
    /// (`AGENT_MAX_INFLIGHT`, already read), and `dns_servers` the agent's name servers
    /// (`AGENT_DNS_SERVERS`), whose first is the upstream when `AGENT_DNS_UPSTREAM` is not set.
    ///
    /// # Errors
    /// `InvalidRequest` naming the variable that does not read, or what cannot work (see
    /// [`validate`](Self::validate)).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use soulbase_net_agent::forwarder::ForwarderConfig;
    ///
    /// let env = [("AGENT_DNS_LISTEN", "127.0.0.1:5300"), ("AGENT_DNS_UPSTREAM_TIMEOUT", "750ms")];
    /// let var = |name: &str| env.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string());
    /// let config = ForwarderConfig::from_vars(var, 8, &["127.0.0.1:53".parse()?])?;
    /// let config = config.ok_or("the forwarder is on")?;
    /// assert_eq!(config.upstream, "127.0.0.1:53".parse()?);
    /// assert_eq!(config.upstream_timeout, Duration::from_millis(750));
    /// assert_eq!(config.max_inflight, 8);
    /// assert_eq!(ForwarderConfig::from_vars(|_| None, 8, &[])?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        max_inflight: u32,
        dns_servers: &[SocketAddr],
    ) -> Result<Option<Self>, NetError> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let address = |name: &str, value: &str| {
            value.trim().parse::<SocketAddr>().map_err(|_| {
                NetError::invalid_request(format!("{name}: `{value}` is not an ip:port"))
            })
        };
        let Some(listen) = set("AGENT_DNS_LISTEN") else {
            return Ok(None);
        };
        let listen = address("AGENT_DNS_LISTEN", &listen)?;
        let upstream = match set("AGENT_DNS_UPSTREAM") {
            Some(v) => address("AGENT_DNS_UPSTREAM", &v)?,
            None => *dns_servers.first().ok_or_else(|| {
                NetError::invalid_request(
                    "AGENT_DNS_UPSTREAM (or AGENT_DNS_SERVERS) is required when AGENT_DNS_LISTEN is set",
                )
            })?,
        };
        let mut config = Self::new(listen, upstream).max_inflight(max_inflight);
        if let Some(v) = set("AGENT_DNS_UPSTREAM_TIMEOUT") {
            config.upstream_timeout = humantime_serde::re::humantime::parse_duration(v.trim())
                .map_err(|_| {
                    NetError::invalid_request(format!(
                        "AGENT_DNS_UPSTREAM_TIMEOUT: `{v}` is not a duration (\"2s\", \"250ms\")"
                    ))
                })?;
        }
        config.validate()?;
        Ok(Some(config))
    }

    /// Checks what cannot work, every problem listed: no query would ever be forwarded
    /// (`max_inflight` 0), every query would time out (a zero timeout), the upstream is not
    /// an address one can send to (port 0, an unspecified address), or it is the forwarder
    /// itself (each query would come back to it, forever).
    ///
    /// # Errors
    /// `InvalidRequest` with the problems.
    pub fn validate(&self) -> Result<(), NetError> {
        let mut problems = Vec::new();
        if self.max_inflight == 0 {
            problems.push("max_inflight must be at least 1");
        }
        if self.upstream_timeout.is_zero() {
            problems.push("upstream_timeout must not be zero");
        }
        if self.upstream.port() == 0 || self.upstream.ip().is_unspecified() {
            problems.push("the upstream must be an address with a port, not 0.0.0.0 or :0");
        }
        if self.upstream == self.listen {
            problems.push("the upstream must not be the forwarder's own address");
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(NetError::invalid_request(format!(
                "dns forwarder: {}",
                problems.join("; ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn problem(result: Result<Option<ForwarderConfig>, NetError>) -> String {
        result.map_err(|e| e.to_string()).err().unwrap_or_default()
    }

    #[test]
    fn validation_lists_every_problem() {
        let bad = ForwarderConfig::new(addr("127.0.0.1:5300"), addr("127.0.0.1:5300"))
            .max_inflight(0)
            .upstream_timeout(Duration::ZERO);
        let text = bad
            .validate()
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        for problem in ["max_inflight", "upstream_timeout", "own address"] {
            assert!(text.contains(problem), "{problem} in {text}");
        }
        let unspecified = ForwarderConfig::new(addr("127.0.0.1:5300"), addr("0.0.0.0:53"));
        assert!(unspecified.validate().is_err());
        let no_port = ForwarderConfig::new(addr("127.0.0.1:5300"), addr("127.0.0.1:0"));
        assert!(no_port.validate().is_err());
        let good = ForwarderConfig::new(addr("127.0.0.1:0"), addr("127.0.0.1:53"));
        assert!(good.validate().is_ok());
        assert_eq!(good.max_inflight, 64);
        assert_eq!(good.upstream_timeout, Duration::from_secs(2));
    }

    #[test]
    fn the_variables_are_read_and_a_bad_one_is_named() {
        assert_eq!(
            ForwarderConfig::from_vars(vars(&[]), 64, &[addr("127.0.0.1:53")]).ok(),
            Some(None),
            "off without AGENT_DNS_LISTEN"
        );
        let on = ForwarderConfig::from_vars(
            vars(&[
                ("AGENT_DNS_LISTEN", "127.0.0.1:5300"),
                ("AGENT_DNS_UPSTREAM", " 127.0.0.1:5353 "),
                ("AGENT_DNS_UPSTREAM_TIMEOUT", "250ms"),
            ]),
            4,
            &[addr("127.0.0.1:53")],
        );
        let expected = ForwarderConfig::new(addr("127.0.0.1:5300"), addr("127.0.0.1:5353"))
            .max_inflight(4)
            .upstream_timeout(Duration::from_millis(250));
        assert_eq!(on.ok(), Some(Some(expected)));
        let fallback = ForwarderConfig::from_vars(
            vars(&[("AGENT_DNS_LISTEN", "127.0.0.1:5300")]),
            4,
            &[addr("127.0.0.1:53"), addr("127.0.0.1:54")],
        );
        assert!(matches!(fallback, Ok(Some(ref c)) if c.upstream == addr("127.0.0.1:53")));
        let none =
            ForwarderConfig::from_vars(vars(&[("AGENT_DNS_LISTEN", "127.0.0.1:5300")]), 4, &[]);
        assert!(problem(none).contains("AGENT_DNS_UPSTREAM"));
        let listen = ForwarderConfig::from_vars(vars(&[("AGENT_DNS_LISTEN", "port 53")]), 4, &[]);
        assert!(problem(listen).contains("AGENT_DNS_LISTEN"));
        let timeout = ForwarderConfig::from_vars(
            vars(&[
                ("AGENT_DNS_LISTEN", "127.0.0.1:5300"),
                ("AGENT_DNS_UPSTREAM", "127.0.0.1:53"),
                ("AGENT_DNS_UPSTREAM_TIMEOUT", "soon"),
            ]),
            4,
            &[],
        );
        assert!(problem(timeout).contains("AGENT_DNS_UPSTREAM_TIMEOUT"));
        let zero = ForwarderConfig::from_vars(
            vars(&[
                ("AGENT_DNS_LISTEN", "127.0.0.1:5300"),
                ("AGENT_DNS_UPSTREAM", "127.0.0.1:53"),
            ]),
            0,
            &[],
        );
        assert!(problem(zero).contains("max_inflight"));
    }
}
