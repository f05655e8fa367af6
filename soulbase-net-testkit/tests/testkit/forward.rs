//! FaultServer in front of an upstream (`forward_to`): requests and answers pass through
//! intact, and the server's faults apply around them — against a wiremock `MockServer` (its
//! matchers and expectations kept) and against another FaultServer (which shows exactly what
//! reached it).

use std::time::Duration;

use bytes::Bytes;
use http::{StatusCode, Version};
use http_body_util::Full;
use soulbase_net_testkit::{refused_addr, CertKit, FaultServer, Reply, Script};
use tokio::time::{timeout, Instant};
use wiremock::matchers::{body_string, header, method, path, path_regex, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::*;

/// A wiremock server answering GETs of `p` with `body`, expecting `expect` of them.
async fn mock_get(p: &str, body: &str, expect: u64) -> MockServer {
    let mock = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(p))
        .respond_with(ResponseTemplate::new(200).set_body_string(body))
        .expect(expect)
        .mount(&mock)
        .await;
    mock
}

#[tokio::test]
async fn passes_method_path_query_headers_and_body_both_ways() {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/orders"))
        .and(query_param("dry", "1"))
        .and(header("x-caller", "orders"))
        .and(body_string("{\"sku\":1}"))
        .respond_with(
            ResponseTemplate::new(201)
                .insert_header("x-order", "o-7")
                .set_body_string("created"),
        )
        .expect(1)
        .mount(&mock)
        .await;
    let front = FaultServer::http1()
        .forward_to(mock.uri())
        .start()
        .await
        .unwrap();

    let req = req("POST", &front.url("/orders?dry=1"))
        .header("x-caller", "orders")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "dropped")
        .body(Full::new(Bytes::from_static(b"{\"sku\":1}")))
        .unwrap();
    let res = h1().request(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.headers()["x-order"], "o-7");
    assert_eq!(body(res).await.unwrap(), "created");

    // The front counted it too; wiremock saw one request, without the hop-by-hop headers,
    // and with its own Host.
    assert_eq!(front.hits("/orders"), 1);
    let seen = mock.received_requests().await.unwrap();
    assert_eq!(seen.len(), 1);
    assert!(!seen[0].headers.contains_key("x-hop"));
    let host = mock.address().to_string();
    assert_eq!(seen[0].headers["host"], host.as_str());
    mock.verify().await;
    front.join().await;
}

#[tokio::test]
async fn upstream_sees_exactly_what_a_direct_call_would_send() {
    let upstream = FaultServer::http1()
        .route("/u", Reply::echo().header("x-from", "upstream"))
        .start()
        .await
        .unwrap();
    // A base path on the upstream URL prefixes every path.
    let front = FaultServer::builder()
        .forward_to(format!("{}/base/", upstream.origin()))
        .start()
        .await
        .unwrap();
    let req = req("PUT", &front.url("/u?a=1&b=2"))
        .header("authorization", "Bearer t")
        .header("te", "trailers")
        .header("x-many", "1")
        .body(Full::new(Bytes::from(vec![b'z'; 100_000])))
        .unwrap();
    let res = h1().request(req).await.unwrap();
    assert_eq!(res.status(), 404, "the upstream has no /base/u route");
    assert_eq!(upstream.hits("/base/u"), 1);
    let got = &upstream.requests("/base/u")[0];
    assert_eq!(got.method, http::Method::PUT);
    assert_eq!(got.uri.query(), Some("a=1&b=2"));
    assert_eq!(got.header("authorization"), Some("Bearer t"));
    assert_eq!(got.header("x-many"), Some("1"));
    assert_eq!(got.header("te"), None);
    assert_eq!(
        got.header("host"),
        Some(upstream.addr().to_string().as_str())
    );
    assert_eq!(got.body_len, 100_000);
    assert_eq!(got.body.len(), 100_000);

    let front = FaultServer::builder()
        .forward_to(upstream.origin())
        .start()
        .await
        .unwrap();
    let res = get(&h1(), &front.url("/u")).await.unwrap();
    assert_eq!(res.headers()["x-from"], "upstream");
    let echoed: serde_json::Value = serde_json::from_slice(&body(res).await.unwrap()).unwrap();
    assert_eq!(echoed["path"], "/u");
    front.join().await;
    upstream.join().await;
}

#[tokio::test]
async fn a_reset_first_connection_then_wiremock_answers() {
    let mock = mock_get("/users/1", "ann", 1).await;
    let front = FaultServer::http1()
        .forward_to(mock.uri())
        .route(
            "/users/1",
            Script::reply(Reply::reset())
                .times(1)
                .then(Reply::forward()),
        )
        .start()
        .await
        .unwrap();
    let c = h1();
    let err = get(&c, &front.url("/users/1")).await.unwrap_err();
    assert!(is_reset(&err), "{err:?}");
    let res = get(&c, &front.url("/users/1")).await.unwrap();
    assert_eq!(body(res).await.unwrap(), "ann");
    assert_eq!(front.hits("/users/1"), 2);
    assert_eq!(front.connections(), 2);
    mock.verify().await; // the reset request never reached wiremock
    front.join().await;
}

#[tokio::test]
async fn a_5xx_burst_in_front_and_faults_on_the_forwarded_body() {
    let mock = mock_get("/burst", "fine", 1).await;
    Mock::given(path_regex("^/(cut|drip|stall)$"))
        .respond_with(ResponseTemplate::new(200).set_body_bytes(vec![7u8; 10_000]))
        .mount(&mock)
        .await;
    let front = FaultServer::http1()
        .forward_to(mock.uri())
        .route(
            "/burst",
            Script::reply(Reply::status(503).retry_after(Duration::from_secs(1)))
                .times(3)
                .then(Reply::forward()),
        )
        .route("/cut", Reply::forward().reset_after(1000))
        .route(
            "/drip",
            Reply::forward().slow_body(2_500, Duration::from_millis(20)),
        )
        .route("/stall", Reply::forward().stall_after(10))
        .start()
        .await
        .unwrap();
    let c = h1();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            get(&c, &front.url("/burst"))
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [503, 503, 503, 200]);
    mock.verify().await;

    // The same upstream body, cut, dripped and stalled on its way back.
    let res = get(&h1(), &front.url("/cut")).await.unwrap();
    assert_eq!(res.headers()["content-length"], "10000");
    let (n, err) = drain(res).await;
    assert_eq!(n, 1000);
    assert!(err.is_some(), "the body ends early");

    let started = Instant::now();
    let res = get(&h1(), &front.url("/drip")).await.unwrap();
    let (n, err) = drain(res).await;
    assert_eq!((n, err.is_none()), (10_000, true));
    assert!(
        started.elapsed() >= Duration::from_millis(60),
        "4 chunks, 3 waits of 20 ms"
    );

    let res = get(&h1(), &front.url("/stall")).await.unwrap();
    let stalled = timeout(Duration::from_millis(300), drain(res)).await;
    assert!(stalled.is_err(), "the body never completes");
    front.join().await;
}

#[tokio::test]
async fn http2_and_tls_toward_the_client_http1_to_the_upstream() {
    let mock = mock_get("/v", "via", 2).await;
    let front = FaultServer::http2()
        .forward_to(mock.uri())
        .start()
        .await
        .unwrap();
    let res = get(&h2c(), &front.url("/v")).await.unwrap();
    assert_eq!(res.version(), Version::HTTP_2);
    assert_eq!(body(res).await.unwrap(), "via");
    assert_eq!(front.requests("/v")[0].version, Version::HTTP_2);

    let kit = CertKit::new().unwrap();
    let tls_front = FaultServer::builder()
        .tls(kit.localhost().unwrap().server_config().unwrap())
        .forward_to(mock.uri())
        .start()
        .await
        .unwrap();
    let tls = crate::tls::connect(
        tls_front.addr(),
        kit.client_config().unwrap(),
        "localhost",
        &[b"h2"],
    )
    .await
    .unwrap();
    let (version, text) = crate::tls::get_over(tls, &tls_front.url("/v")).await;
    assert_eq!((version, text), (Version::HTTP_2, Bytes::from("via")));
    mock.verify().await;
    front.join().await;
    tls_front.join().await;
}

#[tokio::test]
async fn redirects_come_back_through_the_front() {
    let mock = MockServer::start().await;
    Mock::given(path("/old"))
        .respond_with(
            ResponseTemplate::new(302).insert_header("location", format!("{}/new", mock.uri())),
        )
        .mount(&mock)
        .await;
    let front = FaultServer::builder()
        .forward_to(mock.uri())
        .start()
        .await
        .unwrap();
    let res = get(&h1(), &front.url("/old")).await.unwrap();
    assert_eq!(res.status(), 302);
    assert_eq!(res.headers()["location"], front.url("/new").as_str());
    front.join().await;
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_and_a_bad_one_is_refused_at_start() {
    let gone = refused_addr().await.unwrap();
    let front = FaultServer::builder()
        .forward_to(format!("http://{gone}"))
        .start()
        .await
        .unwrap();
    let res = get(&h1(), &front.url("/x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    let text = body(res).await.unwrap();
    assert!(
        text.starts_with(b"testkit: upstream http://127.0.0.1:"),
        "{text:?}"
    );
    front.join().await;

    for bad in [
        "http://10.0.0.1:80",
        "https://127.0.0.1:1",
        "http://example.com",
    ] {
        let err = FaultServer::builder()
            .forward_to(bad)
            .start()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{bad}");
    }
    // Forwarding without an upstream is a test's mistake, answered as 500 naming it.
    let srv = FaultServer::builder()
        .route("/f", Reply::forward())
        .start()
        .await
        .unwrap();
    let res = get(&h1(), &srv.url("/f")).await.unwrap();
    assert_eq!(res.status(), 500);
    srv.join().await;
}
