//! Redirects through the client: chains, limits, loops, credentials across origins, and
//! hops to internal addresses refused by the guard.

use soulbase_net_core::{ErrorCode, ErrorKind, NetClient, NetRequest};
use soulbase_net_policy::NetPolicy;
use soulbase_net_testkit::{FaultServer, Reply, Script};

use crate::support::{harness, loopback_policy};

#[tokio::test]
async fn a_chain_within_the_cap_is_followed_and_one_over_it_fails() {
    let srv = FaultServer::http1()
        .redirect_chain("/c", 5, "/end")
        .redirect_chain("/d", 6, "/end")
        .route("/end", Reply::ok("done"))
        .redirect_loop("/loop")
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    let res = h
        .client
        .send(NetRequest::get(srv.url("/c/0")))
        .await
        .unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(res.url, srv.url("/end"));
    assert_eq!(res.text().await.unwrap(), "done");
    let redirected = h
        .events
        .seen
        .lock()
        .iter()
        .filter(|e| e.starts_with("Redirected"))
        .count();
    assert_eq!(redirected, 5);

    let err = h
        .client
        .send(NetRequest::get(srv.url("/d/0")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RedirectLimit);
    assert_eq!(srv.hits("/end"), 1, "the hop over the cap was not made");

    let err = h
        .client
        .send(NetRequest::get(srv.url("/loop/a")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RedirectLimit);
    assert!(err.to_string().contains("loop"), "{err}");
    srv.join().await;
}

#[tokio::test]
async fn credentials_never_cross_origins_and_are_not_restored() {
    let b = FaultServer::http1()
        .route("/b", Reply::echo())
        .start()
        .await
        .unwrap();
    let a = FaultServer::http1()
        .route("/same", Reply::redirect(302, "/echo"))
        .route("/echo", Reply::echo())
        .route("/away", Reply::redirect(307, b.url("/b")))
        .start()
        .await
        .unwrap();
    let b_back = FaultServer::http1()
        .route("/back", Reply::redirect(302, a.url("/echo")))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.security.cross_origin_strip_headers = vec!["x-api-key".to_owned()];
    let h = harness(p);
    let with_secrets = |url: String| {
        NetRequest::get(url)
            .header("authorization", "Bearer s3cret")
            .header("cookie", "sid=1")
            .header("proxy-authorization", "Basic cHg=")
            .header("x-api-key", "k")
            .header("x-plain", "kept")
    };
    // Same origin: kept (but Proxy-Authorization never reaches an origin).
    h.client.send(with_secrets(a.url("/same"))).await.unwrap();
    let got = &a.requests("/echo")[0];
    assert_eq!(got.header("authorization"), Some("Bearer s3cret"));
    assert_eq!(got.header("x-api-key"), Some("k"));
    assert_eq!(got.header("proxy-authorization"), None);

    // Other origin: dropped.
    h.client.send(with_secrets(a.url("/away"))).await.unwrap();
    let got = &b.requests("/b")[0];
    for name in [
        "authorization",
        "cookie",
        "proxy-authorization",
        "x-api-key",
    ] {
        assert_eq!(got.header(name), None, "{name} leaked cross-origin");
    }
    assert_eq!(got.header("x-plain"), Some("kept"));

    // A → B → A: still dropped when the chain comes back.
    h.client
        .send(with_secrets(b_back.url("/back")))
        .await
        .unwrap();
    let got = a.requests("/echo").last().cloned().unwrap();
    assert_eq!(
        got.header("authorization"),
        None,
        "restored after leaving the origin"
    );
    for s in [a, b, b_back] {
        s.join().await;
    }
}

#[tokio::test]
async fn redirects_to_internal_addresses_are_refused_at_every_hop() {
    // The public-facing server is reachable by grant; the internal target is not.
    let internal = FaultServer::http1()
        .route("/admin", Reply::ok("secret"))
        .start()
        .await
        .unwrap();
    let front = FaultServer::http1()
        .route(
            "/first",
            Reply::redirect(302, "http://169.254.169.254/latest/meta-data/"),
        )
        .route("/second", Reply::redirect(302, "/hop"))
        .route("/hop", Reply::redirect(302, "http://10.0.0.1/"))
        .route("/loopback", Reply::redirect(302, internal.url("/admin")))
        .start()
        .await
        .unwrap();
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec![format!("{}/32", front.addr().ip()).parse().unwrap()];
    let h = harness(p);
    for path in ["/first", "/second"] {
        let err = h
            .client
            .send(NetRequest::get(front.url(path)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Blocked, "{path}");
        assert_eq!(err.code(), ErrorCode::AuthForbidden);
    }
    assert!(
        h.dialer.off_loopback().is_empty(),
        "dialled {:?}",
        h.dialer.off_loopback()
    );
    assert_eq!(internal.hits("/admin"), 0);

    // With cross-origin redirects off, a hop to another port of the same address is refused.
    let mut p = loopback_policy();
    p.redirect.allow_cross_origin = false;
    let h = harness(p);
    let err = h
        .client
        .send(NetRequest::get(front.url("/loopback")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked);
    assert_eq!(internal.hits("/admin"), 0);
    front.join().await;
    internal.join().await;
}

#[tokio::test]
async fn redirect_targets_get_every_check_a_request_url_gets() {
    // Loopback is granted, so only the URL check stands between these hops and the target.
    let internal = FaultServer::http1()
        .route("/admin", Reply::ok("secret"))
        .start()
        .await
        .unwrap();
    let port = internal.addr().port();
    let front = FaultServer::http1()
        .route(
            "/hex",
            Reply::redirect(302, format!("http://0x7f.1:{port}/admin")),
        )
        .route(
            "/dword",
            Reply::redirect(302, format!("//2130706433:{port}/admin")),
        )
        .route(
            "/hidden",
            Reply::redirect(302, format!("https:127.1:{port}/admin?://127.0.0.1")),
        )
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    for path in ["/hex", "/dword", "/hidden"] {
        let direct = h
            .client
            .send(NetRequest::get(format!("http://0x7f.1:{port}/admin")))
            .await
            .unwrap_err();
        assert_eq!(direct.code(), ErrorCode::SchemaValidationFailed);
        let err = h
            .client
            .send(NetRequest::get(front.url(path)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Blocked, "{path}: {err}");
        assert!(
            err.to_string().contains("not a canonical IPv4 address"),
            "{path}: {err}"
        );
    }
    assert_eq!(internal.hits("/admin"), 0);
    front.join().await;
    internal.join().await;
}

#[tokio::test]
async fn post_becomes_get_on_303_and_307_keeps_method_and_body() {
    let srv = FaultServer::http1()
        .route("/see-other", Reply::redirect(303, "/echo"))
        .route("/temp", Reply::redirect(307, "/echo"))
        .route("/echo", Reply::echo())
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    h.client
        .send(NetRequest::post(srv.url("/see-other")).body("payload"))
        .await
        .unwrap();
    h.client
        .send(NetRequest::post(srv.url("/temp")).body("payload"))
        .await
        .unwrap();
    let echoed = srv.requests("/echo");
    assert_eq!(echoed[0].method, http::Method::GET);
    assert!(echoed[0].body.is_empty());
    assert_eq!(echoed[1].method, http::Method::POST);
    assert_eq!(&echoed[1].body[..], b"payload");
    srv.join().await;
}

/// A harness whose names resolve through `dns`, with `host`'s override `fields`.
fn with_override(
    dns: &soulbase_net_testkit::MockDns,
    host: &str,
    fields: serde_json::Value,
) -> crate::support::Harness {
    let mut p = loopback_policy();
    p.dns.nameservers = vec![dns.addr()];
    p.dns.prefetch.clear();
    let mut doc = soulbase_net_policy::PolicyDocument::from_policy(&p);
    doc.set_override(host, fields);
    let resolver = soulbase_net_policy::SnapshotResolver::new(doc).unwrap();
    crate::support::harness_with(p, |builder| {
        builder.policy_resolver(std::sync::Arc::new(resolver))
    })
}

#[tokio::test]
async fn a_hop_to_another_host_goes_under_that_hosts_policy() {
    let b = FaultServer::http1()
        .route("/big", Reply::ok(vec![7u8; 1000]))
        .start()
        .await
        .unwrap();
    let dns = soulbase_net_testkit::MockDns::start().await.unwrap();
    dns.set_ips("small.test", &[std::net::IpAddr::from([127, 0, 0, 1])], 60);
    let to_b = format!("http://small.test:{}/big", b.addr().port());
    let a = FaultServer::http1()
        .route("/go", Reply::redirect(302, &to_b))
        .route("/big", Reply::ok(vec![7u8; 1000]))
        .start()
        .await
        .unwrap();
    // Responses from small.test may be 100 bytes at most; the request's own host has the
    // default limit.
    let h = with_override(
        &dns,
        "small.test",
        serde_json::json!({"security": {"max_resp_bytes": "100B"}}),
    );

    // Under the first host's policy, 1000 bytes are fine.
    let res = h.client.send(NetRequest::get(a.url("/big"))).await.unwrap();
    assert_eq!(res.bytes().await.unwrap().len(), 1000);
    // The hop to small.test is held to small.test's limit.
    let err = match h.client.send(NetRequest::get(a.url("/go"))).await {
        Ok(res) => res.bytes().await.unwrap_err(),
        Err(e) => e,
    };
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
    assert_eq!(b.hits("/big"), 1, "the hop was made");
    // Asked directly, small.test's limit applies too.
    let err = h
        .client
        .send(NetRequest::get(to_b.as_str()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    a.join().await;
    b.join().await;
}

#[tokio::test]
async fn a_hop_to_another_host_takes_a_slot_under_that_hosts_limits() {
    let b = FaultServer::http1()
        .route(
            "/hold",
            Reply::ok("held").delay(std::time::Duration::from_secs(1)),
        )
        .route("/quick", Reply::ok("quick"))
        .start()
        .await
        .unwrap();
    let dns = soulbase_net_testkit::MockDns::start().await.unwrap();
    dns.set_ips("one.test", &[std::net::IpAddr::from([127, 0, 0, 1])], 60);
    let hold = format!("http://one.test:{}/hold", b.addr().port());
    let quick = format!("http://one.test:{}/quick", b.addr().port());
    let a = FaultServer::http1()
        .route("/go", Reply::redirect(302, &quick))
        .start()
        .await
        .unwrap();
    // one.test takes one call at a time, refusing the next at once; the request's own host
    // has the default limits.
    let h = with_override(
        &dns,
        "one.test",
        serde_json::json!({"limits": {"per_host_concurrency": 1}}),
    );
    let client = std::sync::Arc::new(h.client);

    // A call to one.test holds its only slot (for the second its answer takes)…
    let held = {
        let client = client.clone();
        tokio::spawn(async move { client.send(NetRequest::get(hold)).await })
    };
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        b.wait_for_hits("/hold", 1),
    )
    .await
    .unwrap();
    // …so a hop there is refused, though the request's own host has room.
    let err = client
        .send(NetRequest::get(a.url("/go")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited, "{err}");
    assert_eq!(err.code(), ErrorCode::QuotaRateLimited);
    assert_eq!(a.hits("/go"), 1);
    assert_eq!(b.hits("/quick"), 0);
    // Once the slot is free, the same redirect is followed.
    let res = held.await.unwrap().unwrap();
    assert_eq!(res.text().await.unwrap(), "held");
    let res = client.send(NetRequest::get(a.url("/go"))).await.unwrap();
    assert_eq!(res.text().await.unwrap(), "quick");
    assert_eq!(b.hits("/quick"), 1);
    a.join().await;
    b.join().await;
}

#[tokio::test]
async fn a_reload_mid_call_leaves_the_calls_hops_on_the_policy_it_started_with() {
    let b = FaultServer::http1()
        .route("/big", Reply::ok(vec![7u8; 1000]))
        .start()
        .await
        .unwrap();
    let dns = soulbase_net_testkit::MockDns::start().await.unwrap();
    dns.set_ips("small.test", &[std::net::IpAddr::from([127, 0, 0, 1])], 60);
    let to_b = format!("http://small.test:{}/big", b.addr().port());
    let gate = soulbase_net_testkit::Gate::new();
    let a = FaultServer::http1()
        .route("/go", Reply::redirect(302, &to_b).after(&gate))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.dns.nameservers = vec![dns.addr()];
    p.dns.prefetch.clear();
    let doc = soulbase_net_policy::PolicyDocument::from_policy(&p);
    let resolver = std::sync::Arc::new(soulbase_net_policy::SnapshotResolver::new(doc).unwrap());
    let h = crate::support::harness_with(p.clone(), |builder| {
        builder.policy_resolver(resolver.clone())
    });
    let client = std::sync::Arc::new(h.client);
    let call = {
        let (client, url) = (client.clone(), a.url("/go"));
        tokio::spawn(async move {
            let res = client.send(NetRequest::get(url)).await?;
            res.bytes().await
        })
    };
    // The call is at the server, waiting for its redirect: the reload lands now.
    tokio::time::timeout(std::time::Duration::from_secs(5), a.wait_for_hits("/go", 1))
        .await
        .unwrap();
    let mut doc = soulbase_net_policy::PolicyDocument::from_policy(&p);
    doc.set_override(
        "small.test",
        serde_json::json!({"security": {"max_resp_bytes": "100B"}}),
    );
    assert_eq!(resolver.update(doc).unwrap(), 2);
    gate.open();
    let body = call.await.unwrap().unwrap();
    assert_eq!(body.len(), 1000, "the hop kept the call's policy");
    // A new call gets the new policy.
    let err = client
        .send(NetRequest::get(to_b.as_str()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    a.join().await;
    b.join().await;
}

/// Seed 000 §3: `security.strip_headers` are removed from every request before it is sent,
/// whoever set them — the caller, or an interceptor on every attempt — while
/// `cross_origin_strip_headers` only leave redirect hops to another origin.
#[tokio::test]
async fn strip_headers_never_leave_the_client() {
    struct Leaky;
    impl soulbase_net_core::Interceptor for Leaky {
        fn on_attempt(&self, req: &mut NetRequest, _attempt: u32) {
            req.headers
                .insert("x-debug-token", "from-interceptor".parse().unwrap());
        }
    }
    let srv = FaultServer::http1()
        .route("/s", Script::status(503).times(1).then(Reply::ok("ok")))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.retry.backoff.base = std::time::Duration::from_millis(5);
    p.security.strip_headers = vec!["X-Debug-Token".to_owned(), "x-internal".to_owned()];
    let h = crate::support::harness_with(p, |b| b.interceptor(Leaky));
    let res = h
        .client
        .send(
            NetRequest::get(srv.url("/s"))
                .header("x-internal", "secret")
                .header("x-kept", "yes"),
        )
        .await
        .unwrap();
    assert_eq!((res.status.as_u16(), res.attempts), (200, 2));
    let seen = srv.received_requests();
    assert_eq!(seen.len(), 2);
    for r in &seen {
        assert_eq!(r.header("x-debug-token"), None, "{r:?}");
        assert_eq!(r.header("x-internal"), None, "{r:?}");
        assert_eq!(r.header("x-kept"), Some("yes"));
    }
    srv.join().await;
}
