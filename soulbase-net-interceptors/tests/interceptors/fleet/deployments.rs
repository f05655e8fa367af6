//! The shared cache and dedup window on a real Redis Cluster (three masters on loopback: the
//! entries spread over every node, each entry one node's business) and on the master a
//! sentinel names.

use std::time::Duration;

use soulbase_net_core::NetRequest;
use soulbase_net_interceptors::{RedisCacheStore, RedisDedupStore, RedisStore};
use soulbase_net_policy::{RedisSentinel, RedisTarget};
use soulbase_net_testkit::{FaultServer, Gate, RedisCluster, Reply};

use super::{deduping_on, instance_on, pay};

/// The most distinct keys tried before every node of a cluster must hold one.
const MAX_KEYS: usize = 60;

fn every_node_holds_keys(cluster: &RedisCluster) -> bool {
    cluster.key_counts().unwrap().iter().all(|n| *n > 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_cache_spreads_over_a_cluster() {
    let Some(cluster) = RedisCluster::start_or_skip("the_shared_cache_spreads_over_a_cluster")
    else {
        return;
    };
    let mut routes = FaultServer::http1();
    for i in 0..MAX_KEYS {
        routes = routes.route(
            format!("/r{i}"),
            Reply::resource(format!("body {i}")).header("cache-control", "max-age=60"),
        );
    }
    let srv = routes.start().await.unwrap();
    let target = RedisTarget::Cluster(cluster.urls());
    let (a, _) = instance_on(RedisCacheStore::from_target(&target).unwrap());
    let (b, _) = instance_on(RedisCacheStore::from_target(&target).unwrap());
    // A fetches until its entries are on every node.
    let mut fetched = 0;
    while !every_node_holds_keys(&cluster) {
        assert!(fetched < MAX_KEYS, "{:?}", cluster.key_counts());
        let res = a
            .send(NetRequest::get(srv.url(&format!("/r{fetched}"))))
            .await
            .unwrap();
        assert_eq!(res.text().await.unwrap(), format!("body {fetched}"));
        fetched += 1;
    }
    // B is answered from every node, without a request.
    for i in 0..fetched {
        let path = format!("/r{i}");
        let res = b.send(NetRequest::get(srv.url(&path))).await.unwrap();
        assert_eq!(res.attempts, 0, "{path}: a fresh hit from the shared cache");
        assert_eq!(res.text().await.unwrap(), format!("body {i}"));
        assert_eq!(srv.hits(&path), 1, "{path}");
    }
    eprintln!(
        "{fetched} entries over the cluster: {:?} per node",
        cluster.key_counts().unwrap()
    );
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_dedup_window_works_over_a_cluster() {
    let Some(cluster) = RedisCluster::start_or_skip("the_shared_dedup_window_works_over_a_cluster")
    else {
        return;
    };
    let gate = Gate::new();
    let srv = FaultServer::http1()
        .route("/pay", Reply::ok("paid #1").after(&gate))
        .route("/ok", Reply::ok("paid"))
        .start()
        .await
        .unwrap();
    let target = RedisTarget::Cluster(cluster.urls());
    let instance = || {
        deduping_on(
            RedisDedupStore::from_target(&target).unwrap(),
            Duration::from_secs(10),
        )
    };
    let (a, b) = (instance(), instance());

    // A's call is held at the server; B's duplicate waits for it, then gets its answer.
    let first = {
        let (a, url) = (a.clone(), srv.url("/pay"));
        tokio::spawn(async move { a.send(pay(&url, "k-held")).await })
    };
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/pay", 1))
        .await
        .unwrap();
    let second = {
        let (b, url) = (b.clone(), srv.url("/pay"));
        tokio::spawn(async move { b.send(pay(&url, "k-held")).await })
    };
    gate.open();
    assert_eq!(
        first.await.unwrap().unwrap().text().await.unwrap(),
        "paid #1"
    );
    assert_eq!(
        second.await.unwrap().unwrap().text().await.unwrap(),
        "paid #1"
    );
    assert_eq!(srv.hits("/pay"), 1, "one upstream hit for two instances");

    // Keys on every node: each sent once by A, answered to B from the window (a key's marker
    // and response share a hash slot, so each claim is one node's script).
    let mut keys = 0;
    while !every_node_holds_keys(&cluster) {
        assert!(keys < MAX_KEYS, "{:?}", cluster.key_counts());
        let key = format!("k-{keys}");
        a.send(pay(&srv.url("/ok"), &key)).await.unwrap();
        let again = b.send(pay(&srv.url("/ok"), &key)).await.unwrap();
        assert_eq!(again.text().await.unwrap(), "paid");
        keys += 1;
        assert_eq!(srv.hits("/ok"), keys as u64, "{key} was sent once");
    }
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_stores_reach_the_master_a_sentinel_names() {
    let Some(sentinel) = soulbase_net_testkit::RedisSentinel::start_or_skip(
        "the_shared_stores_reach_the_master_a_sentinel_names",
    ) else {
        return;
    };
    let srv = FaultServer::http1()
        .route(
            "/fresh",
            Reply::resource("fresh body").header("cache-control", "max-age=60"),
        )
        .route("/ok", Reply::ok("paid"))
        .start()
        .await
        .unwrap();
    let target = RedisTarget::Sentinel(RedisSentinel::new(
        soulbase_net_testkit::RedisSentinel::MASTER_NAME,
        [sentinel.url()],
    ));
    let (a, _) = instance_on(RedisCacheStore::from_target(&target).unwrap());
    let (b, _) = instance_on(RedisCacheStore::from_target(&target).unwrap());
    a.send(NetRequest::get(srv.url("/fresh"))).await.unwrap();
    let res = b.send(NetRequest::get(srv.url("/fresh"))).await.unwrap();
    assert_eq!(res.attempts, 0, "a fresh hit from the shared cache");
    assert_eq!(srv.hits("/fresh"), 1);

    let a = deduping_on(
        RedisDedupStore::from_target(&target).unwrap(),
        Duration::from_secs(10),
    );
    let b = deduping_on(
        RedisDedupStore::from_target(&target).unwrap(),
        Duration::from_secs(10),
    );
    a.send(pay(&srv.url("/ok"), "k-1")).await.unwrap();
    let again = b.send(pay(&srv.url("/ok"), "k-1")).await.unwrap();
    assert_eq!(again.text().await.unwrap(), "paid");
    assert_eq!(srv.hits("/ok"), 1);
    srv.join().await;
}
