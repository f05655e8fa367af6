//! ConnectProxy driven by hyper-util's CONNECT tunnel and by absolute-form requests.

use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http_body_util::Full;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use soulbase_net_testkit::{ConnectProxy, FaultServer, ProxyFault, ProxyOutcome, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_service::Service;

use crate::support::body;

fn basic(user: &str, pw: &str) -> HeaderValue {
    use base64::Engine as _;
    let t = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"));
    HeaderValue::from_str(&format!("Basic {t}")).unwrap()
}

fn tunnel(proxy: &ConnectProxy) -> Tunnel<HttpConnector> {
    Tunnel::new(proxy.url().parse().unwrap(), HttpConnector::new())
}

#[tokio::test]
async fn tunnels_with_credentials_and_answers_407_without() {
    let srv = FaultServer::http1()
        .route("/x", Reply::ok("through"))
        .start()
        .await
        .unwrap();
    let proxy = ConnectProxy::builder()
        .basic_auth("u", "p")
        .start()
        .await
        .unwrap();

    let client = Client::builder(TokioExecutor::new())
        .build::<_, Full<Bytes>>(tunnel(&proxy).with_auth(basic("u", "p")));
    let res = client.get(srv.url("/x").parse().unwrap()).await.unwrap();
    assert_eq!(body(res).await.unwrap(), "through");
    assert_eq!(srv.hits("/x"), 1);

    let err = tunnel(&proxy)
        .call(srv.url("/").parse().unwrap())
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("ProxyAuthRequired"), "{err:?}");
    let err = tunnel(&proxy)
        .with_auth(basic("u", "wrong"))
        .call(srv.url("/").parse().unwrap())
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("ProxyAuthRequired"), "{err:?}");

    let log = proxy.requests();
    assert_eq!(log.len(), 3);
    assert_eq!(log[0].method, "CONNECT");
    assert_eq!(log[0].target, srv.addr().to_string());
    assert_eq!(log[0].outcome, ProxyOutcome::Tunneled);
    assert!(log[0].authorized);
    assert_eq!(
        (log[1].outcome, log[1].authorized),
        (ProxyOutcome::AuthRequired, false)
    );
    assert_eq!(log[2].outcome, ProxyOutcome::AuthRequired);
    assert_eq!(srv.hits("/"), 0);
    srv.join().await;
}

#[tokio::test]
async fn raw_407_has_a_challenge() {
    let proxy = ConnectProxy::builder()
        .basic_auth("u", "p")
        .start()
        .await
        .unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nhost: 127.0.0.1:1\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 407 "), "{out}");
    assert!(
        out.to_ascii_lowercase()
            .contains("proxy-authenticate: basic"),
        "{out}"
    );
}

#[tokio::test]
async fn forwards_absolute_form_requests() {
    let srv = FaultServer::http1()
        .route("/echo", Reply::echo())
        .start()
        .await
        .unwrap();
    let proxy = ConnectProxy::builder()
        .basic_auth("u", "p")
        .start()
        .await
        .unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    let req = format!(
        "GET {} HTTP/1.1\r\nhost: {}\r\nproxy-authorization: {}\r\nconnection: close\r\n\r\n",
        srv.url("/echo?x=1"),
        srv.addr(),
        basic("u", "p").to_str().unwrap()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let got = &srv.requests("/echo")[0];
    assert_eq!(got.uri.to_string(), "/echo?x=1");
    assert!(
        got.header("proxy-authorization").is_none(),
        "credentials must not be forwarded"
    );
    assert_eq!(proxy.requests()[0].outcome, ProxyOutcome::Forwarded);
    srv.join().await;
}

#[tokio::test]
async fn maps_names_and_blocks_non_loopback_targets() {
    let srv = FaultServer::http1()
        .route("/x", Reply::ok("mapped"))
        .start()
        .await
        .unwrap();
    let proxy = ConnectProxy::builder()
        .map_host("api.example.test:8080", srv.addr())
        .start()
        .await
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(tunnel(&proxy));
    let res = client
        .get("http://api.example.test:8080/x".parse().unwrap())
        .await
        .unwrap();
    assert_eq!(body(res).await.unwrap(), "mapped");
    // (hyper-util's Tunnel defaults to port 443, hence explicit ports)
    // a private address is never dialled: 502, logged as blocked
    let err = tunnel(&proxy)
        .call("http://10.0.0.1:80/".parse().unwrap())
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("TunnelUnsuccessful"), "{err:?}");
    let log = proxy.requests();
    assert_eq!(log[0].target, "api.example.test:8080");
    assert_eq!(log[1].target, "10.0.0.1:80");
    assert_eq!(log[1].outcome, ProxyOutcome::Blocked);
    srv.join().await;
}

#[tokio::test]
async fn faults_refuse_hang_502() {
    let target = "http://127.0.0.1:9/";
    let p = ConnectProxy::builder()
        .fault(ProxyFault::BadGateway)
        .start()
        .await
        .unwrap();
    let err = tunnel(&p).call(target.parse().unwrap()).await.unwrap_err();
    assert!(format!("{err:?}").contains("TunnelUnsuccessful"), "{err:?}");
    assert_eq!(p.requests()[0].outcome, ProxyOutcome::BadGateway);

    let p = ConnectProxy::builder()
        .fault(ProxyFault::Refuse)
        .start()
        .await
        .unwrap();
    let err = tunnel(&p).call(target.parse().unwrap()).await.unwrap_err();
    assert!(
        format!("{err:?}").contains("TunnelUnexpectedEof"),
        "{err:?}"
    );
    assert_eq!(p.requests()[0].outcome, ProxyOutcome::Refused);

    let mut p = ConnectProxy::builder()
        .fault(ProxyFault::Hang)
        .start()
        .await
        .unwrap();
    let mut t = tunnel(&p);
    let hung =
        tokio::time::timeout(Duration::from_millis(200), t.call(target.parse().unwrap())).await;
    assert!(hung.is_err());
    assert_eq!(p.requests()[0].outcome, ProxyOutcome::Hung);
    assert_eq!(p.connections(), 1);
    p.shutdown().await;
}
