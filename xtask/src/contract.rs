//! `cargo xtask contract [--json PATH]`: the contract matrix of seed 000 §10 and the
//! assertions of seed 001 §XI, run against the testkit over loopback. Each row is a named
//! contract with what was expected and what was measured; any failing row fails the command.
#![allow(clippy::print_stdout, reason = "a command-line report")]
#![allow(
    clippy::disallowed_types,
    reason = "std Instant only to time the whole run for the report"
)]

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::Mutex;
use soulbase_net_core::{ErrorCode, ErrorKind, NetEvent, NetRequest, Observer, Phase, TimeoutCfg};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::{Client, DialFuture, Dialer};
use soulbase_net_testkit::{FaultServer, Reply, Script};

use soulbase_net_runtime::testing::LoopbackDialer;

mod seed001;
pub(crate) mod slo;
use crate::table::{self, print_table, row, Row};

/// Runs the matrix, prints the table, writes JSON when asked; `Err` when a row failed.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let json_path = match args.iter().position(|a| a == "--json") {
        Some(i) => Some(args.get(i + 1).ok_or("--json needs a path")?.clone()),
        None => None,
    };
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let rows = rt.block_on(matrix())?;
    print_table("contract", &rows);
    let failed = table::failed(&rows);
    println!(
        "\n{} contracts, {} passed, {failed} failed, in {:.1}s",
        rows.len(),
        rows.len() - failed,
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = json_path {
        table::write_json(&path, &table::rows_json(&rows))?;
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} contract(s) failed"))
    }
}

/// A dialer whose connections never open.
#[derive(Debug)]
struct Silent;

impl Dialer for Silent {
    fn dial(&self, _addr: SocketAddr) -> DialFuture {
        Box::pin(std::future::pending())
    }
}

/// Per request: retry delays (J_total of seed 001) and attempts.
#[derive(Debug, Default)]
struct Jitter {
    delays: Mutex<HashMap<u64, Duration>>,
}

impl Observer for Jitter {
    fn on_event(&self, ev: &NetEvent<'_>) {
        if let NetEvent::RetryScheduled { req, delay, .. } = ev {
            *self.delays.lock().entry(req.id).or_default() += *delay;
        }
    }
}

/// The default policy, loopback granted, fast backoff, no system resolver.
fn base_policy() -> Result<NetPolicy, String> {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().map_err(|e| format!("{e}"))?];
    p.dns.nameservers = vec![SocketAddr::from(([127, 0, 0, 1], 9))];
    p.dns.timeout = Duration::from_millis(300);
    p.retry.backoff.base = Duration::from_millis(2);
    p.retry.backoff.cap = Duration::from_secs(2);
    Ok(p)
}

fn client(policy: NetPolicy) -> Result<Client, String> {
    Client::builder()
        .policy(policy)
        .dialer(Arc::new(LoopbackDialer::default()))
        .build()
        .map_err(|e| e.to_string())
}

fn kind_of<T>(r: &Result<T, soulbase_net_core::NetError>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => format!("{} {}", e.kind().label(), e.code()),
    }
}

async fn start(b: soulbase_net_testkit::FaultServerBuilder) -> Result<FaultServer, String> {
    b.start().await.map_err(|e| format!("fault server: {e}"))
}

/// Every contract, in order.
async fn matrix() -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    rows.extend(timeouts().await?);
    rows.extend(retries().await?);
    rows.extend(breaker().await?);
    rows.extend(security().await?);
    rows.extend(limits().await?);
    rows.extend(seed001::rows().await?);
    rows.push(slo::retry_amplification().await?);
    Ok(rows)
}

async fn timeouts() -> Result<Vec<Row>, String> {
    let srv = start(
        FaultServer::http1()
            .route("/late", Reply::ok("x").delay(Duration::from_secs(3)))
            .route("/stall", Reply::huge(1 << 20).stall_after(100)),
    )
    .await?;
    let mut p = base_policy()?;
    p.retry.enabled = false;
    let c = client(p.clone())?;
    let mut rows = Vec::new();

    let mut silent = p.clone();
    silent.timeout.connect = Duration::from_millis(200);
    let sc = Client::builder()
        .policy(silent)
        .dialer(Arc::new(Silent))
        .build()
        .map_err(|e| e.to_string())?;
    let r = sc.send(NetRequest::get("http://127.0.0.1:9/")).await;
    let ok = matches!(&r, Err(e) if e.kind() == ErrorKind::Timeout(Phase::Connect) && e.code() == ErrorCode::ProviderTimeout);
    rows.push(row(
        "timeout.connect",
        "timeout_connect PROVIDER.TIMEOUT",
        kind_of(&r),
        ok,
    ));

    let req = NetRequest::get(srv.url("/late"))
        .timeout(TimeoutCfg::default().with_ttfb(Duration::from_millis(200)));
    let r = c.send(req).await;
    let ok = matches!(&r, Err(e) if e.kind() == ErrorKind::Timeout(Phase::Ttfb) && e.public_code() == ErrorCode::ProviderUnavailable);
    rows.push(row(
        "timeout.ttfb",
        "timeout_ttfb PROVIDER.TIMEOUT",
        kind_of(&r),
        ok,
    ));

    let req = NetRequest::get(srv.url("/stall"))
        .timeout(TimeoutCfg::default().with_read(Duration::from_millis(200)));
    let measured = match c.send(req).await {
        Ok(res) => kind_of(&res.bytes().await),
        Err(e) => format!("{} {}", e.kind().label(), e.code()),
    };
    rows.push(row(
        "timeout.read",
        "timeout_read PROVIDER.TIMEOUT",
        measured.clone(),
        measured == "timeout_read PROVIDER.TIMEOUT",
    ));

    let req = NetRequest::get(srv.url("/late")).total_timeout(Duration::from_millis(300));
    let t = Instant::now();
    let r = c.send(req).await;
    let took = t.elapsed();
    let ok = matches!(&r, Err(e) if e.kind() == ErrorKind::Timeout(Phase::Total))
        && took < Duration::from_millis(800);
    rows.push(row(
        "timeout.total",
        "timeout_total within 300ms + 500ms",
        format!("{} in {}ms", kind_of(&r), took.as_millis()),
        ok,
    ));
    Ok(rows)
}

async fn retries() -> Result<Vec<Row>, String> {
    let srv = start(
        FaultServer::http1()
            .route(
                "/get5xx",
                Script::status(503).times(2).then(Reply::ok("ok")),
            )
            .route_method(
                soulbase_net_core::http::Method::HEAD,
                "/head429",
                Script::status(429).times(1).then(Reply::ok("")),
            )
            .route("/post", Reply::status(503))
            .route(
                "/after",
                Script::reply(Reply::status(503).header("retry-after", "1"))
                    .times(1)
                    .then(Reply::ok("ok")),
            )
            .route("/bad", Reply::status(400)),
    )
    .await?;
    let c = client(base_policy()?)?;
    let mut rows = Vec::new();

    let r = c.send(NetRequest::get(srv.url("/get5xx"))).await;
    let ok = matches!(&r, Ok(res) if res.status == 200) && srv.hits("/get5xx") == 3;
    rows.push(row(
        "retry.get_5xx",
        "200 after 3 hits",
        format!("{} after {} hits", status_of(&r), srv.hits("/get5xx")),
        ok,
    ));

    let r = c.send(NetRequest::head(srv.url("/head429"))).await;
    let ok = matches!(&r, Ok(res) if res.status == 200) && srv.hits("/head429") == 2;
    rows.push(row(
        "retry.head_429",
        "200 after 2 hits",
        format!("{} after {} hits", status_of(&r), srv.hits("/head429")),
        ok,
    ));

    let r = c.send(NetRequest::get("http://127.0.0.1:1/")).await;
    let ok = matches!(&r, Err(e) if e.kind() == ErrorKind::Connect && e.attempts() == 3);
    rows.push(row(
        "retry.connect",
        "connect error after 3 attempts",
        format!(
            "{} after {} attempts",
            kind_of(&r),
            r.as_ref().err().map_or(0, |e| e.attempts())
        ),
        ok,
    ));

    let r = c.send(NetRequest::get("http://nxdomain.invalid/")).await;
    let ok = matches!(&r, Err(e) if e.kind() == ErrorKind::Dns || e.kind() == ErrorKind::Timeout(Phase::Dns));
    let attempts = r.as_ref().err().map_or(0, |e| e.attempts());
    rows.push(row(
        "retry.dns",
        "dns error after 3 attempts",
        format!("{} after {attempts} attempts", kind_of(&r)),
        ok && attempts == 3,
    ));

    let r = c
        .send(NetRequest::post(srv.url("/post")).body("side effect"))
        .await;
    let ok = matches!(&r, Ok(res) if res.status == 503) && srv.hits("/post") == 1;
    rows.push(row(
        "retry.post_never",
        "1 hit (not idempotent)",
        format!("{} hits", srv.hits("/post")),
        ok,
    ));

    let r = c.send(NetRequest::get(srv.url("/bad"))).await;
    let ok = matches!(&r, Ok(res) if res.status == 400) && srv.hits("/bad") == 1;
    rows.push(row(
        "retry.4xx_never",
        "1 hit",
        format!("{} hits", srv.hits("/bad")),
        ok,
    ));

    let t = Instant::now();
    let r = c.send(NetRequest::get(srv.url("/after"))).await;
    let took = t.elapsed();
    let ok = matches!(&r, Ok(res) if res.status == 200) && took >= Duration::from_secs(1);
    rows.push(row(
        "retry.retry_after",
        "200 after waiting >= 1000ms",
        format!("{} after {}ms", status_of(&r), took.as_millis()),
        ok,
    ));
    Ok(rows)
}

fn status_of(r: &Result<soulbase_net_core::NetResponse, soulbase_net_core::NetError>) -> String {
    match r {
        Ok(res) => res.status.as_u16().to_string(),
        Err(e) => e.kind().label().to_owned(),
    }
}

async fn breaker() -> Result<Vec<Row>, String> {
    let healed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = healed.clone();
    let srv = start(FaultServer::http1().route(
        "/svc",
        Script::respond_with(move |_req| {
            if flag.load(std::sync::atomic::Ordering::SeqCst) {
                Reply::ok("ok")
            } else {
                Reply::status(503)
            }
        }),
    ))
    .await?;
    let mut p = base_policy()?;
    p.retry.enabled = false;
    p.cbreaker.enabled = true;
    p.cbreaker.consecutive_failures = 5;
    p.cbreaker.cooldown = Duration::from_millis(300);
    p.cbreaker.half_open_probes = 1;
    let c = client(p)?;
    let mut rows = Vec::new();
    let mut first_open = None;
    for i in 1..=20u32 {
        let r = c.send(NetRequest::get(srv.url("/svc"))).await;
        if matches!(&r, Err(e) if e.kind() == ErrorKind::CircuitOpen) && first_open.is_none() {
            first_open = Some(i);
        }
    }
    let hits = srv.hits("/svc");
    rows.push(row(
        "breaker.opens",
        "open from call 6 (5 consecutive failures); 5 hits of 20",
        format!(
            "open from call {}; {hits} hits",
            first_open.map_or("-".to_owned(), |n| n.to_string())
        ),
        first_open == Some(6) && hits == 5,
    ));
    healed.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let probe = c.send(NetRequest::get(srv.url("/svc"))).await;
    let after = c.send(NetRequest::get(srv.url("/svc"))).await;
    let ok =
        matches!(&probe, Ok(r) if r.status == 200) && matches!(&after, Ok(r) if r.status == 200);
    rows.push(row(
        "breaker.half_open_closes",
        "probe 200, then closed (200)",
        format!("probe {}, then {}", status_of(&probe), status_of(&after)),
        ok,
    ));
    Ok(rows)
}

async fn security() -> Result<Vec<Row>, String> {
    let other = start(FaultServer::http1().route("/x", Reply::echo())).await?;
    let srv = start(
        FaultServer::http1()
            .redirect_chain("/chain", 6, "/end")
            .route("/end", Reply::ok("end"))
            .route("/away", Reply::redirect(302, other.url("/x")))
            .route(
                "/meta",
                Reply::redirect(302, "http://169.254.169.254/latest/meta-data/"),
            ),
    )
    .await?;
    let mut rows = Vec::new();
    // Private and special addresses: the default policy, nothing granted.
    let mut deny = NetPolicy::default();
    deny.dns.nameservers = vec![SocketAddr::from(([127, 0, 0, 1], 9))];
    let dialer = Arc::new(LoopbackDialer::default());
    let c = Client::builder()
        .policy(deny)
        .dialer(dialer.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let targets = [
        "http://127.0.0.1/",
        "http://10.0.0.1/",
        "http://172.16.0.1/",
        "http://192.168.1.1/",
        "http://169.254.169.254/",
        "http://100.64.0.1/",
        "http://0.0.0.0/",
        "http://[::1]/",
        "http://[fd00::1]/",
        "http://[::ffff:10.0.0.1]/",
        "http://[fe80::1]/",
        "http://168.63.129.16/",
    ];
    let mut refused = 0;
    for t in targets {
        if matches!(c.send(NetRequest::get(t)).await, Err(e) if e.code() == ErrorCode::AuthForbidden)
        {
            refused += 1;
        }
    }
    let dials = dialer.dialled().len();
    rows.push(row(
        "security.private_refused",
        format!("{}/{} refused, 0 dials", targets.len(), targets.len()),
        format!("{refused}/{} refused, {dials} dials", targets.len()),
        refused == targets.len() && dials == 0,
    ));

    let mut allow = base_policy()?;
    allow.security.allow_hosts = Some(vec!["*.example.com".to_owned()]);
    let r = client(allow)?.send(NetRequest::get(srv.url("/end"))).await;
    let ok = matches!(&r, Err(e) if e.kind() == ErrorKind::Blocked);
    rows.push(row(
        "security.allow_list",
        "blocked AUTH.FORBIDDEN",
        kind_of(&r),
        ok,
    ));

    let c = client(base_policy()?)?;
    let r = c.send(NetRequest::get(srv.url("/chain/0"))).await;
    let ok = matches!(&r, Err(e) if e.kind() == ErrorKind::RedirectLimit);
    rows.push(row(
        "security.redirect_cap",
        "redirect_limit after 5 hops",
        kind_of(&r),
        ok,
    ));

    let r = c.send(NetRequest::get(srv.url("/meta"))).await;
    let ok = matches!(&r, Err(e) if e.kind() == ErrorKind::Blocked);
    rows.push(row(
        "security.redirect_to_metadata",
        "blocked AUTH.FORBIDDEN",
        kind_of(&r),
        ok,
    ));

    let r = c
        .send(NetRequest::get(srv.url("/away")).header("authorization", "Bearer secret"))
        .await;
    let leaked = other
        .requests("/x")
        .iter()
        .any(|q| q.header("authorization").is_some());
    let ok = matches!(&r, Ok(res) if res.status == 200) && !leaked;
    rows.push(row(
        "security.cross_origin_strip",
        "followed, credentials dropped",
        format!("{}, leaked: {leaked}", status_of(&r)),
        ok,
    ));
    Ok(rows)
}

async fn limits() -> Result<Vec<Row>, String> {
    let srv = start(
        FaultServer::http1()
            .route("/huge", Reply::huge(1 << 30))
            .route("/up", Reply::ok("ok")),
    )
    .await?;
    let mut p = base_policy()?;
    p.security.max_resp_bytes = soulbase_net_policy::ByteSize(1 << 20);
    p.security.max_req_bytes = soulbase_net_policy::ByteSize(1 << 10);
    let c = client(p)?;
    let mut rows = Vec::new();
    let t = Instant::now();
    let r = c.send(NetRequest::get(srv.url("/huge"))).await;
    let took = t.elapsed();
    let ok =
        matches!(&r, Err(e) if e.kind() == ErrorKind::TooLarge) && took < Duration::from_secs(1);
    rows.push(row(
        "limits.response",
        "too_large before reading, < 1s",
        format!("{} in {}ms", kind_of(&r), took.as_millis()),
        ok,
    ));
    let r = c
        .send(NetRequest::post(srv.url("/up")).body(vec![0u8; 2048]))
        .await;
    let ok = matches!(&r, Err(e) if e.kind() == ErrorKind::InvalidRequest) && srv.hits("/up") == 0;
    rows.push(row(
        "limits.request",
        "invalid_request, 0 hits",
        format!("{}, {} hits", kind_of(&r), srv.hits("/up")),
        ok,
    ));
    Ok(rows)
}
