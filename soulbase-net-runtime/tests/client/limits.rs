//! Size limits: request bodies before any connection, response Content-Length before reading.
//! Backpressure through the client over sockets: the per-tenant concurrency cap, the per-host
//! rate (GCRA) and the AIMD window shrinking on timeouts and growing back on successes.

use std::{net::IpAddr, sync::Arc, time::Duration};

use soulbase_net_core::{
    ErrorCode, ErrorKind, GaugeReading, NetClient, NetError, NetRequest, NetResponse, Phase,
    TimeoutCfg,
};
use soulbase_net_policy::ByteSize;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{FaultServer, Gate, Reply};
use tokio::task::JoinHandle;

use crate::support::{bounded, harness, harness_with, loopback_policy, Events};

#[tokio::test]
async fn request_body_over_the_limit_is_refused_before_connecting() {
    let srv = FaultServer::http1()
        .route("/up", Reply::ok("ok"))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.security.max_req_bytes = ByteSize(1024);
    let h = harness(p);
    let err = h
        .client
        .send(NetRequest::post(srv.url("/up")).body(vec![0u8; 1025]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
    assert!(err.to_string().contains("max_req_bytes"), "{err}");
    assert_eq!(srv.connections(), 0);
    let ok = h
        .client
        .send(NetRequest::post(srv.url("/up")).body(vec![0u8; 1024]))
        .await
        .unwrap();
    assert_eq!(ok.status, 200);
    srv.join().await;
}

#[tokio::test]
async fn declared_content_length_over_the_limit_is_refused_before_reading() {
    let srv = FaultServer::http1()
        .route("/big", Reply::huge(1 << 30))
        .route("/fits", Reply::huge(4096))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.security.max_resp_bytes = ByteSize(4096);
    let h = harness(p);
    let err = h
        .client
        .send(NetRequest::get(srv.url("/big")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    assert_eq!(err.code(), ErrorCode::ProviderUnavailable);
    let body = h
        .client
        .send(NetRequest::get(srv.url("/fits")))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(body.len(), 4096);
    // A HEAD's Content-Length describes the body a GET would get, not one that comes: no
    // TooLarge for it.
    let head = h
        .client
        .send(NetRequest::head(srv.url("/big")))
        .await
        .unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(
        head.headers["content-length"],
        (1u64 << 30).to_string().as_str()
    );
    assert!(head.bytes().await.unwrap().is_empty());
    srv.join().await;
}

/// The head limit holds on the parsed head, whatever the connection's read buffer: a 100 KiB
/// head (parsable, under the buffer) is over the default 64 KiB limit, and within a 256 KiB
/// one; with a 1 MiB body after a small head, the body arrives whole.
#[tokio::test]
async fn the_head_limit_is_the_clients_not_the_read_buffers() {
    let srv = FaultServer::http1()
        .route("/head", Reply::ok("x").huge_header(100 * 1024))
        .route("/body", Reply::ok(vec![b'b'; 1 << 20]))
        .start()
        .await
        .unwrap();
    let default = harness(loopback_policy());
    let err = default
        .client
        .send(NetRequest::get(srv.url("/head")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
    assert!(err.to_string().contains("response head"), "{err}");
    let body = default
        .client
        .send(NetRequest::get(srv.url("/body")))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(body.len(), 1 << 20);
    let roomy = harness_with(loopback_policy(), |b| b.max_response_head_bytes(256 * 1024));
    let res = roomy
        .client
        .send(NetRequest::get(srv.url("/head")))
        .await
        .unwrap();
    assert_eq!(res.status, 200);
    assert!(res.headers.iter().map(|(_, v)| v.len()).sum::<usize>() >= 100 * 1024);
}

#[tokio::test]
async fn response_heads_over_the_header_limits_are_refused() {
    let srv = FaultServer::http1()
        .route("/many", Reply::ok("x").many_headers(500))
        .route("/huge", Reply::ok("x").huge_header(1 << 20))
        .route("/fine", Reply::ok("x").many_headers(50))
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    for path in ["/many", "/huge"] {
        let err = h
            .client
            .send(NetRequest::get(srv.url(path)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TooLarge, "{path}: {err}");
    }
    assert_eq!(
        h.client
            .send(NetRequest::get(srv.url("/fine")))
            .await
            .unwrap()
            .status,
        200
    );
    srv.join().await;
}

#[tokio::test]
async fn a_streamed_request_body_is_cut_at_the_limit_while_sending() {
    let srv = FaultServer::http1()
        .route("/up", Reply::ok("ok"))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.security.max_req_bytes = ByteSize(10_000);
    let h = harness(p);
    // A body of unknown length: 20 chunks of 1000 bytes.
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(32);
    for _ in 0..20 {
        tx.send(bytes::Bytes::from(vec![7u8; 1000])).await.unwrap();
    }
    drop(tx);
    let body = ChannelBody(rx);
    let err = h
        .client
        .send(NetRequest::put(srv.url("/up")).body(soulbase_net_core::Body::stream(body)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(err.to_string().contains("max_req_bytes"), "{err}");
    srv.join().await;
}

/// A request body fed from a channel: its length is unknown until it ends.
struct ChannelBody(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
    }
}

// === backpressure ===

/// Starts `req` on its own task: the call stays in flight while the test goes on.
fn spawn_send(client: &Arc<Client>, req: NetRequest) -> JoinHandle<Result<NetResponse, NetError>> {
    let client = client.clone();
    tokio::spawn(async move { client.send(req).await })
}

/// The `RateLimited` events seen so far, as their scopes (`Debug`).
fn refusals(events: &Events) -> Vec<String> {
    events
        .seen
        .lock()
        .iter()
        .filter(|e| e.starts_with("RateLimited"))
        .map(|e| {
            let scope = e.rsplit("scope: ").next().unwrap_or_default();
            scope.trim_end_matches(" }").to_owned()
        })
        .collect()
}

/// The client's per-host AIMD window for `host`, if it has one.
fn window(client: &Client, host: &str) -> Option<u64> {
    let mut found = None;
    client.gauge_source().read_gauges(&mut |r| {
        if let GaugeReading::LimiterWindow {
            host: Some(h),
            value,
        } = r
        {
            if h == host {
                found = Some(value);
            }
        }
    });
    found
}

/// The calls `tenant` has in flight, by the client's gauge.
fn tenant_in_flight(client: &Client, tenant: &str) -> Option<u64> {
    let mut found = None;
    client.gauge_source().read_gauges(&mut |r| {
        if let GaugeReading::TenantInFlight { tenant: t, value } = r {
            if t == tenant {
                found = Some(value);
            }
        }
    });
    found
}

/// Asserts `err` is a refusal by the limiter named `scope`.
fn assert_refused(err: &NetError, scope: &str) {
    assert_eq!(err.kind(), ErrorKind::RateLimited, "{err}");
    assert_eq!(err.code(), ErrorCode::QuotaRateLimited);
    assert!(err.to_string().contains(scope), "{scope}: {err}");
}

#[tokio::test]
async fn a_tenant_over_its_concurrency_cap_is_refused_while_others_go_through() {
    let gate = Gate::new();
    let srv = FaultServer::http1()
        .route("/held", Reply::ok("held").after(&gate))
        .route("/free", Reply::ok("free"))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.limits.per_tenant_concurrency = 2;
    let h = harness(p);
    let client = Arc::new(h.client);
    let held: Vec<_> = (0..2)
        .map(|_| spawn_send(&client, NetRequest::get(srv.url("/held")).tenant("t1")))
        .collect();
    bounded(srv.wait_for_hits("/held", 2)).await;
    assert_eq!(tenant_in_flight(&client, "t1"), Some(2));

    // t1's third call is refused before it is sent, though the host has room (64) and the
    // path it asks for is not held.
    let err = client
        .send(NetRequest::get(srv.url("/free")).tenant("t1"))
        .await
        .unwrap_err();
    assert_refused(&err, "TenantConcurrency");
    assert_eq!(refusals(&h.events), ["TenantConcurrency"]);
    assert_eq!(srv.hits("/free"), 0);

    // Another tenant, and a call with no tenant, are not counted against t1.
    for req in [
        NetRequest::get(srv.url("/free")).tenant("t2"),
        NetRequest::get(srv.url("/free")),
    ] {
        let res = client.send(req).await.unwrap();
        assert_eq!(res.text().await.unwrap(), "free");
    }
    assert_eq!(srv.hits("/free"), 2);
    assert_eq!(srv.hits("/held"), 2);

    // Once t1's calls are answered, its slots are back.
    gate.open();
    for call in held {
        let res = bounded(call).await.unwrap().unwrap();
        assert_eq!(res.text().await.unwrap(), "held");
    }
    assert_eq!(tenant_in_flight(&client, "t1"), Some(0));
    let both: Vec<_> = (0..2)
        .map(|_| spawn_send(&client, NetRequest::get(srv.url("/free")).tenant("t1")))
        .collect();
    for call in both {
        assert_eq!(bounded(call).await.unwrap().unwrap().status, 200);
    }
    assert_eq!(srv.hits("/free"), 4);
    assert_eq!(refusals(&h.events).len(), 1, "no other refusal");
    srv.join().await;
}

#[tokio::test]
async fn a_host_over_its_rate_is_refused_at_once_and_other_hosts_keep_theirs() {
    let a = FaultServer::http1()
        .route("/r", Reply::ok("a"))
        .start()
        .await
        .unwrap();
    let b = FaultServer::http1()
        .route("/r", Reply::ok("b"))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    // One call a second with bursts of five: a sixth call within the first second is over.
    // The interval is long so that a slow machine still sends six calls within it.
    p.limits.per_host_rate_rps = Some(1);
    p.limits.rate_burst = Some(5);
    p.dns
        .static_hosts
        .insert("other.test".to_owned(), vec![IpAddr::from([127, 0, 0, 1])]);
    let h = harness(p);
    let other = format!("http://other.test:{}/r", b.addr().port());

    let before = tokio::time::Instant::now();
    for _ in 0..5 {
        assert_eq!(
            h.client
                .send(NetRequest::get(a.url("/r")))
                .await
                .unwrap()
                .status,
            200
        );
    }
    let err = h
        .client
        .send(NetRequest::get(a.url("/r")))
        .await
        .unwrap_err();
    assert_refused(&err, "HostRate");
    assert_eq!(a.hits("/r"), 5);
    // The rate is kept per host name, whatever the port: another server on 127.0.0.1 shares
    // the bucket…
    let err = h
        .client
        .send(NetRequest::get(b.url("/r")))
        .await
        .unwrap_err();
    assert_refused(&err, "HostRate");
    assert_eq!(b.hits("/r"), 0);
    // …while another name for it has a full burst of its own.
    for _ in 0..5 {
        let res = h
            .client
            .send(NetRequest::get(other.as_str()))
            .await
            .unwrap();
        assert_eq!(res.text().await.unwrap(), "b");
    }
    let err = h
        .client
        .send(NetRequest::get(other.as_str()))
        .await
        .unwrap_err();
    assert_refused(&err, "HostRate");
    assert_eq!(b.hits("/r"), 5);
    assert_eq!(refusals(&h.events), ["HostRate"; 3]);

    // One interval (1 s) after the burst began, exactly one more call is admitted; the next
    // is due a second later. The margins (300 ms before, 700 ms after) are for slow machines.
    tokio::time::sleep_until(before + Duration::from_millis(1300)).await;
    assert_eq!(
        h.client
            .send(NetRequest::get(a.url("/r")))
            .await
            .unwrap()
            .status,
        200
    );
    let err = h
        .client
        .send(NetRequest::get(a.url("/r")))
        .await
        .unwrap_err();
    assert_refused(&err, "HostRate");
    assert!(
        before.elapsed() < Duration::from_secs(2),
        "too slow to judge the rate: {:?}",
        before.elapsed()
    );
    assert_eq!(a.hits("/r"), 6);
    a.join().await;
    b.join().await;
}

#[tokio::test]
async fn timeouts_shrink_the_aimd_window_and_successes_grow_it_back() {
    let (wide, narrow) = (Gate::new(), Gate::new());
    let mut srv = FaultServer::http1()
        .route("/wide", Reply::ok("held").after(&wide))
        .route("/narrow", Reply::ok("held").after(&narrow))
        .route("/hang", Reply::hang())
        .route("/fast", Reply::ok("fast"))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.retry.enabled = false;
    p.limits.aimd.enabled = true;
    p.limits.aimd.initial = 5;
    p.limits.aimd.min = 1;
    p.limits.aimd.max = 16;
    p.limits.aimd.increase = 1;
    p.limits.aimd.decrease_factor = 0.5;
    let h = harness(p);
    let client = Arc::new(h.client);
    let host = "127.0.0.1";
    assert_eq!(window(&client, host), None, "no call yet");

    // Window 5: three calls at once all get in, and each answer adds one: 8.
    let calls: Vec<_> = (0..3)
        .map(|_| spawn_send(&client, NetRequest::get(srv.url("/wide"))))
        .collect();
    bounded(srv.wait_for_hits("/wide", 3)).await;
    assert_eq!(window(&client, host), Some(5));
    wide.open();
    for call in calls {
        assert_eq!(bounded(call).await.unwrap().unwrap().status, 200);
    }
    assert_eq!(window(&client, host), Some(8));

    // Each time-to-first-byte timeout halves it: 8 → 4 → 2.
    for expected in [4, 2] {
        let req = NetRequest::get(srv.url("/hang"))
            .timeout(TimeoutCfg::default().with_ttfb(Duration::from_millis(100)));
        let err = bounded(client.send(req)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Ttfb), "{err}");
        assert_eq!(window(&client, host), Some(expected));
    }
    assert_eq!(srv.hits("/hang"), 2);

    // Window 2: two calls held fill it, and a third is refused before it is sent, though
    // the host's concurrency cap (64) has room. A refusal leaves the window as it is.
    let calls: Vec<_> = (0..2)
        .map(|_| spawn_send(&client, NetRequest::get(srv.url("/narrow"))))
        .collect();
    bounded(srv.wait_for_hits("/narrow", 2)).await;
    let err = client
        .send(NetRequest::get(srv.url("/fast")))
        .await
        .unwrap_err();
    assert_refused(&err, "Adaptive");
    assert_eq!(refusals(&h.events), ["Adaptive"]);
    assert_eq!(srv.hits("/fast"), 0);
    assert_eq!(window(&client, host), Some(2));

    // Successes add one each: the two held answers (4), then three more (7).
    narrow.open();
    for call in calls {
        assert_eq!(bounded(call).await.unwrap().unwrap().status, 200);
    }
    assert_eq!(window(&client, host), Some(4));
    for expected in [5, 6, 7] {
        let res = client
            .send(NetRequest::get(srv.url("/fast")))
            .await
            .unwrap();
        assert_eq!(res.text().await.unwrap(), "fast");
        assert_eq!(window(&client, host), Some(expected));
    }
    assert_eq!(srv.hits("/fast"), 3);
    assert_eq!(srv.hits("/narrow"), 2);
    srv.shutdown().await;
}
