//! Requests to the production name reach the mock, under the production policy.

use std::time::Duration;

use serde_json::json;
use soulbase_net_core::{ErrorKind, NetClient, NetRequest, Phase};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::{testing::TestNet, Client};
use soulbase_net_testkit::{CertKit, FaultServer};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{client, dialled_to, production, received, shop_net};

#[tokio::test]
async fn the_production_name_reaches_wiremock_with_its_host_override() {
    let mock = MockServer::start().await;
    // Four 503s first, then the stock: only the override's five attempts get there.
    Mock::given(method("GET"))
        .and(path("/stock/sku-1"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(4)
        .with_priority(1)
        .expect(4)
        .mount(&mock)
        .await;
    Mock::given(method("GET"))
        .and(path("/stock/sku-1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"available": 7})))
        .expect(1)
        .mount(&mock)
        .await;
    let net = shop_net(&mock);
    let client = client(&net, &production());

    let res = client
        .send(NetRequest::get("http://api.shop.example/stock/sku-1"))
        .await
        .unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(
        res.attempts, 5,
        "the override's attempts, not the default 3"
    );
    let stock: serde_json::Value = res.json().await.unwrap();
    assert_eq!(stock["available"], 7);

    // Every attempt reached wiremock naming the production host.
    let seen = mock.received_requests().await.unwrap();
    assert_eq!(seen.len(), 5);
    assert!(seen
        .iter()
        .all(|r| r.headers.get("host").unwrap() == "api.shop.example"));
    // Every connection went to the mock, through the host's stand-in address.
    let stand_in = net.stand_in("api.shop.example").unwrap();
    let dials = net.dials();
    assert!(!dials.is_empty());
    for d in &dials {
        assert_eq!(d.addr.ip(), stand_in, "{d}");
        assert_eq!(d.addr.port(), 80, "{d}");
        assert_eq!(d.host.as_deref(), Some("api.shop.example"), "{d}");
        assert_eq!(d.to, Some(*mock.address()), "{d}");
    }
    mock.verify().await;
}

#[tokio::test]
async fn a_timeout_override_for_the_production_name_is_in_force() {
    let mock = MockServer::start().await;
    Mock::given(path("/slow"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(5)))
        .mount(&mock)
        .await;
    // Production says 1s for a first byte; the API's override says 150ms, two attempts.
    let doc = production()
        .merged_with_toml(
            r#"
            [overrides."api.shop.example"]
            retry.max_attempts = 2
            timeout = { connect = "300ms", ttfb = "150ms", read = "300ms", write = "300ms", attempt = "300ms", total = "2s" }
            "#,
        )
        .unwrap();
    let net = shop_net(&mock);
    let client = client(&net, &doc);

    let started = tokio::time::Instant::now();
    let err = client
        .send(NetRequest::get("http://api.shop.example/slow"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Ttfb), "{err}");
    assert_eq!(err.attempts(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(received(&mock).await, 2);
}

#[tokio::test]
async fn an_https_production_url_goes_through_a_tls_front() {
    let mock = MockServer::start().await;
    Mock::given(path("/stock/sku-1"))
        .respond_with(ResponseTemplate::new(200).set_body_string("7"))
        .expect(1)
        .mount(&mock)
        .await;
    // wiremock speaks plain HTTP: a TLS front with a certificate for the production name.
    let kit = CertKit::new().unwrap();
    let leaf = kit.leaf(&["api.shop.example"]).unwrap();
    let front = FaultServer::builder()
        .tls(leaf.server_config().unwrap())
        .forward_to(mock.uri())
        .start()
        .await
        .unwrap();
    let trust = json!({"default": {"tls": {"extra_roots_pem": [kit.root_pem()]}}});
    let doc = production().merged_with_value(&trust).unwrap();
    let net = TestNet::new().map("https://api.shop.example", front.addr());
    let client = client(&net, &doc);

    let res = client
        .send(NetRequest::get("https://api.shop.example/stock/sku-1"))
        .await
        .unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(res.text().await.unwrap(), "7");
    assert_eq!(dialled_to(&net), vec![Some(front.addr())]);
    mock.verify().await;

    // The same name over plain HTTP is another origin, which is not mapped.
    let err = client
        .send(NetRequest::get("http://api.shop.example/stock/sku-1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect, "{err}");
    assert_eq!(received(&mock).await, 1);
}

#[tokio::test]
async fn a_single_policy_is_patched_like_a_document() {
    let mock = MockServer::start().await;
    Mock::given(path("/ping"))
        .respond_with(ResponseTemplate::new(204))
        .expect(1)
        .mount(&mock)
        .await;
    let net = shop_net(&mock);
    let mut policy = NetPolicy::default();
    policy.security.allow_hosts = Some(vec!["api.shop.example".to_owned()]);
    let client = Client::builder()
        .policy(net.policy(policy).unwrap())
        .dialer(net.dialer())
        .build()
        .unwrap();
    let res = client
        .send(NetRequest::get("http://api.shop.example/ping"))
        .await
        .unwrap();
    assert_eq!(res.status, 204);
    mock.verify().await;
}
