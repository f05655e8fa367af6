//! The HTTP cache shared by a fleet in Redis: one instance's response is another's fresh hit,
//! a 304 revalidation serves the body another instance stored, big bodies stay out, and a
//! Redis that is gone is a miss, not an error.

use std::{sync::Arc, time::Duration};

use soulbase_net_core::{NetClient, NetRequest};
use soulbase_net_interceptors::{CacheHook, RedisCacheStore};
use soulbase_net_testkit::{FaultServer, RedisServer, Reply};

use crate::support::client;

/// An instance: a client whose cache is the shared one at `url`.
fn instance(url: &str) -> (soulbase_net_runtime::Client, Arc<CacheHook>) {
    let store = RedisCacheStore::new(url)
        .unwrap()
        .timeout(Duration::from_millis(500))
        .max_body(1024);
    let hook = Arc::new(CacheHook::with_store(store));
    (client(vec![hook.clone()]), hook)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_share_fresh_hits_and_revalidations() {
    let Some(mut redis) =
        RedisServer::start_or_skip("instances_share_fresh_hits_and_revalidations")
    else {
        return;
    };
    let srv = FaultServer::http1()
        .route(
            "/fresh",
            Reply::resource("fresh body").header("cache-control", "max-age=60"),
        )
        .route(
            "/etag",
            Reply::resource("etag body")
                .etag("\"v1\"")
                .header("cache-control", "max-age=0"),
        )
        .route(
            "/big",
            Reply::resource(vec![b'x'; 4096]).header("cache-control", "max-age=60"),
        )
        .start()
        .await
        .unwrap();
    let (a, _) = instance(&redis.url());
    let (b, _) = instance(&redis.url());

    // A fetches; B is answered from what A stored, without a request.
    let res = a.send(NetRequest::get(srv.url("/fresh"))).await.unwrap();
    assert_eq!(res.text().await.unwrap(), "fresh body");
    let res = b.send(NetRequest::get(srv.url("/fresh"))).await.unwrap();
    assert_eq!(res.attempts, 0, "a fresh hit from the shared cache");
    assert_eq!(res.text().await.unwrap(), "fresh body");
    assert_eq!(srv.hits("/fresh"), 1);

    // A stores a validated entry; B revalidates it (If-None-Match), gets a 304 and serves
    // the body A stored.
    a.send(NetRequest::get(srv.url("/etag"))).await.unwrap();
    let res = b.send(NetRequest::get(srv.url("/etag"))).await.unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(res.text().await.unwrap(), "etag body");
    let seen = srv.requests("/etag");
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].header("if-none-match"), Some("\"v1\""));

    // Over max_body: not stored, each instance fetches.
    a.send(NetRequest::get(srv.url("/big"))).await.unwrap();
    b.send(NetRequest::get(srv.url("/big"))).await.unwrap();
    assert_eq!(srv.hits("/big"), 2);

    // Redis gone: a miss, the call goes out and succeeds.
    redis.stop();
    let (c, _) = instance(&redis.url());
    let res = c.send(NetRequest::get(srv.url("/fresh"))).await.unwrap();
    assert_eq!(res.text().await.unwrap(), "fresh body");
    assert_eq!(srv.hits("/fresh"), 2);
    srv.join().await;
}
