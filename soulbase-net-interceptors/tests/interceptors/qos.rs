//! QosBytes: exact byte counts per tenant and host, and a budget that refuses before sending.

use std::{sync::Arc, time::Duration};

use soulbase_net_core::{ErrorKind, NetRequest};
use soulbase_net_interceptors::{ByteBudget, ByteCount, QosBytes};
use soulbase_net_testkit::{FaultServer, Reply};
use tokio::time::Instant;

use crate::support::client;

#[tokio::test]
async fn counts_exact_bytes_and_refuses_over_budget() {
    let srv = FaultServer::http1()
        .route("/e", Reply::echo())
        .start()
        .await
        .unwrap();
    let host = srv.addr().ip().to_string();
    let qos = Arc::new(QosBytes::new().budget("t1", 2_000));
    let c = client(vec![qos.clone()]);

    let body = "a".repeat(100);
    let res = c
        .send(NetRequest::post(srv.url("/e")).tenant("t1").body(body))
        .await
        .unwrap();
    let got = res.bytes().await.unwrap().len() as u64;
    assert!(got > 100, "the echo carries the body: {got}");
    let counted = qos.counts("t1", &host);
    assert_eq!(
        counted,
        ByteCount {
            bytes_out: 100,
            bytes_in: got
        }
    );
    assert_eq!(srv.requests("/e")[0].body_len, 100);
    assert_eq!(qos.remaining("t1"), Some(2_000 - 100 - got));

    // This one would take the tenant past its budget: refused, not sent.
    let left = qos.remaining("t1").unwrap();
    let too_big = "b".repeat(left as usize + 1);
    let err = c
        .send(NetRequest::post(srv.url("/e")).tenant("t1").body(too_big))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::QuotaExceeded);
    assert_eq!(err.code().as_str(), "QUOTA.RATE_LIMITED");
    assert_eq!(srv.hits("/e"), 1);
    assert_eq!(qos.counts("t1", &host), counted);

    // Other tenants have no budget and are counted apart.
    c.send(NetRequest::get(srv.url("/e"))).await.unwrap();
    assert_eq!(srv.hits("/e"), 2);
    assert_eq!(qos.counts("", &host).bytes_out, 0);
    assert!(qos.counts("", &host).bytes_in > 0);
    srv.join().await;
}

#[tokio::test]
async fn a_host_budget_per_window_refuses_then_refills() {
    let srv = FaultServer::http1()
        .route("/hundred", Reply::ok("x".repeat(100)))
        .start()
        .await
        .unwrap();
    let host = srv.addr().ip().to_string();
    // A short window; the first four calls take a few milliseconds of it.
    let window = Duration::from_secs(1);
    let qos = Arc::new(QosBytes::new().host_budget("t1", &host, ByteBudget::per(250, window)));
    let c = client(vec![qos.clone()]);
    let get = || NetRequest::get(srv.url("/hundred")).tenant("t1");
    for left in [150, 50, 0] {
        c.send(get()).await.unwrap().bytes().await.unwrap();
        assert_eq!(qos.host_remaining("t1", &host), Some(left));
    }
    let err = c.send(get()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::QuotaExceeded);
    assert_eq!(srv.hits("/hundred"), 3, "refused before sending");
    // Without a budget of its own, another tenant is not held back.
    c.send(NetRequest::get(srv.url("/hundred"))).await.unwrap();
    assert_eq!(srv.hits("/hundred"), 4);

    // The window rolls over (a time-based condition: bounded wait).
    let deadline = Instant::now() + window * 3;
    while qos.host_remaining("t1", &host) != Some(250) {
        assert!(Instant::now() < deadline, "the window never rolled over");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.send(get()).await.unwrap().bytes().await.unwrap();
    assert_eq!(srv.hits("/hundred"), 5);
    assert_eq!(qos.host_remaining("t1", &host), Some(150));
    assert_eq!(qos.counts("t1", &host).bytes_in, 400);
    srv.join().await;
}
