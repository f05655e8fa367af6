//! Bearer: the header as it arrives, and 401 → refresh → success in two server hits.

use std::{
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
    time::Duration,
};

use soulbase_net_core::NetRequest;
use soulbase_net_interceptors::{Bearer, Token};
use soulbase_net_testkit::{CapturedLogs, FaultServer, Reply, Script};

use crate::support::client;

#[tokio::test]
async fn a_401_refreshes_the_token_and_resends_once() {
    let srv = FaultServer::http1()
        .route(
            "/me",
            Script::respond_with(|r| match r.header("authorization") {
                Some("Bearer tok-2") => Reply::echo(),
                _ => Reply::status(401),
            }),
        )
        .start()
        .await
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let bearer = Arc::new(Bearer::new(move || {
        let i = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Ok(Token::expires_in(
                format!("tok-{i}"),
                Duration::from_secs(3600),
            ))
        }
    }));
    let c = client(vec![bearer.clone()]);
    let res = c.send(NetRequest::get(srv.url("/me"))).await.unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(srv.hits("/me"), 2);
    let seen = srv.requests("/me");
    assert_eq!(seen[0].header("authorization"), Some("Bearer tok-1"));
    assert_eq!(seen[1].header("authorization"), Some("Bearer tok-2"));
    // The refreshed token is cached.
    c.send(NetRequest::get(srv.url("/me"))).await.unwrap();
    assert_eq!(srv.hits("/me"), 3);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(!format!("{bearer:?} {c:?}").contains("tok-"));
    srv.join().await;
}

/// A Bearer whose n-th token is `tok-n`, and how many it fetched.
fn numbered() -> (Arc<Bearer>, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let bearer = Arc::new(Bearer::new(move || {
        let i = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Ok(Token::expires_in(
                format!("tok-{i}"),
                Duration::from_secs(3600),
            ))
        }
    }));
    (bearer, calls)
}

#[tokio::test]
async fn a_resend_after_a_redirect_starts_from_the_callers_request() {
    // POST /order → 303 → /status, which refuses the first token: the resend is the caller's
    // POST with its body and the new token, not the GET the 303 made of it.
    let srv = FaultServer::http1()
        .route(
            "/order",
            Script::reply(Reply::redirect(303, "/status"))
                .times(1)
                .then(Reply::echo()),
        )
        .route(
            "/status",
            Script::respond_with(|r| match r.header("authorization") {
                Some("Bearer tok-2") => Reply::ok("done"),
                _ => Reply::status(401),
            }),
        )
        .start()
        .await
        .unwrap();
    let (bearer, calls) = numbered();
    let c = client(vec![bearer]);
    let res = c
        .send(
            NetRequest::post(srv.url("/order"))
                .body("item=1")
                .idempotent(true),
        )
        .await
        .unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let orders = srv.requests("/order");
    assert_eq!(orders.len(), 2);
    for (i, seen) in orders.iter().enumerate() {
        assert_eq!(seen.method, "POST", "order request {i}");
        assert_eq!(seen.text(), "item=1", "order request {i}");
    }
    assert_eq!(orders[1].header("authorization"), Some("Bearer tok-2"));
    srv.join().await;
}

#[tokio::test]
async fn a_401_from_another_origin_does_not_refresh_the_token() {
    let login = FaultServer::http1()
        .route("/login", Script::status(401))
        .start()
        .await
        .unwrap();
    let api = FaultServer::http1()
        .route("/me", Reply::redirect(302, login.url("/login")))
        .start()
        .await
        .unwrap();
    let (bearer, calls) = numbered();
    let c = client(vec![bearer]);
    let res = c.send(NetRequest::get(api.url("/me"))).await.unwrap();
    assert_eq!(res.status, 401);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no refresh for another origin's 401"
    );
    assert_eq!((api.hits("/me"), login.hits("/login")), (1, 1));
    // Credentials never crossed to the other origin.
    assert_eq!(login.requests("/login")[0].header("authorization"), None);
    api.join().await;
    login.join().await;
}

#[tokio::test]
async fn a_second_401_is_returned_not_retried_again() {
    let srv = FaultServer::http1()
        .route("/me", Script::status(401))
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(Bearer::new(|| async {
        Ok(Token {
            value: "never-good".to_owned(),
            expires_at: None,
        })
    }))]);
    let res = c.send(NetRequest::get(srv.url("/me"))).await.unwrap();
    assert_eq!(res.status, 401);
    assert_eq!(srv.hits("/me"), 2);
    srv.join().await;
}

#[tokio::test]
async fn the_token_never_appears_in_captured_logs() {
    let (captured, _guard) = CapturedLogs::start(tracing::Level::TRACE);

    let srv = FaultServer::http1()
        .route("/me", Script::status(401).times(1).then(Reply::echo()))
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(Bearer::new(|| async {
        Ok(Token::expires_in("SECRET-abc123", Duration::from_secs(60)))
    }))]);
    let req = NetRequest::get(srv.url("/me"));
    tracing::debug!(?req, "sending");
    let res = c.send(req).await.unwrap();
    tracing::debug!(status = %res.status, "done");
    assert_eq!(
        srv.requests("/me")[1].header("authorization"),
        Some("Bearer SECRET-abc123")
    );
    srv.join().await;

    let text = captured.text();
    assert!(text.contains("sending"), "the capture works: {text}");
    assert!(!text.contains("SECRET-abc123"), "{text}");
}
