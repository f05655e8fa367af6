//! Mutual TLS: servers that require a client certificate, asserted on the first response read.

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::version::TLS12;
use rustls::ServerConfig;
use soulbase_net_core::ErrorKind;
use soulbase_net_policy::{MtlsCfg, TlsPolicy};
use soulbase_net_runtime::tls::client_config;
use soulbase_net_testkit::{crypto_provider, CertKit, Leaf};

use crate::support::{attempt, bounded, kind_of, rustls_error, server, trusting};

fn with_identity(kit: &CertKit, identity: &Leaf) -> TlsPolicy {
    let mut p = trusting(kit);
    let mut m = MtlsCfg::default();
    m.client_cert_pem = identity.chain_pem().to_owned();
    m.client_key_pem = identity.key_pem().to_owned();
    p.mtls = Some(m);
    p
}

/// Like `CertKit::mtls_server_config`, TLS 1.2 only (the refusal then comes in the handshake).
fn mtls_tls12(kit: &CertKit, leaf: &Leaf) -> Arc<ServerConfig> {
    let provider = crypto_provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(
        Arc::new(kit.root_store().unwrap()),
        provider.clone(),
    )
    .build()
    .unwrap();
    let cfg = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&TLS12])
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(leaf.chain().to_vec(), leaf.key_der())
        .unwrap();
    Arc::new(cfg)
}

#[tokio::test]
async fn without_a_client_certificate_the_first_read_is_tls_verify() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        for (name, cfg) in [
            ("tls13", kit.mtls_server_config(&leaf).unwrap()),
            ("tls12", mtls_tls12(&kit, &leaf)),
        ] {
            let srv = server(cfg).await;
            for http2 in [true, false] {
                let mut policy = trusting(&kit);
                policy.http2 = http2;
                let cfg = client_config(&policy, &[]).unwrap();
                let err = attempt(cfg, &srv, "localhost").await.unwrap_err();
                assert_eq!(
                    kind_of(&err),
                    Some(ErrorKind::TlsVerify),
                    "{name} h2={http2}: {err:?}"
                );
                // Over HTTP/1.1 the rustls error itself survives; h2 keeps only its text.
                if !http2 {
                    assert!(
                        matches!(
                            rustls_error(&*err),
                            Some(rustls::Error::AlertReceived(
                                rustls::AlertDescription::CertificateRequired
                            ))
                        ),
                        "{name} h2={http2}: {err:?}"
                    );
                }
            }
            assert_eq!(srv.hits("/"), 0, "{name}");
        }
    })
    .await;
}

#[tokio::test]
async fn with_the_kit_client_certificate_the_request_succeeds() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        let identity = kit.client("svc.soulbase.test").unwrap();
        for (name, cfg) in [
            ("tls13", kit.mtls_server_config(&leaf).unwrap()),
            ("tls12", mtls_tls12(&kit, &leaf)),
        ] {
            let srv = server(cfg).await;
            let cfg = client_config(&with_identity(&kit, &identity), &[]).unwrap();
            let (status, body) = attempt(cfg, &srv, "localhost").await.unwrap();
            assert_eq!((status, &body[..]), (200, &b"hello"[..]), "{name}");
            assert_eq!(srv.hits("/"), 1, "{name}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_client_certificate_the_server_does_not_trust_is_tls_verify() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let srv = server(kit.mtls_server_config(&kit.localhost().unwrap()).unwrap()).await;
        let stranger = kit.self_signed().unwrap();
        let cfg = client_config(&with_identity(&kit, &stranger), &[]).unwrap();
        let err = attempt(cfg, &srv, "localhost").await.unwrap_err();
        assert_eq!(kind_of(&err), Some(ErrorKind::TlsVerify), "{err:?}");
        assert_eq!(srv.hits("/"), 0);
    })
    .await;
}

#[test]
fn bad_pem_is_invalid_request_naming_the_field() {
    let kit = CertKit::new().unwrap();
    let identity = kit.client("svc.soulbase.test").unwrap();
    let other = kit.client("other.soulbase.test").unwrap();

    let mut bad_key = with_identity(&kit, &identity);
    let secret =
        "-----BEGIN PRIVATE KEY-----\nU0VDUkVULUtFWS1NQVRFUklBTA!!\n-----END PRIVATE KEY-----\n";
    bad_key.mtls.as_mut().unwrap().client_key_pem = secret.into();
    let err = client_config(&bad_key, &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(
        err.message().unwrap().contains("tls.mtls.client_key_pem"),
        "{err}"
    );
    assert!(!format!("{err:?}").contains("U0VDUkVU"), "{err:?}");

    let mut no_key = with_identity(&kit, &identity);
    no_key.mtls.as_mut().unwrap().client_key_pem = "not pem at all".into();
    let err = client_config(&no_key, &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(
        err.message().unwrap().contains("tls.mtls.client_key_pem"),
        "{err}"
    );

    let mut bad_cert = with_identity(&kit, &identity);
    bad_cert.mtls.as_mut().unwrap().client_cert_pem = "garbage".into();
    let err = client_config(&bad_cert, &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(
        err.message().unwrap().contains("tls.mtls.client_cert_pem"),
        "{err}"
    );

    let mut mismatched = with_identity(&kit, &identity);
    mismatched.mtls.as_mut().unwrap().client_key_pem = other.key_pem().to_owned();
    let err = client_config(&mismatched, &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(
        err.message().unwrap().contains("tls.mtls.client_key_pem"),
        "{err}"
    );
}
