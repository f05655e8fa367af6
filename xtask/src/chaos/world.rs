//! The faulty world a chaos run talks to, all on loopback: fault servers (plain HTTP/1.1,
//! HTTP/2 over TLS, broken certificates, a black hole, a closed port), a mock DNS server with
//! poisoned, failing, slow, rebinding and flipping names, and forward proxies that work,
//! refuse, hang, answer 502 or demand credentials — plus the one client under test.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use serde_json::json;
use soulbase_net_policy::{NetPolicy, PolicyDocument, SnapshotResolver};
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{
    CertKit, ConnectProxy, FaultServer, FaultServerBuilder, MockDns, ProxyFault, RandomFaults,
    Reply, Script,
};
use tokio::{task::JoinHandle, time::Instant};

use soulbase_net_runtime::testing::LoopbackDialer;

/// The total deadline of a call that does not set its own.
pub(crate) const POLICY_TOTAL: Duration = Duration::from_secs(2);

/// The paths the fault servers answer; the arrivals on each are read after the run.
pub(crate) const PATHS: [&str; 4] = ["/mix", "/ok", "/burst", "/close"];

/// Where the chaos traffic goes: one URL and what may come back from it.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// Short label for the report.
    pub(crate) name: &'static str,
    /// The URL called.
    pub(crate) url: String,
    /// Relative share of the traffic.
    pub(crate) weight: u32,
    /// No call here may succeed (a poisoned name, a broken certificate, a failing proxy): a
    /// 2xx would mean a protection was bypassed.
    pub(crate) must_fail: bool,
}

/// Everything a run needs; dropping it stops every server.
#[derive(Debug)]
pub(crate) struct World {
    pub(crate) client: Arc<Client>,
    pub(crate) dialer: Arc<LoopbackDialer>,
    pub(crate) targets: Vec<Target>,
    pub(crate) servers: Vec<FaultServer>,
    _dns: Arc<MockDns>,
    /// The proxies: working, refusing, hanging (also the one every `no_proxy` host is
    /// configured with), 502, 407.
    proxies: Vec<ConnectProxy>,
    flipper: JoinHandle<()>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.flipper.abort();
    }
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> String + '_ {
    move |e| format!("chaos: could not start {what}: {e}")
}

/// The faults of `/mix`, drawn per hit from `seed`: resets, closes, hangs, slow starts (some
/// past the first-byte timeout), stalls, cut and dripping bodies, 5xx and 429.
fn mixed_faults(seed: u64) -> RandomFaults {
    let body = "0123456789".repeat(40);
    RandomFaults::seeded(seed)
        .fault(0.07, Reply::reset())
        .fault(0.04, Reply::close())
        .fault(0.03, Reply::hang())
        .fault(0.07, Reply::ok("late").delay(Duration::from_millis(150)))
        .fault(
            0.04,
            Reply::ok("too late").delay(Duration::from_millis(700)),
        )
        .fault(0.04, Reply::ok(body.clone()).stall_after(64))
        .fault(0.04, Reply::ok(body.clone()).reset_after(100))
        .fault(0.03, Reply::ok(body.clone()).close_after(100))
        .fault(
            0.04,
            Reply::ok(body).slow_body(100, Duration::from_millis(30)),
        )
        .fault(0.08, Reply::status(503))
        .fault(0.02, Reply::status(500))
        .fault(0.05, Reply::status(429).header("retry-after", "0"))
        .otherwise(Reply::ok("ok"))
}

/// `/burst`: runs of eight hits that are all 200, all 503 or all 429, chosen per run from
/// `seed` — the bursts that trip breakers and drain retry budgets.
fn bursts(seed: u64) -> Script {
    let draws = RandomFaults::seeded(seed);
    let hits = std::sync::atomic::AtomicU64::new(0);
    Script::respond_with(move |_| {
        let n = hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match draws.draw(n / 8) {
            u if u < 0.5 => Reply::ok("ok"),
            u if u < 0.8 => Reply::status(503),
            _ => Reply::status(429),
        }
    })
}

fn routes(b: FaultServerBuilder, seed: u64) -> FaultServerBuilder {
    b.route("/mix", mixed_faults(seed))
        .route("/ok", Reply::ok("ok"))
        // Closes after answering, so the next call dials (and resolves) again.
        .route("/close", Reply::ok("ok").header("connection", "close"))
        .route("/burst", bursts(seed ^ 0xB0B))
}

async fn start(b: FaultServerBuilder, what: &str) -> Result<FaultServer, String> {
    b.start().await.map_err(io(what))
}

fn at(host: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, host], 0))
}

/// The client's policy: loopback granted, DNS only from the mock, short phase timeouts,
/// retries with fast backoff, hedging for idempotent calls, a breaker that trips quickly.
fn policy(dns: SocketAddr) -> Result<NetPolicy, String> {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().map_err(|e| format!("{e}"))?];
    p.dns.nameservers = vec![dns];
    p.dns.timeout = Duration::from_millis(300);
    p.dns.cache_ttl = Duration::from_secs(1);
    p.dns.min_ttl = Duration::ZERO;
    p.dns.prefetch.clear();
    p.timeout.connect = Duration::from_millis(300);
    p.timeout.ttfb = Duration::from_millis(400);
    p.timeout.read = Duration::from_millis(250);
    p.timeout.write = Duration::from_millis(300);
    p.timeout.attempt = Duration::from_millis(550);
    p.timeout.total = POLICY_TOTAL;
    p.retry.backoff.base = Duration::from_millis(10);
    p.retry.backoff.cap = Duration::from_millis(50);
    p.hedge.enabled = true;
    p.hedge.delay = Duration::from_millis(200);
    p.cbreaker.enabled = true;
    p.cbreaker.consecutive_failures = 8;
    p.cbreaker.cooldown = Duration::from_millis(300);
    p.cbreaker.half_open_probes = 1;
    Ok(p)
}

/// A policy override sending `host` through `proxy`.
fn via(proxy: &ConnectProxy) -> serde_json::Value {
    json!({ "proxy": { "http_proxy": proxy.url(), "https_proxy": proxy.url() } })
}

/// The names the mock DNS serves, all pointing (when they answer at all) at `upstream`.
fn zone(dns: &MockDns, upstream: IpAddr) {
    let private = IpAddr::from([10, 0, 0, 7]);
    dns.set_ips("good.chaos.test", &[upstream], 1);
    dns.set_ips("slow.chaos.test", &[upstream], 0);
    dns.delay("slow.chaos.test", Duration::from_millis(120));
    dns.set_ips("sluggish.chaos.test", &[upstream], 0);
    dns.delay("sluggish.chaos.test", Duration::from_secs(1));
    dns.set_ips("poison.chaos.test", &[private], 60);
    dns.set_ips(
        "metadata.chaos.test",
        &[IpAddr::from([169, 254, 169, 254])],
        60,
    );
    dns.set_ips(
        "mixed.chaos.test",
        &[IpAddr::from([10, 0, 0, 8]), upstream],
        1,
    );
    dns.servfail("servfail.chaos.test");
    dns.nxdomain("nx.chaos.test");
    dns.rebind("rebind.chaos.test", upstream, IpAddr::from([10, 0, 0, 9]));
    dns.set_ips("bypass.chaos.test", &[upstream], 1);
    dns.set_ips("flip.chaos.test", &[upstream], 0);
}

/// Re-points `flip.chaos.test` every 40 ms, drawn from `seed`: loopback, a private address,
/// the metadata address, a unique-local IPv6 address, SERVFAIL or NXDOMAIN. Stops at `until`.
fn flipper(dns: Arc<MockDns>, upstream: IpAddr, seed: u64, until: Instant) -> JoinHandle<()> {
    let draws = RandomFaults::seeded(seed);
    tokio::spawn(async move {
        let mut n = 0u64;
        while Instant::now() < until {
            let name = "flip.chaos.test";
            match (draws.draw(n) * 6.0) as u32 {
                0 => dns.set_ips(name, &[upstream], 0),
                1 => dns.set_ips(name, &[IpAddr::from([10, 9, 8, 7])], 0),
                2 => dns.set_ips(name, &[IpAddr::from([169, 254, 169, 254])], 0),
                3 => dns.set_ips(name, &[IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 1])], 0),
                4 => dns.servfail(name),
                _ => dns.nxdomain(name),
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    })
}

/// Index in [`World::proxies`] of the hanging proxy.
const BYPASSED_PROXY: usize = 2;

/// A target: `name`, `url`, `weight`, `must_fail`.
fn target(name: &'static str, url: String, weight: u32, must_fail: bool) -> Target {
    Target {
        name,
        url,
        weight,
        must_fail,
    }
}

impl World {
    /// The proxy the `no_proxy` host is configured with; it must never hear of it.
    pub(crate) fn bypassed_proxy(&self) -> Option<&ConnectProxy> {
        self.proxies.get(BYPASSED_PROXY)
    }

    /// Starts every server, the DNS zone and its flipper (until `until`), the proxies, and
    /// the client; all fault draws come from `seed`.
    pub(crate) async fn start(seed: u64, until: Instant) -> Result<World, String> {
        let kit = CertKit::new().map_err(io("the certificate kit"))?;
        let cert = |leaf: std::io::Result<soulbase_net_testkit::Leaf>| {
            leaf.and_then(|l| l.server_config())
                .map_err(io("a TLS certificate"))
        };
        let plain = start(
            routes(FaultServer::http1().bind(at(4)), seed),
            "the upstream",
        )
        .await?;
        let tls = start(
            routes(FaultServer::builder().bind(at(2)), seed ^ 0x7115)
                .tls(cert(kit.leaf(&["127.0.0.2", "tunnel.chaos.test"]))?),
            "the TLS upstream",
        )
        .await?;
        let mut broken = Vec::new();
        for leaf in [kit.expired(), kit.wrong_host(), kit.self_signed()] {
            let b = routes(FaultServer::builder().bind(at(1)), seed).tls(cert(leaf)?);
            broken.push(start(b, "a TLS server with a broken certificate").await?);
        }
        let hole = start(FaultServer::http1().bind(at(5)).blackhole(), "a black hole").await?;
        let closed = soulbase_net_testkit::refused_addr()
            .await
            .map_err(io("a closed port"))?;
        let dns = Arc::new(MockDns::start().await.map_err(io("the mock DNS"))?);
        let upstream = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4));
        zone(&dns, upstream);
        let flipper = flipper(dns.clone(), upstream, seed ^ 0xF11B, until);

        let (p, pt) = (plain.addr().port(), tls.addr().port());
        let good = ConnectProxy::builder()
            .map_host(&format!("via-proxy.chaos.test:{p}"), plain.addr())
            .map_host(&format!("tunnel.chaos.test:{pt}"), tls.addr());
        let faulty = |fault| ConnectProxy::builder().fault(fault);
        let mut proxies = Vec::new();
        for b in [
            good,
            faulty(ProxyFault::Refuse),
            faulty(ProxyFault::Hang),
            faulty(ProxyFault::BadGateway),
            ConnectProxy::builder().basic_auth("chaos", "secret"),
        ] {
            proxies.push(b.start().await.map_err(io("a proxy"))?);
        }
        let [good, refuse, hang, gateway, auth] = &proxies[..] else {
            return Err("chaos: five proxies were started".to_owned());
        };

        let mut doc = PolicyDocument::from_policy(&policy(dns.addr())?);
        for (host, proxy) in [
            ("via-proxy.chaos.test", good),
            ("tunnel.chaos.test", good),
            ("p-refuse.chaos.test", refuse),
            ("p-hang.chaos.test", hang),
            ("p-502.chaos.test", gateway),
            ("p-407.chaos.test", auth),
        ] {
            doc.set_override(host, via(proxy));
        }
        let mut bypass = via(hang);
        bypass["proxy"]["no_proxy"] = json!(["bypass.chaos.test"]);
        doc.set_override("bypass.chaos.test", bypass);
        let resolver = SnapshotResolver::new(doc).map_err(|e| format!("chaos policy: {e}"))?;

        let dialer = Arc::new(LoopbackDialer::default());
        let client = Client::builder()
            .policy_resolver(Arc::new(resolver))
            .dialer(dialer.clone())
            .add_root_certificate(kit.root_der())
            .build()
            .map_err(|e| format!("chaos: could not build the client: {e}"))?;

        let http = |host: &str, path: &str| format!("http://{host}:{p}{path}");
        let https = |host: &str, path: &str| format!("https://{host}:{pt}{path}");
        let targets = vec![
            target("direct /mix", plain.url("/mix"), 6, false),
            target("direct /burst", plain.url("/burst"), 3, false),
            target("h2+tls /mix", tls.url("/mix"), 4, false),
            target("dns good", http("good.chaos.test", "/mix"), 3, false),
            target("dns slow", http("slow.chaos.test", "/ok"), 2, false),
            target("dns timeout", http("sluggish.chaos.test", "/ok"), 1, true),
            target("dns poisoned", http("poison.chaos.test", "/ok"), 2, true),
            target("dns metadata", http("metadata.chaos.test", "/ok"), 2, true),
            target("dns mixed", http("mixed.chaos.test", "/ok"), 2, false),
            target("dns servfail", http("servfail.chaos.test", "/ok"), 1, true),
            target("dns nxdomain", http("nx.chaos.test", "/ok"), 1, true),
            target("dns rebind", http("rebind.chaos.test", "/close"), 2, false),
            target("dns flip", http("flip.chaos.test", "/close"), 3, false),
            target("tls expired", broken[0].url("/ok"), 1, true),
            target("tls wrong host", broken[1].url("/ok"), 1, true),
            target("tls self-signed", broken[2].url("/ok"), 1, true),
            target("black hole", hole.url("/ok"), 1, true),
            target("closed port", format!("http://{closed}/ok"), 1, true),
            target("proxy ok", http("via-proxy.chaos.test", "/mix"), 3, false),
            target("proxy tunnel", https("tunnel.chaos.test", "/mix"), 2, false),
            target("proxy refuse", http("p-refuse.chaos.test", "/ok"), 1, true),
            target("proxy hang", https("p-hang.chaos.test", "/ok"), 1, true),
            target("proxy 502", http("p-502.chaos.test", "/ok"), 1, true),
            target("proxy 407", https("p-407.chaos.test", "/ok"), 1, true),
            target("no_proxy", http("bypass.chaos.test", "/ok"), 2, false),
        ];
        let mut servers = vec![plain, tls, hole];
        servers.extend(broken);
        Ok(World {
            client: Arc::new(client),
            dialer,
            targets,
            servers,
            _dns: dns,
            proxies,
            flipper,
        })
    }
}
