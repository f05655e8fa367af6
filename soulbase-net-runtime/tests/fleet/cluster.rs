//! Shared limits on a real Redis Cluster (three masters on loopback): each tenant's bucket is
//! one key on the node that owns its slot, and the quota stays exact however the keys spread.

use std::{sync::Arc, time::Duration};

use soulbase_net_core::{ErrorKind, NetRequest};
use soulbase_net_policy::{RedisTarget, StoreConfig};
use soulbase_net_runtime::{
    fleet::{RateStore, RedisRateStore, RedisStore, TakeRequest},
    Client,
};
use soulbase_net_testkit::RedisCluster;
use tokio::time::Instant;

use super::{global, policy, server, Seen};
use soulbase_net_runtime::testing::LoopbackDialer;

/// Tenants whose buckets land on every node of `cluster`, `per_node` on each.
fn tenants_on_every_node(cluster: &RedisCluster, per_node: usize) -> Vec<String> {
    let mut chosen = Vec::new();
    let mut on_node = [0; RedisCluster::MASTERS];
    for i in 0.. {
        let tenant = format!("tenant-{i}");
        // The rate store's key for a tenant-scoped bucket.
        let node = cluster
            .node_of(&format!("soulbase:gcra:t:{tenant}"))
            .unwrap();
        if on_node[node] < per_node {
            on_node[node] += 1;
            chosen.push(tenant);
        }
        if on_node.iter().all(|n| *n == per_node) {
            return chosen;
        }
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_rate_limit_is_exact_over_a_cluster() {
    let Some(cluster) =
        RedisCluster::start_or_skip("the_global_rate_limit_is_exact_over_a_cluster")
    else {
        return;
    };
    let srv = server().await;
    let url = srv.url("/q");
    let seen = Arc::new(Seen::default());
    let (rps, burst) = (1, 8);
    let g = global(rps, burst);
    // One instance through the `[store]` section, the other with a store of its own.
    let store = StoreConfig::redis_cluster(cluster.urls()).unwrap();
    let a = Client::builder()
        .policy(policy(g.clone()))
        .dialer(Arc::new(LoopbackDialer::default()))
        .store(store)
        .observer(seen.clone())
        .build()
        .unwrap();
    let b = Client::builder()
        .policy(policy(g))
        .dialer(Arc::new(LoopbackDialer::default()))
        .rate_store(Arc::new(
            RedisRateStore::from_target(&RedisTarget::Cluster(cluster.urls())).unwrap(),
        ))
        .observer(seen.clone())
        .build()
        .unwrap();
    let tenants = tenants_on_every_node(&cluster, 2);
    let started = Instant::now();
    // Each tenant: 12 calls from each instance, all at once.
    let calls = tenants.iter().flat_map(|t| {
        (0..24).map(|i| {
            let client = if i % 2 == 0 { a.clone() } else { b.clone() };
            let req = NetRequest::get(url.as_str()).tenant(t.as_str());
            let t = t.clone();
            tokio::spawn(async move { (t, client.send(req).await) })
        })
    });
    let calls: Vec<_> = calls.collect();
    let mut admitted = std::collections::BTreeMap::<String, u32>::new();
    for call in calls {
        let (tenant, answer) = call.await.unwrap();
        match answer {
            Ok(_) => *admitted.entry(tenant).or_default() += 1,
            Err(e) => assert_eq!(e.kind(), ErrorKind::RateLimited, "{e}"),
        }
    }
    let elapsed = started.elapsed();
    // Per tenant: the burst, plus what the rate refilled while the calls ran.
    let refill = (elapsed.as_secs_f64() * f64::from(rps)).floor() as u32;
    for tenant in &tenants {
        let ok = admitted.get(tenant).copied().unwrap_or(0);
        assert!(
            ok >= burst && ok <= burst + refill,
            "{tenant}: {ok} admitted in {elapsed:?} (burst {burst}, rate {rps}/s)"
        );
    }
    let total: u32 = admitted.values().sum();
    assert_eq!(
        srv.hits("/q"),
        u64::from(total),
        "only admitted calls were sent"
    );
    // No store error (a CROSSSLOT or a MOVED left unhandled would be one), and every node
    // holds buckets.
    assert!(
        seen.store_errors.lock().is_empty(),
        "{:?}",
        seen.store_errors.lock()
    );
    let keys = cluster.key_counts().unwrap();
    assert!(keys.iter().all(|n| *n == 2), "buckets per node: {keys:?}");
    eprintln!(
        "{} tenants over {} nodes: {admitted:?} admitted of 24 each in {elapsed:?}",
        tenants.len(),
        RedisCluster::MASTERS
    );
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_node_costs_only_the_buckets_it_owns() {
    let Some(cluster) =
        RedisCluster::start_or_skip("a_stalled_node_costs_only_the_buckets_it_owns")
    else {
        return;
    };
    let tenants = tenants_on_every_node(&cluster, 1);
    let store = RedisRateStore::from_target(&RedisTarget::Cluster(cluster.urls())).unwrap();
    let take = |tenant: &str| {
        let key = format!("t:{tenant}");
        let store = &store;
        async move {
            let req = TakeRequest {
                key: &key,
                rps: 1000,
                burst: 1000,
                want: 1,
                at_least: 1,
                owed: 0,
            };
            tokio::time::timeout(Duration::from_millis(200), store.take(req)).await
        }
    };
    for t in &tenants {
        assert_eq!(take(t).await.unwrap().unwrap().granted, 1, "{t}");
    }
    // The first node stalls: its tenant's take times out, the others' are answered.
    let stalled = cluster
        .node_of(&format!("soulbase:gcra:t:{}", tenants[0]))
        .unwrap();
    cluster.nodes()[stalled].pause().unwrap();
    for t in &tenants {
        let node = cluster.node_of(&format!("soulbase:gcra:t:{t}")).unwrap();
        let answer = take(t).await;
        if node == stalled {
            assert!(answer.is_err(), "{t}: the stalled node's bucket times out");
        } else {
            assert_eq!(
                answer.unwrap().unwrap().granted,
                1,
                "{t}: another node's bucket"
            );
        }
    }
    cluster.nodes()[stalled].resume().unwrap();
    let back = Instant::now();
    while !matches!(take(&tenants[0]).await, Ok(Ok(_))) {
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "the node resumed, the store did not"
        );
        // Nothing to await but the next try.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_client_a_stalled_node_refuses_only_its_own_tenants() {
    let Some(cluster) = RedisCluster::start_or_skip(
        "through_the_client_a_stalled_node_refuses_only_its_own_tenants",
    ) else {
        return;
    };
    let srv = server().await;
    let url = srv.url("/q");
    // Two tenants per node, a quota far above the load: only the store can refuse.
    let tenants = tenants_on_every_node(&cluster, 2);
    let mut g = global(100_000, 100_000);
    g.on_store_error = soulbase_net_policy::OnStoreError::Deny;
    g.store_timeout = Duration::from_millis(100);
    let client = Client::builder()
        .policy(policy(g))
        .dialer(Arc::new(LoopbackDialer::default()))
        .store(StoreConfig::redis_cluster(cluster.urls()).unwrap())
        .build()
        .unwrap();
    let call = |tenant: &str| {
        let req = NetRequest::get(url.as_str()).tenant(tenant);
        let client = &client;
        async move { client.send(req).await.map(|_| ()).map_err(|e| e.kind()) }
    };
    for t in &tenants {
        assert_eq!(call(t).await, Ok(()), "{t} before the stall");
    }
    let node_of = |t: &str| cluster.node_of(&format!("soulbase:gcra:t:{t}")).unwrap();
    let stalled = node_of(&tenants[0]);
    cluster.nodes()[stalled].pause().unwrap();
    // Rounds over every tenant while the node is stalled: its tenants' calls are refused
    // (deny), every other tenant's calls are admitted.
    let (mut admitted, mut refused_elsewhere, mut refused_on_stalled) = (0, 0, 0);
    for _ in 0..10 {
        for t in &tenants {
            match (call(t).await, node_of(t) == stalled) {
                (Ok(()), true) => panic!("{t}: admitted with its node stalled"),
                (Ok(()), false) => admitted += 1,
                (Err(kind), true) => {
                    assert_eq!(kind, ErrorKind::RateLimited);
                    refused_on_stalled += 1;
                }
                (Err(kind), false) => {
                    refused_elsewhere += 1;
                    eprintln!("{t}: refused ({kind:?}) on a healthy node");
                }
            }
        }
    }
    cluster.nodes()[stalled].resume().unwrap();
    let healthy = tenants.iter().filter(|t| node_of(t) != stalled).count() * 10;
    assert_eq!(
        (admitted, refused_elsewhere),
        (healthy, 0),
        "tenants on healthy nodes"
    );
    assert_eq!(refused_on_stalled, 20);
    srv.join().await;
}
