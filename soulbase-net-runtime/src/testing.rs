//! [`TestNet`]: production host names pointed at loopback servers (a wiremock `MockServer`,
//! a testkit `FaultServer`), for tests that keep the service's production URLs and policy;
//! and [`LoopbackDialer`], the dialer of tests that name loopback servers directly.
//!
//! Why here and not in the testkit: the testkit depends on core only (it is the other side of
//! the wire), while this helper must shape what the client resolves, guards and dials — a
//! [`PolicyDocument`] patch and a [`Dialer`] — so it lives with the client. It adds no
//! dependency and does nothing unless a test builds a client with it.
//!
//! Why a stand-in address per host and a dialer, rather than `name → 127.0.0.1` alone: DNS has
//! no ports, while a mock listens on a random port and the production URL has none (80, 443).
//! Each mapped host resolves (a `dns.static_hosts` entry) to its own stand-in address in
//! `127.77.0.0/16`; the address guard is granted exactly those addresses, one `/32` each; and
//! the dialer turns `stand-in:port` into the mapped loopback server. Nothing else about the
//! request changes: it still names the production host, so the host allow-list, the
//! `SandboxGuard` interceptor and the document's host overrides apply as in production.

use std::{
    collections::BTreeMap,
    fmt, io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
};

use parking_lot::Mutex;
use serde_json::{Map, Value};
use soulbase_net_core::NetError;
use soulbase_net_policy::{NetPolicy, PolicyDocument};

use crate::client::ClientBuilder;
use crate::transport::{DialFuture, Dialer, TcpDialer};

/// The name server a [`TestNet`] policy uses unless [`TestNet::name_server`] gives one: port 0
/// on loopback, to which the operating system refuses to send, so every lookup of a name that
/// is not mapped fails at once, and no query leaves the machine.
const REFUSING_NAME_SERVER: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// How many hosts one [`TestNet`] can map: stand-ins are `127.77.h.l` with `l` in `1..=254`.
const MAX_HOSTS: usize = 254 * 256;

/// Points production host names at loopback servers, for a client built from the service's
/// own policy document: `http://api.shop.example/…` reaches a wiremock `MockServer` on
/// `127.0.0.1:<random port>`, with the host allow-list untouched and the document's
/// overrides for `api.shop.example` in effect.
///
/// [`map`](Self::map) takes an origin (`http://api.shop.example`, `https://api.shop.example`,
/// `http://api.shop.example:8080`) and the loopback address of the server that plays it.
/// [`client_builder`](Self::client_builder) then gives a [`ClientBuilder`] with:
///
/// - the document patched ([`document`](Self::document)): each mapped host resolves to a
///   stand-in address of its own in `127.77.0.0/16` (`dns.static_hosts`), and those
///   addresses, one `/32` each, are added to `security.grants.cidrs` — loopback is let
///   through the address guard for the mappings only, not for `127.0.0.1` at large; every
///   other name is looked up on [`name_server`](Self::name_server) only (by default none: the
///   lookup fails at once with `ErrorKind::Dns`, never reaching the system resolver);
/// - [`dialer`](Self::dialer): a dialer that sends `stand-in:port` to the mapped server,
///   refuses a stand-in on a port no mapping names (`https://` when only `http://` was
///   mapped, say) and every address off loopback, and records each dial ([`dials`](Self::dials)).
///
/// Everything else the document says stays: allow-lists, host, tenant and key overrides,
/// timeouts, retries, breakers. The patch is made at every layer that states one of the
/// three fields itself — a host override with its own `security.grants.cidrs` gets the
/// stand-ins appended, one with its own `dns.nameservers` gets the test's name server — so no
/// layer can route a test to the network.
///
/// TLS is left alone: the scheme is never rewritten. wiremock serves plain HTTP, so map and
/// call `http://` origins; to keep an `https://` production URL, put a TLS front before the
/// mock (the testkit's `FaultServer::builder().tls(..).forward_to(mock.uri())` with a
/// `CertKit` leaf for the production name, the kit's root in `tls.extra_roots_pem`) and map
/// `https://api.shop.example` to the front. Rewriting `https` to `http` would test a request
/// production never sends (no handshake, no pins, another scheme on redirects).
///
/// Limits: the mapping is for connections the client dials itself (HTTP/1.1 and HTTP/2 over
/// TCP). A request the policy sends through a proxy dials the proxy (map the proxy's origin
/// to a testkit `ConnectProxy`, or the refusal applies); a policy asking for HTTP/3 would
/// send QUIC to the stand-in address, where nothing answers. This type shares its name with
/// the testkit's `TestNet` (a MockDns and a CertKit with a TOML patch), which serves tests
/// that put the port in their URLs; the two do not combine.
///
/// # Errors
/// [`document`](Self::document), [`policy`](Self::policy) and
/// [`client_builder`](Self::client_builder) report an invalid mapping or name server (see
/// [`map`](Self::map)) as `ErrorKind::InvalidRequest`, and a document the patch makes invalid
/// with every problem listed.
///
/// # Examples
/// ```
/// use soulbase_net_core::{ErrorKind, NetClient, NetRequest};
/// use soulbase_net_policy::PolicyDocument;
/// use soulbase_net_runtime::testing::TestNet;
/// use wiremock::{matchers::path, Mock, MockServer, ResponseTemplate};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mock = MockServer::start().await;          // plain HTTP on 127.0.0.1:<random>
/// Mock::given(path("/orders/1"))
///     .respond_with(ResponseTemplate::new(200).set_body_string("shipped"))
///     .mount(&mock)
///     .await;
///
/// // Production's policy: only the shop's API, and its own timeout.
/// let production = PolicyDocument::from_toml_str(r#"
///     [default]
///     security.allow_hosts = ["api.shop.example"]
///
///     [overrides."api.shop.example"]
///     timeout.ttfb = "2s"
/// "#)?;
///
/// let net = TestNet::new().map("http://api.shop.example", *mock.address());
/// let client = net.client_builder(&production)?.build()?;
///
/// // The production URL, no port: it reaches the mock.
/// let res = client.send(NetRequest::get("http://api.shop.example/orders/1")).await?;
/// assert_eq!(res.text().await?, "shipped");
/// assert_eq!(net.dials().len(), 1);
///
/// // The allow-list still applies, before any lookup or dial.
/// let err = client.send(NetRequest::get("http://tracker.example.net/")).await.unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::Blocked);
/// assert_eq!(net.dials().len(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct TestNet {
    /// The origins as given, in order, with their servers; checked when a policy is made.
    mappings: Vec<(String, SocketAddr)>,
    /// `None`: [`REFUSING_NAME_SERVER`].
    name_server: Option<SocketAddr>,
    /// What the dialer routes and what it saw; shared with every dialer handed out.
    shared: Arc<Shared>,
}

/// One connection the client asked a [`TestNet`] dialer to open, in the order asked.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Dial {
    /// The address the client dialled: a mapped host's stand-in (`127.77.x.y:port`), or any
    /// other address the address guard let through.
    pub addr: SocketAddr,
    /// The mapped host whose stand-in `addr` is; `None` for any other address.
    pub host: Option<String>,
    /// Where the connection was opened: the mapped server, or `addr` itself for another
    /// loopback address; `None` when the dialer refused (a port no mapping names, an address
    /// off loopback). A refusal reaches the caller as `ErrorKind::Connect`.
    pub to: Option<SocketAddr>,
}

/// The routes and the record, behind one lock.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Host → its stand-in address.
    stand_ins: BTreeMap<String, Ipv4Addr>,
    /// `stand-in:port` → (host, server).
    routes: BTreeMap<SocketAddr, (String, SocketAddr)>,
    dials: Vec<Dial>,
}

/// The dialer of a [`TestNet`]: routes stand-ins, lets other loopback addresses through,
/// refuses the rest.
#[derive(Debug)]
struct TestNetDialer {
    shared: Arc<Shared>,
}

/// A checked mapping.
struct Route {
    host: String,
    port: u16,
    to: SocketAddr,
}

// === impl TestNet ===

impl TestNet {
    /// A test network with no mappings: every name fails to resolve, at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends requests for `origin` (`scheme://host[:port]`, the port defaulting to 80 for
    /// `http` and 443 for `https`) to `to`, a loopback server such as
    /// `*wiremock::MockServer::address()`. Mapping another origin of the same host (another
    /// port) keeps the host's stand-in address. A later mapping of the same origin replaces
    /// the earlier one.
    ///
    /// The mapping is checked when a policy is made: `origin` must be an `http` or `https`
    /// origin naming a host (not an IP literal) with no user, path, query or fragment, and
    /// `to` a loopback address with a port.
    pub fn map(mut self, origin: &str, to: SocketAddr) -> Self {
        self.mappings.push((origin.to_owned(), to));
        self
    }

    /// Names that are not mapped are looked up on `addr` only, e.g. a testkit `MockDns`
    /// (`dns.addr()`), for a test that also resolves names through DNS. It must be on
    /// loopback. Default is none: every lookup of a name that is not mapped fails at once
    /// with `ErrorKind::Dns` (the policy's name server is `127.0.0.1:0`, to which the
    /// operating system refuses to send).
    pub fn name_server(mut self, addr: SocketAddr) -> Self {
        self.name_server = Some(addr);
        self
    }

    /// `doc` with what the mappings need, at every layer that needs it (see [`TestNet`]);
    /// `doc` itself is unchanged. The result is validated like a document read from a file.
    ///
    /// # Errors
    /// `InvalidRequest` for an invalid mapping or name server; the problems of the patched
    /// document (`SCHEMA.VALIDATION_FAILED` codes, as a policy file's).
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_policy::{PolicyDocument, SnapshotResolver};
    /// use soulbase_net_runtime::testing::TestNet;
    ///
    /// let production = PolicyDocument::from_toml_str(r#"
    ///     [default]
    ///     security.allow_hosts = ["api.shop.example"]
    ///     timeout = { attempt = "1s", connect = "1s", ttfb = "1s", read = "1s", write = "1s" }
    ///
    ///     [overrides."api.shop.example"]
    ///     retry.max_attempts = 5
    /// "#)?;
    /// let net = TestNet::new().map("http://api.shop.example", "127.0.0.1:4100".parse()?);
    /// let test = net.document(&production)?;
    ///
    /// let p = SnapshotResolver::new(test)?.resolve(None, "api.shop.example");
    /// let stand_in = net.stand_in("api.shop.example").unwrap();
    /// assert_eq!(p.dns.static_hosts["api.shop.example"], [stand_in]);
    /// assert_eq!(p.security.grants.cidrs[0].to_string(), format!("{stand_in}/32"));
    /// assert_eq!(p.dns.nameservers[0].to_string(), "127.0.0.1:0");   // refuses at once
    /// assert_eq!(p.retry.max_attempts, 5);                             // production's override
    /// assert_eq!(p.security.allow_hosts.as_deref(), Some(&["api.shop.example".to_owned()][..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn document(&self, doc: &PolicyDocument) -> Result<PolicyDocument, NetError> {
        let patch = self.patch()?;
        let mut tree = doc.to_value();
        if let Value::Object(top) = &mut tree {
            let default = top
                .entry("default")
                .or_insert_with(|| Value::Object(Map::new()));
            patch.layer(default, true);
            for (_, section) in sections_mut(top.get_mut("overrides")) {
                patch.layer(section, false);
            }
            for (_, section) in sections_mut(top.get_mut("keys")) {
                patch.layer(section, false);
            }
            for (_, tenant) in sections_mut(top.get_mut("tenants")) {
                patch.layer(tenant, false);
                if let Value::Object(t) = tenant {
                    for (_, section) in sections_mut(t.get_mut("overrides")) {
                        patch.layer(section, false);
                    }
                }
            }
        }
        Ok(PolicyDocument::from_value(tree)?)
    }

    /// `policy` with what the mappings need, for a client built from one policy
    /// ([`ClientBuilder::policy`]): the stand-ins in `dns.static_hosts` and appended to
    /// `security.grants.cidrs`, and the test's name server as the only one.
    ///
    /// # Errors
    /// `InvalidRequest` for an invalid mapping or name server.
    pub fn policy(&self, mut policy: NetPolicy) -> Result<NetPolicy, NetError> {
        let patch = self.patch()?;
        for (host, ip) in &patch.stand_ins {
            policy
                .dns
                .static_hosts
                .insert(host.clone(), vec![IpAddr::V4(*ip)]);
            let net = IpAddr::V4(*ip).into();
            if !policy.security.grants.cidrs.contains(&net) {
                policy.security.grants.cidrs.push(net);
            }
        }
        policy.dns.nameservers = vec![patch.name_server];
        Ok(policy)
    }

    /// The dialer that routes the mappings; give it to [`ClientBuilder::dialer`] together
    /// with a patched [`document`](Self::document) or [`policy`](Self::policy): the routes
    /// are installed when one of those is made, and stay for clients already built. Every
    /// dialer of this `TestNet` (and of its clones) records into the same
    /// [`dials`](Self::dials).
    pub fn dialer(&self) -> Arc<dyn Dialer> {
        Arc::new(TestNetDialer {
            shared: self.shared.clone(),
        })
    }

    /// `Client::builder()` with the patched `doc` and this dialer: add interceptors, an
    /// observer or anything else, then `build()`.
    ///
    /// # Errors
    /// As [`document`](Self::document).
    pub fn client_builder(&self, doc: &PolicyDocument) -> Result<ClientBuilder, NetError> {
        let doc = self.document(doc)?;
        Ok(ClientBuilder::new()
            .policy_document(doc)
            .dialer(self.dialer()))
    }

    /// Every connection the client asked to open, in order, with where it went.
    pub fn dials(&self) -> Vec<Dial> {
        self.shared.state.lock().dials.clone()
    }

    /// The stand-in address `host` resolves to in the patched policies, once a document or
    /// policy has been made with a mapping of it.
    pub fn stand_in(&self, host: &str) -> Option<IpAddr> {
        let host = host.to_ascii_lowercase();
        let state = self.shared.state.lock();
        state.stand_ins.get(&host).map(|ip| IpAddr::V4(*ip))
    }

    /// Checks the mappings, installs their routes in the shared dialer state and returns
    /// what the policy needs.
    fn patch(&self) -> Result<Patch, NetError> {
        let name_server = match self.name_server {
            Some(addr) if !addr.ip().is_loopback() => {
                return Err(NetError::invalid_request(format!(
                    "TestNet: the name server {addr} is not on loopback"
                )))
            }
            Some(addr) => addr,
            None => REFUSING_NAME_SERVER,
        };
        let routes = self
            .mappings
            .iter()
            .map(|(origin, to)| Route::parse(origin, *to))
            .collect::<Result<Vec<_>, _>>()?;
        let mut state = self.shared.state.lock();
        // The stand-ins of the hosts mapped now: a new policy names only these, while every
        // route installed earlier stays, for clients already built.
        let mut stand_ins = BTreeMap::new();
        for route in routes {
            let next = state.stand_ins.len();
            let ip = match state.stand_ins.get(&route.host) {
                Some(ip) => *ip,
                None => {
                    let ip = stand_in(next).ok_or_else(|| {
                        NetError::invalid_request(format!(
                            "TestNet: more than {MAX_HOSTS} hosts mapped"
                        ))
                    })?;
                    state.stand_ins.insert(route.host.clone(), ip);
                    ip
                }
            };
            stand_ins.insert(route.host.clone(), ip);
            let key = SocketAddr::new(IpAddr::V4(ip), route.port);
            state.routes.insert(key, (route.host, route.to));
        }
        Ok(Patch {
            stand_ins,
            name_server,
        })
    }
}

/// The `i`-th stand-in address: `127.77.h.l`, `l` in `1..=254`.
fn stand_in(i: usize) -> Option<Ipv4Addr> {
    if i >= MAX_HOSTS {
        return None;
    }
    let hi = u8::try_from(i / 254).ok()?;
    let lo = u8::try_from(i % 254 + 1).ok()?;
    Some(Ipv4Addr::new(127, 77, hi, lo))
}

/// The sections of a table of sections (`overrides`, `keys`, `tenants`), if it is one.
fn sections_mut(table: Option<&mut Value>) -> impl Iterator<Item = (&String, &mut Value)> {
    table
        .and_then(Value::as_object_mut)
        .into_iter()
        .flat_map(|m| m.iter_mut())
}

// === impl Route ===

impl Route {
    fn parse(origin: &str, to: SocketAddr) -> Result<Route, NetError> {
        let bad =
            |why: &str| NetError::invalid_request(format!("TestNet: cannot map {origin:?}: {why}"));
        let url = url::Url::parse(origin).map_err(|e| bad(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad("not an http:// or https:// origin"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad("an origin has no user or password"));
        }
        if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return Err(bad("an origin has no path, query or fragment"));
        }
        let host = match url.host() {
            Some(url::Host::Domain(name)) => name.trim_end_matches('.').to_owned(),
            Some(_) => return Err(bad("an IP literal is dialled as it is; map a host name")),
            None => return Err(bad("no host")),
        };
        let port = url.port_or_known_default().ok_or_else(|| bad("no port"))?;
        if !to.ip().is_loopback() || to.port() == 0 {
            return Err(bad(&format!(
                "{to} is not a loopback address with a port; TestNet only dials loopback"
            )));
        }
        Ok(Route { host, port, to })
    }
}

/// What a policy needs for the mappings.
struct Patch {
    stand_ins: BTreeMap<String, Ipv4Addr>,
    name_server: SocketAddr,
}

// === impl Patch ===

impl Patch {
    /// Patches one layer of a document tree: the default layer always, another layer where
    /// it states the field itself (where it does not, the default's value reaches it).
    fn layer(&self, section: &mut Value, default: bool) {
        let Value::Object(section) = section else {
            return;
        };
        let stand_in_cidrs = self
            .stand_ins
            .values()
            .map(|ip| Value::String(format!("{ip}/32")));

        // security.grants.cidrs: the stand-ins appended to what the layer grants.
        if default || has_path(section, &["security", "grants", "cidrs"]) {
            let cidrs = table(table(table_entry(section, "security"), "grants"), "cidrs");
            if !cidrs.is_array() {
                *cidrs = Value::Array(Vec::new());
            }
            if let Value::Array(list) = cidrs {
                for cidr in stand_in_cidrs {
                    if !list.contains(&cidr) {
                        list.push(cidr);
                    }
                }
            }
        }

        // dns.static_hosts: the mapped hosts (tables merge key by key across layers).
        if default || has_path(section, &["dns", "static_hosts"]) {
            let hosts = table(table_entry(section, "dns"), "static_hosts");
            if !hosts.is_object() {
                *hosts = Value::Object(Map::new());
            }
            if let Value::Object(hosts) = hosts {
                for (host, ip) in &self.stand_ins {
                    hosts.insert(
                        host.clone(),
                        Value::Array(vec![Value::String(ip.to_string())]),
                    );
                }
            }
        }

        // dns.nameservers: the test's only.
        if default || has_path(section, &["dns", "nameservers"]) {
            *table(table_entry(section, "dns"), "nameservers") =
                Value::Array(vec![Value::String(self.name_server.to_string())]);
        }
    }
}

/// Whether `section` states the field at `path`.
fn has_path(section: &Map<String, Value>, path: &[&str]) -> bool {
    let mut at = section;
    for (i, key) in path.iter().enumerate() {
        match at.get(*key) {
            Some(Value::Object(next)) if i + 1 < path.len() => at = next,
            Some(_) if i + 1 == path.len() => return true,
            _ => return false,
        }
    }
    false
}

/// `map[key]`, created as an empty table when missing.
fn table_entry<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Value {
    map.entry(key.to_owned())
        .or_insert_with(|| Value::Object(Map::new()))
}

/// `value[key]` for a table `value` (made a table if it is not one), created as an empty
/// table when missing.
fn table<'a>(value: &'a mut Value, key: &str) -> &'a mut Value {
    if !value.is_object() {
        *value = Value::Object(Map::new());
    }
    match value {
        Value::Object(map) => table_entry(map, key),
        // Made a table just above.
        other => other,
    }
}

// === impl TestNetDialer ===

impl TestNetDialer {
    /// Where a dial of `addr` goes, and the host it stands for.
    fn route(&self, addr: SocketAddr) -> (Option<String>, Option<SocketAddr>) {
        let state = self.shared.state.lock();
        if let Some((host, to)) = state.routes.get(&addr) {
            return (Some(host.clone()), Some(*to));
        }
        let host = state
            .stand_ins
            .iter()
            .find(|(_, ip)| IpAddr::V4(**ip) == addr.ip())
            .map(|(host, _)| host.clone());
        match host {
            // A stand-in on a port no mapping names: refused, not dialled as it is.
            Some(host) => (Some(host), None),
            None if addr.ip().is_loopback() => (None, Some(addr)),
            None => (None, None),
        }
    }
}

impl Dialer for TestNetDialer {
    /// QUIC cannot be sent to a mapped server (a stand-in names no UDP port of it), so only
    /// loopback peers outside the stand-ins are allowed, as for TCP; each is recorded.
    fn udp_peer(&self, peer: SocketAddr) -> io::Result<()> {
        let (host, to) = self.route(peer);
        self.shared.state.lock().dials.push(Dial {
            addr: peer,
            host: host.clone(),
            to: to.filter(|to| *to == peer),
        });
        match (host, to) {
            (None, Some(to)) if to == peer => Ok(()),
            (Some(host), _) => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("TestNet: {host} ({peer}) is mapped for tcp only; http/3 cannot reach it"),
            )),
            _ => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("TestNet: {peer} is not on loopback; tests never leave the machine"),
            )),
        }
    }

    fn dial(&self, addr: SocketAddr) -> DialFuture {
        let (host, to) = self.route(addr);
        self.shared.state.lock().dials.push(Dial {
            addr,
            host: host.clone(),
            to,
        });
        match to {
            Some(to) => TcpDialer.dial(to),
            None => {
                let why = match host {
                    Some(host) => format!(
                        "TestNet: {host}:{} is not mapped (map its origin with that port)",
                        addr.port()
                    ),
                    None => {
                        format!("TestNet: {addr} is not on loopback; tests never leave the machine")
                    }
                };
                Box::pin(async move { Err(io::Error::new(io::ErrorKind::ConnectionRefused, why)) })
            }
        }
    }
}

impl fmt::Display for Dial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.host, self.to) {
            (Some(host), Some(to)) => write!(f, "{host} ({}) -> {to}", self.addr),
            (Some(host), None) => write!(f, "{host} ({}) refused", self.addr),
            (None, Some(to)) => write!(f, "{} -> {to}", self.addr),
            (None, None) => write!(f, "{} refused", self.addr),
        }
    }
}

/// A [`Dialer`] for tests: records every peer the client asks for, over TCP and over QUIC
/// (HTTP/3's UDP peers and the sockets it binds), and refuses — without dialling or sending —
/// any peer that is not loopback. A guard that let a private or metadata address through then
/// shows up in the record and fails the test, and the connection never leaves the machine.
///
/// ```
/// use std::sync::Arc;
/// use soulbase_net_runtime::{testing::LoopbackDialer, Client};
///
/// let dialer = Arc::new(LoopbackDialer::default());
/// let client = Client::builder().dialer(dialer.clone()).build()?;
/// # drop(client);
/// assert!(dialer.dialled().is_empty());
/// assert!(dialer.off_loopback().is_empty());
/// # Ok::<(), soulbase_net_core::NetError>(())
/// ```
#[derive(Debug, Default)]
pub struct LoopbackDialer {
    record: Mutex<LoopbackRecord>,
}

/// What a [`LoopbackDialer`] was asked for, in order.
#[derive(Debug, Default)]
struct LoopbackRecord {
    tcp: Vec<SocketAddr>,
    udp_peers: Vec<SocketAddr>,
    udp_binds: Vec<SocketAddr>,
}

// === impl LoopbackDialer ===

impl LoopbackDialer {
    /// Every TCP address asked for, in order (refused ones too).
    pub fn dialled(&self) -> Vec<SocketAddr> {
        self.record.lock().tcp.clone()
    }

    /// Every QUIC (HTTP/3) peer asked for, in order (refused ones too).
    pub fn udp_peers(&self) -> Vec<SocketAddr> {
        self.record.lock().udp_peers.clone()
    }

    /// Every local address a UDP socket was bound at for QUIC, in order.
    pub fn udp_binds(&self) -> Vec<SocketAddr> {
        self.record.lock().udp_binds.clone()
    }

    /// The peers asked for, TCP then QUIC, that are not loopback (each one refused).
    pub fn off_loopback(&self) -> Vec<SocketAddr> {
        let record = self.record.lock();
        record
            .tcp
            .iter()
            .chain(&record.udp_peers)
            .copied()
            .filter(|a| !a.ip().is_loopback())
            .collect()
    }

    /// Forgets what was recorded.
    pub fn clear(&self) {
        *self.record.lock() = LoopbackRecord::default();
    }
}

/// The refusal of a peer off loopback.
fn off_loopback(peer: SocketAddr) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("the test dialer reaches loopback only, not {peer}; tests never leave the machine"),
    )
}

impl Dialer for LoopbackDialer {
    fn dial(&self, addr: SocketAddr) -> DialFuture {
        self.record.lock().tcp.push(addr);
        if addr.ip().is_loopback() {
            return TcpDialer.dial(addr);
        }
        Box::pin(async move { Err(off_loopback(addr)) })
    }

    fn bind_udp(&self, local: SocketAddr) -> io::Result<std::net::UdpSocket> {
        self.record.lock().udp_binds.push(local);
        std::net::UdpSocket::bind(local)
    }

    fn udp_peer(&self, peer: SocketAddr) -> io::Result<()> {
        self.record.lock().udp_peers.push(peer);
        if peer.ip().is_loopback() {
            Ok(())
        } else {
            Err(off_loopback(peer))
        }
    }
}
