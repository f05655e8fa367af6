//! The clients under test, and the policies soulbase-net runs them with.

pub(crate) mod price;

use std::{
    future::Future,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2::SendRequest;
use hyper_util::{
    client::legacy::{
        connect::{dns::Name, HttpConnector},
        Client as HyperClient,
    },
    rt::{TokioExecutor, TokioIo},
};
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
use soulbase_net_core::NetRequest;
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;

use self::price::Feature;
use super::h3raw::H3Raw;
use super::legacy_tls::{client_config, TlsConnector};
use super::scenario::{Proto, Scenario};
use super::server::ServerProcess;

/// The clients, in the order they take turns.
pub(crate) const CLIENTS: [Kind; 4] = [
    Kind::Hyper,
    Kind::Reqwest,
    Kind::SoulbaseMin,
    Kind::SoulbaseFull,
];

/// A client under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The limit: hyper-util's pooled client (`client::legacy::Client`): over HTTP/1.1, over
    /// h2c (`http2_only`, prior knowledge) and over HTTP/2 with TLS (`http2_only`, rustls
    /// with ALPN `h2`, see [`super::legacy_tls`]).
    Hyper,
    /// hyper's bare `client::conn::http2` on one connection, no pool (HTTP/2 only: `bench
    /// --instructions --h2c` counts it beside the pooled limit).
    HyperConn,
    /// What users would pick instead.
    Reqwest,
    /// soulbase-net, retries and breaker off, the guard on.
    SoulbaseMin,
    /// soulbase-net with everything a production service runs (see [`full_policy`]).
    SoulbaseFull,
    /// soulbase-net minimal with [`NOOP_INTERCEPTORS`] interceptors that implement no hook
    /// themselves (every hook declared, each the trait's default): what a hook costs
    /// (`bench --instructions` only).
    SoulbaseHooks,
    /// soulbase-net full over HTTP/2 with TLS (`bench --h3`).
    SoulbaseH2,
    /// soulbase-net full over HTTP/3 (`http.version = "h3"`, `bench --h3`).
    SoulbaseH3,
    /// soulbase-net minimal over HTTP/3 (`bench --h3`): what the layer costs over the raw
    /// client, without the full policy's features.
    SoulbaseH3Min,
    /// soulbase-net minimal with one feature on (`bench --instructions --price-list`).
    Price(Feature),
    /// The limit over HTTP/3: a raw `h3` + `h3-quinn` client on one QUIC connection
    /// (`bench --h3`, see [`super::h3raw`]).
    H3Raw,
}

/// The clients `bench --instructions` counts: those of the rounds, and the minimal client
/// with [`NOOP_INTERCEPTORS`] interceptors that do nothing, which prices a hook.
pub(crate) const INSTRUCTION_CLIENTS: [Kind; 5] = [
    Kind::Hyper,
    Kind::Reqwest,
    Kind::SoulbaseMin,
    Kind::SoulbaseFull,
    Kind::SoulbaseHooks,
];

/// How many no-op interceptors [`Kind::SoulbaseHooks`] runs.
pub(crate) const NOOP_INTERCEPTORS: usize = 4;

/// The hooks an interceptor declaring every hook has called on a request answered at the
/// first attempt: `before`, `respond`, `on_attempt`, `should_resend`, `after`.
pub(crate) const HOOKS_PER_REQUEST: usize = 5;

/// The clients of `bench --h3`, in the order they take turns: the raw HTTP/3 limit, then
/// soulbase-net full over HTTP/2 with TLS, minimal over HTTP/3 and full over HTTP/3.
pub(crate) const H3_CLIENTS: [Kind; 4] = [
    Kind::H3Raw,
    Kind::SoulbaseH2,
    Kind::SoulbaseH3Min,
    Kind::SoulbaseH3,
];

impl Kind {
    /// The key in the JSON report and on the command line.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Kind::Hyper => "hyper",
            Kind::HyperConn => "hyper_conn",
            Kind::Price(f) => f.client_key(),
            Kind::Reqwest => "reqwest",
            Kind::SoulbaseMin => "soulbase_min",
            Kind::SoulbaseFull => "soulbase_full",
            Kind::SoulbaseHooks => "soulbase_hooks",
            Kind::SoulbaseH2 => "soulbase_h2",
            Kind::SoulbaseH3 => "soulbase_h3",
            Kind::SoulbaseH3Min => "soulbase_h3_min",
            Kind::H3Raw => "h3raw",
        }
    }

    /// The client's name in tables.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Hyper => "hyper (the limit)",
            Kind::HyperConn => "hyper conn::http2 (bare)",
            Kind::Price(f) => f.label(),
            Kind::Reqwest => "reqwest",
            Kind::SoulbaseMin => "soulbase-net minimal",
            Kind::SoulbaseFull => "soulbase-net full",
            Kind::SoulbaseHooks => "soulbase-net minimal + 4 no-op interceptors",
            Kind::SoulbaseH2 => "soulbase-net HTTP/2+TLS",
            Kind::SoulbaseH3 => "soulbase-net HTTP/3",
            Kind::SoulbaseH3Min => "soulbase-net minimal HTTP/3",
            Kind::H3Raw => "h3 + h3-quinn (the limit)",
        }
    }

    /// Whether this is the limit its scenario's other clients are measured against: hyper,
    /// or the raw HTTP/3 client in `bench --h3`.
    pub(crate) fn is_limit(self) -> bool {
        matches!(self, Kind::Hyper | Kind::H3Raw)
    }

    /// The client named `key`.
    pub(crate) fn parse(key: &str) -> Option<Kind> {
        INSTRUCTION_CLIENTS
            .into_iter()
            .chain(H3_CLIENTS)
            .chain([Kind::HyperConn])
            .find(|k| k.key() == key)
            .or_else(|| Feature::parse(key).map(Kind::Price))
    }
}

/// Where a scenario's requests go: one URL, or many (one per host), taken in turn.
#[derive(Clone, Debug)]
pub(crate) struct Targets {
    urls: Vec<String>,
    uris: Vec<Uri>,
    /// The root certificate of the TLS listener, for TLS scenarios.
    root: Option<CertificateDer<'static>>,
}

impl Targets {
    /// `urls`, with `root_pem` (when given) trusted for `https` ones.
    pub(crate) fn new(urls: Vec<String>, root_pem: Option<&str>) -> Result<Self, String> {
        let uris = urls
            .iter()
            .map(|u| u.parse().map_err(|e| format!("bench: bad url {u}: {e}")))
            .collect::<Result<_, _>>()?;
        let root = root_pem
            .map(|pem| CertificateDer::from_pem_slice(pem.as_bytes()))
            .transpose()
            .map_err(|e| format!("bench: the server's root certificate: {e}"))?;
        Ok(Self { urls, uris, root })
    }

    /// How many distinct URLs.
    pub(crate) fn len(&self) -> usize {
        self.urls.len()
    }

    fn host_names(&self) -> impl Iterator<Item = &str> {
        self.uris.iter().filter_map(Uri::host)
    }
}

/// One client, built fresh for each run, sending to its [`Targets`].
pub(crate) struct BenchClient {
    inner: Inner,
    targets: Targets,
    /// The tenant soulbase-net's requests carry (the price list's tenant row).
    tenant: Option<&'static str>,
}

enum Inner {
    Legacy(Box<HyperClient<HttpConnector<LoopbackResolver>, Empty<Bytes>>>),
    LegacyTls(Box<HyperClient<TlsConnector<LoopbackResolver>, Empty<Bytes>>>),
    H2(SendRequest<Empty<Bytes>>),
    Reqwest(reqwest::Client),
    Soulbase(Client),
    H3(H3Raw),
}

impl BenchClient {
    /// `kind` as `scenario` runs it.
    pub(crate) async fn build(
        kind: Kind,
        scenario: &Scenario,
        targets: Targets,
    ) -> Result<Self, String> {
        let callers = scenario.callers;
        let inner = match (kind, scenario.proto) {
            (Kind::Hyper, proto @ (Proto::H1 | Proto::H2c)) => {
                let mut connector = HttpConnector::new_with_resolver(LoopbackResolver);
                connector.set_nodelay(true);
                let client = HyperClient::builder(TokioExecutor::new())
                    .pool_max_idle_per_host(callers)
                    .http2_only(proto == Proto::H2c)
                    .build(connector);
                Inner::Legacy(Box::new(client))
            }
            (Kind::Hyper, Proto::H2Tls) => {
                let mut http = HttpConnector::new_with_resolver(LoopbackResolver);
                http.set_nodelay(true);
                let connector = TlsConnector::new(http, targets.root.as_ref())?;
                let client = HyperClient::builder(TokioExecutor::new())
                    .http2_only(true)
                    .build(connector);
                Inner::LegacyTls(Box::new(client))
            }
            (Kind::HyperConn, Proto::H1) => {
                return Err("bench: hyper_conn speaks HTTP/2 only".to_owned())
            }
            (Kind::Hyper | Kind::HyperConn, proto) => {
                Inner::H2(h2_connection(&targets, proto).await?)
            }
            (Kind::H3Raw, _) => {
                Inner::H3(H3Raw::connect(&targets.uris[0], targets.root.as_ref()).await?)
            }
            (Kind::Reqwest, Proto::H2Tls) => {
                return Err("bench: reqwest is built without TLS here".to_owned())
            }
            (Kind::Reqwest, proto) => {
                let mut b = reqwest::Client::builder()
                    .pool_max_idle_per_host(callers)
                    .tcp_nodelay(true)
                    .dns_resolver(Arc::new(LoopbackResolver));
                if proto == Proto::H2c {
                    b = b.http2_prior_knowledge();
                }
                Inner::Reqwest(b.build().map_err(|e| format!("bench: reqwest: {e}"))?)
            }
            (
                Kind::SoulbaseMin
                | Kind::SoulbaseFull
                | Kind::SoulbaseHooks
                | Kind::SoulbaseH2
                | Kind::SoulbaseH3
                | Kind::SoulbaseH3Min
                | Kind::Price(_),
                proto,
            ) => Inner::Soulbase(soulbase(kind, proto, callers, &targets)?),
        };
        let tenant = match kind {
            Kind::Price(f) => f.tenant(),
            _ => None,
        };
        Ok(Self {
            inner,
            targets,
            tenant,
        })
    }

    /// A soulbase-net client built by the caller.
    pub(crate) fn soulbase(client: Client, targets: Targets) -> Self {
        Self {
            inner: Inner::Soulbase(client),
            targets,
            tenant: None,
        }
    }

    /// One GET to the `i`-th target (modulo their number), the body read to the end;
    /// the body's length, or `Err` for an error or a status other than 200.
    pub(crate) async fn get(&self, i: usize) -> Result<usize, String> {
        let i = i % self.targets.len();
        let (status, len) = match &self.inner {
            Inner::Legacy(client) => legacy_get(client, self.targets.uris[i].clone()).await?,
            Inner::LegacyTls(client) => legacy_get(client, self.targets.uris[i].clone()).await?,
            Inner::H2(send) => {
                let mut send = send.clone();
                send.ready().await.map_err(|e| e.to_string())?;
                let req = Request::get(self.targets.uris[i].clone())
                    .body(Empty::new())
                    .map_err(|e| e.to_string())?;
                let res = send.send_request(req).await.map_err(|e| e.to_string())?;
                let status = res.status().as_u16();
                let body = res.into_body().collect().await.map_err(|e| e.to_string())?;
                (status, body.to_bytes().len())
            }
            Inner::Reqwest(client) => {
                let res = client
                    .get(&self.targets.urls[i])
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let status = res.status().as_u16();
                (status, res.bytes().await.map_err(|e| e.to_string())?.len())
            }
            Inner::Soulbase(client) => {
                let mut req = NetRequest::get(self.targets.urls[i].as_str());
                if let Some(tenant) = self.tenant {
                    req = req.tenant(tenant);
                }
                let res = client.send(req).await.map_err(|e| e.to_string())?;
                let status = res.status.as_u16();
                (status, res.bytes().await.map_err(|e| e.to_string())?.len())
            }
            Inner::H3(client) => client.get(self.targets.uris[i].clone()).await?,
        };
        if status == 200 {
            Ok(len)
        } else {
            Err(format!("status {status}"))
        }
    }
}

/// One GET by hyper-util's pooled client: the status and the body's length.
async fn legacy_get<C>(
    client: &HyperClient<C, Empty<Bytes>>,
    uri: Uri,
) -> Result<(u16, usize), String>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let res = client.get(uri).await.map_err(|e| e.to_string())?;
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.map_err(|e| e.to_string())?;
    Ok((status, body.to_bytes().len()))
}

/// One HTTP/2 connection of hyper's own client (h2c, or TLS with ALPN `h2`) to the first
/// target, its driver spawned; every caller sends on a clone of it.
async fn h2_connection(
    targets: &Targets,
    proto: Proto,
) -> Result<SendRequest<Empty<Bytes>>, String> {
    let uri = &targets.uris[0];
    let port = uri.port_u16().ok_or("bench: the h2 url has no port")?;
    let tcp = tokio::net::TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .await
        .map_err(|e| format!("bench: connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    let err = |e: hyper::Error| format!("bench: h2 handshake: {e}");
    if proto == Proto::H2c {
        let (send, conn) = builder.handshake(TokioIo::new(tcp)).await.map_err(err)?;
        tokio::spawn(conn);
        return Ok(send);
    }
    let cfg = client_config(targets.root.as_ref())?;
    let host = uri.host().unwrap_or("localhost").to_owned();
    let name = ServerName::try_from(host).map_err(|e| format!("bench: server name: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("bench: TLS handshake: {e}"))?;
    let (send, conn) = builder.handshake(TokioIo::new(tls)).await.map_err(err)?;
    tokio::spawn(conn);
    Ok(send)
}

fn soulbase(kind: Kind, proto: Proto, callers: usize, targets: &Targets) -> Result<Client, String> {
    let mut policy = if matches!(
        kind,
        Kind::SoulbaseMin | Kind::SoulbaseHooks | Kind::SoulbaseH3Min | Kind::Price(_)
    ) {
        minimal_policy(callers)
    } else {
        full_policy(callers)
    };
    if let Kind::Price(f) = kind {
        f.adjust(&mut policy, callers);
    }
    let security = policy.security.clone();
    if matches!(kind, Kind::SoulbaseH3 | Kind::SoulbaseH3Min) {
        policy.http.version = soulbase_net_policy::HttpVersionPolicy::H3;
    }
    // Named hosts (the many-hosts scenario) resolve to loopback without a name server.
    for host in targets.host_names() {
        if host.parse::<IpAddr>().is_err() {
            policy
                .dns
                .static_hosts
                .insert(host.to_owned(), vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]);
        }
    }
    let mut builder = Client::builder()
        .policy(policy)
        .pool_max_idle_per_host(callers)
        .http2_prior_knowledge(proto == Proto::H2c);
    if let Some(root) = &targets.root {
        builder = builder.add_root_certificate(root.clone());
    }
    if let Kind::Price(f) = kind {
        builder = f.install(builder, &security)?;
    } else if kind == Kind::SoulbaseHooks {
        for _ in 0..NOOP_INTERCEPTORS {
            builder = builder.interceptor(Noop);
        }
    } else if !matches!(kind, Kind::SoulbaseMin | Kind::SoulbaseH3Min) {
        // What a service runs in production: trace context and metrics too.
        builder = builder
            .interceptor(soulbase_net_interceptors::TraceUa::new())
            .observer(Arc::new(soulbase_net_observe::Metrics::new()));
    }
    builder
        .build()
        .map_err(|e| format!("bench: soulbase-net client: {e}"))
}

/// An interceptor that implements nothing: every hook is declared (the default `hooks()`)
/// and each is the trait's default, so the client pays for calling it and nothing else.
struct Noop;

impl soulbase_net_core::Interceptor for Noop {}

/// The common part: the guard on with only loopback granted, DNS kept on loopback, and
/// concurrency limits that never bind at `callers`.
fn base_policy(callers: usize) -> NetPolicy {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = "127.0.0.0/8".parse().into_iter().collect();
    p.dns.nameservers = vec![SocketAddr::from(([127, 0, 0, 1], 9))];
    p.limits.per_host_concurrency = never_binding(callers);
    p.limits.per_tenant_concurrency = never_binding(callers);
    p
}

/// A limit four times the callers: on, never reached.
pub(crate) fn never_binding(callers: usize) -> u32 {
    u32::try_from(callers.saturating_mul(4)).unwrap_or(u32::MAX)
}

/// Retries and the breaker off; the guard on.
pub(crate) fn minimal_policy(callers: usize) -> NetPolicy {
    let mut p = base_policy(callers);
    p.retry.enabled = false;
    p.cbreaker.enabled = false;
    p
}

/// Everything on: retries with their budget, the breaker, the concurrency limiter, the AIMD
/// window (starting at its maximum, four times the callers, so it is kept but never binds) and
/// a per-host rate limit far above any load this machine can offer; the guard. The builder
/// adds TraceUa and the metrics observer.
pub(crate) fn full_policy(callers: usize) -> NetPolicy {
    let mut p = base_policy(callers);
    p.retry.enabled = true;
    p.retry.budget.enabled = true;
    p.cbreaker.enabled = true;
    p.limits.aimd.enabled = true;
    p.limits.aimd.max = never_binding(callers);
    p.limits.aimd.initial = p.limits.aimd.max;
    p.limits.per_host_rate_rps = Some(10_000_000);
    p
}

/// Resolves every name to 127.0.0.1: the many-hosts scenario's names for hyper-util and
/// reqwest (soulbase-net gets them as `dns.static_hosts`). Nothing is ever asked of a name
/// server.
#[derive(Clone, Copy, Debug)]
struct LoopbackResolver;

impl tower_service::Service<Name> for LoopbackResolver {
    type Response = std::iter::Once<SocketAddr>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Name) -> Self::Future {
        std::future::ready(Ok(std::iter::once(SocketAddr::from((
            Ipv4Addr::LOCALHOST,
            0,
        )))))
    }
}

impl reqwest::dns::Resolve for LoopbackResolver {
    fn resolve(&self, _: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let addrs: reqwest::dns::Addrs =
            Box::new(std::iter::once(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))));
        Box::pin(std::future::ready(Ok(addrs))) as Pin<Box<dyn Future<Output = _> + Send>>
    }
}

/// Which clients take part in a scenario, and where they send.
impl Scenario {
    /// Whether `kind` takes part (reqwest is built without TLS here).
    pub(crate) fn runs(&self, kind: Kind) -> bool {
        let versions = matches!(
            kind,
            Kind::SoulbaseH2 | Kind::SoulbaseH3 | Kind::SoulbaseH3Min | Kind::H3Raw
        );
        match self.proto {
            Proto::Quic => versions,
            Proto::H2Tls => !versions && kind != Kind::Reqwest,
            _ => !versions,
        }
    }

    /// Its URLs on `server`: `127.0.0.1`, or `h<i>.bench.test` names for many hosts.
    pub(crate) fn targets(&self, server: &ServerProcess) -> Result<Targets, String> {
        let scheme = if matches!(self.proto, Proto::H2Tls | Proto::Quic) {
            "https"
        } else {
            "http"
        };
        let port = server.port(self.listener());
        let urls = if self.hosts <= 1 {
            vec![format!("{scheme}://127.0.0.1:{port}{}", self.path)]
        } else {
            (0..self.hosts)
                .map(|i| format!("{scheme}://h{i}.bench.test:{port}{}", self.path))
                .collect()
        };
        Targets::new(urls, Some(server.root_pem()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scenario_runs_the_clients_that_speak_its_protocol() {
        let tls = super::super::scenario::all()
            .into_iter()
            .find(|s| s.proto == Proto::H2Tls)
            .unwrap();
        assert!(!tls.runs(Kind::Reqwest) && tls.runs(Kind::SoulbaseFull));
        let h3 = super::super::scenario::h3();
        assert!(h3.runs(Kind::SoulbaseH3) && h3.runs(Kind::SoulbaseH2));
        assert!(h3.runs(Kind::SoulbaseH3Min) && !h3.runs(Kind::SoulbaseMin));
        assert!(!h3.runs(Kind::SoulbaseFull) && !tls.runs(Kind::SoulbaseH3));
        assert!(h3.runs(Kind::H3Raw) && !tls.runs(Kind::H3Raw));
    }
}
