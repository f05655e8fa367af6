//! QosBytes: exact byte counts per tenant and host, and a budget that refuses before sending.

use std::sync::Arc;

use soulbase_net_core::{ErrorKind, NetClient, NetRequest};
use soulbase_net_interceptors::{ByteCount, QosBytes};
use soulbase_net_testkit::{FaultServer, Reply};

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
