//! The soulbase-net test kit: the other side of the wire.
//!
//! What this workspace's tests, and other services' contract tests, run their HTTP clients
//! against — all on loopback, all stopping by themselves when dropped:
//!
//! - [`FaultServer`]: a scripted HTTP/1.1 + HTTP/2 server (plain or TLS) whose routes follow a
//!   [`Script`] of [`Reply`]s and faults — status and headers, delays, slow bodies, stalls,
//!   resets, clean closes, hangs, huge streamed bodies, lying `Content-Length`, redirects,
//!   gzip/br bodies and decompression bombs, echo, conditional `304`s, sequences and seeded
//!   random faults — with hit counters, captured requests and a connection count. Connections
//!   can be retired gracefully (GOAWAY, `Connection: close`) after N requests or on demand,
//!   as nginx's `keepalive_requests` and reloads do, and HTTP/2 streams refused with
//!   `REFUSED_STREAM` ([`FaultServerBuilder::retire_after`],
//!   [`FaultServer::retire_connections`], [`FaultServerBuilder::refuse_streams`]). A route
//!   may have a [`Capacity`] (so many requests served at once, the rest queued; a request
//!   holds its slot for its service time even after its client gave up), the upstream near
//!   capacity behind a retry storm. A
//!   [`Mock`] route matches on method, path, query, headers and body (exact, JSON-equal or a
//!   closure), with a priority and an expected number of requests that
//!   [`FaultServer::verify`] checks, and dropping the server too (as wiremock does). With
//!   [`FaultServerBuilder::forward_to`] it sits in front of any upstream on loopback (a
//!   wiremock `MockServer`, say) and applies its faults around the upstream's answers.
//!   With the `http3` feature it serves HTTP/3 too (`FaultServerBuilder::http3`, QUIC on
//!   the UDP port beside the TCP one, `Alt-Svc` on request with
//!   [`FaultServerBuilder::alt_svc`]), with QUIC's own faults: packets dropped for a while,
//!   a stream reset with `H3_REQUEST_REJECTED`, the connection closed mid-response, GOAWAY.
//! - [`CertKit`]: a test PKI with good and broken certificates, client certificates for mTLS,
//!   SPKI pins and PEM export.
//! - [`MockDns`]: an authoritative DNS server (UDP + TCP) with changeable records, poisoned
//!   and rebinding names, slow answers, SERVFAIL / NXDOMAIN, truncation and a query log.
//! - [`ConnectProxy`]: an HTTP forward proxy (CONNECT and absolute-form) with optional
//!   `Proxy-Authorization`, faults (refuse, hang, 502) and a log of what it was asked to reach.
//! - [`RedisServer`]: a throwaway `redis-server` on a free loopback port (stopped, paused,
//!   restarted at will) for tests of state a fleet shares; [`RedisCluster`] (three masters)
//!   and [`RedisSentinel`] (a master found through a sentinel) likewise.
//! - [`LatencyRelay`]: a TCP relay that holds each chunk a client sends for a random delay,
//!   so that each instance of a fleet sees its own store latency; or each chunk of the
//!   answers, so that a test can act between a request's effect and its answer.
//! - [`PostgresServer`]: a throwaway PostgreSQL cluster on a free loopback port, for the
//!   outbox's fleet store; stopped, paused, restarted (data kept) at will.
//! - [`TestNet`]: a MockDns and a CertKit together, with the policy patch (TOML, for
//!   `PolicyDocument::merged_with_toml`) that lets a service test on its production policy
//!   file: loopback granted, the MockDns as name server, the kit's root trusted.
//! - [`trace_init`]: `tracing` output through the test harness.
//!
//! It depends on `soulbase-net-core` only, never on the runtime. Everything listens on
//! `127.0.0.1` (or `[::1]`) and dials nothing but loopback: a redirect to `http://10.0.0.1/`
//! is only a `Location` header, a poisoned DNS answer only data, and the proxy refuses to dial
//! anything that is not loopback.
//!
//! # How faults reach the socket
//!
//! hyper owns a connection once it serves it, so replies cannot write raw bytes. Each accepted
//! socket is wrapped (below TLS) in an IO type tied to a per-connection kill switch: a reset
//! sets `SO_LINGER 0` and drops the connection, so the kernel sends RST; a close drops it
//! normally (FIN); a cut "after N body bytes" fires on the flush that follows those bytes. The
//! same mechanism works for HTTP/1.1 and HTTP/2 — on HTTP/2 a reset or close hits the whole
//! connection, not one stream. A lying `Content-Length` claims more than is sent, then the
//! connection closes (hyper never sends more than it announced).
//!
//! # Determinism
//!
//! [`RandomFaults`] draws the n-th hit of a route from a SplitMix64 stream keyed by the seed
//! and n, so a run is reproducible whatever the timing. No part needs sleeps to synchronise;
//! time-based faults (delays, pacing) are real time, so keep them short in tests.
//!
//! # Examples
//!
//! A flaky endpoint, driven by a plain hyper-util client:
//! ```
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use soulbase_net_testkit::{FaultServer, Reply, Script};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let srv = FaultServer::builder()
//!     .route("/flaky", Script::reply(Reply::status(503).header("retry-after", "1"))
//!         .times(2)
//!         .then(Reply::ok("hi")))
//!     .start()
//!     .await?;
//! let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
//! let mut statuses = Vec::new();
//! for _ in 0..3 {
//!     statuses.push(client.get(srv.url("/flaky").parse()?).await?.status().as_u16());
//! }
//! assert_eq!(statuses, [503, 503, 200]);
//! assert_eq!(srv.hits("/flaky"), 3);
//! assert_eq!(srv.requests("/flaky")[0].method, http::Method::GET);
//! srv.join().await; // re-raises a panic of the server, if any
//! # Ok(()) }
//! ```
//!
//! TLS with a [`CertKit`] leaf, and a default rustls client that rejects an expired one:
//! ```
//! use std::sync::Arc;
//! use rustls::pki_types::ServerName;
//! use soulbase_net_testkit::{CertKit, FaultServer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let kit = CertKit::new()?;
//! let connector = tokio_rustls::TlsConnector::from(kit.client_config()?);
//! for (leaf, ok) in [(kit.localhost()?, true), (kit.expired()?, false)] {
//!     let srv = FaultServer::builder().tls(leaf.server_config()?).start().await?;
//!     let tcp = tokio::net::TcpStream::connect(srv.addr()).await?;
//!     let res = connector.connect(ServerName::try_from("localhost")?, tcp).await;
//!     assert_eq!(res.is_ok(), ok);
//! }
//! # Ok(()) }
//! ```
//!
//! A resolver pointed at [`MockDns`]:
//! ```
//! use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
//! use hickory_resolver::net::runtime::TokioRuntimeProvider;
//! use soulbase_net_testkit::MockDns;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dns = MockDns::start().await?;
//! dns.set_ips("api.example.test", &["127.0.0.1".parse()?], 60);
//! let mut udp = ConnectionConfig::udp();
//! udp.port = dns.addr().port();
//! let ns = NameServerConfig::new(dns.addr().ip(), true, vec![udp]);
//! let resolver = hickory_resolver::Resolver::builder_with_config(
//!     ResolverConfig::from_name_servers(vec![ns]),
//!     TokioRuntimeProvider::default(),
//! )
//! .build()?;
//! let ips: Vec<_> = resolver.lookup_ip("api.example.test.").await?.iter().collect();
//! assert_eq!(ips, ["127.0.0.1".parse::<std::net::IpAddr>()?]);
//! assert!(dns.query_count("api.example.test") >= 1);
//! # Ok(()) }
//! ```
//!
//! A CONNECT through [`ConnectProxy`], refused without credentials:
//! ```
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use soulbase_net_testkit::{ConnectProxy, ProxyOutcome};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let proxy = ConnectProxy::builder().basic_auth("user", "secret").start().await?;
//! let mut s = tokio::net::TcpStream::connect(proxy.addr()).await?;
//! s.write_all(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nhost: 127.0.0.1:9\r\n\r\n").await?;
//! let mut answer = String::new();
//! s.read_to_string(&mut answer).await?;
//! assert!(answer.starts_with("HTTP/1.1 407"));
//! assert_eq!(proxy.requests()[0].outcome, ProxyOutcome::AuthRequired);
//! # Ok(()) }
//! ```

mod certkit;
mod dns;
mod postgres;
mod process;
mod proxy;
mod redis;
mod relay;
mod server;
mod signal;
mod testnet;
mod trace;

pub use certkit::{crypto_provider, CertKit, Leaf, LOCAL_NAMES};
pub use dns::{DnsQuery, MockDns};
pub use postgres::{PostgresServer, PostgresServerBuilder, REQUIRE_POSTGRES};
pub use proxy::{ConnectProxy, ConnectProxyBuilder, ProxyFault, ProxyOutcome, ProxyRequest};
pub use redis::{RedisCluster, RedisSentinel, RedisServer, REQUIRE_REDIS};
pub use relay::LatencyRelay;
pub use server::{
    refused_addr, Capacity, CapturedRequest, FaultServer, FaultServerBuilder, Gate, JsonBodyError,
    Mock, Protocol, RandomFaults, Reply, Script, Times, VerifyError,
};
pub use testnet::TestNet;
pub use trace::{trace_init, CapturedLogs};
