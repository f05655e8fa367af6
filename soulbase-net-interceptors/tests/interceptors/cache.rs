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

/// Sends `req` and returns whether it was answered from the cache (no attempt made).
async fn from_cache(c: &soulbase_net_runtime::Client, req: NetRequest) -> bool {
    let res = c.send(req).await.unwrap();
    assert_eq!(res.status, 200);
    res.attempts == 0
}

/// Asserts that `path` is fresh once fetched: the second GET is served without a request.
async fn fresh_after_first(c: &soulbase_net_runtime::Client, srv: &FaultServer, path: &str) {
    assert!(
        !from_cache(c, NetRequest::get(srv.url(path))).await,
        "{path}"
    );
    assert!(
        from_cache(c, NetRequest::get(srv.url(path))).await,
        "{path} is fresh"
    );
    assert_eq!(srv.hits(path), 1, "{path}");
}

/// Asserts that `path` (which carries the ETag `etag`) is stale from the start: two GETs both
/// reach the server, the second with `If-None-Match`, and both end as 200 with the body.
async fn stale_on_arrival(
    c: &soulbase_net_runtime::Client,
    srv: &FaultServer,
    path: &str,
    etag: &str,
) {
    assert!(
        !from_cache(c, NetRequest::get(srv.url(path))).await,
        "{path}"
    );
    assert!(
        !from_cache(c, NetRequest::get(srv.url(path))).await,
        "{path} is stale"
    );
    assert_eq!(srv.hits(path), 2, "{path}");
    assert_eq!(
        srv.requests(path)[1].header("if-none-match"),
        Some(etag),
        "{path}"
    );
}

#[tokio::test]
async fn expires_gives_freshness_only_without_max_age() {
    let http_date = |d: SystemTime| httpdate::fmt_http_date(d);
    let in_a_minute = http_date(SystemTime::now() + Duration::from_secs(60));
    let a_minute_ago = http_date(SystemTime::now() - Duration::from_secs(60));
    let srv = FaultServer::http1()
        .route(
            "/future",
            Reply::resource("f").header("expires", &in_a_minute),
        )
        .route(
            "/past",
            Reply::resource("p")
                .etag("\"p\"")
                .header("expires", &a_minute_ago),
        )
        .route(
            "/invalid",
            Reply::resource("i").etag("\"i\"").header("expires", "0"),
        )
        .route(
            "/max-age-wins",
            Reply::resource("m")
                .etag("\"m\"")
                .header("expires", &in_a_minute)
                .header("cache-control", "max-age=0"),
        )
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(CacheHook::new())]);
    fresh_after_first(&c, &srv, "/future").await;
    for (path, etag) in [
        ("/past", "\"p\""),
        ("/invalid", "\"i\""),
        ("/max-age-wins", "\"m\""),
    ] {
        stale_on_arrival(&c, &srv, path, etag).await;
    }
    srv.join().await;
}

#[tokio::test]
async fn a_date_in_the_past_counts_as_age() {
    let two_minutes_ago = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(120));
    let srv = FaultServer::http1()
        // Made two minutes ago (by its `Date`), fresh for one: stale on arrival.
        .route(
            "/dated",
            Reply::resource("d")
                .etag("\"d\"")
                .header("cache-control", "max-age=60")
                .header("date", &two_minutes_ago),
        )
        // The server's own `Date` (now): fresh.
        .route(
            "/now",
            Reply::resource("n").header("cache-control", "max-age=60"),
        )
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(CacheHook::new())]);
    fresh_after_first(&c, &srv, "/now").await;
    stale_on_arrival(&c, &srv, "/dated", "\"d\"").await;
    srv.join().await;
}

#[tokio::test]
async fn age_counts_against_freshness_and_is_reported() {
    let srv = FaultServer::http1()
        .route(
            "/young",
            Reply::resource("y")
                .header("cache-control", "max-age=60")
                .header("age", "30"),
        )
        .route(
            "/old",
            Reply::resource("o")
                .etag("\"o\"")
                .header("cache-control", "max-age=60")
                .header("age", "60"),
        )
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(CacheHook::new())]);
    c.send(NetRequest::get(srv.url("/young"))).await.unwrap();
    let hit = c.send(NetRequest::get(srv.url("/young"))).await.unwrap();
    assert_eq!(hit.attempts, 0);
    let age: u64 = hit.headers["age"].to_str().unwrap().parse().unwrap();
    assert!((30..40).contains(&age), "age {age}");
    assert_eq!(srv.hits("/young"), 1);
    // Already 60 s old with a 60 s lifetime: stale on arrival.
    stale_on_arrival(&c, &srv, "/old", "\"o\"").await;
    srv.join().await;
}

/// A server whose `/v` echoes the request, fresh for 60 s and varying on `Accept-Language`,
/// and a client caching through a `CacheHook`.
async fn vary_by_language() -> (FaultServer, soulbase_net_runtime::Client) {
    let srv = FaultServer::http1()
        .route(
            "/v",
            Reply::echo()
                .header("cache-control", "max-age=60")
                .header("vary", "accept-language"),
        )
        .start()
        .await
        .unwrap();
    (srv, client(vec![Arc::new(CacheHook::new())]))
}

#[tokio::test]
async fn each_vary_variant_is_kept_beside_the_others() {
    let (srv, c) = vary_by_language().await;
    let get = |lang: Option<&str>| {
        let req = NetRequest::get(srv.url("/v"));
        match lang {
            Some(l) => req.header("accept-language", l),
            None => req,
        }
    };
    for lang in [Some("de"), Some("fr"), None] {
        assert!(!from_cache(&c, get(lang)).await, "{lang:?} first");
    }
    assert_eq!(srv.hits("/v"), 3);
    // Every variant is served from the cache, with its own body.
    for lang in [Some("de"), Some("fr"), None, Some("de")] {
        let res = c.send(get(lang)).await.unwrap();
        assert_eq!(res.attempts, 0, "{lang:?}");
        let echo: serde_json::Value = res.json().await.unwrap();
        assert_eq!(
            echo["headers"]["accept-language"][0].as_str(),
            lang,
            "{lang:?} got its own variant: {echo}"
        );
    }
    assert_eq!(srv.hits("/v"), 3);
    srv.join().await;
}

#[tokio::test]
async fn vary_compares_every_line_of_a_selecting_header() {
    let (srv, c) = vary_by_language().await;
    // One header line per entry.
    let get = |lines: &[&str]| {
        let mut req = NetRequest::get(srv.url("/v"));
        for line in lines {
            let value = soulbase_net_core::http::HeaderValue::from_str(line).unwrap();
            req.headers.append("accept-language", value);
        }
        req
    };
    assert!(!from_cache(&c, get(&["en", "fr"])).await);
    // Same first line, another second one: another variant, asked of the server.
    assert!(!from_cache(&c, get(&["en", "de"])).await);
    assert_eq!(srv.hits("/v"), 2);
    // Each is then served from the cache — also when its lines arrive as one line.
    assert!(from_cache(&c, get(&["en", "fr"])).await);
    assert!(from_cache(&c, get(&["en", "de"])).await);
    assert!(from_cache(&c, get(&["en, fr"])).await);
    assert!(!from_cache(&c, get(&["en"])).await);
    assert_eq!(srv.hits("/v"), 3);
    srv.join().await;
}

#[tokio::test]
async fn vary_star_is_never_served_from_the_cache() {
    use soulbase_net_testkit::Script;
    let srv = FaultServer::http1()
        .route(
            "/star",
            Reply::resource("s")
                .header("cache-control", "max-age=60")
                .header("vary", "*"),
        )
        .route(
            "/turns",
            Script::reply(
                Reply::ok("v")
                    .header("cache-control", "max-age=60")
                    .header("vary", "accept-language"),
            )
            .times(1)
            .then(
                Reply::ok("*")
                    .header("cache-control", "max-age=60")
                    .header("vary", "accept-language, *"),
            ),
        )
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(CacheHook::new())]);
    for _ in 0..2 {
        assert!(!from_cache(&c, NetRequest::get(srv.url("/star"))).await);
    }
    assert_eq!(srv.hits("/star"), 2);
    // A variant is cached, then the resource answers `Vary: *`: nothing is served any more.
    let get = |lang: &str| NetRequest::get(srv.url("/turns")).header("accept-language", lang);
    assert!(!from_cache(&c, get("de")).await);
    assert!(from_cache(&c, get("de")).await);
    assert!(!from_cache(&c, get("fr")).await);
    assert!(!from_cache(&c, get("de")).await);
    assert!(!from_cache(&c, get("fr")).await);
    assert_eq!(srv.hits("/turns"), 4);
    srv.join().await;
}

#[tokio::test]
async fn s_maxage_is_the_lifetime_of_this_shared_cache() {
    let srv = FaultServer::http1()
        .route(
            "/longer",
            Reply::resource("l").header("cache-control", "max-age=0, s-maxage=60"),
        )
        .route(
            "/shorter",
            Reply::resource("s")
                .etag("\"s\"")
                .header("cache-control", "max-age=60, s-maxage=0"),
        )
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(CacheHook::new())]);
    fresh_after_first(&c, &srv, "/longer").await;
    stale_on_arrival(&c, &srv, "/shorter", "\"s\"").await;
    srv.join().await;
}

#[tokio::test]
async fn must_revalidate_is_never_served_stale() {
    let srv = FaultServer::http1()
        .route(
            "/strict",
            Reply::resource("v1").etag("\"v1\"").header(
                "cache-control",
                "max-age=0, stale-while-revalidate=60, must-revalidate",
            ),
        )
        .start()
        .await
        .unwrap();
    let hook = Arc::new(CacheHook::new());
    let c: Arc<dyn NetClient> = Arc::new(client(vec![hook.clone()]));
    hook.revalidate_with(Arc::downgrade(&c));
    for _ in 0..3 {
        let res = c.send(NetRequest::get(srv.url("/strict"))).await.unwrap();
        assert_eq!(res.attempts, 1, "revalidated in line, never served stale");
        assert_eq!(res.text().await.unwrap(), "v1");
    }
    assert_eq!(srv.hits("/strict"), 3);
    let seen = srv.requests("/strict");
    assert!(seen[1..]
        .iter()
        .all(|r| r.header("if-none-match") == Some("\"v1\"")));
    srv.join().await;
}
