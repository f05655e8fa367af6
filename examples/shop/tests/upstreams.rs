//! The shop against its upstreams on the testkit: production's policy file, patched by
//! `TestNet` for loopback, with the production names resolved by MockDns and served over TLS.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use serde_json::json;
use shop::{Order, Price, Shop};
use soulbase_net::prelude::*;
use soulbase_net_testkit::{FaultServer, FaultServerBuilder, Leaf, Mock, Reply, Script, TestNet};

const PRICING: &str = "pricing.example.com";
const ORDERS: &str = "orders.example.com";
/// The one line a test adds on top of the patch: short waits between retries.
const FAST_BACKOFF: &str = "[default]\nretry.backoff.base = \"1ms\"";

/// The shop on production's policy plus the patch, calling `pricing` and `orders`.
fn shop(net: &TestNet, pricing: &str, orders: &str) -> Shop {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/policy.toml");
    let doc = PolicyDocument::from_path(path).unwrap();
    let doc = doc.merged_with_toml(&net.policy_patch()).unwrap();
    let doc = doc.merged_with_toml(FAST_BACKOFF).unwrap();
    Shop::new(doc, pricing, orders).unwrap()
}

/// Serves `host` (resolved by the MockDns to loopback) over TLS with `leaf`; its base URL.
async fn serve(
    net: &TestNet,
    host: &str,
    leaf: Leaf,
    srv: FaultServerBuilder,
) -> (FaultServer, String) {
    net.dns().set_ips(host, &["127.0.0.1".parse().unwrap()], 60);
    let srv = srv
        .tls(leaf.server_config().unwrap())
        .start()
        .await
        .unwrap();
    let base = format!("https://{host}:{}", srv.addr().port());
    (srv, base)
}

async fn upstream(net: &TestNet, host: &str, srv: FaultServerBuilder) -> (FaultServer, String) {
    serve(net, host, net.certs().leaf(&[host]).unwrap(), srv).await
}

/// The pricing API answering `/prices/sku-1` by `route`, and a shop calling it.
async fn pricing_by(net: &TestNet, route: impl Into<Script>) -> (FaultServer, Shop) {
    let srv = FaultServer::builder().route("/prices/sku-1", route);
    let (pricing, base) = upstream(net, PRICING, srv).await;
    (pricing, shop(net, &base, "https://orders.example.com"))
}

fn price_json(cents: u64) -> Reply {
    Reply::json(&json!({"sku": "sku-1", "cents": cents}))
}

fn created(order_ref: &str) -> Reply {
    Reply::status(201)
        .header("content-type", "application/json")
        .body(json!({"order_ref": order_ref}).to_string())
}

fn order(id: &str) -> Order {
    Order {
        id: id.to_owned(),
        sku: "sku-1".to_owned(),
        qty: 2,
    }
}

#[tokio::test]
async fn pricing_503_twice_then_200_is_retried() {
    let net = TestNet::new().await.unwrap();
    let flaky = Script::status(503).times(2).then(price_json(1250));
    let mock = Mock::get("/prices/sku-1").respond(flaky).expect(3);
    let (pricing, base) = upstream(&net, PRICING, FaultServer::builder().mock(mock)).await;
    let shop = shop(&net, &base, "https://orders.example.com");

    let price = shop.price("sku-1").await.unwrap();
    assert_eq!(
        price,
        Price {
            sku: "sku-1".to_owned(),
            cents: 1250
        }
    );
    pricing.verify().unwrap();
    assert!(net.dns().query_count(PRICING) >= 1);
    let metrics = shop.metrics_text();
    assert!(
        metrics.contains("net_retry_total{reason=\"status_5xx\"} 2\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_connection_reset_is_retried_on_a_new_connection() {
    let net = TestNet::new().await.unwrap();
    let route = Script::reply(Reply::reset()).times(1).then(price_json(990));
    let (pricing, shop) = pricing_by(&net, route).await;

    assert_eq!(shop.price("sku-1").await.unwrap().cents, 990);
    assert_eq!(pricing.hits("/prices/sku-1"), 2);
    assert_eq!(pricing.connections(), 2);
}

#[tokio::test]
async fn a_slow_first_byte_times_out_per_attempt() {
    let net = TestNet::new().await.unwrap();
    let slow = price_json(1).delay(Duration::from_secs(3));
    let (pricing, shop) = pricing_by(&net, slow).await;

    let started = tokio::time::Instant::now();
    let err = shop.price("sku-1").await.unwrap_err();
    // Production's pricing override: three attempts of a 300 ms first byte each.
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(err.code(), ErrorCode::ProviderTimeout);
    assert_eq!(err.attempts(), 3);
    assert_eq!(pricing.hits("/prices/sku-1"), 3);
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn tls_names_come_from_mockdns_and_certs_from_the_certkit() {
    let net = TestNet::new().await.unwrap();
    let good = FaultServer::builder().route("/prices/sku-1", price_json(500));
    let (real, base) = upstream(&net, PRICING, good).await;
    assert_eq!(
        shop(&net, &base, "").price("sku-1").await.unwrap().cents,
        500
    );
    assert_eq!(real.hits("/prices/sku-1"), 1);
    assert!(net.dns().query_count(PRICING) >= 1);

    // The same name served with a certificate for another host: refused in the handshake.
    let impostor = FaultServer::builder().route("/prices/sku-1", price_json(1));
    let (fake, base) = serve(&net, PRICING, net.certs().wrong_host().unwrap(), impostor).await;
    let err = shop(&net, &base, "").price("sku-1").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TlsVerify);
    assert_eq!(err.code(), ErrorCode::AuthForbidden);
    assert_eq!(fake.hits("/prices/sku-1"), 0);
}

#[tokio::test]
async fn the_allow_list_refuses_a_host_not_granted() {
    let net = TestNet::new().await.unwrap();
    let tracker = FaultServer::builder().route("/prices/sku-1", price_json(1));
    let (srv, base) = upstream(&net, "tracker.example.net", tracker).await;
    let shop = shop(&net, &base, "");

    let err = shop.price("sku-1").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked);
    assert_eq!(err.code(), ErrorCode::AuthForbidden);
    assert_eq!(srv.total_hits(), 0);
    assert_eq!(net.dns().query_count("tracker.example.net"), 0);
}

#[tokio::test]
async fn an_order_keeps_its_idempotency_key_across_retries() {
    let net = TestNet::new().await.unwrap();
    let mock = Mock::post("/orders")
        .header("idempotency-key", "ord-7")
        .json_body(json!({"id": "ord-7", "sku": "sku-1", "qty": 2}))
        .respond(Script::status(503).times(2).then(created("R-1")))
        .expect(3);
    let (orders, base) = upstream(&net, ORDERS, FaultServer::builder().mock(mock)).await;
    let shop = shop(&net, "", &base);

    let receipt = shop.place_order("retail", &order("ord-7")).await.unwrap();
    assert_eq!(receipt.order_ref, "R-1");
    orders.verify().unwrap();
    let keys: Vec<_> = orders
        .requests("/orders")
        .iter()
        .map(|r| r.header("idempotency-key").map(str::to_owned))
        .collect();
    assert_eq!(keys, vec![Some("ord-7".to_owned()); 3]);
}

#[tokio::test]
async fn the_wholesale_tenant_gets_one_attempt_per_order() {
    let net = TestNet::new().await.unwrap();
    let script = Script::status(503)
        .times(2)
        .then(created("R-2"))
        .times(1)
        .then(Reply::status(503));
    let (orders, base) = upstream(
        &net,
        ORDERS,
        FaultServer::builder().route("/orders", script),
    )
    .await;
    let shop = shop(&net, "", &base);

    // Retail: production's three attempts, the third answered.
    assert_eq!(
        shop.place_order("retail", &order("r-1"))
            .await
            .unwrap()
            .order_ref,
        "R-2"
    );
    assert_eq!(orders.hits("/orders"), 3);
    // Wholesale: the tenant's override, one attempt, and the 503 is the answer.
    let err = shop
        .place_order("wholesale", &order("w-1"))
        .await
        .unwrap_err();
    assert_eq!(err.status_code().map(|s| s.as_u16()), Some(503), "{err:?}");
    assert_eq!(orders.hits("/orders"), 4);
}

#[tokio::test]
async fn the_breaker_opens_on_a_failing_orders_api() {
    let net = TestNet::new().await.unwrap();
    let failing = Mock::post("/orders").respond(Reply::status(500)).expect(3);
    let (orders, base) = upstream(&net, ORDERS, FaultServer::builder().mock(failing)).await;
    let shop = shop(&net, "", &base);

    // One attempt each (wholesale), three failures in a row: production's threshold.
    for i in 0..3 {
        let err = shop
            .place_order("wholesale", &order(&format!("w-{i}")))
            .await
            .unwrap_err();
        assert_eq!(err.status_code().map(|s| s.as_u16()), Some(500));
    }
    let err = shop
        .place_order("wholesale", &order("w-3"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    orders.verify().unwrap(); // the fourth order never reached the API
    let metrics = shop.metrics_text();
    // The circuit is the origin's (scheme, host and port): the label names host and port.
    let authority = base.trim_start_matches("https://").trim_end_matches('/');
    assert!(authority.starts_with("orders.example.com:"), "{base}");
    assert!(
        metrics.contains(&format!(
            "net_circuit_open_total{{host=\"{authority}\"}} 1\n"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("tenant=\"wholesale\",host=\"orders.example.com\",method=\"POST\",scheme=\"https\",outcome=\"circuit_open\",version=\"\"} 1\n"), "{metrics}");
}
