//! Retries, the retry budget, the circuit breaker and the limiter through the client.

use std::{sync::Arc, time::Duration};

use soulbase_net_core::{ErrorCode, ErrorKind, NetClient, NetRequest};
use soulbase_net_policy::NetPolicy;
use soulbase_net_testkit::{FaultServer, Reply, Script};

use crate::support::{harness, loopback_policy, slow_then_fast};

/// Fast backoff so retry tests take milliseconds.
fn quick(mut p: NetPolicy) -> NetPolicy {
    p.retry.backoff.base = Duration::from_millis(5);
    p.retry.backoff.cap = Duration::from_secs(2);
    p
}

#[tokio::test]
async fn get_is_retried_on_503_then_succeeds() {
    let srv = FaultServer::http1()
        .route("/flaky", Script::status(503).times(1).then(Reply::ok("hi")))
        .start()
        .await
        .unwrap();
    let h = harness(quick(loopback_policy()));
    let res = h
        .client
        .send(NetRequest::get(srv.url("/flaky")))
        .await
        .unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(res.attempts, 2);
    assert_eq!(srv.hits("/flaky"), 2);
    let seen = h.events.seen.lock().clone();
    assert!(
        seen.iter().any(|e| e.starts_with("RetryScheduled")),
        "{seen:?}"
    );
    srv.join().await;
}

#[tokio::test]
async fn post_is_never_retried_without_the_flag_and_keeps_one_key_with_it() {
    let srv = FaultServer::http1()
        .route("/once", Script::status(503).times(5).then(Reply::ok("x")))
        .route(
            "/keyed",
            Script::status(503).times(2).then(Reply::ok("done")),
        )
        .start()
        .await
        .unwrap();
    let h = harness(quick(loopback_policy()));
    let res = h
        .client
        .send(NetRequest::post(srv.url("/once")).body("order"))
        .await
        .unwrap();
    assert_eq!(res.status, 503);
    assert_eq!(srv.hits("/once"), 1, "exactly one side effect");

    let res = h
        .client
        .send(
            NetRequest::post(srv.url("/keyed"))
                .body("order")
                .idempotent(true),
        )
        .await
        .unwrap();
    assert_eq!(res.status, 200);
    let seen = srv.requests("/keyed");
    assert_eq!(seen.len(), 3);
    let keys: Vec<_> = seen
        .iter()
        .map(|r| r.header("idempotency-key").map(str::to_owned))
        .collect();
    assert!(
        keys[0].as_deref().is_some_and(|k| k.len() == 32),
        "{keys:?}"
    );
    assert!(keys.iter().all(|k| k == &keys[0]), "{keys:?}");
    srv.join().await;
}

#[tokio::test]
async fn client_errors_are_never_retried() {
    let srv = FaultServer::http1()
        .route("/bad", Reply::status(400))
        .start()
        .await
        .unwrap();
    let h = harness(quick(loopback_policy()));
    let res = h
        .client
        .send(NetRequest::get(srv.url("/bad")))
        .await
        .unwrap();
    assert_eq!(res.status, 400);
    assert_eq!(srv.hits("/bad"), 1);
    srv.join().await;
}

#[tokio::test]
async fn retry_after_is_obeyed_and_one_over_the_cap_stops() {
    let srv = FaultServer::http1()
        .route(
            "/wait",
            Script::reply(Reply::status(503).header("retry-after", "1"))
                .times(1)
                .then(Reply::ok("ok")),
        )
        .route("/long", Reply::status(503).header("retry-after", "30"))
        .start()
        .await
        .unwrap();
    let h = harness(quick(loopback_policy()));
    let started = tokio::time::Instant::now();
    let res = h
        .client
        .send(NetRequest::get(srv.url("/wait")))
        .await
        .unwrap();
    assert_eq!(res.status, 200);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited {:?}",
        started.elapsed()
    );
    let res = h
        .client
        .send(NetRequest::get(srv.url("/long")))
        .await
        .unwrap();
    assert_eq!(res.status, 503);
    assert_eq!(
        srv.hits("/long"),
        1,
        "Retry-After above the cap is not waited for"
    );
    srv.join().await;
}

#[tokio::test]
async fn the_total_deadline_bounds_every_retry() {
    let mut srv = FaultServer::http1()
        .route(
            "/slow",
            Reply::status(503).delay(Duration::from_millis(150)),
        )
        .start()
        .await
        .unwrap();
    let mut p = quick(loopback_policy());
    p.retry.max_attempts = 10;
    // The policy must keep its own deadline (10 attempts × 1 s + backoff ≤ 30 s − margin).
    p.timeout.attempt = Duration::from_secs(1);
    p.timeout.connect = Duration::from_millis(500);
    p.timeout.ttfb = Duration::from_secs(1);
    p.timeout.read = Duration::from_secs(1);
    p.timeout.write = Duration::from_secs(1);
    p.timeout.dynamic.max = Duration::from_secs(1);
    let h = harness(p);
    let started = tokio::time::Instant::now();
    let req = NetRequest::get(srv.url("/slow")).total_timeout(Duration::from_millis(600));
    let res = h.client.send(req).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(600) + Duration::from_millis(900),
        "took {took:?}"
    );
    match res {
        Ok(r) => assert_eq!(r.status, 503),
        Err(e) => assert_eq!(
            e.kind(),
            ErrorKind::Timeout(soulbase_net_core::Phase::Total)
        ),
    }
    srv.shutdown().await;
}

#[tokio::test]
async fn dropping_the_call_stops_further_attempts() {
    let mut srv = FaultServer::http1()
        .route("/r", Reply::status(503).header("retry-after", "1"))
        .start()
        .await
        .unwrap();
    let h = harness(quick(loopback_policy()));
    let client = Arc::new(h.client);
    let call = {
        let (client, url) = (client.clone(), srv.url("/r"));
        tokio::spawn(async move { client.send(NetRequest::get(url)).await })
    };
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/r", 1))
        .await
        .unwrap();
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    // The retry was due after 1 s; watch 1.5 s for an attempt that must not come.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(srv.hits("/r"), 1);
    srv.shutdown().await;
}

#[tokio::test]
async fn the_breaker_cuts_requests_to_a_failing_upstream_by_over_90_percent() {
    let mut counts = Vec::new();
    for breaker_on in [false, true] {
        let srv = FaultServer::http1()
            .route("/down", Reply::status(503))
            .start()
            .await
            .unwrap();
        let mut p = quick(loopback_policy());
        p.retry.enabled = false;
        p.cbreaker.enabled = breaker_on;
        p.cbreaker.consecutive_failures = 5;
        p.cbreaker.cooldown = Duration::from_secs(60);
        let h = harness(p);
        let mut open = 0;
        for _ in 0..100 {
            match h.client.send(NetRequest::get(srv.url("/down"))).await {
                Ok(res) => assert_eq!(res.status, 503),
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::CircuitOpen);
                    assert_eq!(e.code(), ErrorCode::ProviderUnavailable);
                    assert!(e.retry_after().is_some());
                    open += 1;
                }
            }
        }
        assert_eq!(open > 0, breaker_on);
        if breaker_on {
            let seen = h.events.seen.lock().clone();
            assert!(
                seen.iter()
                    .any(|e| e.contains("BreakerTransition") && e.contains("Open")),
                "{seen:?}"
            );
        }
        counts.push(srv.hits("/down"));
        srv.join().await;
    }
    let (off, on) = (counts[0], counts[1]);
    assert_eq!(off, 100);
    let reduction = 1.0 - on as f64 / off as f64;
    assert!(reduction >= 0.9, "breaker off {off} hits, on {on} hits");
}

#[tokio::test]
async fn a_failing_port_does_not_open_the_circuit_of_another_port_of_the_same_host() {
    let down = FaultServer::http1()
        .route("/x", Reply::status(503))
        .start()
        .await
        .unwrap();
    let healthy = FaultServer::http1()
        .route("/x", Reply::ok("up"))
        .start()
        .await
        .unwrap();
    assert_eq!(down.addr().ip(), healthy.addr().ip());
    let mut p = quick(loopback_policy());
    p.retry.enabled = false;
    p.cbreaker.enabled = true;
    p.cbreaker.consecutive_failures = 3;
    p.cbreaker.cooldown = Duration::from_secs(60);
    let h = harness(p);
    let mut open = 0;
    for _ in 0..10 {
        if let Err(e) = h.client.send(NetRequest::get(down.url("/x"))).await {
            assert_eq!(e.kind(), ErrorKind::CircuitOpen);
            open += 1;
        }
    }
    assert_eq!(
        open, 7,
        "the failing port's circuit opened after 3 failures"
    );
    for _ in 0..20 {
        let res = h
            .client
            .send(NetRequest::get(healthy.url("/x")))
            .await
            .unwrap();
        assert_eq!(res.status, 200);
    }
    assert_eq!(healthy.hits("/x"), 20);
    // The circuit is the origin's: scheme, host and port.
    let seen = h.events.seen.lock().clone();
    let origin = down.origin();
    assert!(
        seen.iter()
            .any(|e| e.contains("BreakerTransition") && e.contains(origin)),
        "{seen:?}"
    );
    down.join().await;
    healthy.join().await;
}

#[tokio::test]
async fn the_retry_budget_caps_retries_under_total_failure() {
    let srv = FaultServer::http1()
        .route("/down", Reply::status(503))
        .start()
        .await
        .unwrap();
    let mut p = quick(loopback_policy());
    p.retry.backoff.base = Duration::from_millis(1);
    p.retry.budget.retry_ratio = 0.2;
    p.retry.budget.min_retries_per_sec = 0;
    let h = harness(p);
    let requests = 200;
    for _ in 0..requests {
        let res = h
            .client
            .send(NetRequest::get(srv.url("/down")))
            .await
            .unwrap();
        assert_eq!(res.status, 503);
    }
    let per_request = srv.hits("/down") as f64 / requests as f64;
    assert!(
        per_request <= 1.0 + 0.2 + 0.02,
        "{per_request} attempts per request"
    );
    assert!(per_request > 1.0, "some retries were allowed");
    assert!(h
        .events
        .seen
        .lock()
        .iter()
        .any(|e| e.starts_with("RetryBudgetExhausted")));
    srv.join().await;
}

#[tokio::test]
async fn over_the_concurrency_limit_is_rate_limited_at_once() {
    let mut srv = FaultServer::http1()
        .route("/hold", Reply::ok("x").delay(Duration::from_secs(2)))
        .start()
        .await
        .unwrap();
    let mut p = loopback_policy();
    p.limits.per_host_concurrency = 1;
    let h = harness(p);
    let client = Arc::new(h.client);
    let first = {
        let (client, url) = (client.clone(), srv.url("/hold"));
        tokio::spawn(async move { client.send(NetRequest::get(url)).await })
    };
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/hold", 1))
        .await
        .unwrap();
    let err = client
        .send(NetRequest::get(srv.url("/hold")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.code(), ErrorCode::QuotaRateLimited);
    assert_eq!(err.public_code(), ErrorCode::ProviderUnavailable);
    assert_eq!(srv.hits("/hold"), 1);
    first.abort();
    srv.shutdown().await;
}

#[tokio::test]
async fn a_hedge_answers_for_a_slow_replica_with_the_same_key() {
    // Hedged copies are copies whatever the retry setting: with retries off they carry the
    // key all the same.
    for retries in [true, false] {
        let mut srv = FaultServer::http1()
            .route("/h", slow_then_fast())
            .start()
            .await
            .unwrap();
        let mut p = quick(loopback_policy());
        p.retry.enabled = retries;
        p.hedge.enabled = true;
        p.hedge.delay = Duration::from_millis(50);
        p.hedge.max_hedges = 1;
        let h = harness(p);
        let started = tokio::time::Instant::now();
        let res = h
            .client
            .send(NetRequest::post(srv.url("/h")).body("x").idempotent(true))
            .await
            .unwrap();
        assert_eq!(res.text().await.unwrap(), "fast");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
        let seen = srv.requests("/h");
        assert_eq!(seen.len(), 2);
        let key = seen[0]
            .header("idempotency-key")
            .unwrap_or_else(|| panic!("no key with retries {retries}"));
        assert_eq!(key.len(), 32);
        assert_eq!(seen[1].header("idempotency-key"), Some(key));
        // Two attempts started, one finished: the slow copy was dropped (cancelled) mid-flight.
        let events = h.events.seen.lock().clone();
        let started = events
            .iter()
            .filter(|e| e.starts_with("attempt ") && e.split(' ').count() == 2)
            .count();
        let finished = events
            .iter()
            .filter(|e| e.starts_with("attempt ") && e.split(' ').count() == 3)
            .count();
        assert_eq!((started, finished), (2, 1), "{events:?}");
        srv.shutdown().await;
    }
}

#[tokio::test]
async fn hedging_cuts_the_tail_of_a_slow_replica() {
    let mut tails = Vec::new();
    for hedged in [false, true] {
        let mut srv = FaultServer::http1()
            .route(
                "/t",
                Script::random(
                    soulbase_net_testkit::RandomFaults::seeded(7)
                        .fault(0.2, Reply::ok("slow").delay(Duration::from_millis(800)))
                        .otherwise(Reply::ok("fast")),
                ),
            )
            .start()
            .await
            .unwrap();
        let mut p = quick(loopback_policy());
        p.hedge.enabled = hedged;
        // Fast replies take about a millisecond; 100 ms keeps a loaded machine from hedging
        // them, and two hedges make three slow draws in a row (0.8 %) the only way to lose.
        p.hedge.delay = Duration::from_millis(100);
        p.hedge.max_hedges = 2;
        let h = harness(p);
        let mut worst = Duration::ZERO;
        for _ in 0..30 {
            let started = tokio::time::Instant::now();
            let res = h.client.send(NetRequest::get(srv.url("/t"))).await.unwrap();
            res.bytes().await.unwrap();
            worst = worst.max(started.elapsed());
        }
        tails.push(worst);
        srv.shutdown().await;
    }
    assert!(
        tails[0] >= Duration::from_millis(800),
        "unhedged worst {:?}",
        tails[0]
    );
    assert!(
        tails[1] < Duration::from_millis(600),
        "hedged worst {:?}",
        tails[1]
    );
}

#[tokio::test]
async fn a_failing_origin_is_frozen_and_the_alternative_serves() {
    let good = FaultServer::http1()
        .route("/v1/x", Reply::ok("alt"))
        .start()
        .await
        .unwrap();
    let dead = soulbase_net_testkit::refused_addr().await.unwrap();
    let mut p = quick(loopback_policy());
    p.endpoints.urls = vec![good.origin().to_owned()];
    let h = harness(p);
    let url = format!("http://{dead}/v1/x");
    let res = h.client.send(NetRequest::get(&url)).await.unwrap();
    assert_eq!(res.attempts, 2);
    assert_eq!(res.text().await.unwrap(), "alt");
    // The frozen origin is skipped at once on the next call.
    let res = h.client.send(NetRequest::get(&url)).await.unwrap();
    assert_eq!(res.attempts, 1);
    let dials_to_dead = h.dialer.dialled().iter().filter(|a| **a == dead).count();
    assert_eq!(dials_to_dead, 1);
    assert_eq!(good.hits("/v1/x"), 2);
    good.join().await;
}

#[tokio::test]
async fn a_5xx_or_a_timeout_freezes_the_origin_as_freeze_on_says() {
    use soulbase_net_policy::FreezeOn;
    for (case, freeze_on) in [
        ("5xx", vec![FreezeOn::Status5xx]),
        ("timeout", vec![FreezeOn::Timeout]),
        ("connect only", vec![FreezeOn::Connect]),
    ] {
        let bad_reply = if case == "timeout" {
            Reply::ok("late").delay(Duration::from_secs(2))
        } else {
            Reply::status(503)
        };
        let mut bad = FaultServer::http1()
            .route("/v1/x", bad_reply)
            .start()
            .await
            .unwrap();
        let good = FaultServer::http1()
            .route("/v1/x", Reply::ok("alt"))
            .start()
            .await
            .unwrap();
        let mut p = quick(loopback_policy());
        p.endpoints.urls = vec![good.origin().to_owned()];
        p.endpoints.freeze_on = freeze_on;
        p.timeout.ttfb = Duration::from_millis(150);
        let h = harness(p);
        let url = bad.url("/v1/x");
        let res = h.client.send(NetRequest::get(url.as_str())).await;
        if case == "connect only" {
            // A 503 does not freeze under this policy: every retry goes to the same origin.
            assert_eq!(res.unwrap().status, 503, "{case}");
            assert_eq!((bad.hits("/v1/x"), good.hits("/v1/x")), (3, 0), "{case}");
            assert!(h.client.frozen_endpoints().is_empty());
        } else {
            // The first attempt fails and freezes the origin; the retry and the next call go
            // to the alternative.
            let res = res.unwrap();
            assert_eq!((res.status.as_u16(), res.attempts), (200, 2), "{case}");
            let res = h.client.send(NetRequest::get(url.as_str())).await.unwrap();
            assert_eq!((res.status.as_u16(), res.attempts), (200, 1), "{case}");
            assert_eq!((bad.hits("/v1/x"), good.hits("/v1/x")), (1, 2), "{case}");
            let frozen = h.client.frozen_endpoints();
            assert_eq!(frozen.len(), 1, "{case}: {frozen:?}");
            assert_eq!(frozen[0].0, bad.origin(), "{case}");
        }
        bad.shutdown().await;
        good.join().await;
    }
}

#[tokio::test]
async fn when_every_origin_is_frozen_the_one_that_thaws_first_is_tried() {
    let a = FaultServer::http1()
        .route("/v1/x", Reply::ok("a"))
        .start()
        .await
        .unwrap();
    let b = FaultServer::http1()
        .route("/v1/x", Reply::ok("b"))
        .start()
        .await
        .unwrap();
    let mut p = quick(loopback_policy());
    p.endpoints.urls = vec![b.origin().to_owned()];
    let h = harness(p);
    // Both frozen by hand: b thaws first, so it serves calls to a.
    h.client
        .freeze_endpoint(&a.url("/"), Duration::from_secs(20))
        .unwrap();
    h.client
        .freeze_endpoint(&b.url("/"), Duration::from_secs(10))
        .unwrap();
    let res = h
        .client
        .send(NetRequest::get(a.url("/v1/x")))
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap(), "b");
    assert_eq!(h.client.frozen_endpoints().len(), 2);
    // Thawed by hand, a serves again.
    assert!(h.client.unfreeze_endpoint(&a.url("/")).unwrap());
    assert!(!h.client.unfreeze_endpoint(&a.url("/")).unwrap());
    let res = h
        .client
        .send(NetRequest::get(a.url("/v1/x")))
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap(), "a");
    assert_eq!((a.hits("/v1/x"), b.hits("/v1/x")), (1, 1));
    assert!(h
        .client
        .freeze_endpoint("not a url", Duration::from_secs(1))
        .is_err());
    a.join().await;
    b.join().await;
}

#[tokio::test]
async fn frozen_origins_survive_a_restart_next_to_the_dns_cache_file() {
    let dir = std::env::temp_dir().join(format!("soulbase-frozen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dead = soulbase_net_testkit::refused_addr().await.unwrap();
    let good = FaultServer::http1()
        .route("/v1/x", Reply::ok("alt"))
        .start()
        .await
        .unwrap();
    let mut p = quick(loopback_policy());
    p.endpoints.urls = vec![good.origin().to_owned()];
    p.dns.persist_file = Some(dir.join("dns.json"));
    p.dns.persist_interval = None;
    let url = format!("http://{dead}/v1/x");
    {
        let h = harness(p.clone());
        let res = h.client.send(NetRequest::get(&url)).await.unwrap();
        assert_eq!(res.attempts, 2, "the refused origin was tried, then frozen");
    }
    assert!(dir.join("dns.json.frozen").exists());
    // A new client (a restart): the origin is still frozen, and not dialled.
    let h = harness(p);
    let frozen = h.client.frozen_endpoints();
    assert_eq!(frozen.len(), 1, "{frozen:?}");
    assert!(frozen[0].1 > Duration::from_secs(500), "{frozen:?}");
    let res = h.client.send(NetRequest::get(&url)).await.unwrap();
    assert_eq!(res.attempts, 1);
    assert!(h.dialer.dialled().iter().all(|a| *a != dead));
    assert_eq!(good.hits("/v1/x"), 2);
    good.join().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_dynamic_timeout_learns_from_recent_latency() {
    let mut srv = FaultServer::http1()
        .route("/fast", Reply::ok("f"))
        .route("/slow", Reply::ok("s").delay(Duration::from_millis(600)))
        .start()
        .await
        .unwrap();
    let mut p = quick(loopback_policy());
    p.retry.enabled = false;
    p.timeout.dynamic.enabled = true;
    p.timeout.dynamic.min_samples = 10;
    p.timeout.dynamic.min = Duration::from_millis(100);
    let h = harness(p.clone());
    for _ in 0..20 {
        h.client
            .send(NetRequest::get(srv.url("/fast")))
            .await
            .unwrap();
    }
    let err = h
        .client
        .send(NetRequest::get(srv.url("/slow")))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Timeout(soulbase_net_core::Phase::Ttfb)
    );
    // Without the learnt timeout the same call succeeds.
    p.timeout.dynamic.enabled = false;
    let fixed = harness(p);
    assert_eq!(
        fixed
            .client
            .send(NetRequest::get(srv.url("/slow")))
            .await
            .unwrap()
            .status,
        200
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn a_cancel_token_stops_the_call_and_its_retries() {
    let mut srv = FaultServer::http1()
        .route("/r", Reply::status(503).header("retry-after", "1"))
        .start()
        .await
        .unwrap();
    let h = harness(quick(loopback_policy()));
    let token = soulbase_net_runtime::CancellationToken::new();
    let mut req = NetRequest::get(srv.url("/r"));
    req.extensions.insert(token.clone());
    let client = Arc::new(h.client);
    let call = {
        let client = client.clone();
        tokio::spawn(async move { client.send(req).await })
    };
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/r", 1))
        .await
        .unwrap();
    token.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    // The retry was due after 1 s; watch 1.5 s for an attempt that must not come.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(srv.hits("/r"), 1);
    srv.shutdown().await;
}

#[tokio::test]
async fn an_address_that_refuses_is_frozen_and_skipped() {
    let srv = FaultServer::http1()
        .route("/a", Reply::ok("up"))
        .start()
        .await
        .unwrap();
    let port = srv.addr().port();
    // 127.0.0.2 is loopback too, but nothing listens there on this port.
    let mut p = loopback_policy();
    p.dns.shuffle = false;
    p.dns.static_hosts.insert(
        "two.test".to_owned(),
        vec!["127.0.0.2".parse().unwrap(), "127.0.0.1".parse().unwrap()],
    );
    let h = crate::support::harness_with(p, |b| b.pool_max_idle_per_host(0));
    let url = format!("http://two.test:{port}/a");
    for _ in 0..3 {
        assert_eq!(
            h.client.send(NetRequest::get(&url)).await.unwrap().status,
            200
        );
    }
    let dead: std::net::SocketAddr = format!("127.0.0.2:{port}").parse().unwrap();
    let dials_to_dead = h.dialer.dialled().iter().filter(|a| **a == dead).count();
    assert_eq!(dials_to_dead, 1, "{:?}", h.dialer.dialled());
    assert_eq!(srv.hits("/a"), 3);
    srv.join().await;
}

#[tokio::test]
async fn a_policy_key_selects_its_named_policy_and_an_unknown_one_is_refused() {
    let srv = FaultServer::http1()
        .route("/pay", Script::status(503).times(2).then(Reply::ok("paid")))
        .start()
        .await
        .unwrap();
    let p = quick(loopback_policy());
    let mut doc = soulbase_net_policy::PolicyDocument::from_policy(&p);
    doc.set_key("payments", serde_json::json!({"retry": {"enabled": false}}));
    let resolver = soulbase_net_policy::SnapshotResolver::new(doc).unwrap();
    let h = crate::support::harness_with(p, |b| b.policy_resolver(std::sync::Arc::new(resolver)));
    // Under the named policy: no retry, the first 503 is the answer.
    let res = h
        .client
        .send(NetRequest::get(srv.url("/pay")).policy_key("payments"))
        .await
        .unwrap();
    assert_eq!((res.status.as_u16(), res.attempts), (503, 1));
    // Without it: the host's policy retries to success.
    let res = h
        .client
        .send(NetRequest::get(srv.url("/pay")))
        .await
        .unwrap();
    assert_eq!((res.status.as_u16(), res.attempts), (200, 2));
    // A key the document does not define: refused before anything is sent.
    let err = h
        .client
        .send(NetRequest::get(srv.url("/pay")).policy_key("payment"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
    assert!(err.to_string().contains("[keys.payment]"), "{err}");
    assert_eq!(srv.hits("/pay"), 3);
    srv.join().await;
}
