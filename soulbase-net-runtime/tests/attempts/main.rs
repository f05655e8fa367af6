//! `attempts()` of an error the response body gives, after the head arrived: the attempt
//! reached the server (the testkit counts the hit), so it counts, on every path the body
//! can take (observed or not, decoded or not) and with the attempt's number in the call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use soulbase_net_core::{ErrorCode, ErrorKind, NetEvent, NetRequest, Observer, Phase, TimeoutCfg};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{FaultServer, Reply, Script};

/// Every test finishes within this bound, or fails.
const LIMIT: Duration = Duration::from_secs(20);

/// The read (idle) timeout of the stalled bodies.
const READ: Duration = Duration::from_millis(150);

/// An observer that wants nothing: its presence makes the client meter response bodies.
#[derive(Debug)]
struct Quiet;

impl Observer for Quiet {
    fn on_event(&self, _: &NetEvent<'_>) {}
}

/// Loopback granted, names never looked up off the machine, retries `retries`.
fn policy(retries: bool) -> NetPolicy {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    p.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    p.retry.enabled = retries;
    p
}

fn client(retries: bool, observed: bool) -> Client {
    let builder = Client::builder().policy(policy(retries));
    let builder = if observed {
        builder.observer(Arc::new(Quiet))
    } else {
        builder
    };
    builder.build().unwrap()
}

/// Sends a GET to `url` with the read timeout, and reads the body to its end: the response
/// (its attempts) and the body's error.
async fn read_failing_body(client: &Client, url: String) -> (u32, soulbase_net_core::NetError) {
    let req = NetRequest::get(url).timeout(TimeoutCfg::default().with_read(READ));
    let work = async {
        let res = client.send(req).await.unwrap();
        let attempts = res.attempts;
        (attempts, res.bytes().await.unwrap_err())
    };
    tokio::time::timeout(LIMIT, work)
        .await
        .expect("the test exceeded its time bound")
}

#[tokio::test]
async fn a_read_timeout_in_the_body_counts_the_attempt_that_reached_the_server() {
    let mut srv = FaultServer::http1()
        .route("/stall", Reply::huge(1 << 20).stall_after_head())
        .start()
        .await
        .unwrap();
    for observed in [false, true] {
        let (attempts, err) = read_failing_body(&client(false, observed), srv.url("/stall")).await;
        assert_eq!(attempts, 1, "observed: {observed}");
        assert_eq!(
            err.kind(),
            ErrorKind::Timeout(Phase::Read),
            "observed: {observed}"
        );
        assert_eq!(err.attempts(), 1, "observed: {observed}: {err:?}");
        // The case: a slow body is a gateway timeout, whatever `public_code` shows.
        assert_eq!(err.public_code(), ErrorCode::ProviderUnavailable);
        assert_eq!(err.http_status(), http::StatusCode::GATEWAY_TIMEOUT);
    }
    // One request each: the server saw both.
    assert_eq!(srv.hits("/stall"), 2);
    srv.shutdown().await;
}

#[tokio::test]
async fn a_body_stalled_half_way_through_decoding_counts_the_attempt() {
    let body: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7919 % 251) as u8).collect();
    let mut srv = FaultServer::http1()
        .route("/gz", Reply::gzip(&body).stall_after(64))
        .start()
        .await
        .unwrap();
    for observed in [false, true] {
        let (attempts, err) = read_failing_body(&client(false, observed), srv.url("/gz")).await;
        assert_eq!(attempts, 1);
        assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Read), "{err:?}");
        assert_eq!(err.attempts(), 1, "observed: {observed}: {err:?}");
    }
    assert_eq!(srv.hits("/gz"), 2);
    srv.shutdown().await;
}

#[tokio::test]
async fn a_body_error_carries_the_number_of_its_attempt_in_the_call() {
    // The first attempt answers 503 and is retried; the second's body stalls.
    let mut srv = FaultServer::http1()
        .route(
            "/flaky",
            Script::status(503)
                .times(1)
                .then(Reply::huge(1 << 20).stall_after(100)),
        )
        .start()
        .await
        .unwrap();
    let (attempts, err) = read_failing_body(&client(true, false), srv.url("/flaky")).await;
    assert_eq!(attempts, 2);
    assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Read));
    assert_eq!(err.attempts(), 2, "{err:?}");
    assert_eq!(srv.hits("/flaky"), 2);
    srv.shutdown().await;
}
