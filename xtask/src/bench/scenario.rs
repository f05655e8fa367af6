//! The load scenarios: protocol, callers, route and hosts.

use super::server::Listener;

/// The wire protocol of a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Proto {
    /// HTTP/1.1, keep-alive, a connection per caller in flight.
    H1,
    /// HTTP/2 with prior knowledge on plain TCP.
    H2c,
    /// HTTP/2 over TLS (ALPN).
    H2Tls,
    /// The FaultServer's TLS port: HTTP/3 on its UDP port or HTTP/2 over TLS, as the client
    /// asks (`bench --h3`).
    Quic,
}

/// Distinct host names of the many-hosts scenario.
pub(crate) const MANY_HOSTS: usize = 10_000;

/// One load scenario.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Scenario {
    /// Its name on the command line and in the JSON.
    pub(crate) name: &'static str,
    /// What it measures, for the table.
    pub(crate) title: &'static str,
    pub(crate) proto: Proto,
    /// Concurrent callers.
    pub(crate) callers: usize,
    /// The route: `/` answers 2 bytes, `/big` 1 MiB.
    pub(crate) path: &'static str,
    /// Distinct host names the requests go to in turn (1: just `127.0.0.1`).
    pub(crate) hosts: usize,
}

/// Every load scenario, in the order they run.
pub(crate) fn all() -> Vec<Scenario> {
    let s = |name, title, proto, callers, path, hosts| Scenario {
        name,
        title,
        proto,
        callers,
        path,
        hosts,
    };
    vec![
        s("h1-256", "HTTP/1.1, 256 callers", Proto::H1, 256, "/", 1),
        s("h1-16", "HTTP/1.1, 16 callers", Proto::H1, 16, "/", 1),
        s("h1-1", "HTTP/1.1, 1 caller", Proto::H1, 1, "/", 1),
        s(
            "h2c-256",
            "h2c, 256 callers on one connection",
            Proto::H2c,
            256,
            "/",
            1,
        ),
        s(
            "h2-tls-256",
            "HTTP/2 over TLS, 256 callers on one connection",
            Proto::H2Tls,
            256,
            "/",
            1,
        ),
        s(
            "body-1m",
            "HTTP/1.1, 1 MiB responses, 16 callers",
            Proto::H1,
            16,
            "/big",
            1,
        ),
        s(
            "hosts-10k",
            "HTTP/1.1, 10 000 distinct hosts in turn, 256 callers",
            Proto::H1,
            256,
            "/",
            MANY_HOSTS,
        ),
    ]
}

/// `bench --h3`: soulbase-net over HTTP/3 and over HTTP/2 with TLS against the same server,
/// 64 callers.
pub(crate) fn h3() -> Scenario {
    Scenario {
        name: H3,
        title: "HTTP/3 vs HTTP/2 over TLS, the same server, 64 callers",
        proto: Proto::Quic,
        callers: 64,
        path: "/",
        hosts: 1,
    }
}

/// The name of [`h3()`].
pub(crate) const H3: &str = "h3-64";

/// The names of the scenarios that are not load scenarios: the failing upstream (breaker
/// and retry budget) and the fleet row (a shared limit on Redis).
pub(crate) const EXTRAS: [&str; 2] = ["breaker", "fleet"];

impl Scenario {
    /// The listener its requests go to.
    pub(crate) fn listener(&self) -> Listener {
        match self.proto {
            Proto::H1 => Listener::H1,
            Proto::H2c => Listener::H2c,
            Proto::H2Tls => Listener::Tls,
            Proto::Quic => Listener::Quic,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_scenarios_are_all_there() {
        let names: Vec<&str> = all().iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "h1-256",
                "h1-16",
                "h1-1",
                "h2c-256",
                "h2-tls-256",
                "body-1m",
                "hosts-10k"
            ]
        );
    }
}
