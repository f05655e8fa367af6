//! Proxies through the client, plain and TLS (`https://`): CONNECT tunnels with credentials,
//! absolute-form forwarding, 407, no_proxy, proxy faults, an untrusted proxy certificate, and
//! the guard still applied to literal targets.

use std::net::IpAddr;

use soulbase_net_core::{ErrorCode, ErrorKind, NetRequest};
use soulbase_net_policy::{NetPolicy, ProxyPolicy, ProxyResolve};
use soulbase_net_testkit::{
    CertKit, ConnectProxy, FaultServer, MockDns, ProxyFault, ProxyOutcome, Reply,
};

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
        assert_eq!(h.dialer.dialled(), vec![proxy.addr()]);
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
    assert_eq!(h.dialer.dialled(), vec![srv.addr()]);
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
    assert!(h.dialer.dialled().is_empty());
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

/// `via(proxy)` with names resolved by `dns` and, when `local`, by the client.
fn via_resolving(
    proxy: &ConnectProxy,
    creds: Option<&str>,
    dns: &MockDns,
    local: bool,
) -> NetPolicy {
    let mut p = via(proxy, creds);
    p.dns.nameservers = vec![dns.addr()];
    p.dns.prefetch.clear();
    if let Some(pp) = p.proxy.as_mut() {
        pp.resolve = if local {
            ProxyResolve::Local
        } else {
            ProxyResolve::Proxy
        };
    }
    p
}

#[tokio::test]
async fn a_name_resolving_to_a_private_address_never_reaches_the_proxy_when_resolved_locally() {
    let dns = MockDns::start().await.unwrap();
    dns.set_ips("internal.test", &[IpAddr::from([10, 0, 0, 1])], 60);
    for local in [false, true] {
        let proxy = ConnectProxy::builder().start().await.unwrap();
        let h = harness(via_resolving(&proxy, None, &dns, local));
        for url in ["http://internal.test:8080/", "https://internal.test:8443/"] {
            let result = h.client.send(NetRequest::get(url)).await;
            let asked: Vec<String> = proxy.requests().into_iter().map(|r| r.target).collect();
            if local {
                // Resolved here, guarded here: refused before the proxy was dialled.
                let err = result.unwrap_err();
                assert_eq!(err.kind(), ErrorKind::Blocked, "{url}: {err}");
                assert_eq!(err.code(), ErrorCode::AuthForbidden);
                assert!(asked.is_empty(), "{asked:?}");
                assert_eq!(proxy.connections(), 0);
            } else {
                // The proxy resolves: the client could not see the address and asked for the
                // name (this proxy refuses non-loopback targets itself: a 502 to an
                // absolute-form request, a refused CONNECT).
                match result {
                    Ok(res) => assert_eq!(res.status, 502, "{url}"),
                    Err(e) => assert_eq!(e.kind(), ErrorKind::Proxy, "{url}: {e}"),
                }
                assert!(
                    asked.iter().any(|t| t.contains("internal.test")),
                    "{asked:?}"
                );
            }
        }
        assert!(h.dialer.off_loopback().is_empty());
    }
}

#[tokio::test]
async fn local_resolution_sends_the_proxy_the_checked_address_and_keeps_the_name() {
    let kit = CertKit::new().unwrap();
    let plain = FaultServer::http1()
        .route("/x", Reply::echo())
        .start()
        .await
        .unwrap();
    let tls = FaultServer::builder()
        .tls(kit.leaf(&["svc.test"]).unwrap().server_config().unwrap())
        .route("/x", Reply::echo())
        .start()
        .await
        .unwrap();
    let dns = MockDns::start().await.unwrap();
    dns.set_ips("svc.test", &[IpAddr::from([127, 0, 0, 1])], 60);
    let proxy = ConnectProxy::builder()
        .basic_auth("u", "pw")
        .start()
        .await
        .unwrap();
    let h = harness_with(via_resolving(&proxy, Some("u:pw"), &dns, true), |b| {
        b.add_root_certificate(kit.root_der())
    });
    for srv in [&plain, &tls] {
        let port = srv.addr().port();
        let scheme = if std::ptr::eq(srv, &tls) {
            "https"
        } else {
            "http"
        };
        let url = format!("{scheme}://svc.test:{port}/x");
        let res = h.client.send(NetRequest::get(url.as_str())).await.unwrap();
        assert_eq!(res.status, 200, "{url}");
        // The proxy was asked for the address the client checked, in a tunnel, with its
        // credentials on the CONNECT; the origin saw the name and no proxy credentials.
        let last = proxy.requests().pop().unwrap();
        assert_eq!(
            (last.method.as_str(), last.target.as_str()),
            ("CONNECT", format!("127.0.0.1:{port}").as_str()),
            "{url}"
        );
        assert!(last.authorized);
        let seen = srv.requests("/x");
        // HTTP/1.1 says it in Host, HTTP/2 (over TLS here) in the authority.
        let authority = seen[0]
            .header("host")
            .map(str::to_owned)
            .or_else(|| seen[0].uri.authority().map(ToString::to_string));
        assert_eq!(authority, Some(format!("svc.test:{port}")), "{url}");
        assert_eq!(seen[0].header("proxy-authorization"), None);
    }
    plain.join().await;
    tls.join().await;
}
