//! The HTTP cache shared by a fleet in Redis: one instance's response is another's fresh hit,
//! a 304 revalidation serves the body another instance stored, big bodies stay out, and a
//! Redis that is gone is a miss, not an error. The same on a Redis Cluster and through
//! Sentinel in `deployments`.

mod deployments;

use std::{sync::Arc, time::Duration};

use soulbase_net_core::NetRequest;
use soulbase_net_interceptors::{CacheHook, RedisCacheStore, RedisStore};
use soulbase_net_testkit::{FaultServer, RedisServer, Reply};

use crate::support::client;

/// An instance: a client whose cache is the shared one at `url`.
fn instance(url: &str) -> (soulbase_net_runtime::Client, Arc<CacheHook>) {
    instance_on(RedisCacheStore::new(url).unwrap())
}

/// An instance whose cache is `store`.
fn instance_on(store: RedisCacheStore) -> (soulbase_net_runtime::Client, Arc<CacheHook>) {
    let store = store.timeout(Duration::from_millis(500)).max_body(1024);
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

/// An instance whose dedup window is the shared one at `url`.
fn deduping(url: &str, wait: Duration) -> soulbase_net_runtime::Client {
    deduping_on(
        soulbase_net_interceptors::RedisDedupStore::new(url).unwrap(),
        wait,
    )
}

/// An instance whose dedup window is `store`.
fn deduping_on(
    store: soulbase_net_interceptors::RedisDedupStore,
    wait: Duration,
) -> soulbase_net_runtime::Client {
    let store = store.timeout(Duration::from_millis(500)).wait(wait);
    let keys = soulbase_net_interceptors::IdempotencyKey::random()
        .dedup_window(Duration::from_secs(60))
        .shared_dedup(store);
    client(vec![Arc::new(keys)])
}

fn pay(url: &str, key: &str) -> NetRequest {
    NetRequest::post(url)
        .body("amount=10")
        .idempotent(true)
        .header("idempotency-key", key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_on_another_instance_is_answered_not_sent() {
    let Some(redis) =
        RedisServer::start_or_skip("a_duplicate_on_another_instance_is_answered_not_sent")
    else {
        return;
    };
    let gate = soulbase_net_testkit::Gate::new();
    let srv = FaultServer::http1()
        .route("/pay", Reply::ok("paid #1").after(&gate))
        .route(
            "/flaky",
            soulbase_net_testkit::Script::status(503)
                .times(1)
                .then(Reply::ok("paid")),
        )
        .route("/slow", Reply::ok("late").delay(Duration::from_secs(2)))
        .start()
        .await
        .unwrap();
    let a = deduping(&redis.url(), Duration::from_secs(10));
    let b = deduping(&redis.url(), Duration::from_secs(10));

    // A's call is at the server (held); B's duplicate waits for it, then gets its answer.
    let first = {
        let (a, url) = (a.clone(), srv.url("/pay"));
        tokio::spawn(async move { a.send(pay(&url, "k-1")).await })
    };
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/pay", 1))
        .await
        .unwrap();
    let second = {
        let (b, url) = (b.clone(), srv.url("/pay"));
        tokio::spawn(async move { b.send(pay(&url, "k-1")).await })
    };
    gate.open();
    let first = first.await.unwrap().unwrap();
    let second = second.await.unwrap().unwrap();
    assert_eq!(first.text().await.unwrap(), "paid #1");
    assert_eq!(second.text().await.unwrap(), "paid #1");
    assert_eq!(srv.hits("/pay"), 1, "one upstream hit for two instances");
    // Later, too.
    let third = b.send(pay(&srv.url("/pay"), "k-1")).await.unwrap();
    assert_eq!(third.text().await.unwrap(), "paid #1");
    assert_eq!(srv.hits("/pay"), 1);

    // A 5xx is not kept: the duplicate is sent again (the first instance does not retry).
    let store = soulbase_net_interceptors::RedisDedupStore::new(&redis.url())
        .unwrap()
        .timeout(Duration::from_millis(500));
    let keys = soulbase_net_interceptors::IdempotencyKey::random().shared_dedup(store);
    let (no_retry, _) = crate::support::client_with(vec![Arc::new(keys)], |p| {
        p.retry.enabled = false;
    });
    let r = no_retry.send(pay(&srv.url("/flaky"), "k-2")).await.unwrap();
    assert_eq!(r.status, 503);
    let r = b.send(pay(&srv.url("/flaky"), "k-2")).await.unwrap();
    assert_eq!(r.text().await.unwrap(), "paid");
    assert_eq!(srv.hits("/flaky"), 2);

    // A duplicate that waits longer than its `wait` gets a conflict, not a second send.
    let hasty = deduping(&redis.url(), Duration::from_millis(300));
    let slow = {
        let (a, url) = (a.clone(), srv.url("/slow"));
        tokio::spawn(async move { a.send(pay(&url, "k-3")).await })
    };
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/slow", 1))
        .await
        .unwrap();
    let err = hasty.send(pay(&srv.url("/slow"), "k-3")).await.unwrap_err();
    assert!(
        err.to_string().contains("in flight on another instance"),
        "{err}"
    );
    assert_eq!(srv.hits("/slow"), 1);
    assert_eq!(slow.await.unwrap().unwrap().status, 200);
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_slower_than_its_claims_lease_is_sent_once() {
    let Some(redis) =
        RedisServer::start_or_skip("a_call_slower_than_its_claims_lease_is_sent_once")
    else {
        return;
    };
    let gate = soulbase_net_testkit::Gate::new();
    let srv = FaultServer::http1()
        .route("/pay", Reply::ok("paid").after(&gate))
        .start()
        .await
        .unwrap();
    // Claims are leases of 300 ms, extended every 150 ms while their call runs.
    let lease = Duration::from_millis(300);
    let on = || {
        soulbase_net_interceptors::RedisDedupStore::new(&redis.url())
            .unwrap()
            .in_flight(lease)
    };
    let (a, b) = (
        deduping_on(on(), Duration::from_secs(10)),
        deduping_on(on(), Duration::from_secs(10)),
    );
    let first = {
        let (a, url) = (a.clone(), srv.url("/pay"));
        tokio::spawn(async move { a.send(pay(&url, "slow-1")).await })
    };
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/pay", 1))
        .await
        .unwrap();
    // Held at the server for four leases: without the extensions, the claim would have
    // expired three times over and B's duplicate would be sent.
    tokio::time::sleep(lease * 4).await;
    let second = {
        let (b, url) = (b.clone(), srv.url("/pay"));
        tokio::spawn(async move { b.send(pay(&url, "slow-1")).await })
    };
    tokio::time::sleep(lease * 2).await;
    assert_eq!(srv.hits("/pay"), 1, "the duplicate waits for the slow call");
    gate.open();
    let first = first.await.unwrap().unwrap();
    let second = second.await.unwrap().unwrap();
    assert_eq!(first.text().await.unwrap(), "paid");
    assert_eq!(second.text().await.unwrap(), "paid");
    assert_eq!(
        srv.hits("/pay"),
        1,
        "one upstream hit for a call slower than its lease"
    );

    // A claim whose holder died (taken, never extended) frees itself within one lease, and
    // only its own token can extend it.
    let store = on();
    assert!(matches!(
        store.claim("", "dead-1", "its-token").await,
        Some(soulbase_net_store::dedup::Claim::Claimed)
    ));
    assert!(!store.extend("", "dead-1", "another-token").await.unwrap());
    assert!(store.extend("", "dead-1", "its-token").await.unwrap());
    let started = tokio::time::Instant::now();
    let res = b.send(pay(&srv.url("/pay"), "dead-1")).await.unwrap();
    assert_eq!(res.text().await.unwrap(), "paid");
    assert!(
        started.elapsed() < lease + Duration::from_secs(1),
        "sent after {:?}",
        started.elapsed()
    );
    assert_eq!(srv.hits("/pay"), 2);
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_gone_a_deduped_call_is_sent_or_refused_as_configured() {
    let Some(mut redis) = RedisServer::start_or_skip(
        "with_redis_gone_a_deduped_call_is_sent_or_refused_as_configured",
    ) else {
        return;
    };
    let srv = FaultServer::http1()
        .route("/pay", Reply::ok("paid"))
        .start()
        .await
        .unwrap();
    redis.stop();
    for refuse in [false, true] {
        let store = soulbase_net_interceptors::RedisDedupStore::new(&redis.url())
            .unwrap()
            .timeout(Duration::from_millis(200))
            .refuse_when_down(refuse);
        let keys = soulbase_net_interceptors::IdempotencyKey::random().shared_dedup(store);
        let c = client(vec![Arc::new(keys)]);
        let r = c
            .send(pay(&srv.url("/pay"), &format!("k-down-{refuse}")))
            .await;
        if refuse {
            let err = r.unwrap_err();
            assert!(
                err.to_string().contains("dedup store is unavailable"),
                "{err}"
            );
        } else {
            assert_eq!(r.unwrap().text().await.unwrap(), "paid");
        }
    }
    assert_eq!(srv.hits("/pay"), 1, "sent once (send), not at all (refuse)");
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_cache_speaks_tls_to_redis() {
    let kit = soulbase_net_testkit::CertKit::new().unwrap();
    let leaf = kit.localhost().unwrap();
    let Some(redis) = RedisServer::start_tls_or_skip(
        "the_shared_cache_speaks_tls_to_redis",
        leaf.chain_pem(),
        leaf.key_pem(),
    ) else {
        return;
    };
    let url = redis.tls_url().unwrap();
    let srv = FaultServer::http1()
        .route(
            "/fresh",
            Reply::resource("over tls").header("cache-control", "max-age=60"),
        )
        .start()
        .await
        .unwrap();
    let instance = || {
        let store = RedisCacheStore::with_root_pem(&url, kit.root_pem().as_bytes())
            .unwrap()
            .timeout(Duration::from_millis(500));
        client(vec![Arc::new(CacheHook::with_store(store))])
    };
    let (a, b) = (instance(), instance());
    a.send(NetRequest::get(srv.url("/fresh"))).await.unwrap();
    let res = b.send(NetRequest::get(srv.url("/fresh"))).await.unwrap();
    assert_eq!(res.attempts, 0);
    assert_eq!(res.text().await.unwrap(), "over tls");
    assert_eq!(srv.hits("/fresh"), 1);
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_claims_finish_changes_nothing() {
    let Some(redis) = RedisServer::start_or_skip("a_lapsed_claims_finish_changes_nothing") else {
        return;
    };
    use soulbase_net_store::dedup::{Claim, StoredResponse};
    let lease = Duration::from_millis(200);
    let store = soulbase_net_interceptors::RedisDedupStore::new(&redis.url())
        .unwrap()
        .timeout(Duration::from_millis(500))
        .in_flight(lease);
    let response = |body: &'static str| {
        let res = soulbase_net_core::NetResponse::from_bytes(
            soulbase_net_core::http::StatusCode::OK,
            body,
        );
        StoredResponse::new(
            &res,
            soulbase_net_core::bytes::Bytes::from_static(body.as_bytes()),
        )
        .unwrap()
    };
    let window = Duration::from_secs(60);
    // A claims the key and stalls past its lease; B takes the key over.
    assert!(matches!(
        store.claim("", "lapsed-1", "a").await,
        Some(Claim::Claimed)
    ));
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    assert!(matches!(
        store.claim("", "lapsed-1", "b").await,
        Some(Claim::Claimed)
    ));
    // A's late finish, with a response or without: B's marker stays, nothing is stored.
    store
        .finish("", "lapsed-1", "a", Some(response("from a")), window)
        .await;
    assert!(
        matches!(
            store.claim("", "lapsed-1", "c").await,
            Some(Claim::InFlight)
        ),
        "A's finish neither stored its response nor dropped B's marker"
    );
    store
        .finish("", "lapsed-1", "a", None, Duration::ZERO)
        .await;
    assert!(matches!(
        store.claim("", "lapsed-1", "c").await,
        Some(Claim::InFlight)
    ));
    assert!(store.extend("", "lapsed-1", "b").await.unwrap(), "B holds");
    // B's finish is the one that counts.
    store
        .finish("", "lapsed-1", "b", Some(response("from b")), window)
        .await;
    let Some(Claim::Stored(res)) = store.claim("", "lapsed-1", "c").await else {
        panic!("B's response is stored")
    };
    assert_eq!(res.text().await.unwrap(), "from b");
    // A marker that lapsed with nobody taking over: the late finish stores nothing either,
    // and the next call is sent (claims the key) as after a crash.
    assert!(matches!(
        store.claim("", "lapsed-2", "a").await,
        Some(Claim::Claimed)
    ));
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    store
        .finish("", "lapsed-2", "a", Some(response("from a")), window)
        .await;
    assert!(matches!(
        store.claim("", "lapsed-2", "c").await,
        Some(Claim::Claimed)
    ));
}
