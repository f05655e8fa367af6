//! CacheHook: fresh hits send nothing, stale entries revalidate, no-store is never kept.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use soulbase_net_core::{NetClient, NetRequest};
use soulbase_net_interceptors::CacheHook;
use soulbase_net_testkit::{FaultServer, Reply};

use crate::support::client;

async fn text(c: &soulbase_net_runtime::Client, req: NetRequest) -> (u16, String) {
    let res = c.send(req).await.unwrap();
    (res.status.as_u16(), res.text().await.unwrap())
}

#[tokio::test]
async fn a_fresh_hit_sends_nothing_and_tenants_are_apart() {
    let srv = FaultServer::http1()
        .route(
            "/r",
            Reply::resource("hello").header("cache-control", "max-age=60"),
        )
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(CacheHook::new())]);
    let get = || NetRequest::get(srv.url("/r")).tenant("a");
    assert_eq!(text(&c, get()).await, (200, "hello".to_owned()));
    let hit = c.send(get()).await.unwrap();
    assert_eq!(hit.attempts, 0);
    assert_eq!(hit.text().await.unwrap(), "hello");
    assert_eq!(srv.hits("/r"), 1);
    // Another tenant, or a POST, is not served from tenant a's entry.
    text(&c, get().tenant("b")).await;
    assert_eq!(srv.hits("/r"), 2);
    c.send(NetRequest::post(srv.url("/r")).tenant("a"))
        .await
        .unwrap();
    assert_eq!(srv.hits("/r"), 3);
    srv.join().await;
}

#[tokio::test]
async fn a_stale_entry_revalidates_and_a_304_serves_the_cached_body() {
    let srv = FaultServer::http1()
        .route(
            "/etag",
            Reply::resource("v1 body")
                .etag("\"v1\"")
                .header("cache-control", "max-age=0"),
        )
        .route(
            "/lm",
            Reply::resource("lm body")
                .last_modified(SystemTime::now() - Duration::from_secs(3600))
                .header("cache-control", "no-cache"),
        )
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(CacheHook::new())]);
    for (path, body) in [("/etag", "v1 body"), ("/lm", "lm body")] {
        assert_eq!(
            text(&c, NetRequest::get(srv.url(path))).await,
            (200, body.to_owned())
        );
        assert_eq!(
            text(&c, NetRequest::get(srv.url(path))).await,
            (200, body.to_owned())
        );
        assert_eq!(srv.hits(path), 2, "{path}");
        let seen = srv.requests(path);
        assert_eq!(seen[0].header("if-none-match"), None);
        assert_eq!(seen[0].header("if-modified-since"), None);
    }
    assert_eq!(
        srv.requests("/etag")[1].header("if-none-match"),
        Some("\"v1\"")
    );
    assert!(srv.requests("/lm")[1].header("if-modified-since").is_some());
    srv.join().await;
}

#[tokio::test]
async fn no_store_is_never_stored() {
    let srv = FaultServer::http1()
        .route(
            "/secret",
            Reply::resource("s")
                .etag("\"s\"")
                .header("cache-control", "no-store, max-age=60"),
        )
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(CacheHook::new())]);
    for _ in 0..3 {
        assert_eq!(
            text(&c, NetRequest::get(srv.url("/secret"))).await,
            (200, "s".to_owned())
        );
    }
    assert_eq!(srv.hits("/secret"), 3);
    assert!(srv
        .requests("/secret")
        .iter()
        .all(|r| r.header("if-none-match").is_none()));
    srv.join().await;
}

#[tokio::test]
async fn vary_keeps_variants_apart() {
    let srv = FaultServer::http1()
        .route(
            "/v",
            Reply::resource("v")
                .header("cache-control", "max-age=60")
                .header("vary", "accept-language"),
        )
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(CacheHook::new())]);
    let get = |lang: &str| NetRequest::get(srv.url("/v")).header("accept-language", lang);
    text(&c, get("de")).await;
    text(&c, get("de")).await;
    assert_eq!(srv.hits("/v"), 1);
    text(&c, get("fr")).await;
    assert_eq!(srv.hits("/v"), 2);
    srv.join().await;
}
