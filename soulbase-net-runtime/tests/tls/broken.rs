//! The testkit's broken certificates: each is `TlsVerify` and no request reaches the handler.

use soulbase_net_core::{ErrorCode, ErrorKind, NetError};
use soulbase_net_runtime::tls::client_config;
use soulbase_net_testkit::{CertKit, Leaf};

use crate::support::{attempt, bounded, kind_of, rustls_error, server, trusting};

#[tokio::test]
async fn every_broken_certificate_is_tls_verify() {
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
        for (name, leaf) in broken {
            let srv = server(leaf.server_config().unwrap()).await;
            let cfg = client_config(&trusting(&kit), &[]).unwrap();
            let err = attempt(cfg, &srv, "localhost").await.unwrap_err();
            let kind = kind_of(&err);
            assert_eq!(kind, Some(ErrorKind::TlsVerify), "{name}: {err:?}");
            assert!(
                matches!(
                    rustls_error(&*err),
                    Some(rustls::Error::InvalidCertificate(_))
                ),
                "{name}: {err:?}"
            );
            assert_eq!(
                NetError::new(ErrorKind::TlsVerify).code(),
                ErrorCode::AuthForbidden
            );
            assert_eq!(srv.hits("/"), 0, "{name}");
        }
    })
    .await;
}
