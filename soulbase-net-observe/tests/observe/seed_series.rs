//! The five series of seed 001 §IX (`Threads.retry.rate`, `Threads.timeout.rate`,
//! `Threads.dedup.drop_rate`, `Threads.hedge.count`, `Threads.circuit.open_ratio`) under their
//! project names: from scripted sequences of events with known values, and from a real
//! client over loopback for the two that depend on how the runtime forms its events (the
//! breaker keys, `IdempotencyKey`'s answers).

use soulbase_net_core::{BreakerState, NetEvent, Observer, Phase};
use soulbase_net_observe::Metrics;

use crate::events::{ms, ok, req, simple, status, timeout};

/// The line of `series` in the exposition, parsed.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (key, value) = l.rsplit_once(' ')?;
        (key == series).then(|| value.parse().ok())?
    })
}

fn transition(m: &dyn Observer, key: &str, from: BreakerState, to: BreakerState) {
    m.on_event(&NetEvent::BreakerTransition { key, from, to });
}

/// Ten calls to a.example: two retried once, two timed out, two duplicates dropped by
/// `IdempotencyKey` plus a cache hit (not a drop), three hedged copies.
fn ten_calls(m: &Metrics) {
    for id in 1..=10u64 {
        let r = req(id, "a.example", None);
        if id <= 2 {
            m.on_event(&NetEvent::RetryScheduled {
                req: r,
                attempt: 1,
                reason: status(503),
                delay: ms(1),
            });
        }
        match id {
            5 | 6 => m.on_event(&NetEvent::Answered {
                req: r,
                by: "idempotency_key",
            }),
            7 => m.on_event(&NetEvent::Answered {
                req: r,
                by: "cache_hook",
            }),
            _ => {}
        }
        if id >= 8 {
            m.on_event(&NetEvent::AttemptStarted {
                req: r,
                attempt: 2,
                hedge: true,
            });
        }
        let outcome = if (3..=4).contains(&id) {
            timeout(Phase::Ttfb)
        } else {
            ok()
        };
        simple(m, r, outcome, 10);
    }
}

#[test]
fn retry_timeout_dedup_and_hedge_series_have_exact_values() {
    let m = Metrics::new();
    ten_calls(&m);
    let text = m.encode();
    let s = |series: &str| sample(&text, series);
    // Threads.retry.rate: the SLI gauge, and the counter pair it divides.
    assert_eq!(s("net_sli_retry_rate"), Some(0.2), "{text}");
    assert_eq!(s(r#"net_retry_total{reason="status_5xx"}"#), Some(2.0));
    // Threads.timeout.rate: the SLI gauge, and the calls whose outcome is a timeout.
    assert_eq!(s("net_sli_timeout_rate"), Some(0.2), "{text}");
    let timed_out = r#"net_requests_total{tenant="",host="a.example",method="GET",scheme="https",outcome="timeout_ttfb",version=""}"#;
    let fine = r#"net_requests_total{tenant="",host="a.example",method="GET",scheme="https",outcome="ok",version="h1"}"#;
    assert_eq!((s(timed_out), s(fine)), (Some(2.0), Some(8.0)), "{text}");
    // Threads.dedup.drop_rate: the cache hit is an answer but not a drop.
    assert_eq!(s("net_sli_dup_drop_rate"), Some(0.2), "{text}");
    assert_eq!(s("net_dedup_drops_total"), Some(2.0), "{text}");
    assert_eq!(s(r#"net_answered_total{by="cache_hook"}"#), Some(1.0));
    // Threads.hedge.count: hedged copies started, per host.
    assert_eq!(
        s(r#"net_hedge_total{host="a.example"}"#),
        Some(3.0),
        "{text}"
    );
    assert_eq!(s("net_sli_hedge_rate"), Some(0.3), "{text}");
}

#[test]
fn dedup_drops_count_the_named_dedup_interceptors() {
    let m = Metrics::builder().dedup_by("my_dedup").build();
    for (id, by) in [(1, "my_dedup"), (2, "idempotency_key"), (3, "cache_hook")] {
        let r = req(id, "a.example", None);
        m.on_event(&NetEvent::Answered { req: r, by });
        simple(&m, r, ok(), 1);
    }
    simple(&m, req(4, "a.example", None), ok(), 1);
    let text = m.encode();
    assert_eq!(sample(&text, "net_dedup_drops_total"), Some(2.0), "{text}");
    assert_eq!(sample(&text, "net_sli_dup_drop_rate"), Some(0.5), "{text}");
}

#[test]
fn open_ratio_is_the_share_of_a_hosts_breakers_that_are_open() {
    use BreakerState::{Closed, HalfOpen, Open};
    let m = Metrics::new();
    let ratio = |m: &Metrics, host: &str| {
        sample(
            &m.encode(),
            &format!(r#"net_circuit_open_ratio{{host="{host}"}}"#),
        )
    };
    // Nothing has changed state: no series.
    assert!(!m.encode().contains("net_circuit_open_ratio"));
    // Keyed by host: one breaker per origin, so 0 or 1.
    transition(&m, "https://a.example", Closed, Open);
    assert_eq!(ratio(&m, "a.example"), Some(1.0));
    transition(&m, "https://a.example", Open, HalfOpen);
    assert_eq!(ratio(&m, "a.example"), Some(0.0), "half-open is not open");
    transition(&m, "https://a.example", HalfOpen, Open);
    assert_eq!(ratio(&m, "a.example"), Some(1.0));
    transition(&m, "https://a.example", Open, HalfOpen);
    transition(&m, "https://a.example", HalfOpen, Closed);
    assert_eq!(ratio(&m, "a.example"), Some(0.0), "closed again");
    // Keyed by host and tenant, and on another port: b.example's four breakers, one open.
    for tenant in ["t1", "t2", "t3"] {
        let key = format!("https://b.example/{tenant}");
        transition(&m, &key, Closed, Open);
    }
    transition(&m, "http://b.example:8081/t1", Closed, Open);
    assert_eq!(ratio(&m, "b.example"), Some(1.0));
    for tenant in ["t1", "t2"] {
        let key = format!("https://b.example/{tenant}");
        transition(&m, &key, Open, HalfOpen);
        transition(&m, &key, HalfOpen, Closed);
    }
    transition(&m, "http://b.example:8081/t1", Open, HalfOpen);
    assert_eq!(ratio(&m, "b.example"), Some(0.25));
    // The host label is the requests' own: no scheme, port or tenant.
    let text = m.encode();
    assert!(
        text.contains("# TYPE net_circuit_open_ratio gauge\n"),
        "{text}"
    );
    assert_eq!(
        text.matches("net_circuit_open_ratio{").count(),
        2,
        "one series per host: {text}"
    );
}

#[test]
fn open_ratio_keeps_open_breakers_and_caps_hosts() {
    use BreakerState::{Closed, Open};
    let m = Metrics::builder().max_hosts(2).build();
    transition(&m, "https://a.example", Closed, Open);
    transition(&m, "https://b.example", Closed, Open);
    transition(&m, "https://b.example", Open, Closed);
    // Two keys known, the most kept: c.example's takes the place of b.example's (closed),
    // and its host, past the two host labels, is `_other`.
    transition(&m, "https://c.example", Closed, Open);
    // Both known keys are open: d.example's is not kept, no open breaker is forgotten.
    transition(&m, "https://d.example", Closed, Open);
    let text = m.encode();
    let s = |host: &str| {
        sample(
            &text,
            &format!(r#"net_circuit_open_ratio{{host="{host}"}}"#),
        )
    };
    assert_eq!(
        (s("a.example"), s("_other")),
        (Some(1.0), Some(1.0)),
        "{text}"
    );
    assert_eq!(s("b.example"), None, "{text}");
    assert_eq!(text.matches("net_circuit_open_ratio{").count(), 2, "{text}");
}

/// A real client over loopback, breakers per (origin, tenant), quick to open and to probe.
#[tokio::test]
async fn a_real_client_reports_the_open_ratio_under_the_requests_host() {
    use std::{sync::Arc, time::Duration};

    use soulbase_net_core::NetRequest;
    use soulbase_net_testkit::{FaultServer, Reply};

    let srv = FaultServer::http1()
        .route("/down", Reply::status(503))
        .route("/up", Reply::ok("ok"))
        .start()
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let mut policy = soulbase_net_policy::NetPolicy::default();
    policy.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    policy.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    policy.retry.enabled = false;
    policy.cbreaker.enabled = true;
    policy.cbreaker.key_by = soulbase_net_policy::CbKey::HostTenant;
    policy.cbreaker.consecutive_failures = 1;
    policy.cbreaker.min_samples = 1;
    policy.cbreaker.half_open_probes = 1;
    policy.cbreaker.cooldown = Duration::from_millis(200);
    let client = soulbase_net_runtime::Client::builder()
        .policy(policy)
        .observer(metrics.clone())
        .build()
        .unwrap();
    let call =
        |path: &str, tenant: &str| client.send(NetRequest::get(srv.url(path)).tenant(tenant));
    for tenant in ["t1", "t2"] {
        let res = call("/down", tenant).await.unwrap();
        assert_eq!(res.status, 503);
    }
    let ratio = r#"net_circuit_open_ratio{host="127.0.0.1"}"#;
    let text = metrics.encode();
    assert_eq!(sample(&text, ratio), Some(1.0), "{text}");
    assert!(
        text.contains(r#"net_requests_total{tenant="t1",host="127.0.0.1","#),
        "the same host label as the requests: {text}"
    );
    // After the cooldown, t2's probe succeeds and closes its breaker; t1's stays open.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let res = call("/up", "t2").await.unwrap();
    assert_eq!(res.status, 200);
    let text = metrics.encode();
    assert_eq!(sample(&text, ratio), Some(0.5), "{text}");
    srv.join().await;
}

/// A real client with `IdempotencyKey`: the duplicate it answers from its dedup window is the
/// runtime's `Answered { by: "idempotency_key" }`, counted as a drop.
#[tokio::test]
async fn a_real_duplicate_dropped_by_idempotency_key_is_a_dedup_drop() {
    use std::{sync::Arc, time::Duration};

    use soulbase_net_core::NetRequest;
    use soulbase_net_interceptors::IdempotencyKey;
    use soulbase_net_testkit::{FaultServer, Reply};

    let srv = FaultServer::http1()
        .route("/pay", Reply::echo())
        .start()
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let keys = Arc::new(
        IdempotencyKey::derived(Duration::from_secs(3600)).dedup_window(Duration::from_secs(60)),
    );
    let mut policy = soulbase_net_policy::NetPolicy::default();
    policy.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    policy.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    let client = soulbase_net_runtime::Client::builder()
        .policy(policy)
        .interceptors(vec![keys.clone()])
        .observer(metrics.clone())
        .build()
        .unwrap();
    let pay = || {
        NetRequest::post(srv.url("/pay"))
            .idempotent(true)
            .body("pay 5")
    };
    let mut answers = Vec::new();
    for _ in 0..3 {
        let res = client.send(pay()).await.unwrap();
        answers.push(res.text().await.unwrap());
    }
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
    assert_eq!((srv.hits("/pay"), keys.dedup_drops()), (1, 2));
    let text = metrics.encode();
    assert_eq!(sample(&text, "net_dedup_drops_total"), Some(2.0), "{text}");
    assert_eq!(
        sample(&text, "net_sli_dup_drop_rate"),
        Some(2.0 / 3.0),
        "{text}"
    );
    srv.join().await;
}
