//! The trace probe: ICMP echo requests to one IPv4 or IPv6 address over a raw socket with
//! TTL (hop limit) 1, 2, … up to `max_hops`, one probe per hop and one hop at a time. The
//! router where a probe's TTL runs out answers time exceeded and so names itself; the target
//! answers the echo.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use serde_json::{json, Value};
use soulbase_net_runtime::DnsResolver;
use tokio::time::Instant;

use super::icmp::{self, IcmpSocket, Message, Quoted, Received};
use super::{millis, ProbeResult};
use crate::protocol::Observation;

/// A trace task's parameters.
#[derive(Debug)]
pub(super) struct TraceTask {
    /// The highest TTL probed, at least 1.
    pub(super) max_hops: u8,
    /// How long each hop's probe waits for its answer.
    pub(super) timeout: Duration,
}

/// How a probe was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// A router on the way: time exceeded.
    Hop,
    /// The target: echo reply.
    Target,
    /// Destination unreachable, with its code.
    Unreachable(u8),
}

/// One hop: the TTL probed, and who answered and when (`None` when nobody did in time).
#[derive(Debug)]
struct Hop {
    ttl: u8,
    answer: Option<(IpAddr, Duration, Answer)>,
}

impl Hop {
    fn to_json(&self) -> Value {
        match self.answer {
            Some((from, rtt, _)) => {
                json!({"ttl": self.ttl, "address": from.to_string(), "rtt_ms": millis(rtt)})
            }
            None => json!({"ttl": self.ttl, "address": null, "rtt_ms": null}),
        }
    }
}

/// Traces the path to `host` (an IP literal, or a name looked up through the agent's
/// resolver). Observations: `address`, `hops` (one `{"ttl", "address", "rtt_ms"}` per TTL
/// probed, `address` and `rtt_ms` null for a silent hop; unit ms, of `rtt_ms`), `reached`,
/// `hop_count` (the hops listed: the target's distance when reached),
/// `unreachable_from`/`unreachable_code` when a router stopped the trace, `resolve_ms` (ms)
/// for a name, `error_kind` on failure. Ok when the target answered.
pub(super) async fn probe(resolver: &DnsResolver, host: &str, task: TraceTask) -> ProbeResult {
    let mut observations = Vec::new();
    if task.max_hops == 0 {
        observations.push(Observation::new("error_kind", "invalid_request"));
        return ProbeResult::error(observations, "max_hops must be at least 1");
    }
    let target = match icmp::resolve(resolver, host, task.timeout, &mut observations).await {
        Ok(ip) => ip,
        Err(result) => return result,
    };
    observations.push(Observation::new("address", target.to_string()));
    let socket = match IcmpSocket::open(target) {
        Ok(s) => s,
        Err(e) => return icmp::failure(observations, "opening a raw ICMP socket", &e),
    };
    let hops = match trace(&socket, target, &task).await {
        Ok(hops) => hops,
        Err(e) => return icmp::failure(observations, &format!("tracing {target}"), &e),
    };
    let last = hops.last().and_then(|h| h.answer);
    let reached =
        matches!(last, Some((from, _, Answer::Target | Answer::Unreachable(_))) if from == target);
    observations.push(Observation::with_unit(
        "hops",
        hops.iter().map(Hop::to_json).collect::<Vec<_>>(),
        "ms",
    ));
    observations.push(Observation::new("reached", reached));
    observations.push(Observation::new("hop_count", hops.len()));
    if reached {
        return ProbeResult::ok(observations);
    }
    if let Some((from, _, Answer::Unreachable(code))) = last {
        observations.push(Observation::new("unreachable_from", from.to_string()));
        observations.push(Observation::new("unreachable_code", code));
        observations.push(Observation::new("error_kind", "unreachable"));
        let reason = icmp::unreachable_reason(from, code);
        return ProbeResult::error(observations, format!("{from} reports {target}: {reason}"));
    }
    observations.push(Observation::new("error_kind", "timeout"));
    let error = format!("{target} not reached within {} hops", task.max_hops);
    ProbeResult::error(observations, error)
}

/// A trace's probes: echo requests with one identifier and payload, the sequence number of
/// each a random start plus its TTL.
#[derive(Debug)]
struct Probe {
    target: IpAddr,
    id: u16,
    first_seq: u16,
    payload: Vec<u8>,
}

impl Probe {
    fn seq(&self, ttl: u8) -> u16 {
        self.first_seq.wrapping_add(u16::from(ttl))
    }

    /// Who answered the probe of `ttl` and how, when what came (from whom) is that answer. A late
    /// answer to an earlier hop's probe is not one.
    fn answer(&self, (from, received): (IpAddr, &[u8]), ttl: u8) -> Option<(IpAddr, Answer)> {
        let seq = self.seq(ttl);
        let ours = |q: Quoted| q.dest == self.target && q.id == self.id && q.seq == seq;
        let Received { from, message } = icmp::parse(from, received)?;
        match message {
            Message::EchoReply {
                id,
                seq: s,
                payload,
            } if from == self.target && id == self.id && s == seq && payload == self.payload => {
                Some((from, Answer::Target))
            }
            Message::TimeExceeded(q) if ours(q) => Some((from, Answer::Hop)),
            Message::Unreachable(code, q) if ours(q) => Some((from, Answer::Unreachable(code))),
            _ => None,
        }
    }
}

/// Probes TTL 1, 2, … until the target answers, a router reports it unreachable, or
/// `max_hops` is probed.
async fn trace(socket: &IcmpSocket, target: IpAddr, task: &TraceTask) -> io::Result<Vec<Hop>> {
    let probe = Probe {
        target,
        id: fastrand::u16(..),
        first_seq: fastrand::u16(..),
        payload: icmp::payload(fastrand::u64(..)),
    };
    let mut buf = vec![0u8; 4096];
    let mut hops = Vec::new();
    for ttl in 1..=task.max_hops {
        socket.set_ttl(ttl)?;
        let request = icmp::echo_request(target, probe.id, probe.seq(ttl), &probe.payload);
        // Timed from before the send: the answer can be queued before the send returns.
        let sent = Instant::now();
        socket.send(&request, target).await?;
        let deadline = sent + task.timeout;
        let answer = loop {
            let Ok(got) = tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await else {
                break None;
            };
            let rtt = sent.elapsed();
            if let Some((from, answer)) = probe.answer(got?, ttl) {
                break Some((from, rtt, answer));
            }
        };
        tracing::debug!(ttl, hop = ?answer.map(|(from, _, _)| from), "trace hop");
        let last = !matches!(answer, None | Some((_, _, Answer::Hop)));
        hops.push(Hop { ttl, answer });
        if last {
            break;
        }
    }
    Ok(hops)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use super::*;

    /// An ICMPv6 message of `kind` quoting our echo request `seq` to `dest` (an IPv6 header
    /// and the echo's first 8 bytes), as a raw ICMPv6 socket hands it over.
    fn quoting(kind: u8, code: u8, dest: Ipv6Addr, id: u16, seq: u16) -> Vec<u8> {
        let mut m = vec![kind, code, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(&[0x60, 0, 0, 0, 0, 16, 58, 1]);
        m.extend_from_slice(&Ipv6Addr::UNSPECIFIED.octets());
        m.extend_from_slice(&dest.octets());
        m.extend_from_slice(&icmp::echo_request(IpAddr::V6(dest), id, seq, &[])[..8]);
        m
    }

    #[test]
    fn a_hop_answer_counts_only_for_this_ttl_s_probe() {
        let target: Ipv6Addr = "fd00:9:3::2".parse().unwrap();
        let router = IpAddr::V6("fd00:9:1::2".parse().unwrap());
        let probe = Probe {
            target: IpAddr::V6(target),
            id: 0x1234,
            first_seq: u16::MAX,
            payload: icmp::payload(7),
        };
        // The sequence wraps: TTL 1 is sequence 0, TTL 2 is 1.
        assert_eq!((probe.seq(1), probe.seq(2)), (0, 1));
        let exceeded = |id, seq| quoting(3, 0, target, id, seq);
        assert_eq!(
            probe.answer((router, &exceeded(0x1234, 1)), 2),
            Some((router, Answer::Hop))
        );
        // A late answer to TTL 1's probe, another trace's, one about another destination.
        assert_eq!(probe.answer((router, &exceeded(0x1234, 0)), 2), None);
        assert_eq!(probe.answer((router, &exceeded(0x1235, 1)), 2), None);
        let elsewhere = quoting(3, 0, "fd00:9:3::9".parse().unwrap(), 0x1234, 1);
        assert_eq!(probe.answer((router, &elsewhere), 2), None);
        // Unreachable names its code; the target's own echo reply reaches it.
        assert_eq!(
            probe.answer((router, &quoting(1, 1, target, 0x1234, 1)), 2),
            Some((router, Answer::Unreachable(1)))
        );
        let mut reply = icmp::echo_request(IpAddr::V6(target), 0x1234, 1, &probe.payload);
        reply[0] = 129;
        let from_target = IpAddr::V6(target);
        assert_eq!(
            probe.answer((from_target, &reply), 2),
            Some((from_target, Answer::Target))
        );
        // An echo reply from elsewhere (with our id and sequence) is not the target's.
        assert_eq!(probe.answer((router, &reply), 2), None);
    }
}
