//! What ping and trace share: a raw ICMP socket (ICMPv4 or ICMPv6) on tokio, echo requests
//! built (and checksummed: the kernel does it for ICMPv6), and the ICMP messages that come
//! back (echo replies, time exceeded, destination unreachable): read out of the whole IPv4
//! datagrams a raw ICMPv4 socket receives, or the ICMPv6 messages (checksum verified by the
//! kernel) a raw ICMPv6 socket receives.
//!
//! A raw socket sees every ICMP message the host receives, so each probe picks a random
//! identifier and a random payload token, and a reply counts only when its identifier,
//! sequence, source (or the destination quoted in an error) and, for echo replies, its
//! payload all match what was sent.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use soulbase_net_runtime::DnsResolver;
use tokio::net::UdpSocket;

use super::{millis, ProbeResult};
use crate::protocol::Observation;

const ECHO_REPLY: u8 = 0;
const DEST_UNREACHABLE: u8 = 3;
const ECHO_REQUEST: u8 = 8;
const TIME_EXCEEDED: u8 = 11;
const IPPROTO_ICMP: u8 = 1;
const ECHO_REQUEST_V6: u8 = 128;
const ECHO_REPLY_V6: u8 = 129;
const DEST_UNREACHABLE_V6: u8 = 1;
const TIME_EXCEEDED_V6: u8 = 3;
const IPPROTO_ICMPV6: u8 = 58;

/// The payload of each echo request, in bytes (ping(8)'s default).
pub(super) const PAYLOAD_LEN: usize = 56;

/// The Internet checksum (RFC 1071) of `data`: the one's complement of the one's complement
/// sum of its 16-bit big-endian words, an odd last byte padded with zero.
pub(super) fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        sum += u32::from(u16::from_be_bytes([*last, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop above leaves `sum` at most 0xffff, so the cast loses nothing.
    !(sum as u16)
}

/// An echo request to `to` with `id`, `seq` and `payload`: ICMPv4 type 8 checksummed, or
/// ICMPv6 type 128 with the checksum left to the kernel (it covers a pseudo-header of
/// addresses only the kernel knows for sure, and a raw ICMPv6 socket always fills it in).
pub(super) fn echo_request(to: IpAddr, id: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let kind = if to.is_ipv4() {
        ECHO_REQUEST
    } else {
        ECHO_REQUEST_V6
    };
    let mut packet = Vec::with_capacity(8 + payload.len());
    packet.extend_from_slice(&[kind, 0, 0, 0]);
    packet.extend_from_slice(&id.to_be_bytes());
    packet.extend_from_slice(&seq.to_be_bytes());
    packet.extend_from_slice(payload);
    if to.is_ipv4() {
        let sum = checksum(&packet);
        packet[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    packet
}

/// A payload of [`PAYLOAD_LEN`] bytes: `token` repeated.
pub(super) fn payload(token: u64) -> Vec<u8> {
    token
        .to_be_bytes()
        .iter()
        .copied()
        .cycle()
        .take(PAYLOAD_LEN)
        .collect()
}

/// The echo request an ICMP error quotes: where it was going, and its identifier and
/// sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Quoted {
    /// The destination of the quoted datagram.
    pub(super) dest: IpAddr,
    /// The quoted echo request's identifier.
    pub(super) id: u16,
    /// The quoted echo request's sequence number.
    pub(super) seq: u16,
}

/// An ICMP message ping or trace cares about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Message<'a> {
    /// An echo reply.
    EchoReply {
        /// Its identifier.
        id: u16,
        /// Its sequence number.
        seq: u16,
        /// The payload it echoes.
        payload: &'a [u8],
    },
    /// A router dropped an echo request whose TTL (hop limit) ran out (ICMPv4 type 11,
    /// ICMPv6 type 3).
    TimeExceeded(Quoted),
    /// A router or the target could not deliver an echo request (ICMPv4 type 3, ICMPv6
    /// type 1), with the code ([`unreachable_reason`] says what it means).
    Unreachable(u8, Quoted),
}

/// A message, and who sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Received<'a> {
    /// The source of the datagram that carried the message.
    pub(super) from: IpAddr,
    /// The message.
    pub(super) message: Message<'a>,
}

/// The header length, protocol, source and destination of the IPv4 datagram `d`, when it is
/// one.
fn ipv4_header(d: &[u8]) -> Option<(usize, u8, Ipv4Addr, Ipv4Addr)> {
    if d.len() < 20 || d[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(d[0] & 0x0f) * 4;
    if ihl < 20 || d.len() < ihl {
        return None;
    }
    let src = Ipv4Addr::new(d[12], d[13], d[14], d[15]);
    let dst = Ipv4Addr::new(d[16], d[17], d[18], d[19]);
    Some((ihl, d[9], src, dst))
}

/// The echo request quoted by an ICMP error's body (the original IPv4 header and at least
/// the first 8 bytes of what it carried), when that is what it quotes.
fn quoted_echo(body: &[u8]) -> Option<Quoted> {
    let (ihl, protocol, _, dest) = ipv4_header(body)?;
    let icmp = body.get(ihl..ihl + 8)?;
    if protocol != IPPROTO_ICMP || icmp[0] != ECHO_REQUEST {
        return None;
    }
    Some(Quoted {
        dest: IpAddr::V4(dest),
        id: u16::from_be_bytes([icmp[4], icmp[5]]),
        seq: u16::from_be_bytes([icmp[6], icmp[7]]),
    })
}

/// The echo request quoted by an ICMPv6 error's body (the original IPv6 header and what
/// follows it), when that is what it quotes (directly: not behind extension headers).
fn quoted_echo_v6(body: &[u8]) -> Option<Quoted> {
    let header = body.get(..40)?;
    let icmp = body.get(40..48)?;
    if header[0] >> 4 != 6 || header[6] != IPPROTO_ICMPV6 || icmp[0] != ECHO_REQUEST_V6 {
        return None;
    }
    let mut dest = [0u8; 16];
    dest.copy_from_slice(&header[24..40]);
    Some(Quoted {
        dest: IpAddr::V6(Ipv6Addr::from(dest)),
        id: u16::from_be_bytes([icmp[4], icmp[5]]),
        seq: u16::from_be_bytes([icmp[6], icmp[7]]),
    })
}

/// Reads what a raw ICMP socket received from `from`: the whole IPv4 datagram, or the
/// ICMPv6 message. `None` for what is too short, fails its checksum, or is a message ping
/// and trace do not use (the host's own echo requests among them).
pub(super) fn parse(from: IpAddr, received: &[u8]) -> Option<Received<'_>> {
    match from {
        IpAddr::V4(_) => parse_v4(received),
        IpAddr::V6(v6) => parse_v6(v6, received),
    }
}

/// Reads an IPv4 datagram as a raw ICMPv4 socket hands it over (IP header included).
fn parse_v4(datagram: &[u8]) -> Option<Received<'_>> {
    let (ihl, protocol, from, _) = ipv4_header(datagram)?;
    let icmp = &datagram[ihl..];
    if protocol != IPPROTO_ICMP || icmp.len() < 8 || checksum(icmp) != 0 {
        return None;
    }
    let message = match icmp[0] {
        ECHO_REPLY => Message::EchoReply {
            id: u16::from_be_bytes([icmp[4], icmp[5]]),
            seq: u16::from_be_bytes([icmp[6], icmp[7]]),
            payload: &icmp[8..],
        },
        TIME_EXCEEDED if icmp[1] == 0 => Message::TimeExceeded(quoted_echo(&icmp[8..])?),
        DEST_UNREACHABLE => Message::Unreachable(icmp[1], quoted_echo(&icmp[8..])?),
        _ => return None,
    };
    Some(Received {
        from: IpAddr::V4(from),
        message,
    })
}

/// Reads an ICMPv6 message as a raw ICMPv6 socket hands it over (no IP header; the kernel
/// verified its checksum).
fn parse_v6(from: Ipv6Addr, icmp: &[u8]) -> Option<Received<'_>> {
    if icmp.len() < 8 {
        return None;
    }
    let message = match icmp[0] {
        ECHO_REPLY_V6 => Message::EchoReply {
            id: u16::from_be_bytes([icmp[4], icmp[5]]),
            seq: u16::from_be_bytes([icmp[6], icmp[7]]),
            payload: &icmp[8..],
        },
        TIME_EXCEEDED_V6 if icmp[1] == 0 => Message::TimeExceeded(quoted_echo_v6(&icmp[8..])?),
        DEST_UNREACHABLE_V6 => Message::Unreachable(icmp[1], quoted_echo_v6(&icmp[8..])?),
        _ => return None,
    };
    Some(Received {
        from: IpAddr::V6(from),
        message,
    })
}

/// What a destination-unreachable `code` from `from` means (ICMPv4 and ICMPv6 number them
/// differently), as traceroute(8) would mark it.
pub(super) fn unreachable_reason(from: IpAddr, code: u8) -> &'static str {
    match (from.is_ipv4(), code) {
        (_, 0) => "network unreachable",
        (true, 1) | (false, 3) => "host unreachable",
        (true, 2) => "protocol unreachable",
        (true, 3) | (false, 4) => "port unreachable",
        (true, 4) => "fragmentation needed",
        (true, 9 | 10 | 13) | (false, 1) => "administratively prohibited",
        _ => "destination unreachable",
    }
}

/// A raw ICMPv4 or ICMPv6 socket, non-blocking under tokio (as a `UdpSocket`: a datagram
/// socket by its calls, whatever its type).
#[derive(Debug)]
pub(super) struct IcmpSocket {
    socket: UdpSocket,
    v6: bool,
}

impl IcmpSocket {
    /// Opens the socket.
    ///
    /// # Errors
    /// The system's, `PermissionDenied` without root or `CAP_NET_RAW`
    /// ([`failure`] says so).
    pub(super) fn open(to: IpAddr) -> io::Result<Self> {
        let v6 = to.is_ipv6();
        let socket = if v6 {
            Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?
        } else {
            Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?
        };
        socket.set_nonblocking(true)?;
        Ok(Self {
            socket: UdpSocket::from_std(socket.into())?,
            v6,
        })
    }

    /// Sets the TTL (the hop limit, for IPv6) of the datagrams sent from now on.
    pub(super) fn set_ttl(&self, ttl: u8) -> io::Result<()> {
        if self.v6 {
            SockRef::from(&self.socket).set_unicast_hops_v6(u32::from(ttl))
        } else {
            self.socket.set_ttl(u32::from(ttl))
        }
    }

    /// Sends the ICMP message `packet` to `to` (the kernel adds the IP header).
    pub(super) async fn send(&self, packet: &[u8], to: IpAddr) -> io::Result<()> {
        // A raw socket ignores the port.
        let sent = self.socket.send_to(packet, SocketAddr::new(to, 0)).await?;
        if sent == packet.len() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "sent {sent} of {} bytes",
                packet.len()
            )))
        }
    }

    /// Receives the next ICMP message into `buf`: who sent it, and the bytes received (the
    /// whole IPv4 datagram, or the ICMPv6 message), for [`parse`].
    pub(super) async fn recv<'b>(&self, buf: &'b mut [u8]) -> io::Result<(IpAddr, &'b [u8])> {
        let (n, from) = self.socket.recv_from(buf).await?;
        Ok((from.ip(), &buf[..n]))
    }
}

/// The address of `host`: a literal, or the first address of a name looked up within
/// `timeout` (adding `resolve_ms` to `observations`). On failure, the probe's error result
/// (`error_kind` `dns` or `timeout`).
pub(super) async fn resolve(
    resolver: &DnsResolver,
    host: &str,
    timeout: Duration,
    observations: &mut Vec<Observation>,
) -> Result<IpAddr, ProbeResult> {
    let fail = |observations: &mut Vec<Observation>, kind: &str, error: String| {
        observations.push(Observation::new("error_kind", kind));
        ProbeResult::error(std::mem::take(observations), error)
    };
    if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
        return Ok(ip);
    }
    match tokio::time::timeout(timeout, resolver.resolve(host)).await {
        Ok(Ok(res)) => {
            observations.push(Observation::with_unit(
                "resolve_ms",
                millis(res.elapsed),
                "ms",
            ));
            match res.addrs.first() {
                Some(ip) => Ok(*ip),
                None => Err(fail(observations, "dns", format!("no address for {host}"))),
            }
        }
        Ok(Err(e)) => Err(fail(observations, "dns", e.to_string())),
        Err(_) => Err(fail(
            observations,
            "timeout",
            format!("resolving {host} timed out"),
        )),
    }
}

/// Whether `e` says there is no route to where a datagram was sent.
pub(super) fn is_unreachable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NetworkUnreachable | io::ErrorKind::HostUnreachable
    )
}

/// The error result of a probe whose raw socket failed `doing` (`opening a raw ICMP
/// socket`, `sending to 10.0.0.1`, …): `error_kind` `permission` (raw sockets need root or
/// `CAP_NET_RAW`, which the error says), `unreachable` (no route) or `io`.
pub(super) fn failure(
    mut observations: Vec<Observation>,
    doing: &str,
    e: &io::Error,
) -> ProbeResult {
    let (kind, error) = match e.kind() {
        io::ErrorKind::PermissionDenied => (
            "permission",
            format!("{doing}: {e} (ping and trace need root or CAP_NET_RAW for raw ICMP sockets)"),
        ),
        _ if is_unreachable(e) => ("unreachable", format!("{doing}: {e}")),
        _ => ("io", format!("{doing}: {e}")),
    };
    observations.push(Observation::new("error_kind", kind));
    ProbeResult::error(observations, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any IPv4 address: `echo_request` and `unreachable_reason` look at the family only.
    const V4: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

    /// An IPv4 header (no options) around `body`, from `src` to `dst`, protocol ICMP.
    fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, body: &[u8]) -> Vec<u8> {
        let total = u16::try_from(20 + body.len()).unwrap();
        let mut d = vec![0x45, 0];
        d.extend_from_slice(&total.to_be_bytes());
        d.extend_from_slice(&[0, 0, 0, 0, 64, IPPROTO_ICMP, 0, 0]);
        d.extend_from_slice(&src.octets());
        d.extend_from_slice(&dst.octets());
        let sum = checksum(&d);
        d[10..12].copy_from_slice(&sum.to_be_bytes());
        d.extend_from_slice(body);
        d
    }

    /// An ICMP error of `kind`/`code` quoting `original` (IPv4 header and all).
    fn icmp_error(kind: u8, code: u8, original: &[u8]) -> Vec<u8> {
        let mut m = vec![kind, code, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(original);
        let sum = checksum(&m);
        m[2..4].copy_from_slice(&sum.to_be_bytes());
        m
    }

    #[test]
    fn checksum_matches_rfc_1071_and_pads_an_odd_byte() {
        // RFC 1071 section 3: these bytes sum to 0xddf2, so the checksum is its complement.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum(&data), !0xddf2);
        assert_eq!(checksum(&[0xab]), !0xab00);
        assert_eq!(checksum(&[]), 0xffff);
        // A carry out of the top folds back in: 0xffff + 0x0001 = 0x0001 (one's complement).
        assert_eq!(checksum(&[0xff, 0xff, 0x00, 0x01]), !0x0001);
    }

    #[test]
    fn an_echo_request_is_checksummed_and_laid_out_as_rfc_792_says() {
        let packet = echo_request(V4, 0x1234, 0x0102, b"abcd");
        // Type 8, code 0, then id, seq, payload; the checksum of the whole is 0.
        assert_eq!(packet[..2], [8, 0]);
        assert_eq!(
            packet[4..],
            [0x12, 0x34, 0x01, 0x02, b'a', b'b', b'c', b'd']
        );
        assert_eq!(checksum(&packet), 0);
        // By hand: 0x0800 + 0x1234 + 0x0102 + 0x6162 + 0x6364 = 0xdffc, complemented 0x2003.
        assert_eq!(u16::from_be_bytes([packet[2], packet[3]]), 0x2003);
        assert_eq!(payload(0x0102_0304_0506_0708).len(), PAYLOAD_LEN);
        assert_eq!(payload(0x0102_0304_0506_0708)[8..10], [1, 2]);
    }

    #[test]
    fn an_echo_reply_parses_with_its_id_seq_and_payload() {
        let host = Ipv4Addr::new(10, 9, 3, 2);
        let me = Ipv4Addr::new(10, 9, 1, 1);
        let mut reply = echo_request(V4, 7, 9, b"token");
        reply[0] = ECHO_REPLY;
        reply[2..4].copy_from_slice(&[0, 0]);
        let sum = checksum(&reply);
        reply[2..4].copy_from_slice(&sum.to_be_bytes());
        let datagram = ipv4(host, me, &reply);
        let got = parse_v4(&datagram).unwrap();
        assert_eq!(got.from, IpAddr::V4(host));
        assert_eq!(
            got.message,
            Message::EchoReply {
                id: 7,
                seq: 9,
                payload: b"token"
            }
        );
        // One bit flipped anywhere in the ICMP part fails the checksum.
        let mut bad = ipv4(host, me, &reply);
        bad[30] ^= 0x01;
        assert_eq!(parse_v4(&bad), None);
        // Our own echo request (a raw socket sees it on loopback) is not a reply.
        assert_eq!(
            parse_v4(&ipv4(me, me, &echo_request(V4, 7, 9, b"token"))),
            None
        );
    }

    #[test]
    fn time_exceeded_and_unreachable_name_the_quoted_echo() {
        let me = Ipv4Addr::new(10, 9, 1, 1);
        let router = Ipv4Addr::new(10, 9, 1, 2);
        let target = Ipv4Addr::new(10, 9, 3, 2);
        let original = ipv4(me, target, &echo_request(V4, 0xbeef, 42, &payload(1)));
        let quoted = Quoted {
            dest: IpAddr::V4(target),
            id: 0xbeef,
            seq: 42,
        };
        // Routers may quote only the first 8 bytes past the header (RFC 792).
        let exceeded = ipv4(router, me, &icmp_error(TIME_EXCEEDED, 0, &original[..28]));
        let got = parse_v4(&exceeded).unwrap();
        assert_eq!(got.from, IpAddr::V4(router));
        assert_eq!(got.message, Message::TimeExceeded(quoted));
        let unreachable = ipv4(router, me, &icmp_error(DEST_UNREACHABLE, 1, &original));
        assert_eq!(
            parse_v4(&unreachable).unwrap().message,
            Message::Unreachable(1, quoted)
        );
        assert_eq!(unreachable_reason(V4, 1), "host unreachable");
        // Fewer than 8 quoted bytes, or a quoted UDP datagram: nothing of ours.
        let short = ipv4(router, me, &icmp_error(TIME_EXCEEDED, 0, &original[..27]));
        assert_eq!(parse_v4(&short), None);
        let mut udp = original.clone();
        udp[9] = 17;
        let other = ipv4(router, me, &icmp_error(TIME_EXCEEDED, 0, &udp));
        assert_eq!(parse_v4(&other), None);
        // Fragment reassembly time exceeded (code 1) is not a hop.
        let reassembly = ipv4(router, me, &icmp_error(TIME_EXCEEDED, 1, &original));
        assert_eq!(parse_v4(&reassembly), None);
    }

    #[test]
    fn icmpv6_echo_time_exceeded_and_unreachable_parse_with_their_own_numbers() {
        let me: Ipv6Addr = "fd00:9:1::1".parse().unwrap();
        let router: Ipv6Addr = "fd00:9:1::2".parse().unwrap();
        let target: Ipv6Addr = "fd00:9:3::2".parse().unwrap();
        // Type 128; the checksum is the kernel's to fill in.
        let request = echo_request(IpAddr::V6(target), 0xbeef, 42, b"token");
        assert_eq!(request[..4], [128, 0, 0, 0]);
        assert_eq!(request[4..8], [0xbe, 0xef, 0, 42]);
        let mut reply = request.clone();
        reply[0] = ECHO_REPLY_V6;
        assert_eq!(
            parse(IpAddr::V6(target), &reply).unwrap().message,
            Message::EchoReply {
                id: 0xbeef,
                seq: 42,
                payload: b"token"
            }
        );
        // Our own request, and neighbour discovery, are not for us.
        assert_eq!(parse(IpAddr::V6(me), &request), None);
        assert_eq!(parse(IpAddr::V6(router), &[135, 0, 0, 0, 0, 0, 0, 0]), None);
        // The quoted IPv6 header: version 6, next header 58 (ICMPv6), source, destination.
        let mut original = vec![0x60, 0, 0, 0, 0, 13, IPPROTO_ICMPV6, 1];
        original.extend_from_slice(&me.octets());
        original.extend_from_slice(&target.octets());
        original.extend_from_slice(&request);
        let error = |kind: u8, code: u8, original: &[u8]| {
            let mut m = vec![kind, code, 0, 0, 0, 0, 0, 0];
            m.extend_from_slice(original);
            m
        };
        let quoted = Quoted {
            dest: IpAddr::V6(target),
            id: 0xbeef,
            seq: 42,
        };
        let exceeded = error(TIME_EXCEEDED_V6, 0, &original);
        let got = parse(IpAddr::V6(router), &exceeded).unwrap();
        assert_eq!(got.from, IpAddr::V6(router));
        assert_eq!(got.message, Message::TimeExceeded(quoted));
        let unreachable = error(DEST_UNREACHABLE_V6, 3, &original);
        assert_eq!(
            parse(IpAddr::V6(router), &unreachable).unwrap().message,
            Message::Unreachable(3, quoted)
        );
        // ICMPv6 numbers its codes its own way: 3 is an address unreachable.
        assert_eq!(
            unreachable_reason(IpAddr::V6(router), 3),
            "host unreachable"
        );
        assert_eq!(unreachable_reason(V4, 3), "port unreachable");
        // A quoted UDP datagram (next header 17) is not ours.
        original[6] = 17;
        assert_eq!(
            parse(IpAddr::V6(router), &error(TIME_EXCEEDED_V6, 0, &original)),
            None
        );
    }
}
