//! Protocol versions: `min_tls` 1.2 and 1.3 against TLS 1.2-only and default servers.

use std::sync::Arc;

use rustls::version::TLS12;
use rustls::{ProtocolVersion, ServerConfig};
use soulbase_net_core::{ErrorCode, ErrorKind, NetError};
use soulbase_net_policy::TlsVersion;
use soulbase_net_runtime::tls::client_config;
use soulbase_net_testkit::{crypto_provider, CertKit, Leaf};

use crate::support::{attempt, bounded, connect, kind_of, server, trusting};

/// A server speaking TLS 1.2 only.
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
async fn min_tls_12_speaks_12_and_13() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        let old = server(tls12_only(&leaf)).await;
        let new = server(leaf.server_config().unwrap()).await;
        let cfg = client_config(&trusting(&kit), &[]).unwrap();
        let tls = connect(cfg.clone(), &old, "localhost").await.unwrap();
        assert_eq!(
            tls.get_ref().1.protocol_version(),
            Some(ProtocolVersion::TLSv1_2)
        );
        let tls = connect(cfg, &new, "localhost").await.unwrap();
        assert_eq!(
            tls.get_ref().1.protocol_version(),
            Some(ProtocolVersion::TLSv1_3)
        );
    })
    .await;
}

#[tokio::test]
async fn min_tls_13_refuses_a_tls12_only_server_as_tls() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        let old = server(tls12_only(&leaf)).await;
        let mut policy = trusting(&kit);
        policy.min_tls = TlsVersion::Tls13;
        let cfg = client_config(&policy, &[]).unwrap();
        let err = attempt(cfg.clone(), &old, "localhost").await.unwrap_err();
        assert_eq!(kind_of(&err), Some(ErrorKind::Tls), "{err:?}");
        assert_eq!(
            NetError::new(ErrorKind::Tls).code(),
            ErrorCode::ProviderUnavailable
        );
        assert_eq!(old.hits("/"), 0);
        // The same config is fine with a server that speaks TLS 1.3.
        let new = server(leaf.server_config().unwrap()).await;
        let tls = connect(cfg, &new, "localhost").await.unwrap();
        assert_eq!(
            tls.get_ref().1.protocol_version(),
            Some(ProtocolVersion::TLSv1_3)
        );
    })
    .await;
}

#[tokio::test]
async fn max_tls_12_speaks_12_only() {
    bounded(async {
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        let new = server(leaf.server_config().unwrap()).await;
        let mut policy = trusting(&kit);
        policy.max_tls = TlsVersion::Tls12;
        let cfg = client_config(&policy, &[]).unwrap();
        let tls = connect(cfg, &new, "localhost").await.unwrap();
        assert_eq!(
            tls.get_ref().1.protocol_version(),
            Some(ProtocolVersion::TLSv1_2)
        );
        // No version left between the two bounds: refused as a configuration error.
        policy.min_tls = TlsVersion::Tls13;
        let err = client_config(&policy, &[]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
    })
    .await;
}
