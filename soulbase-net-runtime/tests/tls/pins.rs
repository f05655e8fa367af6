//! SPKI pins: match, backup pins, mismatch, CA pins, and pins that must not rescue a bad chain.

use soulbase_net_core::ErrorKind;
use soulbase_net_policy::TlsPolicy;
use soulbase_net_runtime::tls::{client_config, spki_sha256, PinMismatch};
use soulbase_net_testkit::CertKit;

use crate::support::{attempt, b64, bounded, kind_of, rustls_error, server, trusting};

fn pinned(kit: &CertKit, pins: &[String]) -> TlsPolicy {
    let mut p = trusting(kit);
    p.pinset_sha256 = Some(pins.to_vec());
    p
}

/// The `PinMismatch` inside a failed handshake, if that is why it failed.
fn pin_mismatch(err: &crate::support::BoxError) -> Option<PinMismatch> {
    match rustls_error(&**err)? {
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)) => {
            other.0.downcast_ref::<PinMismatch>().cloned()
        }
        _ => None,
    }
}

#[tokio::test]
async fn the_leaf_pin_is_accepted_alone_prefixed_or_as_a_backup() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        let srv = server(leaf.server_config().unwrap()).await;
        let other = b64(&[7u8; 32]);
        for pins in [
            vec![leaf.spki_sha256()],
            vec![format!("sha256/{}", leaf.spki_sha256())],
            vec![other.clone(), leaf.spki_sha256()],
            vec![leaf.spki_sha256(), other.clone()],
        ] {
            let cfg = client_config(&pinned(&kit, &pins), &[]).unwrap();
            let (status, _) = attempt(cfg, &srv, "localhost").await.unwrap();
            assert_eq!(status, 200, "{pins:?}");
        }
        assert_eq!(srv.hits("/"), 4);
    })
    .await;
}

#[tokio::test]
async fn a_wrong_pin_is_tls_verify() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        let srv = server(leaf.server_config().unwrap()).await;
        // Another good leaf's pin, and a random one.
        let pins = [kit.localhost().unwrap().spki_sha256(), b64(&[9u8; 32])];
        let cfg = client_config(&pinned(&kit, &pins), &[]).unwrap();
        let err = attempt(cfg, &srv, "localhost").await.unwrap_err();
        assert_eq!(kind_of(&err), Some(ErrorKind::TlsVerify), "{err:?}");
        let mismatch = pin_mismatch(&err).expect("a pin mismatch");
        assert_eq!(mismatch.presented(), leaf.spki_sha256_bytes());
        assert!(
            mismatch.to_string().contains("none of the 2 pinned"),
            "{mismatch}"
        );
        assert_eq!(srv.hits("/"), 0);
    })
    .await;
}

#[tokio::test]
async fn only_the_leaf_is_pinned_not_a_ca_of_the_chain() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let srv = server(kit.localhost().unwrap().server_config().unwrap()).await;
        // The intermediate is in the chain the server sends; its pin must not match.
        let ca_pin = b64(&spki_sha256(&kit.intermediate_der()).unwrap());
        let root_pin = b64(&spki_sha256(&kit.root_der()).unwrap());
        let cfg = client_config(&pinned(&kit, &[ca_pin, root_pin]), &[]).unwrap();
        let err = attempt(cfg, &srv, "localhost").await.unwrap_err();
        assert_eq!(kind_of(&err), Some(ErrorKind::TlsVerify), "{err:?}");
        assert!(pin_mismatch(&err).is_some(), "{err:?}");
        assert_eq!(srv.hits("/"), 0);
    })
    .await;
}

#[tokio::test]
async fn a_matching_pin_never_rescues_a_bad_chain() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        for (name, leaf) in [
            ("self_signed", kit.self_signed().unwrap()),
            ("expired", kit.expired().unwrap()),
            ("untrusted_root", kit.untrusted_root().unwrap()),
            ("wrong_host", kit.wrong_host().unwrap()),
        ] {
            let srv = server(leaf.server_config().unwrap()).await;
            let cfg = client_config(&pinned(&kit, &[leaf.spki_sha256()]), &[]).unwrap();
            let err = attempt(cfg, &srv, "localhost").await.unwrap_err();
            assert_eq!(kind_of(&err), Some(ErrorKind::TlsVerify), "{name}: {err:?}");
            // Refused by the chain check, before the pin is looked at.
            assert!(pin_mismatch(&err).is_none(), "{name}: {err:?}");
            assert_eq!(srv.hits("/"), 0, "{name}");
        }
    })
    .await;
}

#[test]
fn invalid_or_empty_pin_sets_are_refused_not_dropped() {
    let kit = CertKit::new().unwrap();
    let good = kit.localhost().unwrap().spki_sha256();
    let err = client_config(&pinned(&kit, &[good, "not-a-pin".into()]), &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(
        err.message().unwrap().contains("tls.pinset_sha256[1]"),
        "{err}"
    );
    let err = client_config(&pinned(&kit, &[]), &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(
        err.message().unwrap().contains("tls.pinset_sha256"),
        "{err}"
    );
}
