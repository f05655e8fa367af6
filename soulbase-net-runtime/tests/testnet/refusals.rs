//! What is not mapped never leaves the machine: names outside the allow-list, allowed names
//! without a mapping, ports without a mapping, and loopback itself outside the mappings.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use soulbase_net_core::{ErrorKind, NetClient, NetRequest};
use soulbase_net_policy::PolicyDocument;
use soulbase_net_testkit::MockDns;
use tokio::time::Instant;
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{client, production, received, shop_net};

/// Production, with a second host (the CDN) on the allow-list that the tests do not map.
fn with_cdn_allowed() -> PolicyDocument {
    production()
        .merged_with_toml(
            r#"
            [default]
            security.allow_hosts = ["api.shop.example", "cdn.shop.example"]
            "#,
        )
        .unwrap()
}

async fn any_ok() -> MockServer {
    let mock = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&mock)
        .await;
    mock
}

#[tokio::test]
async fn a_name_off_the_allow_list_is_blocked_before_any_lookup_or_dial() {
    let mock = any_ok().await;
    let dns = MockDns::start().await.unwrap();
    let net = shop_net(&mock).name_server(dns.addr());
    let client = client(&net, &production());

    let err = client
        .send(NetRequest::get("http://tracker.example.net/pixel"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked, "{err}");
    assert_eq!(dns.query_count("tracker.example.net"), 0);
    assert!(net.dials().is_empty(), "{:?}", net.dials());
    assert_eq!(received(&mock).await, 0);
}

#[tokio::test]
async fn an_allowed_name_without_a_mapping_fails_at_once_without_dns() {
    let mock = any_ok().await;
    let net = shop_net(&mock);
    // Without production's sandbox interceptor (whose allow-list names the API only), so
    // that the request gets as far as name resolution.
    let client = net
        .client_builder(&with_cdn_allowed())
        .unwrap()
        .build()
        .unwrap();

    let started = Instant::now();
    let err = client
        .send(NetRequest::get("http://cdn.shop.example/logo.png"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Dns, "{err}");
    // No name server to wait for: the default one refuses at once.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(net.dials().is_empty(), "{:?}", net.dials());
    assert_eq!(received(&mock).await, 0);
}

#[tokio::test]
async fn unmapped_names_are_asked_of_the_given_name_server_only() {
    let mock = any_ok().await;
    let dns = MockDns::start().await.unwrap();
    let net = shop_net(&mock).name_server(dns.addr());
    let client = net
        .client_builder(&with_cdn_allowed())
        .unwrap()
        .build()
        .unwrap();

    // The mapped name is never looked up.
    let res = client
        .send(NetRequest::get("http://api.shop.example/"))
        .await
        .unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(dns.query_count("api.shop.example"), 0);

    // An unknown name: the MockDns is asked, and says no.
    let err = client
        .send(NetRequest::get("http://cdn.shop.example/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Dns, "{err}");
    assert!(dns.query_count("cdn.shop.example") >= 1);

    // A name the MockDns answers with a public address: the guard lets it through, and the
    // dialer refuses it, since it is off loopback.
    let public = IpAddr::from([93, 184, 215, 14]);
    dns.set_ips("cdn.shop.example", &[public], 60);
    let err = client
        .send(NetRequest::get("http://cdn.shop.example/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect, "{err}");
    let refused: Vec<_> = net.dials().into_iter().filter(|d| d.to.is_none()).collect();
    assert!(!refused.is_empty());
    assert!(refused
        .iter()
        .all(|d| d.addr == SocketAddr::new(public, 80) && d.host.is_none()));
    assert_eq!(received(&mock).await, 1);
}

#[tokio::test]
async fn a_port_without_a_mapping_is_refused_not_dialled() {
    let mock = any_ok().await;
    let net = shop_net(&mock); // http:// only, port 80
    let client = client(&net, &production());

    for url in ["https://api.shop.example/", "http://api.shop.example:8080/"] {
        let err = client.send(NetRequest::get(url)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Connect, "{url}: {err}");
    }
    let dials = net.dials();
    assert!(!dials.is_empty());
    for d in &dials {
        assert_eq!(d.host.as_deref(), Some("api.shop.example"), "{d}");
        assert_eq!(d.to, None, "{d}");
    }
    assert_eq!(received(&mock).await, 0);
}

#[tokio::test]
async fn loopback_is_granted_for_the_mapping_only() {
    let mock = any_ok().await;
    let net = shop_net(&mock);
    // No allow-list here, so that only the address guard stands in the way.
    let client = net
        .client_builder(&PolicyDocument::new())
        .unwrap()
        .build()
        .unwrap();

    let res = client
        .send(NetRequest::get("http://api.shop.example/"))
        .await
        .unwrap();
    assert_eq!(res.status, 200);

    // The mock's own address as a literal, and `localhost`: loopback, not granted.
    let err = client
        .send(NetRequest::get(format!("http://{}/", mock.address())))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked, "{err}");
    let err = client
        .send(NetRequest::get("http://localhost/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked, "{err}");
    assert_eq!(net.dials().len(), 1, "{:?}", net.dials());
    assert_eq!(received(&mock).await, 1);
}
