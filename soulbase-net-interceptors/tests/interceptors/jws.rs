//! A2aJws: the signature that arrives verifies against the body that arrived, and only it.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use ring::{rand::SystemRandom, signature::Ed25519KeyPair};
use soulbase_net_core::NetRequest;
use soulbase_net_interceptors::{jws_verify, A2aJws, JwsError};
use soulbase_net_testkit::{FaultServer, Reply};

use crate::support::client;

fn key(kid: &str) -> A2aJws {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    A2aJws::from_pkcs8(pkcs8.as_ref(), kid).unwrap()
}

#[tokio::test]
async fn the_signed_body_verifies_on_the_receiving_side() {
    let srv = FaultServer::http1()
        .route("/a2a", Reply::echo())
        .start()
        .await
        .unwrap();
    let signer = Arc::new(key("agent-7"));
    let c = client(vec![signer.clone()]);
    let body = serde_json::json!({"task": "transfer", "amount": 10, "meta": {"z": 1, "a": [1, 2]}});
    let req = NetRequest::post(srv.url("/a2a")).json(&body).unwrap();
    assert_eq!(c.send(req).await.unwrap().status, 200);

    let seen = &srv.requests("/a2a")[0];
    let auth = seen.header("authorization").unwrap();
    assert!(auth.starts_with("A2A "), "{auth}");
    assert!(auth.contains(".."), "detached: {auth}");
    let window = Duration::from_secs(300);
    let now = SystemTime::now();
    let claims = jws_verify(auth, &seen.body, signer.public_key(), window, now).unwrap();
    assert_eq!(claims.kid.as_deref(), Some("agent-7"));

    let mut changed = seen.body.to_vec();
    let at = changed.iter().position(|b| *b == b'1').unwrap();
    changed[at] = b'2';
    let err = jws_verify(auth, &changed, signer.public_key(), window, now).unwrap_err();
    assert_eq!(err, JwsError::BadSignature);
    let other = key("agent-7");
    let err = jws_verify(auth, &seen.body, other.public_key(), window, now).unwrap_err();
    assert_eq!(err, JwsError::BadSignature);
    let later = now + Duration::from_secs(301);
    let err = jws_verify(auth, &seen.body, signer.public_key(), window, later).unwrap_err();
    assert_eq!(err, JwsError::Expired);
    srv.join().await;
}
