//! TestNet: the policy patch parses as TOML with exactly the three fields it promises, and
//! what it names works over loopback — a name given to its MockDns resolves through the
//! patch's name server, and a certificate from its CertKit verifies against the patch's root
//! (and one from another kit does not).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::Resolver;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use serde_json::{json, Value};
use soulbase_net_testkit::{crypto_provider, FaultServer, Reply, TestNet};

use crate::tls::{connect, get_over};

fn patch(net: &TestNet) -> Value {
    toml::from_str(&net.policy_patch()).unwrap()
}

/// A rustls client that trusts the roots of the patch only.
fn client_trusting(patch: &Value) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for pem in patch["default"]["tls"]["extra_roots_pem"]
        .as_array()
        .unwrap()
    {
        let der = CertificateDer::from_pem_slice(pem.as_str().unwrap().as_bytes()).unwrap();
        roots.add(der).unwrap();
    }
    let cfg = ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(cfg)
}

/// A resolver that asks the patch's name servers only.
fn resolver_of(patch: &Value) -> Resolver<TokioRuntimeProvider> {
    let servers = patch["default"]["dns"]["nameservers"].as_array().unwrap();
    let ns = servers
        .iter()
        .map(|s| {
            let addr: SocketAddr = s.as_str().unwrap().parse().unwrap();
            let mut udp = ConnectionConfig::udp();
            udp.port = addr.port();
            NameServerConfig::new(addr.ip(), true, vec![udp])
        })
        .collect();
    let mut b = Resolver::builder_with_config(
        ResolverConfig::from_name_servers(ns),
        TokioRuntimeProvider::default(),
    );
    b.options_mut().use_hosts_file = ResolveHosts::Never;
    b.build().unwrap()
}

#[tokio::test]
async fn the_patch_states_loopback_the_mock_dns_and_the_kit_root_in_the_default_layer() {
    let net = TestNet::new().await.unwrap();
    assert_eq!(
        patch(&net),
        json!({"default": {
            "security": {"grants": {"cidrs": ["127.0.0.0/8", "::1/128"]}},
            "dns": {"nameservers": [net.dns().addr().to_string()]},
            "tls": {"extra_roots_pem": [net.certs().root_pem()]},
        }})
    );
    assert!(net.dns().addr().ip().is_loopback());
}

#[tokio::test]
async fn a_name_and_a_certificate_from_the_test_net_work_with_what_the_patch_names() {
    let net = TestNet::new().await.unwrap();
    let name = "inventory.example.com";
    net.dns().set_ips(name, &[IpAddr::from([127, 0, 0, 1])], 60);
    let leaf = net.certs().leaf(&[name]).unwrap();
    let upstream = FaultServer::builder()
        .tls(leaf.server_config().unwrap())
        .route("/", Reply::ok("hi"))
        .start()
        .await
        .unwrap();
    let p = patch(&net);

    let ips: Vec<IpAddr> = resolver_of(&p)
        .lookup_ip(format!("{name}."))
        .await
        .unwrap()
        .iter()
        .collect();
    assert_eq!(ips, [IpAddr::from([127, 0, 0, 1])]);
    assert!(net.dns().query_count(name) >= 1);

    let addr = SocketAddr::new(ips[0], upstream.addr().port());
    let tls = connect(addr, client_trusting(&p), name, &[b"http/1.1"])
        .await
        .unwrap();
    let (_, body) = get_over(tls, &format!("https://{name}/")).await;
    assert_eq!(&body[..], b"hi");
    assert_eq!(upstream.hits("/"), 1);

    // A certificate from another test net's kit is not trusted by this patch.
    let other = TestNet::new().await.unwrap();
    let stranger = FaultServer::builder()
        .tls(
            other
                .certs()
                .leaf(&[name])
                .unwrap()
                .server_config()
                .unwrap(),
        )
        .route("/", Reply::ok("no"))
        .start()
        .await
        .unwrap();
    let addr = SocketAddr::new(ips[0], stranger.addr().port());
    assert!(connect(addr, client_trusting(&p), name, &[b"http/1.1"])
        .await
        .is_err());
    assert_eq!(stranger.hits("/"), 0);
    upstream.join().await;
}
