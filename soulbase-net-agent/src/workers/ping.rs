//! The ping probe: `count` ICMP echo requests to one IPv4 or IPv6 address over a raw
//! socket, one every `interval`, each answered within `timeout` of its sending or counted
//! lost.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use serde_json::Value;
use soulbase_net_runtime::DnsResolver;
use tokio::time::Instant;

use super::icmp::{self, IcmpSocket, Message, Received};
use super::{millis, ProbeResult};
use crate::protocol::Observation;

/// The most echoes one ping sends: one per 16-bit sequence number.
const MAX_COUNT: u32 = 1 << 16;

/// A ping task's parameters.
#[derive(Debug)]
pub(super) struct PingTask {
    /// How many echoes, 1 to [`MAX_COUNT`].
    pub(super) count: u32,
    /// The time between two echoes' sending.
    pub(super) interval: Duration,
    /// How long each echo waits for its reply.
    pub(super) timeout: Duration,
}

/// One ping's echoes: what was sent, and what came back of it.
#[derive(Debug)]
struct Echoes {
    /// The identifier of every echo request (random: a raw socket sees every reply).
    id: u16,
    /// The payload of every echo request, which a reply must echo (random too).
    payload: Vec<u8>,
    /// Where they go.
    target: IpAddr,
    /// How long a reply may take.
    timeout: Duration,
    /// When each was sent, by sequence number.
    sent_at: Vec<Instant>,
    /// Each one's round-trip time, `None` when lost (or answered past its timeout).
    rtts: Vec<Option<Duration>>,
    /// How many of `rtts` are `Some`.
    answered: usize,
    /// The last destination-unreachable about one of them: who sent it, and its code.
    unreachable: Option<(IpAddr, u8)>,
    /// Why the last echo that could not be sent was not (no route: it counts as lost).
    send_error: Option<io::Error>,
}

impl Echoes {
    fn new(target: IpAddr, task: &PingTask) -> Self {
        let count = task.count as usize;
        Self {
            id: fastrand::u16(..),
            payload: icmp::payload(fastrand::u64(..)),
            target,
            timeout: task.timeout,
            sent_at: Vec::with_capacity(count),
            rtts: vec![None; count],
            answered: 0,
            unreachable: None,
            send_error: None,
        }
    }

    /// Takes in what came from whom at `at`: a reply to one of the echoes, an unreachable
    /// about one of them, or (ignored) anything else.
    fn receive(&mut self, (from, received): (IpAddr, &[u8]), at: Instant) {
        match icmp::parse(from, received) {
            Some(Received {
                from,
                message: Message::EchoReply { id, seq, payload },
            }) if from == self.target && id == self.id && payload == self.payload => {
                let n = usize::from(seq);
                let Some(sent) = self.sent_at.get(n) else {
                    return;
                };
                let rtt = at.duration_since(*sent);
                if self.rtts[n].is_none() && rtt <= self.timeout {
                    self.rtts[n] = Some(rtt);
                    self.answered += 1;
                    tracing::debug!(seq, rtt_ms = millis(rtt), from = %from, "echo reply");
                }
            }
            Some(Received {
                from,
                message: Message::Unreachable(code, quoted),
            }) if quoted.dest == self.target
                && quoted.id == self.id
                && usize::from(quoted.seq) < self.sent_at.len() =>
            {
                tracing::debug!(seq = quoted.seq, %from, code, "destination unreachable");
                self.unreachable = Some((from, code));
            }
            _ => {}
        }
    }
}

/// Pings `host` (an IP literal, or a name looked up through the agent's resolver: its first
/// address). An echo refused for want of a route counts as sent and lost.
/// Observations: `address`, `sent`, `received`, `loss` (%), `rtts` (ms, one per
/// echo in order, `null` when lost), `rtt_min_ms`/`rtt_avg_ms`/`rtt_max_ms` (ms) when any
/// came back, `unreachable_from`/`unreachable_code` when a router said the target is
/// unreachable, `resolve_ms` (ms) for a name, `error_kind` on failure. Ok when at least one
/// echo came back.
pub(super) async fn probe(resolver: &DnsResolver, host: &str, task: PingTask) -> ProbeResult {
    let mut observations = Vec::new();
    if task.count == 0 || task.count > MAX_COUNT {
        observations.push(Observation::new("error_kind", "invalid_request"));
        return ProbeResult::error(
            observations,
            format!("count must be 1 to {MAX_COUNT}, not {}", task.count),
        );
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
    match echo(&socket, target, &task).await {
        Ok(echoes) => summary(observations, target, &echoes),
        Err(e) => icmp::failure(observations, &format!("pinging {target}"), &e),
    }
}

/// Sends the echoes on schedule and collects their replies until every one is answered or
/// past its timeout.
async fn echo(socket: &IcmpSocket, target: IpAddr, task: &PingTask) -> io::Result<Echoes> {
    let count = task.count as usize;
    let mut echoes = Echoes::new(target, task);
    let mut buf = vec![0u8; 4096];
    let start = Instant::now();
    loop {
        let sent = echoes.sent_at.len();
        // Echo `i` is due `i` intervals after the start (no drift from late sends).
        let wake = if sent < count {
            start + task.interval * u32::try_from(sent).unwrap_or(u32::MAX)
        } else if echoes.answered == count {
            break;
        } else {
            match echoes.sent_at.last() {
                Some(last) => *last + task.timeout,
                None => break,
            }
        };
        if Instant::now() >= wake {
            if sent == count {
                break;
            }
            // `sent < count <= 65 536`, so the sequence number fits.
            let seq = u16::try_from(sent).unwrap_or(u16::MAX);
            let request = icmp::echo_request(target, echoes.id, seq, &echoes.payload);
            // Timed from before the send: over a short path the reply can be queued before
            // the send returns.
            echoes.sent_at.push(Instant::now());
            match socket.send(&request, target).await {
                Ok(()) => {}
                // No route now (ping(8) goes on too): this echo is lost, the next may go.
                Err(e) if icmp::is_unreachable(&e) => echoes.send_error = Some(e),
                Err(e) => return Err(e),
            }
            continue;
        }
        if let Ok(got) = tokio::time::timeout_at(wake, socket.recv(&mut buf)).await {
            echoes.receive(got?, Instant::now());
        }
    }
    Ok(echoes)
}

/// The observations of `echoes`, and the probe's status.
fn summary(mut observations: Vec<Observation>, target: IpAddr, echoes: &Echoes) -> ProbeResult {
    let got: Vec<Duration> = echoes.rtts.iter().flatten().copied().collect();
    let sent = echoes.sent_at.len();
    let received = got.len();
    let loss = if sent == 0 {
        100.0
    } else {
        let lost = (sent - received) as f64;
        (lost * 10_000.0 / sent as f64).round() / 100.0
    };
    observations.push(Observation::new("sent", sent));
    observations.push(Observation::new("received", received));
    observations.push(Observation::with_unit("loss", loss, "%"));
    let rtts: Vec<Value> = echoes
        .rtts
        .iter()
        .take(sent)
        .map(|r| r.map_or(Value::Null, |d| Value::from(millis(d))))
        .collect();
    observations.push(Observation::with_unit("rtts", rtts, "ms"));
    if let (Some(min), Some(max)) = (got.iter().min(), got.iter().max()) {
        let total: Duration = got.iter().sum();
        // `received` is at least 1 here and at most 65 536.
        let avg = total / u32::try_from(received).unwrap_or(u32::MAX);
        observations.push(Observation::with_unit("rtt_min_ms", millis(*min), "ms"));
        observations.push(Observation::with_unit("rtt_avg_ms", millis(avg), "ms"));
        observations.push(Observation::with_unit("rtt_max_ms", millis(*max), "ms"));
    }
    if let Some((from, code)) = echoes.unreachable {
        observations.push(Observation::new("unreachable_from", from.to_string()));
        observations.push(Observation::new("unreachable_code", code));
    }
    if received > 0 {
        return ProbeResult::ok(observations);
    }
    let (kind, error) = match (echoes.unreachable, &echoes.send_error) {
        (Some((from, code)), _) => (
            "unreachable",
            format!(
                "no echo reply from {target}: {from} reports {}",
                icmp::unreachable_reason(from, code)
            ),
        ),
        (None, Some(e)) => ("unreachable", format!("sending to {target}: {e}")),
        (None, None) => (
            "timeout",
            format!("no echo reply from {target}: {sent} sent, all lost"),
        ),
    };
    observations.push(Observation::new("error_kind", kind));
    ProbeResult::error(observations, error)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use super::*;

    /// An ICMPv6 echo reply (no IP header, as a raw ICMPv6 socket hands it over).
    fn reply(id: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
        let mut m = icmp::echo_request(IpAddr::V6(Ipv6Addr::LOCALHOST), id, seq, payload);
        m[0] = 129;
        m
    }

    #[test]
    fn only_a_timely_reply_from_the_target_to_an_echo_sent_counts_once() {
        let target = IpAddr::V6("fd00:9:3::2".parse().unwrap());
        let other = IpAddr::V6("fd00:9:3::9".parse().unwrap());
        let task = PingTask {
            count: 3,
            interval: Duration::from_millis(10),
            timeout: Duration::from_millis(100),
        };
        let mut echoes = Echoes::new(target, &task);
        let t0 = Instant::now();
        echoes.sent_at.push(t0);
        echoes.sent_at.push(t0 + Duration::from_millis(10));
        let (id, payload) = (echoes.id, echoes.payload.clone());
        let at = t0 + Duration::from_millis(30);
        // Not ours: another identifier, another payload, another source, an echo not sent.
        echoes.receive((target, &reply(id.wrapping_add(1), 0, &payload)), at);
        echoes.receive((target, &reply(id, 0, b"someone else's")), at);
        echoes.receive((other, &reply(id, 0, &payload)), at);
        echoes.receive((target, &reply(id, 2, &payload)), at);
        assert_eq!(echoes.answered, 0);
        // Ours: echo 0 at 30 ms; again (a duplicate) changes nothing.
        echoes.receive((target, &reply(id, 0, &payload)), at);
        echoes.receive(
            (target, &reply(id, 0, &payload)),
            at + Duration::from_millis(5),
        );
        assert_eq!(echoes.rtts[0], Some(Duration::from_millis(30)));
        assert_eq!(echoes.answered, 1);
        // Echo 1 answered 101 ms after its sending: past its timeout, lost.
        echoes.receive(
            (target, &reply(id, 1, &payload)),
            t0 + Duration::from_millis(111),
        );
        assert_eq!(echoes.rtts[1], None);
        assert_eq!(echoes.answered, 1);

        let r = summary(Vec::new(), target, &echoes);
        assert_eq!(r.status, crate::protocol::ReportStatus::Ok);
        let value = |name: &str| {
            r.observations
                .iter()
                .find(|o| o.name == name)
                .map(|o| o.value.clone())
        };
        assert_eq!(value("sent"), Some(2.into()));
        assert_eq!(value("received"), Some(1.into()));
        assert_eq!(value("loss"), Some(50.0.into()));
        assert_eq!(value("rtts"), Some(serde_json::json!([30.0, null])));
        assert_eq!(value("rtt_avg_ms"), Some(30.0.into()));
    }
}
