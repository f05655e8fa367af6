//! FaultServer over TLS (ALPN h2 / http/1.1), and every CertKit certificate against a default
//! rustls client.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Version};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use rustls::{CertificateError, ClientConfig};
use soulbase_net_testkit::{CertKit, FaultServer, Leaf, Protocol, Reply};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

pub(crate) async fn connect(
    addr: SocketAddr,
    cfg: Arc<ClientConfig>,
    name: &str,
    alpn: &[&[u8]],
) -> io::Result<TlsStream<TcpStream>> {
    let mut cfg = (*cfg).clone();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(name.to_owned()).unwrap();
    TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await
}

fn rustls_error(e: &io::Error) -> &rustls::Error {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<rustls::Error>())
        .unwrap_or_else(|| panic!("not a rustls error: {e:?}"))
}

pub(crate) async fn get_over(tls: TlsStream<TcpStream>, url: &str) -> (Version, Bytes) {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let req = Request::get(url).body(Empty::<Bytes>::new()).unwrap();
    let res = if h2 {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    };
    let v = res.version();
    (v, res.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test]
async fn tls_with_alpn_h2_and_http1() {
    let kit = CertKit::new().unwrap();
    let leaf = kit.localhost().unwrap();
    let srv = FaultServer::builder()
        .tls(leaf.server_config().unwrap())
        .route("/x", Reply::ok("secret"))
        .start()
        .await
        .unwrap();
    assert!(srv.url("/x").starts_with("https://127.0.0.1:"));
    let cfg = kit.client_config().unwrap();
    let tls = connect(srv.addr(), cfg.clone(), "localhost", &[b"h2", b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(
        get_over(tls, &srv.url("/x")).await,
        (Version::HTTP_2, Bytes::from("secret"))
    );
    // by IP address (the leaf has IP SANs), HTTP/1.1 only
    let tls = connect(srv.addr(), cfg.clone(), "127.0.0.1", &[b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    // the pin of the presented leaf is the kit's pin
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    assert_eq!(presented, *leaf.cert_der());
    assert_eq!(
        get_over(tls, "/x").await,
        (Version::HTTP_11, Bytes::from("secret"))
    );
    let reqs = srv.requests("/x");
    assert_eq!(
        reqs.iter().map(|r| r.version).collect::<Vec<_>>(),
        [Version::HTTP_2, Version::HTTP_11]
    );
    srv.join().await;

    // an HTTP/2-only TLS server offers only h2
    let srv = FaultServer::builder()
        .protocol(Protocol::Http2)
        .tls(leaf.server_config().unwrap())
        .route("/x", Reply::ok("h2"))
        .start()
        .await
        .unwrap();
    let tls = connect(srv.addr(), cfg, "localhost", &[b"h2", b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    srv.join().await;
}

async fn handshake_error(kit: &CertKit, leaf: &Leaf, name: &str) -> rustls::Error {
    let srv = FaultServer::builder()
        .tls(leaf.server_config().unwrap())
        .start()
        .await
        .unwrap();
    let err = connect(srv.addr(), kit.client_config().unwrap(), name, &[])
        .await
        .expect_err("handshake must fail");
    let e = rustls_error(&err).clone();
    srv.join().await;
    e
}

#[tokio::test]
async fn each_broken_certificate_is_rejected_as_expected() {
    let kit = CertKit::new().unwrap();
    let cert_err = |e: rustls::Error| match e {
        rustls::Error::InvalidCertificate(c) => c,
        other => panic!("not a certificate error: {other:?}"),
    };
    let e = cert_err(handshake_error(&kit, &kit.expired().unwrap(), "localhost").await);
    assert!(
        matches!(
            e,
            CertificateError::Expired | CertificateError::ExpiredContext { .. }
        ),
        "{e:?}"
    );
    let e = cert_err(handshake_error(&kit, &kit.not_yet_valid().unwrap(), "localhost").await);
    assert!(
        matches!(
            e,
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. }
        ),
        "{e:?}"
    );
    let e = cert_err(handshake_error(&kit, &kit.wrong_host().unwrap(), "localhost").await);
    assert!(
        matches!(
            e,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        ),
        "{e:?}"
    );
    // the good leaf is not valid for another name either
    let e = cert_err(handshake_error(&kit, &kit.localhost().unwrap(), "api.example.test").await);
    assert!(
        matches!(e, CertificateError::NotValidForNameContext { .. }),
        "{e:?}"
    );
    for leaf in [
        kit.self_signed().unwrap(),
        kit.untrusted_root().unwrap(),
        kit.missing_intermediate().unwrap(),
    ] {
        let e = cert_err(handshake_error(&kit, &leaf, "localhost").await);
        assert_eq!(e, CertificateError::UnknownIssuer);
    }
    let e = cert_err(handshake_error(&kit, &kit.wrong_eku().unwrap(), "localhost").await);
    assert!(
        matches!(
            e,
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. }
        ),
        "{e:?}"
    );
    let e = cert_err(handshake_error(&kit, &kit.ca_as_leaf().unwrap(), "localhost").await);
    match e {
        CertificateError::Other(other) => {
            let inner = other.0.downcast_ref::<webpki::Error>().unwrap();
            assert_eq!(*inner, webpki::Error::CaUsedAsEndEntity);
        }
        e => panic!("{e:?}"),
    }
    // and the good one passes, by name and by both IPs
    let good = kit.localhost().unwrap();
    let srv = FaultServer::builder()
        .tls(good.server_config().unwrap())
        .start()
        .await
        .unwrap();
    for name in ["localhost", "127.0.0.1"] {
        connect(srv.addr(), kit.client_config().unwrap(), name, &[])
            .await
            .unwrap();
    }
    srv.join().await;
}

#[tokio::test]
async fn mtls_requires_a_client_certificate() {
    let kit = CertKit::new().unwrap();
    let leaf = kit.localhost().unwrap();
    let srv = FaultServer::http1()
        .tls(kit.mtls_server_config(&leaf).unwrap())
        .route("/x", Reply::ok("mutual"))
        .start()
        .await
        .unwrap();
    let me = kit.client("svc-a.test").unwrap();
    let cfg = kit.client_config_with_identity(&me).unwrap();
    let tls = connect(srv.addr(), cfg, "localhost", &[b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(get_over(tls, "/x").await.1, "mutual");

    // Without a certificate: TLS 1.3 finishes the client side of the handshake, so the
    // rejection (alert CertificateRequired) arrives on the first read.
    let anon = connect(
        srv.addr(),
        kit.client_config().unwrap(),
        "localhost",
        &[b"http/1.1"],
    )
    .await;
    let failed = match anon {
        Err(_) => true,
        Ok(tls) => {
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .unwrap();
            let conn = tokio::spawn(conn);
            let r = send
                .send_request(Request::get("/x").body(Empty::<Bytes>::new()).unwrap())
                .await;
            let _ = conn.await;
            r.is_err()
        }
    };
    assert!(failed);
    assert_eq!(srv.hits("/x"), 1);
    srv.join().await;
}

#[test]
fn pins_and_pem_export() {
    let kit = CertKit::new().unwrap();
    let a = kit.localhost().unwrap();
    let b = kit.localhost().unwrap();
    assert_eq!(a.spki_sha256().len(), 44);
    assert_ne!(a.spki_sha256(), b.spki_sha256());
    assert_eq!(a.spki_sha256(), a.clone().spki_sha256());
    // the pin is SHA-256 over the DER SubjectPublicKeyInfo, as rcgen encodes the key too
    let key = rcgen::KeyPair::from_pem(a.key_pem()).unwrap();
    let spki = rcgen::PublicKeyData::subject_public_key_info(&key);
    let d = ring::digest::digest(&ring::digest::SHA256, &spki);
    assert_eq!(a.spki_sha256_bytes(), d.as_ref());
    assert!(a.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(a.chain_pem().matches("BEGIN CERTIFICATE").count(), 2);
    assert_eq!(a.chain().len(), 2);
    assert!(a.key_pem().starts_with("-----BEGIN PRIVATE KEY-----"));
    assert!(kit.root_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(kit.missing_intermediate().unwrap().chain().len(), 1);
}
