//! The TCP probe: how long a connect to `host:port` takes, or how it fails.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use soulbase_net_runtime::DnsResolver;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{millis, ProbeResult};
use crate::protocol::Observation;

/// Connects to the first address of `host` (an IP literal, or a name looked up through the
/// agent's resolver) within `timeout`. Observations: `connected`, `address`, `connect_ms`
/// (ms); `resolve_ms` (ms) for a name; `error_kind` (`refused`, `timeout`, `unreachable`,
/// `dns`, `io`) on failure.
pub(super) async fn probe(
    resolver: &DnsResolver,
    host: &str,
    port: u16,
    timeout: Duration,
) -> ProbeResult {
    let start = Instant::now();
    let mut observations = Vec::new();
    let ip = match host.trim_matches(['[', ']']).parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => match tokio::time::timeout(timeout, resolver.resolve(host)).await {
            Ok(Ok(res)) => {
                observations.push(Observation::with_unit(
                    "resolve_ms",
                    millis(res.elapsed),
                    "ms",
                ));
                match res.addrs.first() {
                    Some(ip) => *ip,
                    None => {
                        observations.push(Observation::new("connected", false));
                        observations.push(Observation::new("error_kind", "dns"));
                        return ProbeResult::error(observations, format!("no address for {host}"));
                    }
                }
            }
            Ok(Err(e)) => {
                observations.push(Observation::new("connected", false));
                observations.push(Observation::new("error_kind", "dns"));
                return ProbeResult::error(observations, e.to_string());
            }
            Err(_) => {
                observations.push(Observation::new("connected", false));
                observations.push(Observation::new("error_kind", "timeout"));
                return ProbeResult::error(observations, format!("resolving {host} timed out"));
            }
        },
    };
    let addr = SocketAddr::new(ip, port);
    observations.push(Observation::new("address", addr.to_string()));
    let left = timeout.saturating_sub(start.elapsed());
    let connect_start = Instant::now();
    let outcome = tokio::time::timeout(left, TcpStream::connect(addr)).await;
    let took = connect_start.elapsed();
    match outcome {
        Ok(Ok(stream)) => {
            drop(stream);
            observations.push(Observation::new("connected", true));
            observations.push(Observation::with_unit("connect_ms", millis(took), "ms"));
            ProbeResult::ok(observations)
        }
        Ok(Err(e)) => {
            let kind = match e.kind() {
                std::io::ErrorKind::ConnectionRefused => "refused",
                std::io::ErrorKind::TimedOut => "timeout",
                std::io::ErrorKind::HostUnreachable | std::io::ErrorKind::NetworkUnreachable => {
                    "unreachable"
                }
                _ => "io",
            };
            observations.push(Observation::new("connected", false));
            observations.push(Observation::with_unit("connect_ms", millis(took), "ms"));
            observations.push(Observation::new("error_kind", kind));
            ProbeResult::error(observations, format!("connecting to {addr}: {e}"))
        }
        Err(_) => {
            observations.push(Observation::new("connected", false));
            observations.push(Observation::new("error_kind", "timeout"));
            ProbeResult::error(
                observations,
                format!("no connection to {addr} within {timeout:?}"),
            )
        }
    }
}
