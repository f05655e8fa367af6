//! TLS through the client: the testkit's broken certificates, trust through the builder and
//! the policy, SPKI pins, mutual TLS and the protocol floor — each over loopback, with the
//! codes of the error and the server's hit counts asserted.

use std::sync::Arc;

use bytes::Bytes;
use rustls::version::TLS12;
use rustls::ServerConfig;
use soulbase_net_core::{ErrorCode, ErrorKind, NetError, NetRequest};
use soulbase_net_policy::{MtlsCfg, NetPolicy, TlsVersion};
use soulbase_net_testkit::{crypto_provider, CertKit, FaultServer, Leaf, Reply};

use crate::support::{bounded, harness, harness_with, loopback_policy, Harness};

/// A TLS FaultServer on 127.0.0.1 answering `GET /t` with `200 secret`.
async fn server(cfg: Arc<ServerConfig>) -> FaultServer {
    FaultServer::builder()
        .tls(cfg)
        .route("/t", Reply::ok("secret"))
        .start()
        .await
        .unwrap()
}

/// The loopback policy trusting the kit's root through `tls.extra_roots_pem`.
fn trusting(kit: &CertKit) -> NetPolicy {
    let mut p = loopback_policy();
    p.tls.extra_roots_pem = vec![kit.root_pem()];
    p
}

/// `trusting` with a pin set.
fn pinned(kit: &CertKit, pins: &[String]) -> NetPolicy {
    let mut p = trusting(kit);
    p.tls.pinset_sha256 = Some(pins.to_vec());
    p
}

/// `GET /t` and the whole body: the first response read. An error may come from `send` or
/// from reading the body; either is returned.
async fn get(h: &Harness, srv: &FaultServer) -> Result<(u16, Bytes), NetError> {
    let res = h.client.send(NetRequest::get(srv.url("/t"))).await?;
    let status = res.status.as_u16();
    let body = res.bytes().await?;
    Ok((status, body))
}

/// Asserts `GET /t` succeeds with `200 secret`.
async fn assert_ok(h: &Harness, srv: &FaultServer, case: &str) {
    match get(h, srv).await {
        Ok((status, body)) => {
            assert_eq!((status, &body[..]), (200, &b"secret"[..]), "{case}");
        }
        Err(e) => panic!("{case}: expected 200, got {:?} ({e:?})", e.kind()),
    }
}

/// Asserts `GET /t` fails with `kind` (and its code) and nothing reached the handler, though
/// the client did connect (the refusal came from the TLS layer, not before it).
async fn assert_refused(h: &Harness, srv: &FaultServer, kind: ErrorKind, case: &str) -> NetError {
    let err = match get(h, srv).await {
        Ok((status, _)) => panic!("{case}: expected {kind:?}, got status {status}"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), kind, "{case}: {err:?}");
    let code = match kind {
        ErrorKind::TlsVerify => ErrorCode::AuthForbidden,
        _ => ErrorCode::ProviderUnavailable,
    };
    assert_eq!(err.code(), code, "{case}: {err:?}");
    assert_eq!(srv.hits("/t"), 0, "{case}: a request reached the handler");
    assert_eq!(srv.total_hits(), 0, "{case}: a request reached the server");
    assert!(srv.connections() >= 1, "{case}: the client never connected");
    assert!(h.dialer.off_loopback().is_empty(), "{case}");
    err
}

/// A server config presenting `leaf` over TLS 1.2 only.
fn tls12_only(leaf: &Leaf) -> Arc<ServerConfig> {
    let cfg = ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&TLS12])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(leaf.chain().to_vec(), leaf.key_der())
        .unwrap();
    Arc::new(cfg)
}

#[tokio::test]
async fn every_broken_certificate_is_auth_forbidden_and_reaches_no_handler() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let broken: Vec<(&str, Leaf)> = vec![
            ("expired", kit.expired().unwrap()),
            ("not_yet_valid", kit.not_yet_valid().unwrap()),
            ("wrong_host", kit.wrong_host().unwrap()),
            ("self_signed", kit.self_signed().unwrap()),
            ("untrusted_root", kit.untrusted_root().unwrap()),
            ("missing_intermediate", kit.missing_intermediate().unwrap()),
            ("wrong_eku", kit.wrong_eku().unwrap()),
            ("ca_as_leaf", kit.ca_as_leaf().unwrap()),
        ];
        // One client trusting the kit's root for all of them (so only the leaf is at fault).
        let h = harness_with(loopback_policy(), |b| {
            b.add_root_certificate(kit.root_der())
        });
        for (name, leaf) in &broken {
            let srv = server(leaf.server_config().unwrap()).await;
            assert_refused(&h, &srv, ErrorKind::TlsVerify, name).await;
            srv.join().await;
        }
        // The same client reaches a good leaf of the same kit.
        let good = server(kit.localhost().unwrap().server_config().unwrap()).await;
        assert_ok(&h, &good, "control").await;
        assert_eq!(good.hits("/t"), 1);
        good.join().await;
    })
    .await;
}

#[tokio::test]
async fn the_kit_root_is_trusted_through_the_builder_or_the_policy_only() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let srv = server(kit.localhost().unwrap().server_config().unwrap()).await;

        let by_builder = harness_with(loopback_policy(), |b| {
            b.add_root_certificate(kit.root_der())
        });
        assert_ok(&by_builder, &srv, "add_root_certificate").await;
        assert_eq!(srv.hits("/t"), 1);

        let by_policy = harness(trusting(&kit));
        assert_ok(&by_policy, &srv, "extra_roots_pem").await;
        assert_eq!(srv.hits("/t"), 2);

        // Neither: the webpki roots alone do not know the kit.
        let stranger = harness(loopback_policy());
        let err = match get(&stranger, &srv).await {
            Ok((status, _)) => panic!("no root: expected TlsVerify, got status {status}"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::TlsVerify, "{err:?}");
        assert_eq!(err.code(), ErrorCode::AuthForbidden);
        assert_eq!(
            srv.hits("/t"),
            2,
            "the untrusting client reached the handler"
        );

        // Another kit's root does not help either.
        let other = CertKit::new().unwrap();
        let wrong_root = harness(trusting(&other));
        let err = get(&wrong_root, &srv).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TlsVerify, "{err:?}");
        assert_eq!(srv.hits("/t"), 2);
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn pins_match_alone_or_as_a_backup_and_a_mismatch_reaches_no_handler() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        let other = kit.localhost().unwrap().spki_sha256();
        let another = kit.client("x.soulbase.test").unwrap().spki_sha256();
        assert_ne!(other, leaf.spki_sha256());

        let srv = server(leaf.server_config().unwrap()).await;
        let h = harness(pinned(&kit, &[leaf.spki_sha256()]));
        assert_ok(&h, &srv, "matching pin").await;
        assert_eq!(srv.hits("/t"), 1);

        let h = harness(pinned(&kit, &[other.clone(), leaf.spki_sha256()]));
        assert_ok(&h, &srv, "backup pin").await;
        assert_eq!(srv.hits("/t"), 2);

        let h = harness(pinned(&kit, &[format!("sha256/{}", leaf.spki_sha256())]));
        assert_ok(&h, &srv, "prefixed pin").await;
        assert_eq!(srv.hits("/t"), 3);
        srv.join().await;

        // A fresh server, so "0 hits" is about this case alone.
        let srv = server(leaf.server_config().unwrap()).await;
        let h = harness(pinned(&kit, &[other, another]));
        assert_refused(&h, &srv, ErrorKind::TlsVerify, "pin mismatch").await;
        srv.join().await;
    })
    .await;
}

#[tokio::test]
async fn a_matching_pin_never_rescues_a_bad_chain() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        for (name, leaf) in [
            ("expired", kit.expired().unwrap()),
            ("self_signed", kit.self_signed().unwrap()),
            ("wrong_host", kit.wrong_host().unwrap()),
        ] {
            let srv = server(leaf.server_config().unwrap()).await;
            let h = harness(pinned(&kit, &[leaf.spki_sha256()]));
            assert_refused(&h, &srv, ErrorKind::TlsVerify, &format!("pinned {name}")).await;
            srv.join().await;
        }
    })
    .await;
}

#[tokio::test]
async fn mtls_without_a_client_certificate_is_auth_forbidden_on_the_first_read() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        for http2 in [true, false] {
            let srv = server(kit.mtls_server_config(&leaf).unwrap()).await;
            let mut p = trusting(&kit);
            p.tls.http2 = http2;
            let h = harness(p);
            assert_refused(
                &h,
                &srv,
                ErrorKind::TlsVerify,
                &format!("no client certificate, h2={http2}"),
            )
            .await;
            srv.join().await;
        }
    })
    .await;
}

#[tokio::test]
async fn mtls_with_the_kit_client_certificate_reaches_the_handler() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        let identity = kit.client("svc.soulbase.test").unwrap();
        for http2 in [true, false] {
            let srv = server(kit.mtls_server_config(&leaf).unwrap()).await;
            let mut p = trusting(&kit);
            p.tls.http2 = http2;
            let mut m = MtlsCfg::default();
            m.client_cert_pem = identity.chain_pem().to_owned();
            m.client_key_pem = identity.key_pem().to_owned();
            p.tls.mtls = Some(m);
            let h = harness(p);
            assert_ok(&h, &srv, &format!("client certificate, h2={http2}")).await;
            assert_eq!(srv.hits("/t"), 1, "h2={http2}");
            let expected = if http2 {
                http::Version::HTTP_2
            } else {
                http::Version::HTTP_11
            };
            assert_eq!(srv.requests("/t")[0].version, expected);
            srv.join().await;
        }
    })
    .await;
}

#[tokio::test]
async fn min_tls_13_refuses_a_tls12_only_server_and_12_reaches_it() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        let srv = server(tls12_only(&leaf)).await;

        let mut p = trusting(&kit);
        p.tls.min_tls = TlsVersion::Tls13;
        let h = harness(p);
        assert_refused(&h, &srv, ErrorKind::Tls, "min_tls 1.3 vs a 1.2-only server").await;

        let mut p = trusting(&kit);
        p.tls.min_tls = TlsVersion::Tls12;
        let h = harness(p);
        assert_ok(&h, &srv, "min_tls 1.2 vs a 1.2-only server").await;
        assert_eq!(srv.hits("/t"), 1);
        srv.join().await;

        // And 1.3 is fine against a server that speaks it.
        let modern = server(leaf.server_config().unwrap()).await;
        let mut p = trusting(&kit);
        p.tls.min_tls = TlsVersion::Tls13;
        let h = harness(p);
        assert_ok(&h, &modern, "min_tls 1.3 vs a default server").await;
        assert_eq!(modern.hits("/t"), 1);
        modern.join().await;
    })
    .await;
}
