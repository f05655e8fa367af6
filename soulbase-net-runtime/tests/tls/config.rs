//! Configuration: ALPN lists, verification that cannot be turned off, unusable roots.

use soulbase_net_core::ErrorKind;
use soulbase_net_policy::{TlsPolicy, TlsVersion};
use soulbase_net_runtime::tls::client_config;
use soulbase_net_testkit::CertKit;

#[test]
fn alpn_follows_http2() {
    let mut p = TlsPolicy::default();
    let cfg = client_config(&p, &[]).unwrap();
    assert_eq!(cfg.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
    p.http2 = false;
    p.min_tls = TlsVersion::Tls13;
    let cfg = client_config(&p, &[]).unwrap();
    assert_eq!(cfg.alpn_protocols, [b"http/1.1".to_vec()]);
}

#[test]
fn verification_cannot_be_turned_off() {
    let mut p = TlsPolicy::default();
    p.verify_cert = false;
    let err = client_config(&p, &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.message().unwrap().contains("tls.verify_cert"), "{err}");
}

#[test]
fn unusable_extra_roots_are_invalid_request_naming_the_field() {
    let kit = CertKit::new().unwrap();
    let mut p = TlsPolicy::default();
    p.extra_roots_pem = vec![kit.root_pem(), "no pem here".into()];
    let err = client_config(&p, &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(
        err.message().unwrap().contains("tls.extra_roots_pem[1]"),
        "{err}"
    );

    // PEM framing around bytes that are not a certificate.
    p.extra_roots_pem =
        vec!["-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into()];
    let err = client_config(&p, &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(
        err.message().unwrap().contains("tls.extra_roots_pem[0]"),
        "{err}"
    );

    let p = TlsPolicy::default();
    let err = client_config(
        &p,
        &[rustls::pki_types::CertificateDer::from(vec![1, 2, 3])],
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(
        err.message().unwrap().contains("extra root certificate #0"),
        "{err}"
    );
}
