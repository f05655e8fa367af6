//! Proxies through the client, plain and TLS (`https://`): CONNECT tunnels with credentials,
//! absolute-form forwarding, 407, no_proxy, proxy faults, an untrusted proxy certificate, and
//! the guard still applied to literal targets.

use soulbase_net_core::{ErrorCode, ErrorKind, NetClient, NetRequest};
use soulbase_net_policy::{NetPolicy, ProxyPolicy};
use soulbase_net_testkit::{CertKit, ConnectProxy, FaultServer, ProxyFault, ProxyOutcome, Reply};

use crate::support::{harness, harness_with, loopback_policy};

/// A policy whose proxy (for both schemes) is `proxy`, `http://` or `https://`, with
/// `creds` in its URL.
fn via(proxy: &ConnectProxy, creds: Option<&str>) -> NetPolicy {
    let url = match creds {
        Some(c) => proxy.url().replacen("://", &format!("://{c}@"), 1),
        None => proxy.url(),
    };
    let mut pp = ProxyPolicy::default();
    pp.http_proxy = Some(url.clone());
    pp.https_proxy = Some(url);
    let mut p = loopback_policy();
    p.proxy = Some(pp);
    p
}

/// A proxy requiring `u:pw`, speaking TLS (a `kit` leaf) when `tls`: an `https://` proxy.
async fn authenticated_proxy(kit: &CertKit, tls: bool) -> ConnectProxy {
    let mut builder = ConnectProxy::builder().basic_auth("u", "pw");
    if tls {
        builder = builder.tls(kit.localhost().unwrap().server_config().unwrap());
    }
    builder.start().await.unwrap()
}

#[tokio::test]
async fn https_goes_through_an_authenticated_connect_tunnel() {
    let kit = CertKit::new().unwrap();
    // A plain proxy, then a TLS one (the target's TLS then runs inside the proxy's).
    for tls in [false, true] {
        let srv = FaultServer::builder()
            .tls(kit.localhost().unwrap().server_config().unwrap())
            .route("/t", Reply::echo())
            .start()
            .await
            .unwrap();
        let proxy = authenticated_proxy(&kit, tls).await;
        assert_eq!(proxy.url().starts_with("https://"), tls);
        let h = harness_with(via(&proxy, Some("u:pw")), |b| {
            b.add_root_certificate(kit.root_der())
        });
        let res = h.client.send(NetRequest::get(srv.url("/t"))).await.unwrap();
        assert_eq!(res.status, 200, "tls proxy {tls}");
        let log = proxy.requests();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].method, "CONNECT");
        assert_eq!(log[0].target, format!("127.0.0.1:{}", srv.addr().port()));
        assert!(log[0].authorized);
        assert_eq!(log[0].outcome, ProxyOutcome::Tunneled);
        // The target's TLS negotiated HTTP/2 by itself, through the tunnel.
        let seen = srv.requests("/t");
        assert_eq!(seen[0].version, http::Version::HTTP_2);
        assert_eq!(seen[0].header("proxy-authorization"), None);
        // Only the proxy was dialled.
        assert_eq!(*h.dialer.dialled.lock(), vec![proxy.addr()]);
        srv.join().await;
    }
}

#[tokio::test]
async fn http_is_forwarded_in_absolute_form_with_proxy_credentials() {
    let kit = CertKit::new().unwrap();
    // A plain proxy, then a TLS one (trusted here through the policy's extra roots).
    for tls in [false, true] {
        let srv = FaultServer::http1()
            .route("/f", Reply::echo())
            .start()
            .await
            .unwrap();
        let proxy = authenticated_proxy(&kit, tls).await;
        let mut p = via(&proxy, Some("u:pw"));
        p.tls.extra_roots_pem = vec![kit.root_pem()];
        let h = harness(p);
        for _ in 0..2 {
            let res = h.client.send(NetRequest::get(srv.url("/f"))).await.unwrap();
            assert_eq!(res.status, 200, "tls proxy {tls}");
            res.bytes().await.unwrap();
        }
        let log = proxy.requests();
        assert_eq!(log[0].method, "GET");
        assert_eq!(log[0].target, srv.url("/f"));
        assert!(log[0].authorized);
        assert_eq!(log[0].outcome, ProxyOutcome::Forwarded);
        // The proxy consumed its credentials; the second request reused the connection.
        assert_eq!(srv.requests("/f")[0].header("proxy-authorization"), None);
        assert_eq!(srv.hits("/f"), 2);
        assert_eq!(proxy.connections(), 1);
        srv.join().await;
    }
}

#[tokio::test]
async fn missing_credentials_get_407_as_a_proxy_error() {
    let kit = CertKit::new().unwrap();
    let srv = FaultServer::builder()
        .tls(kit.localhost().unwrap().server_config().unwrap())
        .route("/t", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    let proxy = ConnectProxy::builder()
        .basic_auth("u", "pw")
        .start()
        .await
        .unwrap();
    let h = harness_with(via(&proxy, None), |b| {
        b.add_root_certificate(kit.root_der())
    });
    let err = h
        .client
        .send(NetRequest::get(srv.url("/t")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Proxy);
    assert_eq!(err.code(), ErrorCode::ProviderUnavailable);
    assert!(err.to_string().contains("407"), "{err}");
    assert_eq!(proxy.requests()[0].outcome, ProxyOutcome::AuthRequired);
    assert_eq!(srv.hits("/t"), 0);
    srv.join().await;
}

#[tokio::test]
async fn no_proxy_goes_direct() {
    let srv = FaultServer::http1()
        .route("/d", Reply::ok("direct"))
        .start()
        .await
        .unwrap();
    let proxy = ConnectProxy::builder().start().await.unwrap();
    let mut p = via(&proxy, None);
    if let Some(pp) = p.proxy.as_mut() {
        pp.no_proxy = vec!["127.0.0.1".to_owned()];
    }
    let h = harness(p);
    let res = h.client.send(NetRequest::get(srv.url("/d"))).await.unwrap();
    assert_eq!(res.text().await.unwrap(), "direct");
    assert!(proxy.requests().is_empty());
    assert_eq!(*h.dialer.dialled.lock(), vec![srv.addr()]);
    srv.join().await;
}

#[tokio::test]
async fn proxy_faults_are_proxy_errors_and_literals_are_still_guarded() {
    let srv = FaultServer::http1()
        .route("/x", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    let refusing = ConnectProxy::builder()
        .fault(ProxyFault::Refuse)
        .start()
        .await
        .unwrap();
    let kit = CertKit::new().unwrap();
    let h = harness_with(via(&refusing, None), |b| {
        b.add_root_certificate(kit.root_der())
    });
    let err = h
        .client
        .send(NetRequest::get(format!(
            "https://127.0.0.1:{}/x",
            srv.addr().port()
        )))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Proxy, "{err}");

    // Through a proxy, a literal private target is refused locally, before the proxy hears of it.
    let proxy = ConnectProxy::builder().start().await.unwrap();
    let mut p = via(&proxy, None);
    p.security.grants.cidrs.clear();
    let h = harness(p);
    let err = h
        .client
        .send(NetRequest::get("http://10.0.0.1/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked);
    let err = h
        .client
        .send(NetRequest::get("http://169.254.169.254/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked);
    assert!(proxy.requests().is_empty());
    assert!(h.dialer.dialled.lock().is_empty());
    srv.join().await;
}

#[tokio::test]
async fn a_tls_proxy_with_an_untrusted_certificate_is_a_proxy_error() {
    let kit = CertKit::new().unwrap();
    let stranger = CertKit::new().unwrap();
    let srv = FaultServer::builder()
        .tls(kit.localhost().unwrap().server_config().unwrap())
        .route("/t", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    // The target is trusted; the proxy's certificate comes from another, unknown root.
    let proxy = ConnectProxy::builder()
        .tls(stranger.localhost().unwrap().server_config().unwrap())
        .start()
        .await
        .unwrap();
    let h = harness_with(via(&proxy, Some("u:pw")), |b| {
        b.add_root_certificate(kit.root_der())
    });
    let err = h
        .client
        .send(NetRequest::get(srv.url("/t")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Proxy);
    assert_eq!(err.code(), ErrorCode::ProviderUnavailable);
    assert!(
        err.to_string().contains("tls handshake with the proxy"),
        "{err}"
    );
    // The cause stays in the chain: a certificate the client does not trust.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    let mut verify = false;
    while let Some(e) = cause {
        verify |= soulbase_net_runtime::tls::classify_error(e) == Some(ErrorKind::TlsVerify);
        cause = e.source();
    }
    assert!(verify, "{err:?}");
    // Nothing was asked of the proxy and nothing reached the target.
    assert!(proxy.requests().is_empty());
    assert_eq!(srv.hits("/t"), 0);
    srv.join().await;
}
