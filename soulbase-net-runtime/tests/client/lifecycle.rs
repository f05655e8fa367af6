//! The ordinary life of a server's connections, which must never fail a call nor trip the
//! breaker: HTTP/2 GOAWAY after N requests (nginx's `keepalive_requests`), streams refused
//! with `REFUSED_STREAM`, and HTTP/1.1
//! connections closed after N requests. The server did not process what it refused, so the
//! client sends it again whatever its method — and a POST still arrives exactly once.

use std::{collections::HashMap, sync::Arc, time::Duration};

use soulbase_net_core::{ErrorKind, NetClient, NetRequest};
use soulbase_net_policy::NetPolicy;
use soulbase_net_testkit::{FaultServer, FaultServerBuilder, Reply};

use crate::support::{harness_with, loopback_policy, Harness};

/// Concurrent callers, as in the measurement against nginx.
const CALLERS: usize = 64;

/// Retries off (a resend must not need them) and the breaker on, quick to open: any failure
/// recorded against the upstream would show as a transition.
fn strict_policy() -> NetPolicy {
    let mut p = loopback_policy();
    p.retry.enabled = false;
    p.cbreaker.enabled = true;
    p.cbreaker.consecutive_failures = 1;
    p.cbreaker.min_samples = 1;
    p.cbreaker.cooldown = Duration::from_secs(60);
    p
}

fn h2c_client() -> Harness {
    harness_with(strict_policy(), |b| b.http2_prior_knowledge(true))
}

/// `rounds` rounds of `CALLERS` concurrent POSTs (non-idempotent: sent again only because the
/// server did not process them), each with its own marker. Returns the failures.
async fn post_rounds(h: &Harness, srv: &FaultServer, rounds: usize) -> Vec<String> {
    let client = Arc::new(h.client.clone());
    let mut failures = Vec::new();
    for round in 0..rounds {
        let mut calls = tokio::task::JoinSet::new();
        for caller in 0..CALLERS {
            let client = client.clone();
            let url = srv.url("/orders");
            calls.spawn(async move {
                let id = format!("{round}-{caller}");
                let req = NetRequest::post(url)
                    .header("x-marker", id.as_str())
                    .body(id.clone());
                match client.send(req).await {
                    Ok(res) if res.status == 200 => Ok(()),
                    Ok(res) => Err(format!("{id}: status {}", res.status)),
                    Err(e) => Err(format!(
                        "{id}: {e} ({:?}) {:?}",
                        e.kind(),
                        e.chain().map(ToString::to_string).collect::<Vec<_>>()
                    )),
                }
            });
        }
        while let Some(done) = calls.join_next().await {
            if let Err(e) = done.unwrap() {
                failures.push(e);
            }
        }
    }
    failures
}

/// Each marker that arrived whole at the server (its body is the marker), with how many
/// times. A request whose stream the client reset before its body was sent did not arrive:
/// a server cannot act on a request it never got the content of.
fn arrivals(srv: &FaultServer) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for r in srv.requests("/orders") {
        let marker = r.header("x-marker").unwrap_or("?").to_owned();
        if r.body != marker.as_bytes() {
            continue;
        }
        *seen.entry(marker).or_default() += 1;
    }
    seen
}

fn transitions(h: &Harness) -> Vec<String> {
    let seen = h.events.seen.lock();
    seen.iter()
        .filter(|e| e.starts_with("BreakerTransition"))
        .cloned()
        .collect()
}

fn resent(h: &Harness) -> usize {
    let seen = h.events.seen.lock();
    seen.iter().filter(|e| e.starts_with("Resent")).count()
}

async fn orders_server(builder: FaultServerBuilder) -> FaultServer {
    builder
        .route(
            "/orders",
            Reply::ok("created").delay(Duration::from_millis(2)),
        )
        .start()
        .await
        .unwrap()
}

/// Runs `rounds` of POSTs and checks what must hold whatever the server's lifecycle: no call
/// failed, the breaker never moved, every POST arrived exactly once.
async fn run_clean(h: &Harness, srv: &FaultServer, rounds: usize) {
    let failures = tokio::time::timeout(Duration::from_secs(60), post_rounds(h, srv, rounds))
        .await
        .expect("the run ends");
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert_eq!(transitions(h), Vec::<String>::new());
    assert_each_post_once(srv, rounds);
}

/// Every one of `rounds` × `CALLERS` POSTs answered, each exactly once at the server.
fn assert_each_post_once(srv: &FaultServer, rounds: usize) {
    let seen = arrivals(srv);
    assert_eq!(seen.len(), rounds * CALLERS, "every POST arrived");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "POSTs that arrived twice: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_goaway_every_few_requests_fails_no_call_and_trips_no_breaker() {
    // Like nginx's keepalive_requests, but every 50 requests: about 40 GOAWAYs in the run.
    let srv = orders_server(FaultServer::http2().retire_after(50)).await;
    let h = h2c_client();
    let rounds = 30;
    run_clean(&h, &srv, rounds).await;
    assert!(
        srv.retired() >= 30,
        "the server retired {} connections",
        srv.retired()
    );
    assert!(srv.connections() >= 30, "{} connections", srv.connections());
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_streams_are_sent_again_without_a_failure_or_a_breaker_trip() {
    let srv = orders_server(FaultServer::http2().refuse_streams(3)).await;
    let h = h2c_client();
    let rounds = 10;
    run_clean(&h, &srv, rounds).await;
    // A third of the streams were refused, and each of those requests went again.
    let refused = srv.refused() as usize;
    assert!(
        refused >= rounds * CALLERS / 3 - CALLERS,
        "{refused} refused"
    );
    assert_eq!(resent(&h), refused);
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_connections_closed_after_a_few_requests_fail_no_call() {
    let srv = orders_server(FaultServer::http1().retire_after(5)).await;
    let h = harness_with(strict_policy(), |b| b);
    let rounds = 10;
    run_clean(&h, &srv, rounds).await;
    srv.join().await;
}

#[tokio::test]
async fn a_request_with_a_stream_body_that_was_refused_is_not_sent_again_and_says_so() {
    // Every stream refused: a stream body cannot go again, so the caller learns the server
    // did not process it — and may send it again itself.
    let srv = orders_server(FaultServer::http2().refuse_streams(1)).await;
    let h = h2c_client();
    let stream = http_body_util::Full::new(bytes::Bytes::from_static(b"once"));
    let err = h
        .client
        .send(NetRequest::post(srv.url("/orders")).body(soulbase_net_core::Body::stream(stream)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotProcessed, "{err:?}");
    assert_eq!(srv.hits("/orders"), 0);
    // A replayable body goes again, up to the limit, then the caller gets NotProcessed.
    let err = h
        .client
        .send(NetRequest::post(srv.url("/orders")).body("x"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotProcessed, "{err:?}");
    assert_eq!(resent(&h), 8);
    assert_eq!(srv.refused(), 1 + 9);
    assert_eq!(transitions(&h), Vec::<String>::new());
    srv.join().await;
}
