//! HTTP/2 prior knowledge (h2c) per host: a policy's `pool.http2_prior_knowledge` decides for
//! the hosts it covers, over the builder's default, through the tower face as through
//! `NetClient::send`.

use std::{net::IpAddr, sync::Arc};

use bytes::Bytes;
use http::{StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use soulbase_net_policy::{PolicyDocument, SnapshotResolver};
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{FaultServer, Reply};
use tower::ServiceExt;

use super::{bounded, loopback_policy, LoopbackDialer};

/// An HTTP/2-only server (h2c on plain TCP: it cannot answer HTTP/1.1) and an HTTP/1.1-only
/// one (it cannot answer h2c), named `h2.test` and `h1.test`.
struct Pair {
    h2: FaultServer,
    h1: FaultServer,
}

impl Pair {
    async fn start() -> Pair {
        let route = |b: soulbase_net_testkit::FaultServerBuilder| b.route("/", Reply::ok("hi"));
        Pair {
            h2: route(FaultServer::http2()).start().await.unwrap(),
            h1: route(FaultServer::http1()).start().await.unwrap(),
        }
    }

    /// A client whose builder says `builder_h2c` and whose policy document overrides
    /// `pool.http2_prior_knowledge` to `value` for `host`.
    fn client(&self, builder_h2c: bool, host: &str, value: bool) -> Client {
        let mut base = loopback_policy();
        for name in ["h2.test", "h1.test"] {
            let loopback = vec![IpAddr::from([127, 0, 0, 1])];
            base.dns.static_hosts.insert(name.to_owned(), loopback);
        }
        let mut doc = PolicyDocument::from_policy(&base);
        doc.set_override(
            host,
            serde_json::json!({ "pool": { "http2_prior_knowledge": value } }),
        );
        Client::builder()
            .policy_resolver(Arc::new(SnapshotResolver::new(doc).unwrap()))
            .http2_prior_knowledge(builder_h2c)
            .dialer(Arc::new(LoopbackDialer::default()))
            .build()
            .unwrap()
    }

    /// Two GETs to each server through the tower face, interleaved; every answer is `hi`.
    async fn call_both(&self, client: &Client) {
        let urls = [
            format!("http://h2.test:{}/", self.h2.addr().port()),
            format!("http://h1.test:{}/", self.h1.addr().port()),
        ];
        for url in urls.iter().chain(&urls) {
            let req = http::Request::get(url).body(Empty::<Bytes>::new()).unwrap();
            let res = bounded(client.clone().oneshot(req))
                .await
                .unwrap_or_else(|e| panic!("{url}: {e:?}"));
            assert_eq!(res.status(), StatusCode::OK, "{url}");
            assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "hi");
        }
    }

    /// What each server saw: its HTTP versions and connections.
    fn assert_seen(&self) {
        let versions = |srv: &FaultServer| -> Vec<Version> {
            srv.received_requests().iter().map(|r| r.version).collect()
        };
        assert_eq!(versions(&self.h2), [Version::HTTP_2; 2]);
        assert_eq!(versions(&self.h1), [Version::HTTP_11; 2]);
        // h2c: both requests on one connection; HTTP/1.1 kept its connection too.
        assert_eq!(self.h2.connections(), 1);
        assert_eq!(self.h1.connections(), 1);
    }

    async fn join(self) {
        self.h2.join().await;
        self.h1.join().await;
    }
}

#[tokio::test]
async fn an_override_gives_one_host_h2c_while_the_others_keep_http1() {
    let servers = Pair::start().await;
    let client = servers.client(false, "h2.test", true);
    servers.call_both(&client).await;
    servers.assert_seen();
    servers.join().await;
}

#[tokio::test]
async fn an_override_gives_one_host_http1_on_a_client_that_speaks_h2c() {
    let servers = Pair::start().await;
    let client = servers.client(true, "h1.test", false);
    servers.call_both(&client).await;
    servers.assert_seen();
    servers.join().await;
}
