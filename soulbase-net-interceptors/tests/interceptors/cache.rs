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

#[tokio::test]
async fn stale_while_revalidate_serves_stale_once_then_updates() {
    use soulbase_net_core::NetClient as _;
    use soulbase_net_testkit::Script;
    let cc = "max-age=0, stale-while-revalidate=60";
    let srv = FaultServer::http1()
        .route(
            "/swr",
            Script::reply(Reply::ok("v1").header("cache-control", cc))
                .times(1)
                .then(Reply::ok("v2").header("cache-control", cc)),
        )
        .start()
        .await
        .unwrap();
    let hook = Arc::new(CacheHook::new());
    let c: Arc<dyn soulbase_net_core::NetClient> = Arc::new(client(vec![hook.clone()]));
    hook.revalidate_with(Arc::downgrade(&c));
    let body = |r: soulbase_net_core::NetResponse| async move { r.text().await.unwrap() };
    assert_eq!(
        body(c.send(NetRequest::get(srv.url("/swr"))).await.unwrap()).await,
        "v1"
    );
    // Stale: served at once from the cache, revalidated in the background.
    let stale = c.send(NetRequest::get(srv.url("/swr"))).await.unwrap();
    assert_eq!(stale.attempts, 0);
    assert_eq!(body(stale).await, "v1");
    for _ in 0..100 {
        if srv.hits("/swr") == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(srv.hits("/swr"), 2);
    // The background task stores what it got right after the server answered.
    let mut updated = false;
    for _ in 0..50 {
        match body(c.send(NetRequest::get(srv.url("/swr"))).await.unwrap())
            .await
            .as_str()
        {
            "v2" => {
                updated = true;
                break;
            }
            other => assert_eq!(other, "v1"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(updated, "the entry was updated in the background");
    srv.join().await;
}
