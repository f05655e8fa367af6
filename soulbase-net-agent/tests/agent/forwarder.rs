//! The UDP DNS forwarder over loopback: answers byte for byte as the upstream gives them
//! (the testkit's MockDns, and a real dnsmasq started here), ids kept, hickory's resolver as a
//! client, the in-flight bound, the upstream timeout and its warning, stray upstream packets
//! and datagrams that are not queries.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_resolver::proto::rr::{Name, RData, RecordType};
use hickory_resolver::TokioResolver;
use soulbase_net_agent::forwarder::{Forwarder, ForwarderConfig};
use soulbase_net_testkit::{CapturedLogs, MockDns};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::time::{timeout, Instant};

/// How long any single answer may take before a test fails (loopback answers take well under
/// a millisecond; this only bounds a broken test).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

// === helpers ===

/// A forwarder on a free loopback port in front of `upstream`.
async fn forwarder(
    upstream: SocketAddr,
    max_inflight: u32,
    upstream_timeout: Duration,
) -> Forwarder {
    let config = ForwarderConfig::new("127.0.0.1:0".parse().unwrap(), upstream)
        .max_inflight(max_inflight)
        .upstream_timeout(upstream_timeout);
    Forwarder::start(config).await.unwrap()
}

/// A standard query (recursion desired) for `name` and `rtype` with message id `id`; with an
/// EDNS OPT record offering 1232 bytes when `edns`.
fn query(id: u16, name: &str, rtype: RecordType, edns: bool) -> Vec<u8> {
    let mut message = Message::new(id, MessageType::Query, OpCode::Query);
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    if edns {
        let mut opt = Edns::new();
        opt.set_max_payload(1232);
        message.set_edns(opt);
    }
    message.to_vec().unwrap()
}

/// The message id of a DNS datagram.
fn id_of(datagram: &[u8]) -> u16 {
    u16::from_be_bytes([datagram[0], datagram[1]])
}

/// Sends `datagram` to `server` from a fresh loopback socket and returns the first answer.
async fn ask(server: SocketAddr, datagram: &[u8]) -> Vec<u8> {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(datagram, server).await.unwrap();
    let mut buf = vec![0u8; 65_535];
    let (n, from) = timeout(ANSWER_WITHIN, socket.recv_from(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("no answer from {server} within {ANSWER_WITHIN:?}"))
        .unwrap();
    assert_eq!(from, server, "the answer comes from the address asked");
    buf.truncate(n);
    buf
}

/// Asks `upstream` directly (with id `id ^ 0x5a5a`) and through `forwarder` (with `id`) the
/// same question; asserts the two answers are the same bytes after the id and the forwarded
/// one carries `id`. Returns the forwarded answer, decoded.
async fn same_answer(
    upstream: SocketAddr,
    forwarder: SocketAddr,
    id: u16,
    name: &str,
    rtype: RecordType,
    edns: bool,
) -> (Message, usize) {
    let direct_id = id ^ 0x5a5a;
    let direct = ask(upstream, &query(direct_id, name, rtype, edns)).await;
    let forwarded = ask(forwarder, &query(id, name, rtype, edns)).await;
    assert_eq!(id_of(&direct), direct_id);
    assert_eq!(
        id_of(&forwarded),
        id,
        "{name} {rtype}: the query's id is kept"
    );
    assert_eq!(
        forwarded[2..],
        direct[2..],
        "{name} {rtype}: the forwarded answer is the upstream's, byte for byte"
    );
    (Message::from_vec(&forwarded).unwrap(), forwarded.len())
}

/// The addresses in `message`'s answer section.
fn addresses(message: &Message) -> Vec<IpAddr> {
    message
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(aaaa) => Some(IpAddr::V6(aaaa.0)),
            _ => None,
        })
        .collect()
}

/// A dnsmasq on a free loopback port, serving a few names of `example.test` (every other name
/// there is NXDOMAIN; names elsewhere are refused: it has no upstream, so nothing leaves the
/// machine). Killed by its PID when dropped, a failing test included.
struct Dnsmasq {
    child: Child,
    addr: SocketAddr,
}

/// The long TXT strings of `big.example.test`, an answer past 512 bytes.
fn big_txt() -> Vec<String> {
    (b'a'..=b'e')
        .map(|c| (c as char).to_string().repeat(200))
        .collect()
}

/// The dnsmasq executable: on `PATH`, or in `/usr/sbin` (Debian's place, not always on a
/// user's `PATH`).
fn dnsmasq_program() -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|dir| Path::new(dir).join("dnsmasq"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| PathBuf::from("dnsmasq"))
}

impl Dnsmasq {
    /// Starts dnsmasq; panics, saying so, when it is not installed or does not answer.
    async fn start() -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let port = {
                let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                probe.local_addr().unwrap().port()
            };
            let big = format!("--txt-record=big.example.test,{}", big_txt().join(","));
            let spawned = Command::new(dnsmasq_program())
                .args([
                    "--no-daemon",
                    &format!("--port={port}"),
                    "--listen-address=127.0.0.1",
                    "--bind-interfaces",
                    "--no-resolv",
                    "--no-hosts",
                    "--conf-file=/dev/null",
                    "--pid-file=",
                    "--local=/example.test/",
                    "--host-record=www.example.test,127.0.0.7,::7",
                    "--host-record=api.example.test,127.0.0.8",
                    "--txt-record=txt.example.test,v=spf1 -all",
                    "--mx-host=example.test,mx1.example.test,10",
                    &big,
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn();
            let child = match spawned {
                Ok(child) => child,
                Err(e) => panic!(
                    "DNSMASQ IS REQUIRED: `dnsmasq` could not be started ({e}); install it \
                     (apt-get install dnsmasq; `cargo xtask ci` does)"
                ),
            };
            let mut server = Dnsmasq {
                child,
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
            };
            match server.ready().await {
                Ok(()) => return server,
                Err(why) => last = why,
            }
        }
        panic!("DNSMASQ DID NOT START on a loopback port after 5 tries: {last}");
    }

    /// Waits (at most 5 s) until dnsmasq answers a query; the reason when it exited or never
    /// answered.
    async fn ready(&mut self) -> Result<(), String> {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let probe = query(1, "www.example.test.", RecordType::A, false);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = vec![0u8; 2048];
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut stderr) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
                }
                return Err(format!("dnsmasq exited with {status}: {err}"));
            }
            socket.send_to(&probe, self.addr).await.unwrap();
            // No event says dnsmasq is listening: ask again every 50 ms until it answers.
            if let Ok(Ok((n, _))) =
                timeout(Duration::from_millis(50), socket.recv_from(&mut buf)).await
            {
                if n >= 12 && id_of(&buf) == 1 {
                    return Ok(());
                }
            }
        }
        Err("dnsmasq did not answer within 5 s".to_owned())
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An upstream of this test's own: answers each query with its own bytes, the response bit
/// set (and padded with zeros to `pad` bytes when longer), only once released; counts the
/// queries outstanding (received, not yet answered) and their peak, and reports each query's
/// id as it arrives. Stops when the test's runtime does.
struct Holding {
    addr: SocketAddr,
    arrived: mpsc::UnboundedReceiver<u16>,
    release: watch::Sender<bool>,
    peak: Arc<AtomicUsize>,
}

impl Holding {
    async fn start(released: bool, pad: usize) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let (tx, arrived) = mpsc::unbounded_channel();
        let (release, mut released_rx) = watch::channel(released);
        let peak = Arc::new(AtomicUsize::new(0));
        let seen_peak = Arc::clone(&peak);
        tokio::spawn(async move {
            let mut held: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
            let mut buf = vec![0u8; 65_535];
            loop {
                tokio::select! {
                    received = socket.recv_from(&mut buf) => {
                        let (n, peer) = received.unwrap();
                        let mut answer = buf[..n].to_vec();
                        answer[2] |= 0x80;
                        if answer.len() < pad {
                            answer.resize(pad, 0);
                        }
                        let _ = tx.send(id_of(&answer));
                        held.push((answer, peer));
                        seen_peak.fetch_max(held.len(), Ordering::SeqCst);
                    }
                    changed = released_rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
                if *released_rx.borrow() {
                    for (answer, peer) in held.drain(..) {
                        socket.send_to(&answer, peer).await.unwrap();
                    }
                }
            }
        });
        Holding {
            addr,
            arrived,
            release,
            peak,
        }
    }

    /// The id of the next query to arrive, within `within`.
    async fn next(&mut self, within: Duration) -> Option<u16> {
        timeout(within, self.arrived.recv()).await.ok().flatten()
    }
}

// === tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mockdns_answers_come_through_byte_for_byte_with_their_ids() {
    let dns = MockDns::start().await.unwrap();
    dns.set_ips(
        "api.example.test",
        &["127.0.0.5".parse().unwrap(), "::5".parse().unwrap()],
        60,
    );
    dns.set_cname("alias.example.test", "api.example.test", 30);
    let fwd = forwarder(dns.addr(), 8, Duration::from_secs(2)).await;

    let (a, _) = same_answer(
        dns.addr(),
        fwd.local_addr(),
        0x0001,
        "api.example.test.",
        RecordType::A,
        false,
    )
    .await;
    assert_eq!(addresses(&a), ["127.0.0.5".parse::<IpAddr>().unwrap()]);
    let (aaaa, _) = same_answer(
        dns.addr(),
        fwd.local_addr(),
        0xbeef,
        "api.example.test.",
        RecordType::AAAA,
        true,
    )
    .await;
    assert_eq!(addresses(&aaaa), ["::5".parse::<IpAddr>().unwrap()]);
    let (cname, _) = same_answer(
        dns.addr(),
        fwd.local_addr(),
        0xffff,
        "alias.example.test.",
        RecordType::A,
        false,
    )
    .await;
    assert_eq!(addresses(&cname), ["127.0.0.5".parse::<IpAddr>().unwrap()]);
    assert_eq!(
        cname.answers.len(),
        2,
        "the CNAME and the address: {cname:?}"
    );
    let (nx, _) = same_answer(
        dns.addr(),
        fwd.local_addr(),
        0x0000,
        "missing.example.test.",
        RecordType::A,
        false,
    )
    .await;
    assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);

    // Each name asked twice (directly and through the forwarder), so the upstream saw each
    // forwarded query once: no retries, no extra queries.
    assert_eq!(dns.query_count("api.example.test"), 4);
    assert_eq!(dns.query_count("missing.example.test"), 2);
    let stats = fwd.shutdown().await;
    assert_eq!((stats.received, stats.forwarded), (4, 4), "{stats:?}");
    assert_eq!(
        (stats.timed_out, stats.failed, stats.dropped, stats.inflight),
        (0, 0, 0, 0)
    );
    assert_eq!(stats.latency.count, 4);
    assert!(stats.latency.max > Duration::ZERO && stats.latency.max < ANSWER_WITHIN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dnsmasq_answers_come_through_byte_for_byte_with_their_ids() {
    let dnsmasq = Dnsmasq::start().await;
    let fwd = forwarder(dnsmasq.addr, 8, Duration::from_secs(2)).await;
    let (up, at) = (dnsmasq.addr, fwd.local_addr());

    let (a, _) = same_answer(up, at, 0x1234, "www.example.test.", RecordType::A, false).await;
    assert_eq!(addresses(&a), ["127.0.0.7".parse::<IpAddr>().unwrap()]);
    let (aaaa, _) = same_answer(up, at, 0x8001, "www.example.test.", RecordType::AAAA, true).await;
    assert_eq!(addresses(&aaaa), ["::7".parse::<IpAddr>().unwrap()]);
    let (txt, _) = same_answer(up, at, 0x0000, "txt.example.test.", RecordType::TXT, false).await;
    let texts: Vec<String> = txt
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::TXT(t) => Some(t.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["v=spf1 -all"]);
    let (mx, _) = same_answer(up, at, 0xffff, "example.test.", RecordType::MX, false).await;
    let exchanges: Vec<(u16, String)> = mx
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::MX(m) => Some((m.preference, m.exchange.to_string())),
            _ => None,
        })
        .collect();
    assert_eq!(exchanges, [(10, "mx1.example.test.".to_owned())]);
    let (nx, _) = same_answer(up, at, 0x4242, "nope.example.test.", RecordType::A, false).await;
    assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);
    assert!(nx.answers.is_empty());
    // An answer past 512 bytes (EDNS), whole.
    let (big, len) = same_answer(up, at, 0x0bad, "big.example.test.", RecordType::TXT, true).await;
    assert!(len > 512, "an answer of {len} bytes");
    assert!(!big.metadata.truncation, "not truncated: {len} bytes");
    assert_eq!(big.answers.len(), 1);

    let stats = fwd.shutdown().await;
    assert_eq!((stats.received, stats.forwarded), (6, 6), "{stats:?}");
    assert_eq!((stats.timed_out, stats.failed, stats.mismatched), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hickory_resolves_through_the_forwarder() {
    let dnsmasq = Dnsmasq::start().await;
    let fwd = forwarder(dnsmasq.addr, 8, Duration::from_secs(2)).await;
    let mut udp = ConnectionConfig::udp();
    udp.port = fwd.local_addr().port();
    let server = NameServerConfig::new(fwd.local_addr().ip(), true, vec![udp]);
    let config = ResolverConfig::from_parts(None, Vec::new(), vec![server]);
    let mut builder = TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
    let opts = builder.options_mut();
    opts.use_hosts_file = ResolveHosts::Never;
    opts.cache_size = 0;
    opts.timeout = Duration::from_secs(2);
    opts.attempts = 1;
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    let resolver = builder.build().unwrap();

    let ips: BTreeSet<IpAddr> = resolver
        .lookup_ip("www.example.test.")
        .await
        .unwrap()
        .iter()
        .collect();
    assert_eq!(
        ips,
        BTreeSet::from(["127.0.0.7".parse().unwrap(), "::7".parse().unwrap()])
    );
    let api: Vec<IpAddr> = resolver
        .lookup_ip("api.example.test.")
        .await
        .unwrap()
        .iter()
        .collect();
    assert_eq!(api, ["127.0.0.8".parse::<IpAddr>().unwrap()]);
    let mx = resolver
        .lookup("example.test.", RecordType::MX)
        .await
        .unwrap();
    assert!(
        mx.answers().iter().any(
            |r| matches!(&r.data, RData::MX(m) if m.exchange.to_string() == "mx1.example.test.")
        ),
        "{mx:?}"
    );
    let missing = resolver.lookup_ip("nope.example.test.").await.unwrap_err();
    assert!(missing.is_nx_domain(), "{missing:?}");

    let stats = fwd.shutdown().await;
    // www (A, AAAA), api (A, AAAA), MX, nope (A, AAAA): hickory asks each once.
    assert_eq!(stats.forwarded, 7, "{stats:?}");
    assert_eq!((stats.timed_out, stats.failed, stats.dropped), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_max_inflight_queries_are_out_at_once() {
    const QUERIES: u16 = 20;
    let mut upstream = Holding::start(false, 0).await;
    let fwd = forwarder(upstream.addr, 4, Duration::from_secs(10)).await;

    // 20 clients, each with its own id, all asking at once.
    let mut clients = Vec::new();
    for i in 0..QUERIES {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let q = query(
            0x1000 + i,
            &format!("n{i}.example.test."),
            RecordType::A,
            false,
        );
        socket.send_to(&q, fwd.local_addr()).await.unwrap();
        clients.push((socket, q));
    }
    let mut arrived = Vec::new();
    for _ in 0..4 {
        arrived.push(
            upstream
                .next(ANSWER_WITHIN)
                .await
                .expect("4 queries reach the upstream"),
        );
    }
    // The fifth must not come while the four are held: the only way to see nothing arrive
    // is to wait a while for it.
    assert_eq!(
        upstream.next(Duration::from_millis(300)).await,
        None,
        "a fifth query went out"
    );
    let held = fwd.stats();
    assert_eq!(held.inflight, 4, "{held:?}");
    assert_eq!(
        held.received, 4,
        "the loop reads no query while no permit is free: {held:?}"
    );

    upstream.release.send(true).unwrap();
    for (socket, q) in &clients {
        let mut buf = vec![0u8; 512];
        let (n, from) = timeout(ANSWER_WITHIN, socket.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(from, fwd.local_addr());
        let mut expected = q.clone();
        expected[2] |= 0x80;
        assert_eq!(
            &buf[..n],
            &expected[..],
            "client {} gets its own answer",
            id_of(q)
        );
    }
    while arrived.len() < usize::from(QUERIES) {
        arrived.push(
            upstream
                .next(ANSWER_WITHIN)
                .await
                .expect("every query reaches the upstream"),
        );
    }
    // 20 arrivals, each id once.
    let distinct: BTreeSet<u16> = arrived.iter().copied().collect();
    assert_eq!(
        distinct,
        (0x1000..0x1000 + QUERIES).collect::<BTreeSet<u16>>()
    );
    assert_eq!(arrived.len(), distinct.len(), "{arrived:?}");
    assert_eq!(
        upstream.peak.load(Ordering::SeqCst),
        4,
        "the upstream's most outstanding at once"
    );
    let stats = fwd.shutdown().await;
    assert_eq!(stats.peak_inflight, 4, "{stats:?}");
    assert_eq!(
        (stats.received, stats.forwarded, stats.inflight),
        (20, 20, 0),
        "{stats:?}"
    );
    assert_eq!(
        upstream.next(Duration::ZERO).await,
        None,
        "no query was sent twice"
    );
}

#[tokio::test]
async fn an_unanswered_query_times_out_with_a_warning_and_no_answer() {
    let (logs, _guard) = CapturedLogs::start(tracing::Level::WARN);
    let mut upstream = Holding::start(false, 0).await;
    let fwd = forwarder(upstream.addr, 4, Duration::from_millis(200)).await;
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let q = query(0xabcd, "slow.example.test.", RecordType::A, false);
    client.send_to(&q, fwd.local_addr()).await.unwrap();
    assert_eq!(upstream.next(ANSWER_WITHIN).await, Some(0xabcd));

    // The client waits past the timeout and gets nothing.
    let mut buf = vec![0u8; 512];
    let answer = timeout(Duration::from_millis(600), client.recv_from(&mut buf)).await;
    assert!(answer.is_err(), "no answer reaches the client: {answer:?}");
    let before = fwd.stats();
    assert_eq!(
        before.timed_out, 1,
        "timed out within the client's wait: {before:?}"
    );
    let stats = fwd.shutdown().await;
    assert_eq!(
        (stats.timed_out, stats.forwarded, stats.inflight),
        (1, 0, 0),
        "{stats:?}"
    );
    assert_eq!(
        stats.latency.count, 0,
        "a timed-out query has no latency: {stats:?}"
    );
    assert_eq!(
        upstream.next(Duration::ZERO).await,
        None,
        "the query went upstream once"
    );

    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("no answer from the upstream in time"))
        .unwrap_or_else(|| panic!("no timeout warning in:\n{text}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(&format!("id={}", 0xabcd)), "{line}");
    assert!(
        line.contains(&format!("client={}", client.local_addr().unwrap())),
        "{line}"
    );
    assert!(
        line.contains(&format!("upstream={}", upstream.addr)),
        "{line}"
    );
    assert!(line.contains("timeout_ms=200"), "{line}");
}

#[tokio::test]
async fn stray_upstream_packets_are_skipped_until_the_answer() {
    // An upstream that, before the answer, sends a scrap, the answer of another id and the
    // query echoed back without the response bit.
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let upstream = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        let (n, peer) = socket.recv_from(&mut buf).await.unwrap();
        let q = buf[..n].to_vec();
        let mut answer = q.clone();
        answer[2] |= 0x80;
        let mut other = answer.clone();
        other[1] ^= 0x01;
        for packet in [&q[..5], &other[..], &q[..], &answer[..]] {
            socket.send_to(packet, peer).await.unwrap();
        }
    });
    let fwd = forwarder(upstream, 4, Duration::from_secs(2)).await;
    let q = query(0x0707, "stray.example.test.", RecordType::A, false);
    let got = ask(fwd.local_addr(), &q).await;
    let mut expected = q.clone();
    expected[2] |= 0x80;
    assert_eq!(got, expected);
    let stats = fwd.shutdown().await;
    assert_eq!((stats.mismatched, stats.forwarded), (3, 1), "{stats:?}");
}

#[tokio::test]
async fn datagrams_that_are_not_queries_are_dropped_and_large_answers_come_whole() {
    let mut upstream = Holding::start(true, 4000).await;
    let fwd = forwarder(upstream.addr, 4, Duration::from_secs(2)).await;
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // Too short for a header, and a response sent to the forwarder.
    client
        .send_to(&[0x12, 0x34, 0x01], fwd.local_addr())
        .await
        .unwrap();
    let mut response = query(0x2222, "r.example.test.", RecordType::A, false);
    response[2] |= 0x80;
    client.send_to(&response, fwd.local_addr()).await.unwrap();
    // Then a query, answered with 4000 bytes.
    let q = query(0x3333, "large.example.test.", RecordType::TXT, true);
    client.send_to(&q, fwd.local_addr()).await.unwrap();
    let mut buf = vec![0u8; 65_535];
    let (n, _) = timeout(ANSWER_WITHIN, client.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 4000, "the whole answer");
    assert_eq!(id_of(&buf), 0x3333);
    let mut expected = q.clone();
    expected[2] |= 0x80;
    assert_eq!(
        &buf[..q.len()],
        &expected[..],
        "the upstream's answer, as sent"
    );
    assert!(buf[q.len()..n].iter().all(|b| *b == 0), "and its padding");
    assert_eq!(upstream.next(ANSWER_WITHIN).await, Some(0x3333));
    assert_eq!(
        upstream.next(Duration::ZERO).await,
        None,
        "only the query went upstream"
    );
    let stats = fwd.shutdown().await;
    assert_eq!(
        (stats.received, stats.dropped, stats.forwarded),
        (3, 2, 1),
        "{stats:?}"
    );
}

/// The binary runs the forwarder beside the agent when `AGENT_DNS_LISTEN` is set, to
/// `AGENT_DNS_UPSTREAM`, and serves while the control plane is not there (the agent keeps
/// trying to register with a port nothing listens on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_binary_runs_the_forwarder_from_its_variables() {
    let dns = MockDns::start().await.unwrap();
    dns.set_ips("bin.example.test", &["127.0.0.9".parse().unwrap()], 60);
    let listen = {
        let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let mut command = super::binary::agent(
        "http://127.0.0.1:1",
        "forwarding-agent",
        &dns.addr().to_string(),
    );
    command
        .env("AGENT_DNS_LISTEN", listen.to_string())
        .env("AGENT_DNS_UPSTREAM", dns.addr().to_string())
        .env("AGENT_DNS_UPSTREAM_TIMEOUT", "1s")
        .env("AGENT_MAX_INFLIGHT", "2");
    let (mut child, started) =
        super::binary::spawn_until(&mut command, "the agent", "dns forwarder on udp", false).await;
    assert!(started.contains(&listen.to_string()), "{started}");

    let (a, _) = same_answer(
        dns.addr(),
        listen,
        0x0b1e,
        "bin.example.test.",
        RecordType::A,
        false,
    )
    .await;
    assert_eq!(addresses(&a), ["127.0.0.9".parse::<IpAddr>().unwrap()]);
    child.start_kill().unwrap();
    let _ = child.wait().await;
}

#[tokio::test]
async fn an_upstream_refusing_fails_the_query_without_waiting_for_the_timeout() {
    let (logs, _guard) = CapturedLogs::start(tracing::Level::WARN);
    // A loopback port with nothing on it: the kernel answers ICMP port unreachable.
    let closed = {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap()
    };
    let fwd = forwarder(closed, 4, Duration::from_secs(10)).await;
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let q = query(0x5150, "refused.example.test.", RecordType::A, false);
    client.send_to(&q, fwd.local_addr()).await.unwrap();
    // Counted at the refusal, long before the 10 s timeout (no event says so: polled).
    super::eventually("the refusal counted", Duration::from_secs(3), || async {
        (fwd.stats().failed == 1).then_some(())
    })
    .await;
    let stats = fwd.shutdown().await;
    assert_eq!(
        (stats.failed, stats.timed_out, stats.forwarded),
        (1, 0, 0),
        "{stats:?}"
    );
    let text = logs.text();
    assert!(
        text.lines().any(|l| l.contains("upstream exchange failed")
            && l.contains(&format!("id={}", 0x5150))
            && l.contains(&format!("upstream={closed}"))),
        "{text}"
    );
}
