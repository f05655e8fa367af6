//! The per-host connection cap holds under a cold-start burst.

use std::sync::Arc;

use soulbase_net_core::{NetClient, NetRequest};
use soulbase_net_testkit::{FaultServer, Reply};

use crate::support::{harness, loopback_policy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_256_never_opens_more_connections_than_the_cap() {
    let srv = FaultServer::http1()
        .route(
            "/c",
            Reply::ok("x").delay(std::time::Duration::from_millis(5)),
        )
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.limits.per_host_concurrency = 8;
    // Requests over the limit wait for a slot instead of failing with RateLimited; the
    // legacy pool alone would still open about twice the in-flight count.
    p.limits.max_wait = std::time::Duration::from_secs(30);
    let h = harness(p);
    let client = Arc::new(h.client);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..256 {
        let (client, url) = (client.clone(), srv.url("/c"));
        tasks.spawn(async move { client.send(NetRequest::get(url)).await.map(|r| r.status) });
    }
    let mut ok = 0;
    while let Some(res) = tasks.join_next().await {
        assert_eq!(res.unwrap().unwrap(), 200);
        ok += 1;
    }
    assert_eq!(ok, 256);
    assert_eq!(srv.hits("/c"), 256);
    assert!(
        srv.connections() <= 8,
        "{} connections opened",
        srv.connections()
    );
    assert!(client.connections_opened() <= 8);
    srv.join().await;
}
