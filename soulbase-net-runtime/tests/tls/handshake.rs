//! Trust roots, names and ALPN on good certificates.

use soulbase_net_core::ErrorKind;
use soulbase_net_policy::TlsPolicy;
use soulbase_net_runtime::tls::client_config;
use soulbase_net_testkit::CertKit;

use crate::support::{attempt, bounded, connect, get, kind_of, rustls_error, server, trusting};

#[tokio::test]
async fn kit_root_as_extra_pem_root_handshakes_and_negotiates_h2() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let srv = server(kit.localhost().unwrap().server_config().unwrap()).await;
        let cfg = client_config(&trusting(&kit), &[]).unwrap();
        let tls = connect(cfg, &srv, "localhost").await.unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()));
        let (status, body) = get(tls).await.unwrap();
        assert_eq!((status, &body[..]), (200, &b"hello"[..]));
        assert_eq!(srv.hits("/"), 1);
    })
    .await;
}

#[tokio::test]
async fn kit_root_as_extra_der_root_and_http1_only() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let srv = server(kit.localhost().unwrap().server_config().unwrap()).await;
        let mut policy = TlsPolicy::default();
        policy.http2 = false;
        let cfg = client_config(&policy, &[kit.root_der()]).unwrap();
        let tls = connect(cfg, &srv, "localhost").await.unwrap();
        assert_eq!(
            tls.get_ref().1.alpn_protocol(),
            Some(b"http/1.1".as_slice())
        );
        let (status, _) = get(tls).await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(srv.hits("/"), 1);
    })
    .await;
}

#[tokio::test]
async fn ip_address_names_are_verified_too() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let srv = server(kit.localhost().unwrap().server_config().unwrap()).await;
        let cfg = client_config(&trusting(&kit), &[]).unwrap();
        let (status, _) = attempt(cfg, &srv, "127.0.0.1").await.unwrap();
        assert_eq!(status, 200);
        // A leaf for `wrong.example.test` only is refused at the IP as well.
        let wrong = server(kit.wrong_host().unwrap().server_config().unwrap()).await;
        let cfg = client_config(&trusting(&kit), &[]).unwrap();
        let err = attempt(cfg, &wrong, "127.0.0.1").await.unwrap_err();
        assert_eq!(kind_of(&err), Some(ErrorKind::TlsVerify), "{err:?}");
    })
    .await;
}

#[tokio::test]
async fn without_the_kit_root_verification_fails() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let srv = server(kit.localhost().unwrap().server_config().unwrap()).await;
        // webpki-roots only: the kit's root is not among them.
        let cfg = client_config(&TlsPolicy::default(), &[]).unwrap();
        let err = attempt(cfg, &srv, "localhost").await.unwrap_err();
        assert_eq!(kind_of(&err), Some(ErrorKind::TlsVerify), "{err:?}");
        assert!(
            matches!(
                rustls_error(&*err),
                Some(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::UnknownIssuer
                ))
            ),
            "{err:?}"
        );
        assert_eq!(srv.hits("/"), 0);
    })
    .await;
}
