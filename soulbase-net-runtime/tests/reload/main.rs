//! Hot reload under load: transports, resolvers, tasks, descriptors and server connections
//! stay bounded however many reloads change connection and DNS settings. Its own test binary,
//! so that no other test's sockets or tasks share the counts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use soulbase_net_core::{NetClient, NetRequest};
use soulbase_net_policy::{NetPolicy, PolicyDocument, SnapshotResolver};
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{FaultServer, Reply};

/// The descriptors this process has open.
fn descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Reload `i`: the loopback policy with connection and DNS settings of its own.
fn policy(i: u32) -> NetPolicy {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    // Never the system resolver: no name is looked up here, and any would fail at once.
    p.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    p.dns.prefetch.clear();
    p.dns.timeout = Duration::from_millis(500 + u64::from(i % 97));
    p.timeout.connect = Duration::from_millis(1000 + u64::from(i));
    p.limits.per_host_concurrency = 64 + i % 7;
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_reloads_under_load_leave_one_transport() {
    const CALLERS: u64 = 16;
    const RELOADS: u32 = 1000;
    let srv = FaultServer::http1()
        .route("/ok", Reply::ok("ok"))
        .start()
        .await
        .unwrap();
    let resolver =
        Arc::new(SnapshotResolver::new(PolicyDocument::from_policy(&policy(0))).unwrap());
    let client = Arc::new(
        Client::builder()
            .policy_resolver(resolver.clone())
            .build()
            .unwrap(),
    );
    let url = srv.url("/ok");
    // Warm: every caller has made a call and holds a pooled connection.
    for _ in 0..CALLERS {
        client.send(NetRequest::get(url.as_str())).await.unwrap();
    }
    let (fds_before, tasks_before) = (descriptors(), alive_tasks());

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..CALLERS {
        let (client, url, stop, done) = (client.clone(), url.clone(), stop.clone(), done.clone());
        callers.spawn(async move {
            // Bounded: at most this many calls each, whatever happens to `stop`.
            for _ in 0..200_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let res = client.send(NetRequest::get(url.as_str())).await.unwrap();
                res.bytes().await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    for i in 1..=RELOADS {
        resolver
            .update(PolicyDocument::from_policy(&policy(i)))
            .unwrap();
        // One call under each new policy, beside the callers' load.
        let res = client.send(NetRequest::get(url.as_str())).await.unwrap();
        res.bytes().await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(r) = callers.join_next().await {
        r.unwrap();
    }
    assert!(done.load(Ordering::Relaxed) > 0, "the callers made calls");

    // No call is in flight and one policy is current: one transport, one resolver for it
    // and the one warmed at build time.
    assert_eq!(client.live_transports(), 1);
    assert!(
        client.live_dns_resolvers() <= 2,
        "{} resolvers",
        client.live_dns_resolvers()
    );
    // The old pools closed their connections: the server sees at most the current pool's.
    tokio::time::timeout(
        Duration::from_secs(10),
        srv.wait_for_open_at_most(CALLERS + 1),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{} connections still open at the server",
            srv.open_connections()
        )
    });
    // Client and server ends of at most that many connections more than before the load.
    let (fds_after, tasks_after) = (descriptors(), alive_tasks());
    let slack = 2 * (CALLERS as usize + 1) + 16;
    assert!(
        fds_after <= fds_before + slack,
        "descriptors {fds_before} before, {fds_after} after {RELOADS} reloads"
    );
    assert!(
        tasks_after <= tasks_before + slack,
        "tasks {tasks_before} before, {tasks_after} after {RELOADS} reloads"
    );
    eprintln!(
        "after {RELOADS} reloads and {} calls: descriptors {fds_before} -> {fds_after}, tasks {tasks_before} -> {tasks_after}, server connections {} open of {} accepted",
        done.load(Ordering::Relaxed),
        srv.open_connections(),
        srv.connections()
    );
    srv.join().await;
}

/// The document of reload `i`: `a.test` and `b.test` on loopback; only `b.test`'s pool
/// settings change from one reload to the next.
fn two_hosts(i: u32) -> PolicyDocument {
    let mut base = policy(0);
    for name in ["a.test", "b.test"] {
        base.dns.static_hosts.insert(
            name.to_owned(),
            vec![std::net::IpAddr::from([127, 0, 0, 1])],
        );
    }
    let mut doc = PolicyDocument::from_policy(&base);
    doc.set_override(
        "b.test",
        serde_json::json!({ "pool": { "max_idle_per_host": 8 + i % 5, "idle_timeout": format!("{}s", 60 + i) } }),
    );
    doc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_reloads_of_one_hosts_pool_settings_keep_the_other_hosts_connections() {
    const CALLERS: usize = 8;
    const RELOADS: u32 = 1000;
    let a = FaultServer::http1()
        .route("/ok", Reply::ok("a"))
        .start()
        .await
        .unwrap();
    let b = FaultServer::http1()
        .route("/ok", Reply::ok("b"))
        .start()
        .await
        .unwrap();
    let resolver = Arc::new(SnapshotResolver::new(two_hosts(0)).unwrap());
    let client = Arc::new(
        Client::builder()
            .policy_resolver(resolver.clone())
            .build()
            .unwrap(),
    );
    let url_a = format!("http://a.test:{}/ok", a.addr().port());
    let url_b = format!("http://b.test:{}/ok", b.addr().port());
    let stop = Arc::new(AtomicBool::new(false));
    let mut callers = tokio::task::JoinSet::new();
    for i in 0..CALLERS {
        let (client, stop) = (client.clone(), stop.clone());
        let url = if i % 2 == 0 {
            url_a.clone()
        } else {
            url_b.clone()
        };
        callers.spawn(async move {
            let mut calls = 0u64;
            for _ in 0..200_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let res = client.send(NetRequest::get(url.as_str())).await.unwrap();
                res.bytes().await.unwrap();
                calls += 1;
            }
            calls
        });
    }
    for i in 1..=RELOADS {
        resolver.update(two_hosts(i)).unwrap();
        for url in [&url_a, &url_b] {
            let res = client.send(NetRequest::get(url.as_str())).await.unwrap();
            res.bytes().await.unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut calls = 0;
    while let Some(r) = callers.join_next().await {
        calls += r.unwrap();
    }
    assert!(calls > 0);
    // a.test's policy never changed: its pool and connections lived through every reload
    // (its callers and the reload loop's call each hold at most one).
    assert!(
        a.connections() <= CALLERS as u64 / 2 + 1,
        "a.test opened {} connections over {RELOADS} reloads",
        a.connections()
    );
    // b.test's changed every time: a new pool each, the old ones closed.
    assert!(
        b.connections() > u64::from(RELOADS) / 2,
        "b.test opened {} connections over {RELOADS} reloads",
        b.connections()
    );
    tokio::time::timeout(
        Duration::from_secs(10),
        b.wait_for_open_at_most(CALLERS as u64 / 2 + 1),
    )
    .await
    .unwrap_or_else(|_| panic!("{} b.test connections still open", b.open_connections()));
    eprintln!(
        "{RELOADS} reloads, {calls} calls: a.test {} connections, b.test {}",
        a.connections(),
        b.connections()
    );
    a.join().await;
    b.join().await;
}

/// The resident memory of this process, KiB.
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_that_each_make_a_new_pool_leave_the_clients_memory_flat() {
    // A bare hyper server: the testkit's keeps every request it received, which would be the
    // growth measured here.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    let resolver =
        Arc::new(SnapshotResolver::new(PolicyDocument::from_policy(&policy(0))).unwrap());
    let client = Client::builder()
        .policy_resolver(resolver.clone())
        .build()
        .unwrap();
    let url = format!("http://{addr}/");
    // Each reload changes connection and DNS settings: a new pool and a new resolver.
    let run = |from: u32, to: u32| {
        let (client, resolver, url) = (&client, &resolver, &url);
        async move {
            for i in from..to {
                resolver
                    .update(PolicyDocument::from_policy(&policy(i)))
                    .unwrap();
                for _ in 0..10 {
                    let res = client.send(NetRequest::get(url.as_str())).await.unwrap();
                    res.bytes().await.unwrap();
                }
            }
        }
    };
    // Warm: the allocator's arenas, the runtime's threads, the resolvers' first tables.
    run(1, 300).await;
    let warm = rss_kib();
    run(300, 1_300).await;
    let after = rss_kib();
    eprintln!("RSS after warm-up {warm} KiB, after 1 000 more reloads {after} KiB");
    // 50 KiB kept per reload (what a pool or resolver left behind would cost) would be 50 MiB.
    assert!(
        after <= warm + 8 * 1024,
        "RSS grew from {warm} to {after} KiB over 1 000 reloads"
    );
    assert_eq!(client.live_transports(), 1);
    server.abort();
}
