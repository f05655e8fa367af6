//! Bearer: the header as it arrives, and 401 → refresh → success in two server hits; no
//! refresh for a 401 to a request that went without the token (A → B → A); a POST resent
//! only with an `Idempotency-Key` and a body that can be sent again.

use std::{
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, OnceLock,
    },
    time::Duration,
};

use soulbase_net_core::{
    bytes::Bytes,
    http::{self, StatusCode},
    Body, NetRequest, RespBody,
};
#[cfg(feature = "idempotency")]
use soulbase_net_interceptors::IdempotencyKey;
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

/// A route that answers 200 (echoing the request) to `Bearer tok-2` and 401 to anything else.
fn wants_tok_2() -> Script {
    Script::respond_with(|r| match r.header("authorization") {
        Some("Bearer tok-2") => Reply::echo(),
        _ => Reply::status(401),
    })
}

#[tokio::test]
async fn a_401_after_a_to_b_to_a_went_without_the_token_and_refreshes_nothing() {
    // A/start → B/hop → A/back: the hop to B dropped `Authorization`, and the hop back to A
    // does not get it again, so A's 401 answered a request without the token. The token
    // was not refused: no new token, no resend, the 401 comes back.
    let a_origin = Arc::new(OnceLock::<String>::new());
    let back = a_origin.clone();
    let b = FaultServer::http1()
        .route(
            "/hop",
            Script::respond_with(move |_| {
                Reply::redirect(302, format!("{}/back", back.get().unwrap()))
            }),
        )
        .start()
        .await
        .unwrap();
    let a = FaultServer::http1()
        .route("/start", Reply::redirect(302, b.url("/hop")))
        .route(
            "/back",
            Script::respond_with(|r| match r.header("authorization") {
                Some(_) => Reply::ok("with a token"),
                None => Reply::status(401),
            }),
        )
        .start()
        .await
        .unwrap();
    a_origin.set(a.origin().to_owned()).unwrap();
    let (bearer, calls) = numbered();
    let c = client(vec![bearer.clone()]);
    let res = c.send(NetRequest::get(a.url("/start"))).await.unwrap();
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the provider was asked again"
    );
    assert_eq!(bearer.fetches(), 1);
    assert_eq!(
        (a.hits("/start"), b.hits("/hop"), a.hits("/back")),
        (1, 1, 1),
        "the chain was followed once, not resent"
    );
    assert_eq!(
        a.requests("/start")[0].header("authorization"),
        Some("Bearer tok-1")
    );
    assert_eq!(b.requests("/hop")[0].header("authorization"), None);
    assert_eq!(a.requests("/back")[0].header("authorization"), None);
    a.join().await;
    b.join().await;
}

#[tokio::test]
async fn a_get_whose_token_is_refused_after_a_same_origin_redirect_is_resent_with_a_new_one() {
    // /old → /me on the same origin keeps the token, and /me refuses it: refreshed once, and
    // the caller's GET (from /old) resent with the new token.
    let srv = FaultServer::http1()
        .route("/old", Reply::redirect(301, "/me"))
        .route("/me", wants_tok_2())
        .start()
        .await
        .unwrap();
    let (bearer, calls) = numbered();
    let c = client(vec![bearer]);
    let res = c.send(NetRequest::get(srv.url("/old"))).await.unwrap();
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one refresh");
    assert_eq!((srv.hits("/old"), srv.hits("/me")), (2, 2));
    let me = srv.requests("/me");
    assert_eq!(me[0].header("authorization"), Some("Bearer tok-1"));
    assert_eq!(me[1].header("authorization"), Some("Bearer tok-2"));
    assert_eq!(
        srv.requests("/old")[1].header("authorization"),
        Some("Bearer tok-2")
    );
    srv.join().await;
}

#[tokio::test]
async fn a_post_with_an_idempotency_key_is_resent_once_with_the_new_token_same_key_and_body() {
    // Not marked idempotent: the key alone lets the server drop a duplicate.
    let srv = FaultServer::http1()
        .route("/orders", wants_tok_2())
        .start()
        .await
        .unwrap();
    let (bearer, calls) = numbered();
    let c = client(vec![bearer]);
    let req = NetRequest::post(srv.url("/orders"))
        .header("idempotency-key", "order-7")
        .body("item=1");
    assert!(!req.is_retryable_method());
    let res = c.send(req).await.unwrap();
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let seen = srv.requests("/orders");
    assert_eq!(seen.len(), 2, "sent once, resent once");
    for (i, r) in seen.iter().enumerate() {
        assert_eq!(r.method, "POST", "request {i}");
        assert_eq!(r.header("idempotency-key"), Some("order-7"), "request {i}");
        assert_eq!(r.text(), "item=1", "request {i}");
    }
    assert_eq!(seen[0].header("authorization"), Some("Bearer tok-1"));
    assert_eq!(seen[1].header("authorization"), Some("Bearer tok-2"));
    srv.join().await;
}

#[cfg(feature = "idempotency")]
#[tokio::test]
async fn a_post_keyed_by_the_idempotency_interceptor_is_resent_with_that_key() {
    let srv = FaultServer::http1()
        .route("/orders", wants_tok_2())
        .start()
        .await
        .unwrap();
    let (bearer, calls) = numbered();
    let c = client(vec![Arc::new(IdempotencyKey::random()), bearer]);
    let req = NetRequest::post(srv.url("/orders"))
        .body("item=2")
        .idempotent(true);
    let res = c.send(req).await.unwrap();
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let seen = srv.requests("/orders");
    assert_eq!(seen.len(), 2);
    let key = seen[0].header("idempotency-key").unwrap();
    assert_eq!(key.len(), 32);
    assert_eq!(seen[1].header("idempotency-key"), Some(key));
    assert_eq!(seen[1].text(), "item=2");
    srv.join().await;
}

#[tokio::test]
async fn a_post_without_an_idempotency_key_gets_its_401_back_after_one_request() {
    let srv = FaultServer::http1()
        .route("/orders", wants_tok_2())
        .start()
        .await
        .unwrap();
    let (bearer, calls) = numbered();
    let c = client(vec![bearer]);
    let res = c
        .send(NetRequest::post(srv.url("/orders")).body("item=1"))
        .await
        .unwrap();
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    assert_eq!(srv.hits("/orders"), 1, "one request at the server");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no refresh for a 401 not resent"
    );
    assert!(srv.requests("/orders")[0]
        .header("idempotency-key")
        .is_none());
    srv.join().await;
}

#[tokio::test]
async fn a_streamed_post_is_not_resent_even_with_a_key() {
    let srv = FaultServer::http1()
        .route("/upload", wants_tok_2())
        .start()
        .await
        .unwrap();
    let (bearer, calls) = numbered();
    let c = client(vec![bearer]);
    let streamed = http::Request::post(srv.url("/upload"))
        .header("idempotency-key", "upload-1")
        .body(RespBody::Bytes(Bytes::from_static(b"chunk")))
        .unwrap();
    let req = NetRequest::try_from(streamed).unwrap();
    assert!(matches!(req.body, Body::Stream(_)));
    let res = c.send(req).await.unwrap();
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    assert_eq!(srv.hits("/upload"), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    srv.join().await;
}
