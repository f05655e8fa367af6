//! Names resolved through MockDns: singleflight across requests, and DNS rebinding refused
//! at connect time.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use soulbase_net_core::{ErrorKind, NetClient, NetRequest};
use soulbase_net_policy::NetPolicy;
use soulbase_net_testkit::{FaultServer, MockDns, Reply};

use crate::support::{harness, loopback_policy};

fn with_dns(mut p: NetPolicy, dns: &MockDns) -> NetPolicy {
    p.dns.nameservers = vec![dns.addr()];
    p.dns.timeout = Duration::from_secs(2);
    p.dns.prefetch.clear();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_requests_make_one_lookup() {
    let srv = FaultServer::http1()
        .route("/", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    let dns = MockDns::start().await.unwrap();
    dns.set_ips("svc.test", &[IpAddr::from([127, 0, 0, 1])], 60);
    dns.delay("svc.test", Duration::from_millis(100));
    let mut p = with_dns(loopback_policy(), &dns);
    p.limits.max_wait = Duration::from_secs(30);
    let h = harness(p);
    let client = Arc::new(h.client);
    let url = format!("http://svc.test:{}/", srv.addr().port());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move { client.send(NetRequest::get(url)).await.map(|r| r.status) });
    }
    while let Some(res) = tasks.join_next().await {
        assert_eq!(res.unwrap().unwrap(), 200);
    }
    let a_queries = dns
        .queries()
        .iter()
        .filter(|q| q.name.trim_end_matches('.') == "svc.test" && q.qtype == "A")
        .count();
    assert_eq!(a_queries, 1, "{:?}", dns.queries());
    srv.join().await;
}

#[tokio::test]
async fn rebinding_to_loopback_never_reaches_the_canary() {
    // The canary listens on loopback, which the default policy denies. The name first
    // answers a public address (the test dialer refuses to dial it), then loopback, TTL 0.
    let canary = FaultServer::http1()
        .route("/", Reply::ok("pwned"))
        .start()
        .await
        .unwrap();
    let dns = MockDns::start().await.unwrap();
    dns.rebind(
        "rebind.test",
        IpAddr::from([93, 184, 215, 14]),
        IpAddr::from([127, 0, 0, 1]),
    );
    let mut p = with_dns(NetPolicy::default(), &dns);
    p.dns.min_ttl = Duration::ZERO;
    p.dns.serve_stale = false;
    // One attempt per request, so each request is one lookup.
    p.retry.enabled = false;
    let h = harness(p);
    let url = format!("http://rebind.test:{}/", canary.addr().port());
    // Public first: the address is allowed, and dialled (the test dialer refuses it).
    let err = h.client.send(NetRequest::get(&url)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect, "{err}");
    assert_eq!(
        h.dialer.off_loopback(),
        [SocketAddr::from(([93, 184, 215, 14], canary.addr().port()))]
    );
    // Then private, lookup after lookup: refused before any dial.
    for i in 0..999 {
        let err = h.client.send(NetRequest::get(&url)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Blocked, "request {i}: {err}");
    }
    assert_eq!(canary.connections(), 0);
    let loopback_dials = h
        .dialer
        .dialled()
        .iter()
        .filter(|a| a.ip().is_loopback())
        .count();
    assert_eq!(loopback_dials, 0);
    canary.join().await;
}

#[tokio::test]
async fn prefetch_resolves_when_the_client_is_built() {
    let dns = MockDns::start().await.unwrap();
    dns.set_ips("warm.test", &[IpAddr::from([127, 0, 0, 1])], 300);
    let mut p = with_dns(loopback_policy(), &dns);
    p.dns.prefetch = vec!["warm.test".to_owned()];
    let _h = harness(p);
    // Bounded wait for the background prefetch: the query arrives without any request.
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while dns.query_count("warm.test") == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(waited.is_ok(), "no prefetch query within 5s");
}

/// Records what it is asked to dial; `127.0.0.2` never answers, loopback is dialled for real.
#[derive(Debug, Default)]
struct SilentFirst {
    dialled: parking_lot::Mutex<Vec<SocketAddr>>,
}

impl soulbase_net_runtime::Dialer for SilentFirst {
    fn dial(&self, addr: SocketAddr) -> soulbase_net_runtime::DialFuture {
        self.dialled.lock().push(addr);
        if addr.ip() == IpAddr::from([127, 0, 0, 2]) {
            return Box::pin(std::future::pending());
        }
        soulbase_net_runtime::TcpDialer.dial(addr)
    }
}

#[tokio::test]
async fn happy_eyeballs_off_tries_one_address_at_a_time() {
    let srv = FaultServer::http1()
        .route("/", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    let port = srv.addr().port();
    for racing in [true, false] {
        let mut p = loopback_policy();
        p.dns.static_hosts.insert(
            "two.test".to_owned(),
            vec![IpAddr::from([127, 0, 0, 2]), IpAddr::from([127, 0, 0, 1])],
        );
        p.dns.shuffle = false;
        p.dns.happy_eyeballs = racing;
        p.dns.happy_eyeballs_delay = Duration::from_millis(50);
        p.timeout.connect = Duration::from_millis(400);
        p.retry.enabled = false;
        let dialer = Arc::new(SilentFirst::default());
        let h = crate::support::harness_with(p, |b| b.dialer(dialer.clone()));
        let res = h
            .client
            .send(NetRequest::get(format!("http://two.test:{port}/")))
            .await;
        let dialled = dialer.dialled.lock().clone();
        if racing {
            // The silent address gets 50 ms, then the next one is tried beside it.
            assert_eq!(res.unwrap().status, 200);
            assert_eq!(dialled.len(), 2, "{dialled:?}");
        } else {
            // In order, one at a time: the silent first address holds the whole connect time.
            let err = res.unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::Timeout(soulbase_net_core::Phase::Connect),
                "{err}"
            );
            assert_eq!(dialled, [SocketAddr::from(([127, 0, 0, 2], port))]);
        }
    }
    srv.join().await;
}
