//! The connection pool: reuse, the idle timeout and the idle maximum, bodies dropped unread,
//! connections the server closes, and HTTP/2 sharing.

use std::{sync::Arc, time::Duration};

use soulbase_net_core::{NetClient, NetRequest};
use soulbase_net_testkit::{CertKit, FaultServer, Reply, Script};

use crate::support::{bounded, harness, harness_with, loopback_policy};

/// `n` GETs of `url` at once, each body read to the end; their bodies.
async fn burst(client: &Arc<soulbase_net_runtime::Client>, url: &str, n: usize) -> Vec<String> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (client, url) = (client.clone(), url.to_owned());
        tasks.spawn(async move {
            let res = client.send(NetRequest::get(url)).await.unwrap();
            res.text().await.unwrap()
        });
    }
    let mut bodies = Vec::new();
    while let Some(body) = tasks.join_next().await {
        bodies.push(body.unwrap());
    }
    bodies
}

/// A server answering `GET /a` with `a`.
async fn server_a() -> FaultServer {
    FaultServer::http1()
        .route("/a", Reply::ok("a"))
        .start()
        .await
        .unwrap()
}

/// `GET /a` in one attempt, its body checked; how long opening a connection for it took.
async fn get_a(client: &soulbase_net_runtime::Client, srv: &FaultServer) -> Duration {
    let res = client.send(NetRequest::get(srv.url("/a"))).await.unwrap();
    assert_eq!(res.attempts, 1);
    let connect = res.elapsed.connect();
    assert_eq!(res.text().await.unwrap(), "a");
    connect
}

#[tokio::test]
async fn sequential_requests_share_one_connection() {
    bounded(async {
        let srv = server_a().await;
        let h = harness(loopback_policy());
        for _ in 0..5 {
            get_a(&h.client, &srv).await;
        }
        assert_eq!(srv.hits("/a"), 5);
        assert_eq!(srv.connections(), 1);
        assert_eq!(h.client.connections_opened(), 1);
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    bounded(async {
        let srv = server_a().await;
        let h = harness_with(loopback_policy(), |b| {
            b.pool_idle_timeout(Duration::from_millis(100))
        });
        get_a(&h.client, &srv).await;
        assert_eq!(srv.connections(), 1);
        // Nothing else happens on the client: the reaper closes the idle connection.
        tokio::time::timeout(Duration::from_secs(5), srv.wait_for_open_at_most(0))
            .await
            .expect("the idle connection was closed");
        // The next request opens a new one and succeeds at once.
        assert!(get_a(&h.client, &srv).await > Duration::ZERO);
        assert_eq!(srv.connections(), 2);
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn a_connection_past_its_lifetime_takes_no_new_request() {
    bounded(async {
        let srv = server_a().await;
        let lifetime = Duration::from_secs(1);
        let h = harness_with(loopback_policy(), |b| b.pool_max_lifetime(lifetime));
        for _ in 0..2 {
            get_a(&h.client, &srv).await;
        }
        assert_eq!(srv.connections(), 1, "reused within its lifetime");
        // What is tested is the passing of time itself: the connection was born before its
        // first request came back, so a lifetime from now it is past its lifetime.
        tokio::time::sleep(lifetime + Duration::from_millis(100)).await;
        assert!(
            get_a(&h.client, &srv).await > Duration::ZERO,
            "a new connection"
        );
        assert_eq!(srv.connections(), 2);
        // The old one was closed, not kept.
        tokio::time::timeout(Duration::from_secs(5), srv.wait_for_open_at_most(1))
            .await
            .expect("the connection past its lifetime was closed");
        srv.join().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_beyond_the_maximum_per_origin_are_closed() {
    bounded(async {
        let srv = FaultServer::http1()
            .route("/slow", Reply::ok("s").delay(Duration::from_millis(200)))
            .start()
            .await
            .unwrap();
        let h = harness_with(loopback_policy(), |b| b.pool_max_idle_per_host(2));
        let client = Arc::new(h.client);
        // Five at once: five connections, all in use together.
        assert_eq!(burst(&client, &srv.url("/slow"), 5).await, vec!["s"; 5]);
        assert_eq!(srv.connections(), 5);
        // Two are kept; three are closed as they come back.
        tokio::time::timeout(Duration::from_secs(5), srv.wait_for_open_at_most(2))
            .await
            .expect("connections over the idle maximum were closed");
        assert_eq!(srv.open_connections(), 2);
        // The next five: two reuse the kept ones, three open new ones.
        assert_eq!(burst(&client, &srv.url("/slow"), 5).await, vec!["s"; 5]);
        assert_eq!(srv.connections(), 8);
        assert_eq!(client.connections_opened(), 8);
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn a_body_dropped_unread_leaves_the_pool_usable() {
    bounded(async {
        let big = vec![b'x'; 4 << 20];
        let srv = FaultServer::http1()
            .route("/small", Reply::ok("tiny"))
            .route("/big", Reply::ok(big))
            .start()
            .await
            .unwrap();
        let h = harness(loopback_policy());
        // A small body already arrived with its head: hyper drains it, the connection is
        // used again.
        let res = h
            .client
            .send(NetRequest::get(srv.url("/small")))
            .await
            .unwrap();
        drop(res);
        let res = h
            .client
            .send(NetRequest::get(srv.url("/small")))
            .await
            .unwrap();
        assert_eq!(res.elapsed.connect(), Duration::ZERO, "the pooled one");
        assert_eq!(res.text().await.unwrap(), "tiny");
        assert_eq!(srv.connections(), 1);
        // Most of 4 MiB is still on the wire when the body is dropped: that connection is
        // closed, and the next request opens another one and succeeds.
        let res = h
            .client
            .send(NetRequest::get(srv.url("/big")))
            .await
            .unwrap();
        drop(res);
        let res = h
            .client
            .send(NetRequest::get(srv.url("/small")))
            .await
            .unwrap();
        assert_eq!(res.attempts, 1);
        assert_eq!(res.text().await.unwrap(), "tiny");
        assert_eq!(srv.connections(), 2);
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn a_connection_the_server_closes_is_not_used_again() {
    bounded(async {
        let srv = FaultServer::http1()
            .route("/bye", Reply::ok("bye").header("connection", "close"))
            .start()
            .await
            .unwrap();
        let mut p = loopback_policy();
        p.retry.enabled = false;
        let h = harness(p);
        for _ in 0..3 {
            let res = h
                .client
                .send(NetRequest::get(srv.url("/bye")))
                .await
                .unwrap();
            assert_eq!(res.attempts, 1);
            assert!(res.elapsed.connect() > Duration::ZERO, "a new connection");
            assert_eq!(res.text().await.unwrap(), "bye");
        }
        assert_eq!(srv.connections(), 3);
        srv.join().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_opens_one_connection_for_a_burst() {
    bounded(async {
        let srv = FaultServer::http2()
            .route("/m", Reply::ok("m").delay(Duration::from_millis(50)))
            .start()
            .await
            .unwrap();
        let h = harness_with(loopback_policy(), |b| b.http2_prior_knowledge(true));
        let client = Arc::new(h.client);
        // Twenty at once on a cold pool: one connects, the others wait for it and share it.
        assert_eq!(burst(&client, &srv.url("/m"), 20).await, vec!["m"; 20]);
        assert_eq!(srv.hits("/m"), 20);
        assert_eq!(srv.connections(), 1);
        assert_eq!(client.connections_opened(), 1);
        assert!(srv
            .requests("/m")
            .iter()
            .all(|r| r.version == http::Version::HTTP_2));
        srv.join().await;
    })
    .await;
}

/// A policy with one connection per origin and a hedge 50 ms into every call: the hedge
/// finds the connection in use and the cap full, so it waits in the pool.
fn one_connection_hedged() -> soulbase_net_policy::NetPolicy {
    let mut p = loopback_policy();
    p.limits.per_host_concurrency = 1;
    p.hedge.enabled = true;
    p.hedge.delay = Duration::from_millis(50);
    p.hedge.max_hedges = 1;
    p
}

#[tokio::test]
async fn a_request_waiting_at_the_cap_can_be_cancelled() {
    bounded(async {
        let srv = FaultServer::http1()
            .route("/w", Reply::ok("w").delay(Duration::from_millis(300)))
            .start()
            .await
            .unwrap();
        let h = harness(one_connection_hedged());
        // The first attempt answers while its hedge still waits for a connection: the hedge
        // is dropped from the queue and never reaches the server.
        let res = h.client.send(NetRequest::get(srv.url("/w"))).await.unwrap();
        assert_eq!(res.text().await.unwrap(), "w");
        assert_eq!(srv.hits("/w"), 1);
        // The pool is whole: the next call takes the same connection.
        let res = h.client.send(NetRequest::get(srv.url("/w"))).await.unwrap();
        assert_eq!(res.elapsed.connect(), Duration::ZERO);
        assert_eq!(res.text().await.unwrap(), "w");
        assert_eq!(srv.connections(), 1);
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn a_request_waiting_at_the_cap_takes_the_slot_a_closed_connection_frees() {
    bounded(async {
        let srv = FaultServer::http1()
            .route(
                "/c",
                Script::reply(Reply::close().delay(Duration::from_millis(200)))
                    .times(1)
                    .then(Reply::ok("second")),
            )
            .start()
            .await
            .unwrap();
        let h = harness(one_connection_hedged());
        // The first attempt's connection is closed by the server at 200 ms; the hedge, which
        // waited at the cap since 50 ms, opens a connection in the slot that frees.
        let res = h.client.send(NetRequest::get(srv.url("/c"))).await.unwrap();
        assert_eq!(res.text().await.unwrap(), "second");
        assert_eq!(srv.hits("/c"), 2);
        assert_eq!(srv.connections(), 2);
        assert_eq!(h.client.connections_opened(), 2);
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn a_broken_http2_connection_is_replaced() {
    bounded(async {
        let srv = FaultServer::http2()
            .route("/m", Reply::ok("m"))
            .route("/reset", Reply::reset())
            .start()
            .await
            .unwrap();
        let mut p = loopback_policy();
        p.retry.enabled = false;
        let h = harness_with(p, |b| b.http2_prior_knowledge(true));
        let res = h.client.send(NetRequest::get(srv.url("/m"))).await.unwrap();
        assert_eq!(res.text().await.unwrap(), "m");
        // The server resets the whole connection: that call fails…
        let err = h
            .client
            .send(NetRequest::get(srv.url("/reset")))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), soulbase_net_core::ErrorKind::Io, "{err}");
        // …and the next one goes on a new connection.
        let res = h.client.send(NetRequest::get(srv.url("/m"))).await.unwrap();
        assert!(res.elapsed.connect() > Duration::ZERO, "a new connection");
        assert_eq!(res.text().await.unwrap(), "m");
        assert_eq!(srv.connections(), 2);
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn http2_by_alpn_shares_one_connection_between_requests() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let srv = FaultServer::builder()
            .tls(kit.localhost().unwrap().server_config().unwrap())
            .route("/t", Reply::ok("secret"))
            .start()
            .await
            .unwrap();
        let mut p = loopback_policy();
        p.tls.extra_roots_pem = vec![kit.root_pem()];
        let h = harness(p);
        for _ in 0..4 {
            let res = h.client.send(NetRequest::get(srv.url("/t"))).await.unwrap();
            assert_eq!(res.text().await.unwrap(), "secret");
        }
        assert_eq!(srv.hits("/t"), 4);
        assert!(srv
            .requests("/t")
            .iter()
            .all(|r| r.version == http::Version::HTTP_2));
        assert_eq!(srv.connections(), 1);
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn a_burst_to_a_new_tls_origin_waits_for_the_first_connection_alpn_makes_http2() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let srv = FaultServer::builder()
            .tls(kit.localhost().unwrap().server_config().unwrap())
            .route("/t", Reply::ok("shared"))
            .start()
            .await
            .unwrap();
        let mut p = loopback_policy();
        p.tls.extra_roots_pem = vec![kit.root_pem()];
        let h = harness(p);
        // 64 callers at once on a client that has never seen the origin: one connect, whose
        // ALPN says h2, serves them all (each used to open a connection of its own).
        let client = Arc::new(h.client.clone());
        let bodies = burst(&client, &srv.url("/t"), 64).await;
        assert!(bodies.iter().all(|b| b == "shared"));
        assert_eq!(srv.hits("/t"), 64);
        assert_eq!(srv.connections(), 1);
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn a_burst_to_a_tls_origin_answering_http1_still_gets_its_connections() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        // ALPN offers h2, the server picks HTTP/1.1: after the first connect the others open
        // connections of their own, and the next burst does not wait at all.
        let srv = FaultServer::http1()
            .tls(kit.localhost().unwrap().server_config().unwrap())
            .route("/t", Reply::ok("own").delay(Duration::from_millis(50)))
            .start()
            .await
            .unwrap();
        let mut p = loopback_policy();
        p.tls.extra_roots_pem = vec![kit.root_pem()];
        let h = harness(p);
        let client = Arc::new(h.client.clone());
        for _ in 0..2 {
            let bodies = burst(&client, &srv.url("/t"), 8).await;
            assert!(bodies.iter().all(|b| b == "own"));
        }
        assert_eq!(srv.hits("/t"), 16);
        assert!(srv
            .requests("/t")
            .iter()
            .all(|r| r.version == http::Version::HTTP_11));
        // Concurrent HTTP/1.1 requests need connections of their own: more than one opened.
        assert!(srv.connections() > 1, "{}", srv.connections());
        srv.join().await;
    })
    .await;
}
