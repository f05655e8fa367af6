//! [`MockDns`]: an authoritative DNS server on a loopback UDP + TCP port (hickory-server),
//! with records changeable while it runs, poisoned and rebinding names, slow answers,
//! SERVFAIL / NXDOMAIN, truncated UDP answers that force TCP, and a query log.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_server::net::runtime::Time;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::{Header, Metadata, ResponseCode};
use hickory_server::proto::rr::rdata::{A, AAAA, CNAME};
use hickory_server::proto::rr::{Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use hickory_server::Server;
use parking_lot::Mutex;
use tokio::net::{TcpListener, UdpSocket};
use tokio::time::Instant;

/// Idle timeout of a DNS-over-TCP connection.
const TCP_TIMEOUT: Duration = Duration::from_secs(10);

/// One query the server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsQuery {
    /// The queried name, lowercase, fully qualified (`api.example.test.`).
    pub name: String,
    /// The query type: `A`, `AAAA`, `CNAME`, …
    pub qtype: String,
    /// Whether it came over TCP (else UDP).
    pub tcp: bool,
    /// When it arrived, counted from the server's start.
    pub at: Duration,
}

#[derive(Clone, Debug)]
enum Answer {
    Ips {
        ips: Vec<IpAddr>,
        ttl: u32,
    },
    Cname {
        target: String,
        ttl: u32,
    },
    Rebind {
        first: Vec<IpAddr>,
        then: Vec<IpAddr>,
        /// Whether the first answer was served, per type: A and AAAA.
        served: [bool; 2],
    },
    ServFail,
    NxDomain,
}

#[derive(Clone, Debug)]
struct Entry {
    answer: Answer,
    delay: Option<Duration>,
    truncate_udp: bool,
}

#[derive(Debug)]
struct DnsState {
    zone: Mutex<HashMap<String, Entry>>,
    log: Mutex<Vec<DnsQuery>>,
    start: Instant,
}

/// Normalises a name to lowercase with a trailing dot.
fn key(name: &str) -> String {
    let mut k = name.trim().to_ascii_lowercase();
    if !k.ends_with('.') {
        k.push('.');
    }
    k
}

/// An authoritative DNS server for made-up names, on `127.0.0.1:PORT` over UDP and TCP.
/// Stops when dropped.
///
/// Every name is answered from a table the test controls, changeable while the server runs;
/// names not in the table get `NXDOMAIN`. Point a resolver at [`MockDns::addr`] (never at the
/// system configuration, so tests never leave the machine).
///
/// - [`MockDns::set_ips`] — A and AAAA records (mixed answers: give both kinds, or public and
///   private addresses together); use a private address for a poisoned answer.
/// - [`MockDns::set_cname`] — a CNAME, followed within the table for A/AAAA queries.
/// - [`MockDns::rebind`] — DNS rebinding: the first lookup (its first A and first AAAA answer)
///   gets `first`, every later one `then`, all with TTL 0.
/// - [`MockDns::servfail`], [`MockDns::nxdomain`] — errors.
/// - [`MockDns::delay`] — answer late; [`MockDns::truncate_udp`] — answer UDP queries with the TC
///   bit and no records, so resolvers retry over TCP, where the full answer is given.
/// - [`MockDns::queries`] — the log (name, type, transport, time).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// use soulbase_net_testkit::MockDns;
///
/// let dns = MockDns::start().await?;
/// dns.set_ips("api.example.test", &["127.0.0.1".parse().unwrap()], 60);
/// dns.set_ips("evil.example.test", &["10.0.0.1".parse().unwrap()], 60); // poisoned
/// dns.rebind("rebind.example.test", "93.184.216.34".parse().unwrap(), "127.0.0.1".parse().unwrap());
/// assert!(dns.addr().ip().is_loopback());
/// assert_eq!(dns.query_count("api.example.test"), 0);
/// # Ok(()) }
/// ```
pub struct MockDns {
    addr: SocketAddr,
    state: Arc<DnsState>,
    _server: Server<Handler>,
}

impl std::fmt::Debug for MockDns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockDns")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl MockDns {
    /// Starts a server on `127.0.0.1`, UDP and TCP on the same free port, with an empty table.
    ///
    /// # Errors
    /// No loopback port was free for both UDP and TCP after a few tries.
    pub async fn start() -> io::Result<Self> {
        let (udp, tcp) = bind_pair().await?;
        let addr = udp.local_addr()?;
        let state = Arc::new(DnsState {
            zone: Mutex::new(HashMap::new()),
            log: Mutex::new(Vec::new()),
            start: Instant::now(),
        });
        let mut server = Server::new(Handler {
            state: state.clone(),
        });
        server.register_socket(udp);
        server.register_listener(tcp, TCP_TIMEOUT, 64);
        Ok(Self {
            addr,
            state,
            _server: server,
        })
    }

    /// The server's address (the same port for UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn upsert(&self, name: &str, answer: Answer) {
        let mut zone = self.state.zone.lock();
        let e = zone.entry(key(name)).or_insert(Entry {
            answer: Answer::NxDomain,
            delay: None,
            truncate_udp: false,
        });
        e.answer = answer;
    }

    /// Answers `name` with `ips` (IPv4 as A, IPv6 as AAAA records) and `ttl` seconds.
    /// Replaces what `name` had; keeps its delay and truncation settings.
    pub fn set_ips(&self, name: &str, ips: &[IpAddr], ttl: u32) {
        self.upsert(
            name,
            Answer::Ips {
                ips: ips.to_vec(),
                ttl,
            },
        );
    }

    /// Makes `name` a CNAME for `target`, with `ttl` seconds.
    pub fn set_cname(&self, name: &str, target: &str, ttl: u32) {
        self.upsert(
            name,
            Answer::Cname {
                target: key(target),
                ttl,
            },
        );
    }

    /// DNS rebinding: the first answer of each type (A, AAAA) for `name` is `first`, every
    /// later one `then`; always TTL 0. Per type, so a resolver's first lookup (A and AAAA
    /// asked together, in either order) sees `first` whole, and the next lookup `then`.
    pub fn rebind(&self, name: &str, first: IpAddr, then: IpAddr) {
        self.upsert(
            name,
            Answer::Rebind {
                first: vec![first],
                then: vec![then],
                served: [false; 2],
            },
        );
    }

    /// Answers `name` with `SERVFAIL`.
    pub fn servfail(&self, name: &str) {
        self.upsert(name, Answer::ServFail);
    }

    /// Answers `name` with `NXDOMAIN` (as for any unknown name).
    pub fn nxdomain(&self, name: &str) {
        self.upsert(name, Answer::NxDomain);
    }

    /// Delays every answer for `name` by `delay`. Default is none.
    pub fn delay(&self, name: &str, delay: Duration) {
        let mut zone = self.state.zone.lock();
        if let Some(e) = zone.get_mut(&key(name)) {
            e.delay = Some(delay);
        }
    }

    /// When `on`, UDP answers for `name` carry the TC bit and no records, so a resolver
    /// retries over TCP, where the full answer is given. Default is off.
    pub fn truncate_udp(&self, name: &str, on: bool) {
        let mut zone = self.state.zone.lock();
        if let Some(e) = zone.get_mut(&key(name)) {
            e.truncate_udp = on;
        }
    }

    /// Removes `name` from the table (it then gets `NXDOMAIN`).
    pub fn remove(&self, name: &str) {
        self.state.zone.lock().remove(&key(name));
    }

    /// Every query received, oldest first.
    pub fn queries(&self) -> Vec<DnsQuery> {
        self.state.log.lock().clone()
    }

    /// How many queries (any type, any transport) arrived for `name`.
    pub fn query_count(&self, name: &str) -> usize {
        let k = key(name);
        self.state.log.lock().iter().filter(|q| q.name == k).count()
    }
}

async fn bind_pair() -> io::Result<(UdpSocket, TcpListener)> {
    let mut last = None;
    for _ in 0..16 {
        let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let port = udp.local_addr()?.port();
        match TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free port for UDP and TCP")))
}

#[derive(Debug)]
struct Handler {
    state: Arc<DnsState>,
}

/// What the handler decided, computed under the lock and sent after it.
#[derive(Debug)]
struct Decision {
    code: ResponseCode,
    records: Vec<Record>,
    truncate: bool,
    delay: Option<Duration>,
}

impl Handler {
    fn decide(&self, qname: &str, qtype: RecordType, tcp: bool) -> Decision {
        let mut zone = self.state.zone.lock();
        let mut records = Vec::new();
        let mut name = qname.to_owned();
        let (mut delay, mut truncate) = (None, false);
        // Follow CNAMEs within the table, at most 8 deep (a loop ends there).
        for depth in 0..8 {
            let Some(entry) = zone.get_mut(&name) else {
                let code = if depth == 0 {
                    ResponseCode::NXDomain
                } else {
                    ResponseCode::NoError
                };
                return Decision {
                    code,
                    records,
                    truncate,
                    delay,
                };
            };
            if depth == 0 {
                delay = entry.delay;
                truncate = entry.truncate_udp && !tcp;
            }
            let owner = Name::from_ascii(&name).unwrap_or_default();
            let (ips, ttl) = match &mut entry.answer {
                Answer::ServFail => {
                    return Decision {
                        code: ResponseCode::ServFail,
                        records: Vec::new(),
                        truncate,
                        delay,
                    }
                }
                Answer::NxDomain => {
                    return Decision {
                        code: ResponseCode::NXDomain,
                        records: Vec::new(),
                        truncate,
                        delay,
                    }
                }
                Answer::Cname { target, ttl } => {
                    let target_name = Name::from_ascii(target.as_str()).unwrap_or_default();
                    records.push(Record::from_rdata(
                        owner,
                        *ttl,
                        RData::CNAME(CNAME(target_name)),
                    ));
                    if qtype == RecordType::CNAME {
                        break;
                    }
                    name = target.clone();
                    continue;
                }
                Answer::Ips { ips, ttl } => (ips.clone(), *ttl),
                Answer::Rebind {
                    first,
                    then,
                    served,
                } => {
                    // Per type: a resolver asks A and AAAA at once, and both belong to
                    // its first lookup.
                    let slot = match qtype {
                        RecordType::A => Some(0),
                        RecordType::AAAA => Some(1),
                        _ => None,
                    };
                    let ips = match slot {
                        Some(i) if served[i] => then.clone(),
                        Some(i) => {
                            served[i] = true;
                            first.clone()
                        }
                        None => first.clone(),
                    };
                    (ips, 0)
                }
            };
            for ip in ips {
                match (ip, qtype) {
                    (IpAddr::V4(v4), RecordType::A) => {
                        records.push(Record::from_rdata(owner.clone(), ttl, RData::A(A(v4))))
                    }
                    (IpAddr::V6(v6), RecordType::AAAA) => records.push(Record::from_rdata(
                        owner.clone(),
                        ttl,
                        RData::AAAA(AAAA(v6)),
                    )),
                    _ => {}
                }
            }
            break;
        }
        Decision {
            code: ResponseCode::NoError,
            records,
            truncate,
            delay,
        }
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.authoritative = true;
        let tcp = request.protocol() == Protocol::Tcp;
        let decision = match request.request_info() {
            Ok(info) => {
                let qname = key(&info.query.name().to_string());
                let qtype = info.query.query_type();
                self.state.log.lock().push(DnsQuery {
                    name: qname.clone(),
                    qtype: qtype.to_string(),
                    tcp,
                    at: self.state.start.elapsed(),
                });
                self.decide(&qname, qtype, tcp)
            }
            Err(_) => Decision {
                code: ResponseCode::FormErr,
                records: Vec::new(),
                truncate: false,
                delay: None,
            },
        };
        if let Some(d) = decision.delay {
            tokio::time::sleep(d).await;
        }
        metadata.response_code = decision.code;
        metadata.truncation = decision.truncate;
        let answers: &[Record] = if decision.truncate {
            &[]
        } else {
            &decision.records
        };
        let builder = MessageResponseBuilder::from_message_request(request);
        let response = builder.build(metadata, answers.iter(), [], [], []);
        match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(_) => {
                metadata.response_code = ResponseCode::ServFail;
                ResponseInfo::from(Header {
                    metadata,
                    counts: Default::default(),
                })
            }
        }
    }
}
