//! Requests and responses over HTTP/1.1, HTTP/2 (ALPN and prior knowledge) and TLS.

use std::sync::Arc;

use http::Method;
use soulbase_net_core::{
    ErrorCode, ErrorKind, Interceptor, NetClientExt, NetError, NetRequest, NetResponse,
};
use soulbase_net_testkit::{CertKit, FaultServer, Reply};

use crate::support::{harness, harness_with, loopback_policy};

#[tokio::test]
async fn get_json_post_json_and_echoed_headers() {
    let srv = FaultServer::http1()
        .route("/j", Reply::json(&serde_json::json!({"n": 7})))
        .route("/echo", Reply::echo())
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    let v: serde_json::Value = h.client.get_json(&srv.url("/j")).await.unwrap();
    assert_eq!(v["n"], 7);

    let _: serde_json::Value = h
        .client
        .post_json(&srv.url("/echo"), &serde_json::json!({"a": [1, 2]}))
        .await
        .unwrap();
    let got = &srv.requests("/echo")[0];
    assert_eq!(got.method, Method::POST);
    assert_eq!(&got.body[..], br#"{"a":[1,2]}"#);
    assert_eq!(got.header("content-type"), Some("application/json"));
    assert!(got
        .header("user-agent")
        .unwrap()
        .starts_with("soulbase-net/"));
    assert!(h.dialer.off_loopback().is_empty());
    srv.join().await;
}

#[tokio::test]
async fn responses_carry_status_headers_timings_and_attempts() {
    let srv = FaultServer::http1()
        .route(
            "/x",
            Reply::status(503).header("x-trace", "t1").body("down"),
        )
        .route("/ok", Reply::ok("up"))
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    let first = h
        .client
        .send(NetRequest::get(srv.url("/ok")))
        .await
        .unwrap();
    assert!(
        first.elapsed.connect() > std::time::Duration::ZERO,
        "first request opened a connection"
    );
    assert!(first.elapsed.ttfb() >= first.elapsed.connect());
    assert_eq!(first.attempts, 1);
    drop(first.bytes().await.unwrap());

    let res = h.client.send(NetRequest::get(srv.url("/x"))).await.unwrap();
    assert_eq!(res.status, 503);
    assert_eq!(res.headers["x-trace"], "t1");
    // A 503 to a GET is retried: 3 attempts by default, the last response is returned.
    assert_eq!(res.attempts, 3);
    assert_eq!(srv.hits("/x"), 3);
    // Every attempt reused the pooled connection: no connect time.
    assert_eq!(res.elapsed.connect(), std::time::Duration::ZERO);
    assert_eq!(res.url, srv.url("/x"));
    let err = res.error_for_status().unwrap_err();
    assert_eq!(err.code(), ErrorCode::ProviderUnavailable);
    assert_eq!(err.attempts(), 3);
    assert_eq!(srv.connections(), 1);
    assert_eq!(h.client.connections_opened(), 1);
    let seen = h.events.seen.lock().clone();
    assert!(
        seen.contains(&"attempt 1 status_5xx".to_owned()),
        "{seen:?}"
    );
    assert!(seen.contains(&"finish status_5xx 3".to_owned()), "{seen:?}");
    srv.join().await;
}

#[tokio::test]
async fn https_negotiates_h2_with_alpn_and_http1_when_h2_is_off() {
    let kit = CertKit::new().unwrap();
    let srv = FaultServer::builder()
        .tls(kit.localhost().unwrap().server_config().unwrap())
        .route("/v", Reply::echo())
        .start()
        .await
        .unwrap();
    let h = harness_with(loopback_policy(), |b| {
        b.add_root_certificate(kit.root_der())
    });
    let res = h.client.send(NetRequest::get(srv.url("/v"))).await.unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(srv.requests("/v")[0].version, http::Version::HTTP_2);

    let mut p = loopback_policy();
    p.tls.http2 = false;
    let h1 = harness_with(p, |b| b.add_root_certificate(kit.root_der()));
    h1.client
        .send(NetRequest::get(srv.url("/v")))
        .await
        .unwrap();
    assert_eq!(srv.requests("/v")[1].version, http::Version::HTTP_11);

    // Without the kit's root the chain is unknown: AUTH.FORBIDDEN, nothing reaches the handler.
    let stranger = harness(loopback_policy());
    let err = stranger
        .client
        .send(NetRequest::get(srv.url("/v")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TlsVerify);
    assert_eq!(err.code(), ErrorCode::AuthForbidden);
    assert_eq!(srv.hits("/v"), 2);
    srv.join().await;
}

#[tokio::test]
async fn h2c_prior_knowledge() {
    let srv = FaultServer::http2()
        .route("/p", Reply::ok("two"))
        .start()
        .await
        .unwrap();
    let h = harness_with(loopback_policy(), |b| b.http2_prior_knowledge(true));
    let res = h.client.send(NetRequest::get(srv.url("/p"))).await.unwrap();
    assert_eq!(res.text().await.unwrap(), "two");
    assert_eq!(srv.requests("/p")[0].version, http::Version::HTTP_2);
    // The attempt's headers over HTTP/2: a copy of the request's (every value, in order,
    // the client's own beside them), and Proxy-Authorization never reaches the origin.
    for proxy_auth in [false, true] {
        let mut req = NetRequest::get(srv.url("/p"));
        for tag in ["a", "b"] {
            req.headers
                .append("x-tags", http::HeaderValue::from_static(tag));
        }
        if proxy_auth {
            req = req.header("proxy-authorization", "Basic cHg=");
        }
        h.client.send(req).await.unwrap().bytes().await.unwrap();
        let got = srv.requests("/p").pop().unwrap();
        let tags: Vec<_> = got.headers.get_all("x-tags").iter().cloned().collect();
        assert_eq!(tags, ["a", "b"], "{proxy_auth}");
        assert_eq!(got.header("proxy-authorization"), None, "{proxy_auth}");
        assert!(got.header("user-agent").is_some(), "{proxy_auth}");
    }
    srv.join().await;
}

/// The `x-tags` values of the first request to `path`, in order.
fn tags_of(srv: &FaultServer, path: &str) -> Vec<http::HeaderValue> {
    let request = &srv.requests(path)[0];
    request.headers.get_all("x-tags").iter().cloned().collect()
}

/// A server echoing `/i` (and answering `/refused`, which `Now` refuses before it is sent),
/// and an empty log of hooks.
async fn echo_and_log() -> (FaultServer, Arc<parking_lot::Mutex<Vec<String>>>) {
    let srv = FaultServer::http1()
        .route("/i", Reply::echo())
        .route("/refused", Reply::ok("never"))
        .start()
        .await
        .unwrap();
    (srv, Arc::new(parking_lot::Mutex::new(Vec::new())))
}

/// Records the order of hooks.
struct Tag(&'static str, Arc<parking_lot::Mutex<Vec<String>>>);

#[async_trait::async_trait]
impl Interceptor for Tag {
    async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
        self.1.lock().push(format!("before {}", self.0));
        req.headers
            .append("x-tags", http::HeaderValue::from_static(self.0));
        Ok(())
    }
    fn on_attempt(&self, _req: &mut NetRequest, attempt: u32) {
        self.1.lock().push(format!("attempt {} {attempt}", self.0));
    }
    async fn after(&self, _req: &NetRequest, _res: &mut NetResponse) -> Result<(), NetError> {
        self.1.lock().push(format!("after {}", self.0));
        Ok(())
    }
    async fn on_error(&self, _req: &NetRequest, err: &NetError) {
        self.1
            .lock()
            .push(format!("error {} {}", self.0, err.kind().label()));
    }
}

#[tokio::test]
async fn interceptors_run_before_in_order_and_after_in_reverse() {
    let (srv, log) = echo_and_log().await;
    let h = harness_with(loopback_policy(), |b| {
        b.interceptor(Tag("a", log.clone()))
            .interceptor(Tag("b", log.clone()))
    });
    h.client.send(NetRequest::get(srv.url("/i"))).await.unwrap();
    assert_eq!(
        *log.lock(),
        [
            "before a",
            "before b",
            "attempt a 1",
            "attempt b 1",
            "after b",
            "after a"
        ]
    );
    let tags = tags_of(&srv, "/i");
    assert_eq!(tags, ["a", "b"]);

    log.lock().clear();
    let err = h
        .client
        .send(NetRequest::get("http://127.0.0.1:1/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect);
    // `before` once, `on_attempt` before each of the 3 attempts (connect errors are retried),
    // `on_error` once, in reverse.
    assert_eq!(
        log.lock()[2..],
        [
            "attempt a 1",
            "attempt b 1",
            "attempt a 2",
            "attempt b 2",
            "attempt a 3",
            "attempt b 3",
            "error b connect",
            "error a connect"
        ]
        .map(str::to_owned)
    );
    assert_eq!(err.attempts(), 3);
    srv.join().await;
}

/// Runs its `before` in place ([`Hooks::BEFORE_NOW`](soulbase_net_core::Hooks)); its async
/// `before` must never be called by the client. Refuses requests to `/refused`.
struct Now(Arc<parking_lot::Mutex<Vec<String>>>);

#[async_trait::async_trait]
impl Interceptor for Now {
    async fn before(&self, _req: &mut NetRequest) -> Result<(), NetError> {
        self.0.lock().push("async before now".to_owned());
        Ok(())
    }
    fn before_now(&self, req: &mut NetRequest) -> Result<(), NetError> {
        self.0.lock().push("before now".to_owned());
        if req.url.ends_with("/refused") {
            return Err(NetError::invalid_request("refused in place"));
        }
        req.headers
            .append("x-tags", http::HeaderValue::from_static("now"));
        Ok(())
    }
    async fn on_error(&self, _req: &NetRequest, err: &NetError) {
        self.0
            .lock()
            .push(format!("error now {}", err.kind().label()));
    }
    fn hooks(&self) -> soulbase_net_core::Hooks {
        // `BEFORE` named too: `BEFORE_NOW` decides which runs.
        use soulbase_net_core::Hooks;
        Hooks::BEFORE_NOW | Hooks::BEFORE | Hooks::ON_ERROR
    }
}

#[tokio::test]
async fn a_before_now_hook_runs_in_place_in_its_order_and_its_error_stops_the_call() {
    let (srv, log) = echo_and_log().await;
    let h = harness_with(loopback_policy(), |b| {
        b.interceptor(Tag("a", log.clone()))
            .interceptor(Now(log.clone()))
            .interceptor(Tag("b", log.clone()))
    });
    h.client.send(NetRequest::get(srv.url("/i"))).await.unwrap();
    assert_eq!(log.lock()[..3], ["before a", "before now", "before b"]);
    assert!(!log.lock().iter().any(|e| e == "async before now"));
    let tags = tags_of(&srv, "/i");
    assert_eq!(tags, ["a", "now", "b"]);

    log.lock().clear();
    let err = h
        .client
        .send(NetRequest::get(srv.url("/refused")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.to_string().contains("refused in place"), "{err}");
    assert_eq!(srv.hits("/refused"), 0);
    // `b`'s before never ran; every `on_error` did, in reverse.
    assert_eq!(
        *log.lock(),
        [
            "before a",
            "before now",
            "error b invalid_request",
            "error now invalid_request",
            "error a invalid_request"
        ]
    );
    srv.join().await;
}

/// Rewrites the request's URL in `before`: `/old` becomes `/i`, `/add-query` becomes `/i`
/// with a query pair, `/bad` a URL that does not parse, `/far` another host.
struct Rewrite;

impl Interceptor for Rewrite {
    fn before_now(&self, req: &mut NetRequest) -> Result<(), NetError> {
        if let Some(base) = req.url.strip_suffix("/old") {
            req.url = format!("{base}/i");
        } else if let Some(base) = req.url.strip_suffix("/add-query") {
            req.url = format!("{base}/i");
            req.query.push(("k".to_owned(), "v".to_owned()));
        } else if req.url.ends_with("/bad") {
            req.url = "http://[not a host/".to_owned();
        } else if req.url.ends_with("/far") {
            req.url = "http://203.0.113.9/i".to_owned();
        }
        Ok(())
    }
    fn hooks(&self) -> soulbase_net_core::Hooks {
        soulbase_net_core::Hooks::BEFORE_NOW
    }
}

#[tokio::test]
async fn a_url_changed_by_a_before_hook_is_checked_again_and_sent_where_it_now_points() {
    let (srv, _log) = echo_and_log().await;
    let h = harness_with(loopback_policy(), |b| b.interceptor(Rewrite));
    // A URL written as the parser writes it, with query pairs added or not, and one the
    // parser rewrites (the scheme in capitals): each way the client tells a change.
    for (sent, query) in [("/old", None), ("/add-query", Some("k=v"))] {
        let res = h.client.send(NetRequest::get(srv.url(sent))).await.unwrap();
        assert_eq!(res.status, 200, "{sent}");
        let seen = srv.requests("/i").pop().unwrap();
        assert_eq!(seen.uri.query(), query, "{sent}");
    }
    let unparsed = srv.url("/old").replacen("http://", "HTTP://", 1);
    let res = h.client.send(NetRequest::get(unparsed)).await.unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(srv.hits("/i"), 3);
    assert_eq!(srv.hits("/old") + srv.hits("/add-query"), 0);
    // A URL that no longer parses, or that leaves the grants: refused, never sent.
    let err = h
        .client
        .send(NetRequest::get(srv.url("/bad")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    let err = h
        .client
        .send(NetRequest::get(srv.url("/far")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked, "{err}");
    assert!(h.dialer.dialled().iter().all(|a| a.ip().is_loopback()));
    srv.join().await;
}

#[tokio::test]
async fn bytes_in_and_out_are_reported() {
    let srv = FaultServer::http1()
        .route("/b", Reply::ok(vec![1u8; 3000]))
        .start()
        .await
        .unwrap();
    let h = harness(loopback_policy());
    let res = h
        .client
        .send(NetRequest::post(srv.url("/b")).body(vec![0u8; 1234]))
        .await
        .unwrap();
    assert_eq!(res.bytes().await.unwrap().len(), 3000);
    let seen = h.events.seen.lock().clone();
    assert!(seen.contains(&"bytes out 1234".to_owned()), "{seen:?}");
    assert!(seen.contains(&"bytes in 3000".to_owned()), "{seen:?}");
    // A request without a body reports no bytes out (body bytes only, none of zero).
    h.events.seen.lock().clear();
    let res = h.client.send(NetRequest::get(srv.url("/b"))).await.unwrap();
    assert_eq!(res.bytes().await.unwrap().len(), 3000);
    let seen = h.events.seen.lock().clone();
    assert!(seen.contains(&"bytes in 3000".to_owned()), "{seen:?}");
    assert!(!seen.iter().any(|e| e.starts_with("bytes out")), "{seen:?}");
    srv.join().await;
}

/// Answers `/cached` itself; asks for one resend after a 401, with a fresh token.
struct Hooks {
    resends: std::sync::atomic::AtomicU32,
}

#[async_trait::async_trait]
impl Interceptor for Hooks {
    async fn respond(&self, req: &NetRequest) -> Option<Result<NetResponse, NetError>> {
        req.url.ends_with("/cached").then(|| {
            Ok(NetResponse::from_bytes(
                http::StatusCode::OK,
                "from the hook",
            ))
        })
    }
    async fn should_resend(&self, req: &mut NetRequest, res: &mut NetResponse) -> bool {
        if res.status != 401 {
            return false;
        }
        self.resends
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        req.headers.insert(
            "authorization",
            http::HeaderValue::from_static("Bearer fresh"),
        );
        true
    }
}

/// A server with `/cached` (never reached when `Hooks` answers), `/auth` (401 once, then
/// 200) and `/always401`; a client running `Hooks`.
async fn resend_setup() -> (FaultServer, Arc<Hooks>, crate::support::Harness) {
    let srv = FaultServer::http1()
        .route("/cached", Reply::ok("origin"))
        .route(
            "/auth",
            soulbase_net_testkit::Script::status(401)
                .times(1)
                .then(Reply::ok("welcome")),
        )
        .route("/always401", Reply::status(401))
        .start()
        .await
        .unwrap();
    let hooks = Arc::new(Hooks {
        resends: std::sync::atomic::AtomicU32::new(0),
    });
    let h = harness_with(loopback_policy(), |b| b.interceptors(vec![hooks.clone()]));
    (srv, hooks, h)
}

#[tokio::test]
async fn interceptors_can_answer_without_sending_and_ask_for_one_resend() {
    let (srv, _hooks, h) = resend_setup().await;
    let res = h
        .client
        .send(NetRequest::get(srv.url("/cached")))
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap(), "from the hook");
    assert_eq!(srv.hits("/cached"), 0);
    // Observers learn which interceptor answered (its name; by default its type's), then
    // that the call finished.
    let seen = h.events.seen.lock().clone();
    let answered = seen.iter().position(|e| e.starts_with("Answered"));
    let finished = seen.iter().position(|e| e.starts_with("finish ok"));
    assert!(answered.is_some() && answered < finished, "{seen:?}");
    assert!(seen[answered.unwrap()].contains("Hooks\""), "{seen:?}");

    let res = h
        .client
        .send(NetRequest::get(srv.url("/auth")))
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap(), "welcome");
    let seen = srv.requests("/auth");
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].header("authorization"), Some("Bearer fresh"));

    // At most one resend per call.
    let res = h
        .client
        .send(NetRequest::get(srv.url("/always401")))
        .await
        .unwrap();
    assert_eq!(res.status, 401);
    assert_eq!(srv.hits("/always401"), 2);
    srv.join().await;
}

/// A resend without a redirect sends the caller's request again, body included; a request
/// whose body is a stream is never resent (it cannot be sent twice).
#[tokio::test]
async fn a_resend_sends_the_body_again_and_a_stream_is_never_resent() {
    let (srv, hooks, h) = resend_setup().await;
    let res = h
        .client
        .send(NetRequest::post(srv.url("/auth")).body("the payload"))
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap(), "welcome");
    let seen = srv.requests("/auth");
    assert_eq!(seen.len(), 2);
    for sent in &seen {
        assert_eq!(sent.body, "the payload".as_bytes());
    }
    assert_eq!(seen[0].header("authorization"), None);
    assert_eq!(seen[1].header("authorization"), Some("Bearer fresh"));

    let stream = http_body_util::Full::new(bytes::Bytes::from_static(b"once"));
    let res = h
        .client
        .send(NetRequest::post(srv.url("/always401")).body(soulbase_net_core::Body::stream(stream)))
        .await
        .unwrap();
    assert_eq!(res.status, 401);
    assert_eq!(srv.hits("/always401"), 1);
    assert_eq!(
        hooks.resends.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "asked once (for /auth); never for the stream"
    );
    srv.join().await;
}

#[tokio::test]
async fn a_policy_file_and_a_tenant_handle_reach_the_tenants_policy() {
    let srv = FaultServer::http1()
        .route("/down", Reply::status(503))
        .start()
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("sbn-tenant-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policy.toml");
    std::fs::write(
        &path,
        r#"
        [default]
        security.grants.cidrs = ["127.0.0.0/8"]
        dns.nameservers = ["127.0.0.1:9"]
        retry.backoff = { base = "1ms", cap = "5ms" }

        [tenants.t1]
        retry.max_attempts = 1
        "#,
    )
    .unwrap();
    let h = harness_with(loopback_policy(), |b| b.policy_file(&path));

    // Without a tenant: the default's three attempts.
    let err = h.client.get_bytes(&srv.url("/down")).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Status(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(srv.hits("/down"), 3);
    // For tenant t1: its own section, one attempt.
    let err = h
        .client
        .for_tenant("t1")
        .get_bytes(&srv.url("/down"))
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 1);
    assert_eq!(srv.hits("/down"), 4);
    std::fs::remove_dir_all(&dir).unwrap();
    srv.join().await;
}

#[tokio::test]
async fn a_watched_policy_file_is_reloaded_when_it_changes() {
    let srv = FaultServer::http1()
        .route("/down", Reply::status(503))
        .start()
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("sbn-watched-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policy.toml");
    let policy = |attempts: u32| {
        format!(
            "[default]\nsecurity.grants.cidrs = [\"127.0.0.0/8\"]\n\
             dns.nameservers = [\"127.0.0.1:9\"]\n\
             retry.backoff = {{ base = \"1ms\", cap = \"5ms\" }}\n\
             retry.max_attempts = {attempts}\n"
        )
    };
    std::fs::write(&path, policy(1)).unwrap();
    let every = std::time::Duration::from_millis(20);
    let h = harness_with(loopback_policy(), |b| b.policy_file_watched(&path, every));
    assert_eq!(h.client.policy_version(), 1);
    h.client.get_bytes(&srv.url("/down")).await.unwrap_err();
    assert_eq!(srv.hits("/down"), 1);

    // A longer file (so its length changes even where modification times are coarse).
    std::fs::write(&path, format!("# three attempts now\n{}", policy(3))).unwrap();
    crate::support::bounded(async {
        while h.client.policy_version() < 2 {
            tokio::time::sleep(every).await;
        }
    })
    .await;
    let err = h.client.get_bytes(&srv.url("/down")).await.unwrap_err();
    assert_eq!(err.attempts(), 3);
    assert_eq!(srv.hits("/down"), 4);
    std::fs::remove_dir_all(&dir).unwrap();
    srv.join().await;
}
