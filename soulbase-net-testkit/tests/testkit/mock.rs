//! Mocks: matchers on method, query, headers and body, priorities, expectations verified on
//! demand and on drop, and the captured body as JSON.

use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::Bytes;
use http_body_util::Full;
use serde_json::json;
use soulbase_net_testkit::{FaultServer, Mock, Reply};

use crate::support::*;

/// Sends `method url` with `headers` and `body`; returns the status.
async fn send(c: &H1Client, method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> u16 {
    let mut b = req(method, url);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    let r = c
        .request(b.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .unwrap();
    r.status().as_u16()
}

/// The panic message of dropping `srv`, if dropping it panicked.
fn drop_panic(srv: FaultServer) -> Option<String> {
    let payload = catch_unwind(AssertUnwindSafe(|| drop(srv))).err()?;
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
}

#[tokio::test]
async fn mocks_match_on_method_query_headers_and_body() {
    let srv = FaultServer::http1()
        .mock(
            Mock::get("/search")
                .query("q", "red shoes")
                .respond(Reply::ok("shoes")),
        )
        .mock(
            Mock::post("/orders")
                .header("x-team", "pay")
                .body("raw")
                .respond(Reply::status(201)),
        )
        .mock(
            Mock::any("/any")
                .header_exists("x-trace")
                .respond(Reply::status(202)),
        )
        .start()
        .await
        .unwrap();
    let c = h1();
    assert_eq!(
        send(&c, "GET", &srv.url("/search?x=1&q=red+shoes"), &[], "").await,
        200
    );
    assert_eq!(
        send(&c, "GET", &srv.url("/search?q=red%20shoes"), &[], "").await,
        200
    );
    assert_eq!(
        send(&c, "GET", &srv.url("/search?q=blue"), &[], "").await,
        404
    );
    assert_eq!(send(&c, "GET", &srv.url("/search"), &[], "").await, 404);
    let pay = [("x-team", "pay")];
    assert_eq!(
        send(&c, "POST", &srv.url("/orders"), &pay, "raw").await,
        201
    );
    assert_eq!(
        send(&c, "POST", &srv.url("/orders"), &[("X-Team", "ops")], "raw").await,
        404
    );
    assert_eq!(
        send(&c, "POST", &srv.url("/orders"), &pay, "other").await,
        404
    );
    assert_eq!(send(&c, "PUT", &srv.url("/orders"), &pay, "raw").await, 404);
    assert_eq!(
        send(&c, "DELETE", &srv.url("/any"), &[("x-trace", "1")], "").await,
        202
    );
    assert_eq!(send(&c, "DELETE", &srv.url("/any"), &[], "").await, 404);
    let routes: Vec<_> = srv
        .received_requests()
        .iter()
        .map(|r| r.route().map(str::to_owned))
        .collect();
    assert_eq!(
        routes[0].as_deref(),
        Some("GET /search [query q=red shoes]")
    );
    assert_eq!(routes[2], None);
    assert_eq!(srv.received_requests().len(), 10);
    srv.verify().unwrap(); // no expectations: nothing to fail
}

#[tokio::test]
async fn json_bodies_match_whatever_spacing_and_key_order_and_closures_match_too() {
    let srv = FaultServer::http1()
        .mock(
            Mock::post("/orders")
                .json_body(json!({"sku": "a1", "qty": 2}))
                .respond(Reply::status(201)),
        )
        .mock(
            Mock::post("/big")
                .matching("body over 10 bytes", |r| r.body.len() > 10)
                .respond(Reply::status(413)),
        )
        .start()
        .await
        .unwrap();
    let c = h1();
    let url = srv.url("/orders");
    assert_eq!(
        send(&c, "POST", &url, &[], r#"{ "qty": 2,  "sku": "a1" }"#).await,
        201
    );
    assert_eq!(
        send(&c, "POST", &url, &[], r#"{"qty": 3, "sku": "a1"}"#).await,
        404
    );
    assert_eq!(send(&c, "POST", &url, &[], "not json").await, 404);
    assert_eq!(
        send(&c, "POST", &srv.url("/big"), &[], "0123456789ab").await,
        413
    );
    assert_eq!(send(&c, "POST", &srv.url("/big"), &[], "small").await, 404);
}

#[tokio::test]
async fn the_lowest_priority_number_answers_then_method_specific_then_first_added() {
    let srv = FaultServer::http1()
        // Plain routes keep working, at priority 5.
        .route("/orders", Reply::status(200))
        .mock(Mock::post("/orders").respond(Reply::status(400)))
        .mock(
            Mock::post("/orders")
                .header("x-team", "pay")
                .priority(1)
                .respond(Reply::status(201)),
        )
        .mock(Mock::post("/orders").respond(Reply::status(409)))
        .start()
        .await
        .unwrap();
    let c = h1();
    let url = srv.url("/orders");
    assert_eq!(send(&c, "POST", &url, &[("x-team", "pay")], "").await, 201);
    assert_eq!(send(&c, "POST", &url, &[], "").await, 400);
    assert_eq!(send(&c, "GET", &url, &[], "").await, 200);
    assert_eq!(srv.hits("/orders"), 3);
}

#[tokio::test]
async fn verify_names_the_mock_what_it_expected_what_came_and_the_unmatched_requests() {
    let srv = FaultServer::http1()
        .mock(
            Mock::post("/orders")
                .header("x-team", "pay")
                .respond(Reply::status(201))
                .expect(1),
        )
        .mock(Mock::get("/health").expect(1..=2).named("health probe"))
        .mock(Mock::get("/stock").expect(1..))
        .start()
        .await
        .unwrap();
    let c = h1();
    for _ in 0..3 {
        assert_eq!(send(&c, "GET", &srv.url("/health"), &[], "").await, 200);
    }
    assert_eq!(send(&c, "GET", &srv.url("/stock"), &[], "").await, 200);
    assert_eq!(
        send(
            &c,
            "POST",
            &srv.url("/orders"),
            &[("x-team", "ops")],
            "{\"sku\":1}"
        )
        .await,
        404
    );
    let err = srv.verify().unwrap_err();
    assert_eq!(
        err.failed_routes(),
        ["POST /orders [header x-team: pay]", "health probe"]
    );
    let msg = err.to_string();
    assert!(
        msg.contains(
            "mock `POST /orders [header x-team: pay]`: expected exactly 1 matching request, got 0"
        ),
        "{msg}"
    );
    assert!(
        msg.contains("mock `health probe`: expected between 1 and 2 matching requests, got 3"),
        "{msg}"
    );
    assert!(!msg.contains("/stock"), "{msg}");
    assert!(
        msg.contains("Requests that matched no route:\n1. POST /orders"),
        "{msg}"
    );
    assert!(
        msg.contains("x-team: ops") && msg.contains("body: {\"sku\":1}"),
        "{msg}"
    );
    // The same message when the server is dropped.
    assert_eq!(drop_panic(srv).as_deref(), Some(msg.as_str()));
}

#[tokio::test]
async fn met_expectations_pass_on_verify_and_on_drop() {
    let srv = FaultServer::http1()
        .mock(Mock::get("/a").expect(2))
        .mock(Mock::get("/b").expect(..=1))
        .mock(Mock::get("/c").expect(0))
        .start()
        .await
        .unwrap();
    let c = h1();
    assert_eq!(send(&c, "GET", &srv.url("/a"), &[], "").await, 200);
    assert!(srv.verify().is_err(), "one of two requests so far");
    assert_eq!(send(&c, "GET", &srv.url("/a"), &[], "").await, 200);
    srv.verify().unwrap();
    assert_eq!(drop_panic(srv), None);
}

#[tokio::test]
async fn a_server_dropped_while_panicking_does_not_panic_again() {
    let srv = FaultServer::http1()
        .mock(Mock::get("/never").expect(1))
        .start()
        .await
        .unwrap();
    let payload = catch_unwind(AssertUnwindSafe(move || {
        let _srv = srv;
        std::panic::panic_any("the test's own failure");
    }))
    .unwrap_err();
    // The test's own panic comes through, not the failed expectation (nor an abort).
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"the test's own failure")
    );
}

#[tokio::test]
async fn captured_bodies_parse_as_json_and_bad_json_names_the_route() {
    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Order {
        sku: String,
        qty: u32,
    }
    let srv = FaultServer::http1()
        .mock(
            Mock::post("/orders")
                .named("create order")
                .respond(Reply::status(201)),
        )
        .start()
        .await
        .unwrap();
    let c = h1();
    assert_eq!(
        send(
            &c,
            "POST",
            &srv.url("/orders"),
            &[],
            r#"{"sku":"a1","qty":2}"#
        )
        .await,
        201
    );
    assert_eq!(
        send(&c, "POST", &srv.url("/orders"), &[], "qty=2").await,
        201
    );
    assert_eq!(send(&c, "POST", &srv.url("/nowhere"), &[], "{").await, 404);
    let got = srv.requests("/orders");
    assert_eq!(
        got[0].json::<Order>().unwrap(),
        Order {
            sku: "a1".into(),
            qty: 2
        }
    );
    assert_eq!(got[0].body_json().unwrap(), json!({"sku": "a1", "qty": 2}));
    assert_eq!(got[0].route(), Some("create order"));
    let err = got[1].json::<Order>().unwrap_err();
    assert_eq!(err.route(), "create order");
    assert_eq!(
        err.to_string(),
        "body of POST /orders (route `create order`) is not the expected JSON"
    );
    assert!(std::error::Error::source(&err).is_some());
    let err = srv.requests("/nowhere")[0].body_json().unwrap_err();
    assert_eq!(
        err.to_string(),
        "body of POST /nowhere (route `no route (fallback)`) is not the expected JSON"
    );
    // to_json describes the whole request, the body among the rest.
    assert_eq!(got[0].to_json()["path"], "/orders");
    assert_eq!(got[0].to_json()["body"], r#"{"sku":"a1","qty":2}"#);
}

#[tokio::test]
async fn mocks_match_and_verify_over_http2_too() {
    let srv = FaultServer::http2()
        .mock(
            Mock::put("/items/1")
                .header("x-team", "pay")
                .json_body(json!([1, 2]))
                .expect(1),
        )
        .start()
        .await
        .unwrap();
    let c = h2c();
    let url = srv.url("/items/1");
    assert_eq!(
        send(&c, "PUT", &url, &[("x-team", "pay")], "[1,2]").await,
        200
    );
    assert_eq!(
        send(&c, "PUT", &url, &[("x-team", "pay")], "[2,1]").await,
        404
    );
    srv.verify().unwrap();
    assert_eq!(srv.received_requests()[1].version, http::Version::HTTP_2);
    assert_eq!(drop_panic(srv), None);
}
