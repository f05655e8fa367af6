//! FaultServer over HTTP/2 prior knowledge (h2c) and the auto-detecting server.

use std::time::Duration;

use http::Version;
use soulbase_net_testkit::{FaultServer, Protocol, Reply, Script};
use tokio::time::{timeout, Instant};

use crate::support::*;

#[tokio::test]
async fn h2_prior_knowledge_multiplexes_on_one_connection() {
    for proto in [Protocol::Http2, Protocol::Auto] {
        let srv = FaultServer::builder()
            .protocol(proto)
            .route("/x", Reply::ok("two"))
            .start()
            .await
            .unwrap();
        let c = h2c();
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let (c, url) = (c.clone(), srv.url("/x"));
            tasks.push(tokio::spawn(async move {
                let res = get(&c, &url).await.unwrap();
                assert_eq!(res.version(), Version::HTTP_2);
                body(res).await.unwrap()
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), "two");
        }
        assert_eq!(srv.hits("/x"), 10);
        assert_eq!(srv.connections(), 1, "{proto:?}");
        assert!(srv
            .requests("/x")
            .iter()
            .all(|r| r.version == Version::HTTP_2));
        srv.join().await;
    }
}

#[tokio::test]
async fn auto_serves_http1_too_and_http1_only_refuses_h2() {
    let srv = FaultServer::builder()
        .route("/x", Reply::ok("one"))
        .start()
        .await
        .unwrap();
    let res = get(&h1(), &srv.url("/x")).await.unwrap();
    assert_eq!(res.version(), Version::HTTP_11);
    srv.join().await;

    let srv = FaultServer::http1()
        .route("/x", Reply::ok("one"))
        .start()
        .await
        .unwrap();
    assert!(get(&h2c(), &srv.url("/x")).await.is_err());
    srv.join().await;
}

#[tokio::test]
async fn h2_faults() {
    let srv = FaultServer::http2()
        .route("/seq", Script::status(503).times(1).then(Reply::ok("ok")))
        .route(
            "/delay",
            Reply::ok("late").delay(Duration::from_millis(100)),
        )
        .route("/stall", Reply::ok("never").stall_after_head())
        .route("/rst", Reply::reset())
        .route("/rst-mid", Reply::huge(1 << 20).reset_after(100))
        .route(
            "/drip",
            Reply::ok("abcdef").slow_body(2, Duration::from_millis(15)),
        )
        .route("/echo", Reply::echo())
        .start()
        .await
        .unwrap();
    let c = h2c();
    assert_eq!(get(&c, &srv.url("/seq")).await.unwrap().status(), 503);
    assert_eq!(get(&c, &srv.url("/seq")).await.unwrap().status(), 200);
    let t0 = Instant::now();
    assert_eq!(
        body(get(&c, &srv.url("/delay")).await.unwrap())
            .await
            .unwrap(),
        "late"
    );
    assert!(t0.elapsed() >= Duration::from_millis(100));
    let res = get(&c, &srv.url("/stall")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(timeout(Duration::from_millis(200), body(res))
        .await
        .is_err());
    let t0 = Instant::now();
    assert_eq!(
        body(get(&c, &srv.url("/drip")).await.unwrap())
            .await
            .unwrap(),
        "abcdef"
    );
    assert!(t0.elapsed() >= Duration::from_millis(30));
    let v: serde_json::Value = serde_json::from_slice(
        &body(get(&c, &srv.url("/echo")).await.unwrap())
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(v["version"], "HTTP/2.0");

    // A reset kills the whole HTTP/2 connection. h2's error hides its io::Error from
    // `source()`, so the reset is recognised from its debug form here.
    let err = get(&h2c(), &srv.url("/rst")).await.unwrap_err();
    assert!(format!("{err:?}").contains("ConnectionReset"), "{err:?}");
    let res = get(&h2c(), &srv.url("/rst-mid")).await.unwrap();
    let (n, err) = drain(res).await;
    assert!(n <= 100);
    assert!(format!("{:?}", err.unwrap()).contains("ConnectionReset"));
    srv.join().await;
}
