//! The ordinary life of a server's connections, which must never fail a call nor trip the
//! breaker: HTTP/2 GOAWAY after N requests (nginx's `keepalive_requests`), streams refused
//! with `REFUSED_STREAM`, and HTTP/1.1
//! connections closed after N requests. The server did not process what it refused, so the
//! client sends it again whatever its method — and a POST still arrives exactly once.

use std::{collections::HashMap, sync::Arc, time::Duration};

use soulbase_net_core::{ErrorKind, GaugeReading, NetClient, NetRequest};
use soulbase_net_policy::NetPolicy;
use soulbase_net_testkit::{FaultServer, FaultServerBuilder, Reply};

use crate::support::{harness_with, loopback_policy, Harness};

/// Concurrent callers, as in the measurement against nginx.
const CALLERS: usize = 64;

/// Retries off (a resend must not need them) and the breaker on, quick to open: any failure
/// recorded against the upstream would show as a transition.
fn strict_policy() -> NetPolicy {
    let mut p = loopback_policy();
    p.retry.enabled = false;
    p.cbreaker.enabled = true;
    p.cbreaker.consecutive_failures = 1;
    p.cbreaker.min_samples = 1;
    p.cbreaker.cooldown = Duration::from_secs(60);
    p
}

fn h2c_client() -> Harness {
    harness_with(strict_policy(), |b| b.http2_prior_knowledge(true))
}

/// `rounds` rounds of `CALLERS` concurrent POSTs (non-idempotent: sent again only because the
/// server did not process them), each with its own marker. Returns the failures.
async fn post_rounds(h: &Harness, srv: &FaultServer, rounds: usize) -> Vec<String> {
    let client = Arc::new(h.client.clone());
    let mut failures = Vec::new();
    for round in 0..rounds {
        let mut calls = tokio::task::JoinSet::new();
        for caller in 0..CALLERS {
            let client = client.clone();
            let url = srv.url("/orders");
            calls.spawn(async move {
                let id = format!("{round}-{caller}");
                let req = NetRequest::post(url)
                    .header("x-marker", id.as_str())
                    .body(id.clone());
                match client.send(req).await {
                    Ok(res) if res.status == 200 => Ok(()),
                    Ok(res) => Err(format!("{id}: status {}", res.status)),
                    Err(e) => Err(format!(
                        "{id}: {e} ({:?}) {:?}",
                        e.kind(),
                        e.chain().map(ToString::to_string).collect::<Vec<_>>()
                    )),
                }
            });
        }
        while let Some(done) = calls.join_next().await {
            if let Err(e) = done.unwrap() {
                failures.push(e);
            }
        }
    }
    failures
}

/// Each marker that arrived whole at the server (its body is the marker), with how many
/// times. A request whose stream the client reset before its body was sent did not arrive:
/// a server cannot act on a request it never got the content of.
fn arrivals(srv: &FaultServer) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for r in srv.requests("/orders") {
        let marker = r.header("x-marker").unwrap_or("?").to_owned();
        if r.body != marker.as_bytes() {
            continue;
        }
        *seen.entry(marker).or_default() += 1;
    }
    seen
}

fn transitions(h: &Harness) -> Vec<String> {
    let seen = h.events.seen.lock();
    seen.iter()
        .filter(|e| e.starts_with("BreakerTransition"))
        .cloned()
        .collect()
}

fn resent(h: &Harness) -> usize {
    let seen = h.events.seen.lock();
    seen.iter().filter(|e| e.starts_with("Resent")).count()
}

async fn orders_server(builder: FaultServerBuilder) -> FaultServer {
    builder
        .route(
            "/orders",
            Reply::ok("created").delay(Duration::from_millis(2)),
        )
        .start()
        .await
        .unwrap()
}

/// Runs `rounds` of POSTs and checks what must hold whatever the server's lifecycle: no call
/// failed, the breaker never moved, every POST arrived exactly once.
async fn run_clean(h: &Harness, srv: &FaultServer, rounds: usize) {
    let failures = tokio::time::timeout(Duration::from_secs(60), post_rounds(h, srv, rounds))
        .await
        .expect("the run ends");
    // A failed call says whether its request reached the server, whole or not.
    let arrived = |failure: &String| {
        let marker = failure.split(':').next().unwrap_or("");
        let seen: Vec<(u64, usize, u64)> = (srv.requests("/orders").iter())
            .filter(|r| r.header("x-marker") == Some(marker))
            .map(|r| (r.connection, r.body.len(), r.body_len))
            .collect();
        format!("{failure} arrived {seen:?}")
    };
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        failures.iter().take(5).map(arrived).collect::<Vec<_>>()
    );
    assert_eq!(transitions(h), Vec::<String>::new());
    assert_each_post_once(srv, rounds);
}

/// Every one of `rounds` × `CALLERS` POSTs answered, each exactly once at the server.
fn assert_each_post_once(srv: &FaultServer, rounds: usize) {
    let seen = arrivals(srv);
    assert_eq!(seen.len(), rounds * CALLERS, "every POST arrived");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "POSTs that arrived twice: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_goaway_every_few_requests_fails_no_call_and_trips_no_breaker() {
    // Like nginx's keepalive_requests, but every 50 requests: about 40 GOAWAYs in the run.
    let srv = orders_server(FaultServer::http2().retire_after(50)).await;
    let h = h2c_client();
    let rounds = 30;
    run_clean(&h, &srv, rounds).await;
    assert!(
        srv.retired() >= 30,
        "the server retired {} connections",
        srv.retired()
    );
    assert!(srv.connections() >= 30, "{} connections", srv.connections());
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_streams_are_sent_again_without_a_failure_or_a_breaker_trip() {
    let srv = orders_server(FaultServer::http2().refuse_streams(3)).await;
    let h = h2c_client();
    let rounds = 10;
    run_clean(&h, &srv, rounds).await;
    // A third of the streams were refused, and each of those requests went again.
    let refused = srv.refused() as usize;
    assert!(
        refused >= rounds * CALLERS / 3 - CALLERS,
        "{refused} refused"
    );
    assert_eq!(resent(&h), refused);
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_retired_every_20ms_under_load_fails_no_call() {
    // nginx -s reload, fifty times a second: every open connection gets a GOAWAY.
    let srv = Arc::new(orders_server(FaultServer::http2()).await);
    let h = h2c_client();
    let reloads = {
        let srv = srv.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                srv.retire_connections();
            }
        })
    };
    let rounds = 30;
    run_clean(&h, &srv, rounds).await;
    reloads.abort();
    assert!(srv.retired() >= 2, "{} retired", srv.retired());
}

/// A front on a free loopback port for `upstream`: the first connection it accepts is read
/// from for a moment and closed without a byte sent (what an nginx worker exiting on reload
/// does to a connection it just accepted); every later one is relayed to `upstream`.
async fn closes_first_connection(upstream: std::net::SocketAddr) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut client, _)) = listener.accept().await {
            if std::mem::take(&mut first) {
                // What the client sends is read (its preface and its requests) until it
                // pauses, then the connection closes: its streams were sent, and none was
                // processed.
                let mut buf = [0u8; 16 * 1024];
                let pause = Duration::from_millis(100);
                while let Ok(Ok(n)) = tokio::time::timeout(
                    pause,
                    tokio::io::AsyncReadExt::read(&mut client, &mut buf),
                )
                .await
                {
                    if n == 0 {
                        break;
                    }
                }
                drop(client);
                continue;
            }
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_before_the_server_said_anything_fails_no_call() {
    let srv = orders_server(FaultServer::http2()).await;
    let front = closes_first_connection(srv.addr()).await;
    let h = h2c_client();
    let client = Arc::new(h.client.clone());
    let mut calls = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let client = client.clone();
        let url = format!("http://{front}/orders");
        calls.spawn(async move {
            let id = format!("0-{caller}");
            let req = NetRequest::post(url)
                .header("x-marker", id.as_str())
                .body(id.clone());
            client
                .send(req)
                .await
                .map(|r| r.status.as_u16())
                .map_err(|e| {
                    format!(
                        "{id}: {e} {:?}",
                        e.chain().map(ToString::to_string).collect::<Vec<_>>()
                    )
                })
        });
    }
    let mut failed = Vec::new();
    while let Some(done) = calls.join_next().await {
        if let Err(e) = done.unwrap() {
            failed.push(e);
        }
    }
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert_eq!(transitions(&h), Vec::<String>::new());
    assert_each_post_once(&srv, 1);
    assert!(
        resent(&h) > 0,
        "the requests of the closed connection went again"
    );
}

/// What [`goaway_then_reset_server`] gives: its address, the word to close its first
/// connection, the word that it did, and the requests it answered on each connection.
struct GoawayThenReset {
    addr: std::net::SocketAddr,
    go: tokio::sync::oneshot::Sender<()>,
    reset: std::sync::mpsc::Receiver<()>,
    answered: Arc<parking_lot::Mutex<Vec<usize>>>,
}

/// An h2c server on its own thread and runtime: on the first connection it answers one
/// request, then, once told on `go`, sends GOAWAY naming that stream as the last it processed
/// and resets the connection (`SO_LINGER` 0: what a server closing with requests of ours
/// unread does), and says so; later connections are answered.
fn goaway_then_reset_server() -> GoawayThenReset {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let (reset_tx, reset) = std::sync::mpsc::channel();
    let answered = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let counts = answered.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let answer = |mut respond: h2::server::SendResponse<bytes::Bytes>| {
                let res = http::Response::builder().status(200).body(()).unwrap();
                respond.send_response(res, true).unwrap();
            };
            let (tcp, _) = listener.accept().await.unwrap();
            tcp.set_zero_linger().unwrap();
            let mut conn = h2::server::handshake(tcp).await.unwrap();
            let (_req, respond) = conn.accept().await.unwrap().unwrap();
            answer(respond);
            counts.lock().push(1);
            // Drives the connection (the answer goes out) until told to close it.
            let mut go = go;
            loop {
                tokio::select! {
                    _ = &mut go => break,
                    next = conn.accept() => match next {
                        Some(Ok((_req, respond))) => {
                            answer(respond);
                            counts.lock()[0] += 1;
                        }
                        _ => return,
                    },
                }
            }
            conn.abrupt_shutdown(h2::Reason::NO_ERROR);
            // The GOAWAY goes out, then the connection ends; dropped with linger 0: a reset.
            let flushed = tokio::time::timeout(Duration::from_secs(5), async {
                while conn.accept().await.is_some() {}
            });
            flushed.await.unwrap();
            drop(conn);
            reset_tx.send(()).unwrap();
            let index = counts.lock().len();
            counts.lock().push(0);
            let (tcp, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(tcp).await.unwrap();
            while let Some(Ok((_req, respond))) = conn.accept().await {
                answer(respond);
                counts.lock()[index] += 1;
            }
        });
    });
    GoawayThenReset {
        addr,
        go: go_tx,
        reset,
        answered,
    }
}

// On a current-thread runtime on purpose: the test blocks it (see below).
#[tokio::test]
async fn a_reset_that_follows_a_goaway_fails_no_call_the_server_did_not_process() {
    let GoawayThenReset {
        addr,
        go,
        reset,
        answered,
    } = goaway_then_reset_server();
    let h = h2c_client();
    let url = format!("http://{addr}/orders");
    let res = h.client.send(NetRequest::post(&url).body("first")).await;
    assert_eq!(res.unwrap().status, 200);
    go.send(()).unwrap();
    // Blocks the runtime's only thread while the server sends its GOAWAY and resets the
    // connection, so that the first thing the client's connection does next is to write the
    // next request into the reset socket — before it has read the GOAWAY (what a busy client
    // meets when an nginx worker exits on reload). The write fails; the GOAWAY waiting in the
    // socket still says the server processed nothing after the first stream.
    reset
        .recv_timeout(Duration::from_secs(10))
        .expect("the server reset the connection");
    let res = h.client.send(NetRequest::post(&url).body("second")).await;
    let status = res.map(|r| r.status.as_u16()).map_err(|e| {
        format!(
            "{e} ({:?}) {:?}",
            e.kind(),
            e.chain().map(ToString::to_string).collect::<Vec<_>>()
        )
    });
    assert_eq!(status, Ok(200), "the unprocessed POST went again");
    assert_eq!(transitions(&h), Vec::<String>::new());
    assert_eq!(resent(&h), 1);
    assert_eq!(*answered.lock(), vec![1, 1], "answered per connection");
}

/// The pool's count of open connections to `host`.
fn open_to(client: &soulbase_net_runtime::Client, host: &str) -> u64 {
    let mut open = 0;
    client.gauge_source().read_gauges(&mut |r| {
        if let GaugeReading::PoolOpen { host: h, value } = r {
            if h == host {
                open += value;
            }
        }
    });
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_that_ended_leaves_the_pool_at_once() {
    // A pool that kept the sender of an ended HTTP/2 connection until its next checkout kept
    // hyper's request channel alive with it: a request caught in that channel as the
    // connection ended waited for its first-byte timeout. Seen here through the budget of one
    // kept connection: an ended connection still counted is evicted (an event) when another
    // origin's connection is kept.
    let first = orders_server(FaultServer::http2()).await;
    let second = orders_server(FaultServer::http2()).await;
    let h = harness_with(strict_policy(), |b| {
        b.http2_prior_knowledge(true).pool_max_idle(1)
    });
    let post = |srv: &FaultServer| NetRequest::post(srv.url("/orders")).body("x");
    let res = h.client.send(post(&first)).await.unwrap();
    res.bytes().await.unwrap();
    first.retire_connections();
    let closed = async {
        while open_to(&h.client, "127.0.0.1") > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("the retired connection ends");
    let res = h.client.send(post(&second)).await.unwrap();
    res.bytes().await.unwrap();
    let seen = h.events.seen.lock().clone();
    assert!(
        !seen.iter().any(|e| e.contains("ConnectionRetired")),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_connections_closed_after_a_few_requests_fail_no_call() {
    let srv = orders_server(FaultServer::http1().retire_after(5)).await;
    let h = harness_with(strict_policy(), |b| b);
    let rounds = 10;
    run_clean(&h, &srv, rounds).await;
    srv.join().await;
}

#[tokio::test]
async fn a_request_with_a_stream_body_that_was_refused_is_not_sent_again_and_says_so() {
    // Every stream refused: a stream body cannot go again, so the caller learns the server
    // did not process it — and may send it again itself.
    let srv = orders_server(FaultServer::http2().refuse_streams(1)).await;
    let h = h2c_client();
    let stream = http_body_util::Full::new(bytes::Bytes::from_static(b"once"));
    let err = h
        .client
        .send(NetRequest::post(srv.url("/orders")).body(soulbase_net_core::Body::stream(stream)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotProcessed, "{err:?}");
    assert_eq!(srv.hits("/orders"), 0);
    // A replayable body goes again, up to the limit, then the caller gets NotProcessed.
    let err = h
        .client
        .send(NetRequest::post(srv.url("/orders")).body("x"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotProcessed, "{err:?}");
    assert_eq!(resent(&h), 8);
    assert_eq!(srv.refused(), 1 + 9);
    assert_eq!(transitions(&h), Vec::<String>::new());
    srv.join().await;
}

/// The worst lateness of this runtime's timers while it runs: a timer asked to wake every
/// 10 ms notes how late it woke.
struct Lateness {
    worst: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Lateness {
    fn start() -> Self {
        let worst = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen = worst.clone();
        let task = tokio::spawn(async move {
            loop {
                let due = tokio::time::Instant::now() + Duration::from_millis(10);
                tokio::time::sleep_until(due).await;
                let late = due.elapsed().as_micros() as u64;
                seen.fetch_max(late, std::sync::atomic::Ordering::Relaxed);
            }
        });
        Lateness { worst, task }
    }

    fn stop(self) -> Duration {
        self.task.abort();
        Duration::from_micros(self.worst.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Requests to `url` one after another until `done` says so (or `limit` passes); returns
/// how many were sent, and fails the test on any failed call.
async fn get_until(
    client: &soulbase_net_runtime::Client,
    url: &str,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> usize {
    let until = tokio::time::Instant::now() + limit;
    let mut sent = 0;
    while !done() && tokio::time::Instant::now() < until {
        let res = client.send(NetRequest::get(url)).await.unwrap();
        assert_eq!(res.status, 200);
        res.bytes().await.unwrap();
        sent += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_moved_in_dns_is_followed_within_its_ttl_and_a_second() {
    // Blue on 127.0.0.1, green on 127.0.0.2, the same port: only DNS tells them apart.
    let blue = FaultServer::http1()
        .route("/", Reply::ok("blue"))
        .start()
        .await
        .unwrap();
    let port = blue.addr().port();
    let green = FaultServer::http1()
        .bind(std::net::SocketAddr::from(([127, 0, 0, 2], port)))
        .route("/", Reply::ok("green"))
        .start()
        .await
        .unwrap();
    let dns = soulbase_net_testkit::MockDns::start().await.unwrap();
    let ttl = 1;
    dns.set_ips("svc.test", &[std::net::IpAddr::from([127, 0, 0, 1])], ttl);
    let mut p = loopback_policy();
    p.dns.nameservers = vec![dns.addr()];
    p.dns.timeout = Duration::from_secs(2);
    p.dns.prefetch.clear();
    let h = crate::support::harness(p);
    let url = format!("http://svc.test:{port}/");
    // Stable for three TTLs: one connection, reused, however many lookups.
    get_until(&h.client, &url, Duration::from_secs(3), || false).await;
    assert_eq!(
        blue.connections(),
        1,
        "no reconnection while the answer is stable"
    );
    assert_eq!(green.hits("/"), 0);
    // The move.
    dns.set_ips("svc.test", &[std::net::IpAddr::from([127, 0, 0, 2])], ttl);
    let moved = tokio::time::Instant::now();
    let lateness = Lateness::start();
    get_until(&h.client, &url, Duration::from_secs(10), || {
        green.hits("/") > 0
    })
    .await;
    let followed = moved.elapsed();
    let late = lateness.stop();
    // TTL + the pool's one-second recheck, the test's own pace, and however late this
    // runtime's timers fired meanwhile (a loaded machine delays the recheck's timer too).
    let limit = Duration::from_secs(u64::from(ttl) + 1) + Duration::from_millis(300) + late;
    assert!(
        followed <= limit,
        "followed after {followed:?}, limit {limit:?} (timers up to {late:?} late)"
    );
    // Everything goes to green now, and blue's connection is closed.
    let blue_hits = blue.hits("/");
    get_until(&h.client, &url, Duration::from_millis(300), || false).await;
    assert_eq!(
        blue.hits("/"),
        blue_hits,
        "no request went to the old address"
    );
    tokio::time::timeout(Duration::from_secs(5), blue.wait_for_open_at_most(0))
        .await
        .expect("the old address's connection closes");
    let seen = h.events.seen.lock().clone();
    assert!(
        seen.iter()
            .any(|e| e.contains("ConnectionRetired") && e.contains("DnsMoved")),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_keeps_no_more_connections_than_its_budget_over_many_hosts() {
    let srv = FaultServer::http1()
        .route("/", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    const HOSTS: usize = 60;
    const BUDGET: usize = 16;
    let p = many_hosts_policy(HOSTS);
    let h = harness_with(p, |b| b.pool_max_idle(BUDGET));
    for i in 0..HOSTS {
        let url = format!("http://h{i}.test:{}/", srv.addr().port());
        let res = h.client.send(NetRequest::get(url)).await.unwrap();
        assert_eq!(res.status, 200);
        res.bytes().await.unwrap();
    }
    // One connection per host was opened; the client keeps at most its budget of them.
    assert_eq!(srv.connections(), HOSTS as u64);
    tokio::time::timeout(
        Duration::from_secs(5),
        srv.wait_for_open_at_most(BUDGET as u64),
    )
    .await
    .expect("the evicted connections close");
    let seen = h.events.seen.lock().clone();
    let evicted = seen
        .iter()
        .filter(|e| e.contains("ConnectionRetired") && e.contains("IdleBudget"))
        .count();
    assert!(evicted >= HOSTS - BUDGET, "{evicted} evicted");
    // The most recently used hosts are still pooled: the last one is reused.
    let last = format!("http://h{}.test:{}/", HOSTS - 1, srv.addr().port());
    h.client.send(NetRequest::get(last)).await.unwrap();
    assert_eq!(
        srv.connections(),
        HOSTS as u64,
        "the last host's connection was kept"
    );
    srv.join().await;
}

/// The loopback policy with `hosts` names `h0.test`, `h1.test`, … all on 127.0.0.1.
fn many_hosts_policy(hosts: usize) -> NetPolicy {
    let mut p = loopback_policy();
    for i in 0..hosts {
        let loopback = vec![std::net::IpAddr::from([127, 0, 0, 1])];
        p.dns.static_hosts.insert(format!("h{i}.test"), loopback);
    }
    p
}

/// Descriptors this process has open now.
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_hosts_in_turn_stay_within_the_descriptor_budget() {
    // The client's defaults: its kept connections are capped at a quarter of the descriptor
    // limit. The server is in this process too, so each kept connection holds two
    // descriptors here; without the budget the client alone held one per host met.
    const HOSTS: usize = 20_000;
    const CALLERS: usize = 8;
    let srv = FaultServer::http1()
        .route("/", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    let p = many_hosts_policy(HOSTS);
    // Where the default (a quarter of the soft limit) would keep a connection per host, the
    // cap would never be met: the budget is then set to a quarter of the hosts, so that the
    // test exercises eviction on any machine.
    let default_budget = (nix_soft_limit() / 4).clamp(16, 1 << 20);
    let budget = if default_budget < HOSTS {
        default_budget
    } else {
        HOSTS / 4
    };
    let h = harness_with(p, |b| {
        if budget == default_budget {
            b
        } else {
            b.pool_max_idle(budget)
        }
    });
    let client = Arc::new(h.client.clone());
    let port = srv.addr().port();
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let before = open_descriptors();
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let (client, peak) = (client.clone(), peak.clone());
        callers.spawn(async move {
            let mut failed = Vec::new();
            for i in (caller..HOSTS).step_by(CALLERS) {
                let url = format!("http://h{i}.test:{port}/");
                match client.send(NetRequest::get(url)).await {
                    Ok(res) if res.status == 200 => {
                        res.bytes().await.unwrap();
                    }
                    Ok(res) => failed.push(format!("h{i}: {}", res.status)),
                    Err(e) => failed.push(format!("h{i}: {e}")),
                }
                if i % 256 == caller {
                    peak.fetch_max(open_descriptors(), std::sync::atomic::Ordering::Relaxed);
                }
            }
            failed
        });
    }
    let mut failed = Vec::new();
    while let Some(done) = callers.join_next().await {
        failed.extend(done.unwrap());
    }
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert_eq!(srv.connections(), HOSTS as u64);
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    // Both ends of each kept connection, the callers' in flight, and what the process had.
    assert!(
        peak <= before + 2 * (budget + CALLERS) + 64,
        "{peak} descriptors open at the peak, {before} before, budget {budget}"
    );
    let seen = h.events.seen.lock();
    let evicted = seen.iter().filter(|e| e.contains("IdleBudget")).count();
    eprintln!(
        "{HOSTS} hosts: budget {budget} (default {default_budget}), {evicted} evicted, peak \
         {peak} descriptors ({before} before)"
    );
    assert!(
        evicted > 0 && evicted >= HOSTS.saturating_sub(budget),
        "{evicted} evicted of {HOSTS} with budget {budget}"
    );
}

/// The process's soft descriptor limit, as the pool reads it.
fn nix_soft_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

#[tokio::test]
async fn pool_settings_are_policy_per_host() {
    // One server speaking HTTP/1.1 and h2c; two names for it: one whose policy keeps no idle
    // HTTP/1.1 connection, one whose policy asks for HTTP/2 prior knowledge.
    let srv = FaultServer::builder()
        .route("/", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    let mut base = many_hosts_policy(0);
    for name in ["one.test", "two.test"] {
        let loopback = vec![std::net::IpAddr::from([127, 0, 0, 1])];
        base.dns.static_hosts.insert(name.to_owned(), loopback);
    }
    let mut doc = soulbase_net_policy::PolicyDocument::from_policy(&base);
    doc.set_override(
        "one.test",
        serde_json::json!({ "pool": { "max_idle_per_host": 0 } }),
    );
    doc.set_override(
        "two.test",
        serde_json::json!({ "pool": { "http2_prior_knowledge": true } }),
    );
    let resolver = soulbase_net_policy::SnapshotResolver::new(doc).unwrap();
    let client = soulbase_net_runtime::Client::builder()
        .policy_resolver(Arc::new(resolver))
        .build()
        .unwrap();
    let port = srv.addr().port();
    for name in ["one.test", "two.test", "one.test", "two.test"] {
        let res = client
            .send(NetRequest::get(format!("http://{name}:{port}/")))
            .await
            .unwrap();
        res.bytes().await.unwrap();
    }
    let versions: Vec<_> = srv
        .received_requests()
        .iter()
        .map(|r| {
            // HTTP/2 names the host in `:authority`, HTTP/1.1 in `Host`.
            let host = r.uri.authority().map(|a| a.to_string());
            let host = host.or_else(|| r.header("host").map(str::to_owned));
            (host.unwrap_or_default(), r.version)
        })
        .collect();
    for (host, version) in &versions {
        let want = if host.starts_with("two.test") {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        assert_eq!(*version, want, "{host}: {versions:?}");
    }
    // one.test kept no connection (two opened); two.test's HTTP/2 one was shared.
    assert_eq!(srv.connections(), 3, "{versions:?}");
    srv.join().await;
}

/// `rounds` rounds of `CALLERS` concurrent POSTs without a body to `path`. Returns the
/// failed calls' errors.
async fn bodiless_post_rounds(
    h: &Harness,
    srv: &FaultServer,
    path: &str,
    rounds: usize,
) -> Vec<soulbase_net_core::NetError> {
    let client = Arc::new(h.client.clone());
    let mut failures = Vec::new();
    for _ in 0..rounds {
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..CALLERS {
            let client = client.clone();
            let url = srv.url(path);
            calls.spawn(async move {
                let res = client.send(NetRequest::post(url)).await?;
                assert_eq!(res.status, 200);
                Ok::<_, soulbase_net_core::NetError>(())
            });
        }
        while let Some(done) = calls.join_next().await {
            if let Err(e) = done.unwrap() {
                failures.push(e);
            }
        }
    }
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bodiless_post_raced_by_a_goaway_fails_as_io_but_trips_no_breaker() {
    // A POST complete in its head that meets a GOAWAY may have been processed (see the pool's
    // `going_away`): the caller gets `Io` and decides. But the server only closed a
    // connection, as it routinely does: the breaker (one failure opens it here) and the SLO
    // controller (one error in its window breaches it) learn nothing of it.
    let srv = orders_server(FaultServer::http2().retire_after(5)).await;
    let mut p = strict_policy();
    p.slo.enabled = true;
    p.slo.error_ratio = 0.01;
    p.slo.window = Duration::from_millis(250);
    p.slo.interval = Duration::from_millis(50);
    p.slo.min_samples = 10;
    let h = harness_with(p, |b| b.http2_prior_knowledge(true));
    // Batches of rounds for longer than a few of the controller's windows.
    let began = tokio::time::Instant::now();
    let (mut rounds, mut failures) = (0, Vec::new());
    while rounds < 40 || began.elapsed() < Duration::from_secs(1) {
        let batch = tokio::time::timeout(
            Duration::from_secs(60),
            bodiless_post_rounds(&h, &srv, "/orders", 10),
        );
        failures.extend(batch.await.expect("the run ends"));
        rounds += 10;
    }
    let calls = rounds * CALLERS;
    for e in &failures {
        assert_eq!(e.kind(), ErrorKind::Io, "{e:?}");
        assert!(
            e.message()
                .is_some_and(|m| m.contains("GOAWAY") && m.contains("may have been processed")),
            "{e:?}"
        );
    }
    eprintln!(
        "{} of {calls} bodiless POSTs failed as Io; {} answered; {} connections retired",
        failures.len(),
        srv.hits("/orders"),
        srv.retired()
    );
    assert_eq!(transitions(&h), Vec::<String>::new());
    let seen = h.events.seen.lock().clone();
    let changes: Vec<_> = (seen.iter())
        .filter(|e| e.starts_with("PolicyChange"))
        .take(3)
        .collect();
    assert!(changes.is_empty(), "{changes:?}");
    assert!(srv.retired() >= 30, "{} retired", srv.retired());
    srv.join().await;
}

/// The whole retries the client's retry budgets allow now, over every key.
fn budget_tokens(client: &soulbase_net_runtime::Client) -> u64 {
    let mut tokens = 0;
    client.gauge_source().read_gauges(&mut |r| {
        if let GaugeReading::RetryBudgetTokens { value, .. } = r {
            tokens += value;
        }
    });
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_spends_no_retry_attempt_nor_budget_and_the_slo_controller_never_sees_it() {
    // Retries on for GETs, which they would cover, but a budget too tight for them: a quarter
    // of a retry per call, none per second, while a third of the streams are refused. The SLO
    // controller is on, with targets that one retry or one error in its window breaches.
    let mut p = strict_policy();
    p.retry.enabled = true;
    p.retry.max_attempts = 3;
    p.retry.budget.enabled = true;
    p.retry.budget.retry_ratio = 0.25;
    p.retry.budget.min_retries_per_sec = 0;
    p.retry.budget.window = Duration::from_secs(60);
    p.slo.enabled = true;
    p.slo.retry_rate = 0.01;
    p.slo.error_ratio = 0.01;
    // It decides once a whole window has passed: several windows pass in the run.
    p.slo.window = Duration::from_millis(250);
    p.slo.interval = Duration::from_millis(50);
    p.slo.min_samples = 10;
    let h = harness_with(p, |b| b.http2_prior_knowledge(true));
    let srv = orders_server(FaultServer::http2().refuse_streams(3)).await;
    let client = Arc::new(h.client.clone());
    // Rounds of concurrent GETs for longer than a few of the controller's windows.
    let began = tokio::time::Instant::now();
    let mut calls = 0;
    let mut attempts = Vec::new();
    while calls < 10 * CALLERS || began.elapsed() < Duration::from_secs(1) {
        let mut round = tokio::task::JoinSet::new();
        for _ in 0..CALLERS {
            let client = client.clone();
            let url = srv.url("/orders");
            round.spawn(async move {
                let res = client.send(NetRequest::get(url)).await.unwrap();
                assert_eq!(res.status, 200);
                let attempts = res.attempts;
                res.bytes().await.unwrap();
                attempts
            });
        }
        while let Some(done) = round.join_next().await {
            attempts.push(done.unwrap());
            calls += 1;
        }
    }
    let refused = srv.refused() as usize;
    assert!(
        refused >= calls / 3 - CALLERS,
        "{refused} refused of {calls}"
    );
    assert_eq!(resent(&h), refused, "every refused request went again");
    assert_eq!(srv.hits("/orders") as usize, calls);
    // Nothing was spent: the budget holds its quarter of a retry per call, whole.
    assert_eq!(budget_tokens(&h.client) as usize, calls / 4);
    let seen = h.events.seen.lock().clone();
    let spent: Vec<_> = (seen.iter())
        .filter(|e| {
            e.starts_with("RetryScheduled")
                || e.starts_with("RetryBudgetExhausted")
                || e.starts_with("PolicyChange")
                || e.starts_with("BreakerTransition")
        })
        .take(5)
        .collect();
    assert!(spent.is_empty(), "{spent:?}");
    eprintln!(
        "{calls} calls, {refused} refused and resent, at most {:?} attempts in a call, {} \
         budget tokens",
        attempts.iter().max(),
        budget_tokens(&h.client)
    );
    srv.join().await;
}

/// An h2c client whose policy gives each of `overrides`' host patterns its pool section; the
/// names `life.test`, `ping.test` and `plain.test` are on 127.0.0.1.
fn pool_override_client(overrides: &[(&str, serde_json::Value)]) -> soulbase_net_runtime::Client {
    let mut base = many_hosts_policy(0);
    for name in ["life.test", "ping.test", "plain.test"] {
        let loopback = vec![std::net::IpAddr::from([127, 0, 0, 1])];
        base.dns.static_hosts.insert(name.to_owned(), loopback);
    }
    let mut doc = soulbase_net_policy::PolicyDocument::from_policy(&base);
    for (host, pool) in overrides {
        doc.set_override(*host, serde_json::json!({ "pool": pool }));
    }
    let resolver = soulbase_net_policy::SnapshotResolver::new(doc).unwrap();
    soulbase_net_runtime::Client::builder()
        .http2_prior_knowledge(true)
        .policy_resolver(Arc::new(resolver))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_lifetime_set_by_the_policy_of_one_host_replaces_its_connections() {
    // The builder sets no lifetime; the policy gives `life.test` one of 300 ms.
    let srv = FaultServer::http2()
        .route("/", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    let client =
        pool_override_client(&[("life.test", serde_json::json!({ "max_lifetime": "300ms" }))]);
    let port = srv.addr().port();
    let began = tokio::time::Instant::now();
    while began.elapsed() < Duration::from_millis(1300) {
        for name in ["life.test", "plain.test"] {
            let res = client
                .send(NetRequest::get(format!("http://{name}:{port}/")))
                .await
                .unwrap();
            res.bytes().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut connections: HashMap<String, std::collections::BTreeSet<u64>> = HashMap::new();
    for r in srv.received_requests() {
        let host = r.uri.host().unwrap_or_default().to_owned();
        connections.entry(host).or_default().insert(r.connection);
    }
    let count = |host: &str| connections.get(host).map_or(0, |c| c.len());
    eprintln!(
        "connections: life.test {}, plain.test {}",
        count("life.test"),
        count("plain.test")
    );
    // 1.3 s of use with a 300 ms lifetime: a connection at least every 300 ms, four or five.
    assert!(count("life.test") >= 4, "{connections:?}");
    assert_eq!(count("plain.test"), 1, "{connections:?}");
    srv.join().await;
}

/// A TCP relay on loopback to `upstream`, and the bytes the client side has sent through it
/// so far.
async fn counting_relay(
    upstream: std::net::SocketAddr,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = sent.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(upstream).await.unwrap();
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
            });
            let count = count.clone();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = vec![0; 16 * 1024];
                while let Ok(n) = from_client.read(&mut buf).await {
                    if n == 0 || to_server.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    count.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    });
    (addr, sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_set_by_the_policy_of_one_host_pings_only_its_connections() {
    // The builder sets no keep-alive; the policy gives `ping.test` pings every 100 ms. Each
    // host is reached through a relay that counts what the client sends.
    let srv = FaultServer::http2()
        .route("/", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    let (ping_relay, ping_sent) = counting_relay(srv.addr()).await;
    let (plain_relay, plain_sent) = counting_relay(srv.addr()).await;
    let client =
        pool_override_client(&[("ping.test", serde_json::json!({ "keep_alive": "100ms" }))]);
    for url in [
        format!("http://ping.test:{}/", ping_relay.port()),
        format!("http://plain.test:{}/", plain_relay.port()),
    ] {
        let res = client.send(NetRequest::get(url)).await.unwrap();
        res.bytes().await.unwrap();
    }
    // What follows a request (acknowledgements) has gone; then both connections stay idle.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = [&ping_sent, &plain_sent].map(|s| s.load(std::sync::atomic::Ordering::SeqCst));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let after = [&ping_sent, &plain_sent].map(|s| s.load(std::sync::atomic::Ordering::SeqCst));
    // A PING frame is 17 bytes: at least three of them in 800 ms, and nothing on the other.
    let ping = after[0] - before[0];
    eprintln!(
        "idle 800 ms: {ping} bytes sent on ping.test's connection, {} on plain.test's",
        after[1] - before[1]
    );
    assert!(ping >= 3 * 17, "{ping} bytes sent on the pinged connection");
    assert_eq!(after[1], before[1], "bytes sent on the other connection");
    assert_eq!(srv.connections(), 2);
    srv.join().await;
}
