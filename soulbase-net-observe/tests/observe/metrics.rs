//! The exposition after a scripted scenario: exact counter values and histogram buckets.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use soulbase_net_core::{http::StatusCode, BreakerState, Direction, NetEvent, Observer, Phase};
use soulbase_net_observe::{Fanout, Metrics};

use crate::events::{attempt, finished, ms, ok, req, simple, started, status, timeout};

/// The sample lines of an exposition: `name{labels}` → value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').unwrap();
            (key.to_owned(), value.parse().unwrap())
        })
        .collect()
}

fn assert_sample(samples: &HashMap<String, f64>, key: &str, want: f64) {
    assert_eq!(samples.get(key).copied(), Some(want), "{key}");
}

/// Successes, a retry, a breaker opening, a redirect, bytes, a timeout and a 503.
fn scenario(m: &dyn Observer) {
    let a = |id| req(id, "a.example", Some("t1"));
    // 1: a plain success on a new connection, with bytes.
    started(m, a(1));
    attempt(m, a(1), 1, ok(), 3, 20);
    m.on_event(&NetEvent::Bytes {
        req: a(1),
        dir: Direction::Out,
        bytes: 100,
    });
    m.on_event(&NetEvent::Bytes {
        req: a(1),
        dir: Direction::In,
        bytes: 2000,
    });
    finished(m, a(1), ok(), 1, 20);
    // 2: a 503, a retry, then a success.
    started(m, a(2));
    attempt(m, a(2), 1, status(503), 0, 40);
    m.on_event(&NetEvent::RetryScheduled {
        req: a(2),
        attempt: 1,
        reason: status(503),
        delay: ms(100),
    });
    attempt(m, a(2), 2, ok(), 0, 30);
    finished(m, a(2), ok(), 2, 180);
    // The breaker for a.example opens, then half-opens.
    for (from, to) in [
        (BreakerState::Closed, BreakerState::Open),
        (BreakerState::Open, BreakerState::HalfOpen),
    ] {
        m.on_event(&NetEvent::BreakerTransition {
            key: "a.example",
            from,
            to,
        });
    }
    // 3: a redirect followed.
    started(m, a(3));
    m.on_event(&NetEvent::Redirected {
        req: a(3),
        status: StatusCode::FOUND,
        location: "https://a.example/next",
    });
    attempt(m, a(3), 1, ok(), 0, 60);
    finished(m, a(3), ok(), 1, 60);
    // 4: a ttfb timeout.
    started(m, a(4));
    attempt(m, a(4), 1, timeout(Phase::Ttfb), 0, 1000);
    m.on_event(&NetEvent::TimedOut {
        req: a(4),
        phase: Phase::Ttfb,
    });
    finished(m, a(4), timeout(Phase::Ttfb), 1, 1000);
    // 5: a 503 without a tenant on another host.
    simple(m, req(5, "b.example", None), status(503), 5);
}

#[test]
fn scripted_scenario_gives_exact_counters_and_buckets() {
    let metrics = Metrics::new();
    scenario(&metrics);
    let text = metrics.encode();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let s = samples(&text);
    let r = |tenant: &str, host: &str, outcome: &str| {
        // A response came over HTTP/1.1; an error has no version.
        let version = if outcome.starts_with("timeout") {
            ""
        } else {
            "h1"
        };
        format!(
            r#"net_requests_total{{tenant="{tenant}",host="{host}",method="GET",scheme="https",outcome="{outcome}",version="{version}"}}"#
        )
    };
    assert_sample(&s, &r("t1", "a.example", "ok"), 3.0);
    assert_sample(&s, &r("t1", "a.example", "timeout_ttfb"), 1.0);
    assert_sample(&s, &r("", "b.example", "status_5xx"), 1.0);
    assert_eq!(
        s.keys()
            .filter(|k| k.starts_with("net_requests_total"))
            .count(),
        3,
        "{text}"
    );
    assert_sample(&s, r#"net_retry_total{reason="status_5xx"}"#, 1.0);
    assert_sample(&s, r#"net_circuit_open_total{host="a.example"}"#, 1.0);
    assert_sample(&s, r#"net_breaker_state{key="a.example"}"#, 1.0);
    assert_sample(&s, r#"net_redirect_total{host="a.example"}"#, 1.0);
    assert_sample(
        &s,
        r#"net_bytes_total{dir="out",tenant="t1",host="a.example"}"#,
        100.0,
    );
    assert_sample(
        &s,
        r#"net_bytes_total{dir="in",tenant="t1",host="a.example"}"#,
        2000.0,
    );
    assert_sample(&s, r#"net_timeouts_total{phase="ttfb"}"#, 1.0);

    // total: 20, 180, 60, 1000, 5 ms.
    let bucket =
        |phase: &str, le: &str| format!(r#"net_latency_ms_bucket{{le="{le}",phase="{phase}"}}"#);
    let total = [
        ("1.0", 0.0),
        ("2.0", 0.0),
        ("5.0", 1.0),
        ("10.0", 1.0),
        ("25.0", 2.0),
        ("50.0", 2.0),
        ("100.0", 3.0),
        ("250.0", 4.0),
        ("500.0", 4.0),
        ("1000.0", 5.0),
        ("10000.0", 5.0),
        ("+Inf", 5.0),
    ];
    for (le, n) in total {
        assert_sample(&s, &bucket("total", le), n);
    }
    assert_sample(&s, r#"net_latency_ms_count{phase="total"}"#, 5.0);
    assert_sample(&s, r#"net_latency_ms_sum{phase="total"}"#, 1265.0);
    // ttfb, responses only: 20, 40, 30, 60, 5 ms (the timed-out attempt is not a ttfb).
    for (le, n) in [
        ("5.0", 1.0),
        ("10.0", 1.0),
        ("25.0", 2.0),
        ("50.0", 4.0),
        ("100.0", 5.0),
        ("+Inf", 5.0),
    ] {
        assert_sample(&s, &bucket("ttfb", le), n);
    }
    // connect, new connections only: 3 ms.
    for (le, n) in [("2.0", 0.0), ("5.0", 1.0), ("+Inf", 1.0)] {
        assert_sample(&s, &bucket("connect", le), n);
    }
    assert_sample(&s, r#"net_latency_ms_count{phase="connect"}"#, 1.0);

    // The SLIs of the same scenario, as gauges.
    assert_sample(&s, "net_sli_retry_rate", 0.2);
    assert_sample(&s, "net_sli_timeout_rate", 0.2);
    assert_sample(&s, "net_sli_error_ratio", 0.4);
    assert_sample(&s, "net_sli_p50_latency_ms", 60.0);
    assert_sample(&s, "net_sli_p99_latency_ms", 1000.0);
    assert_sample(&s, "net_sli_dup_drop_rate", 0.0);
    assert_sample(&s, "net_sli_hedge_rate", 0.0);
}

#[test]
fn limits_blocks_budgets_and_dns_are_counted() {
    use soulbase_net_core::{DnsSource, LimitScope};
    let m = Metrics::new();
    let r = req(1, "c.example", None);
    m.on_event(&NetEvent::RateLimited {
        req: r,
        scope: LimitScope::HostRate,
    });
    m.on_event(&NetEvent::RateLimited {
        req: r,
        scope: LimitScope::HostRate,
    });
    m.on_event(&NetEvent::RetryBudgetExhausted {
        req: r,
        reason: status(503),
    });
    m.on_event(&NetEvent::Blocked {
        req: r,
        addr: None,
        rule: "private",
    });
    m.on_event(&NetEvent::BreakerRejected { req: r });
    m.on_event(&NetEvent::DnsResolved {
        host: "c.example",
        addrs: &[],
        source: DnsSource::Cache,
        elapsed: ms(0),
    });
    m.on_event(&NetEvent::BreakerTransition {
        key: "c.example",
        from: BreakerState::HalfOpen,
        to: BreakerState::Open,
    });
    let s = samples(&m.encode());
    assert_sample(
        &s,
        r#"net_rate_limited_total{host="c.example",scope="host_rate"}"#,
        2.0,
    );
    assert_sample(
        &s,
        r#"net_retry_budget_exhausted_total{host="c.example"}"#,
        1.0,
    );
    assert_sample(&s, r#"net_blocked_total{rule="private"}"#, 1.0);
    assert_sample(&s, r#"net_breaker_rejected_total{host="c.example"}"#, 1.0);
    assert_sample(&s, r#"net_dns_lookups_total{source="cache"}"#, 1.0);
    assert_sample(&s, r#"net_breaker_state{key="c.example"}"#, 2.0);
    assert_sample(&s, r#"net_circuit_open_total{host="c.example"}"#, 1.0);
}

#[test]
fn hosts_and_tenants_past_the_cap_become_other() {
    let m = Metrics::builder().max_hosts(2).max_tenants(1).build();
    for (id, host, tenant) in [
        (1, "h1", "ta"),
        (2, "h2", "ta"),
        (3, "h3", "ta"),
        (4, "h4", "tb"),
        (5, "h1", "tb"),
    ] {
        simple(&m, req(id, host, Some(tenant)), ok(), 1);
        m.on_event(&NetEvent::Redirected {
            req: req(id, host, None),
            status: StatusCode::FOUND,
            location: "/",
        });
    }
    let text = m.encode();
    let s = samples(&text);
    let r = |tenant: &str, host: &str| {
        format!(
            r#"net_requests_total{{tenant="{tenant}",host="{host}",method="GET",scheme="https",outcome="ok",version="h1"}}"#
        )
    };
    assert_sample(&s, &r("ta", "h1"), 1.0);
    assert_sample(&s, &r("ta", "h2"), 1.0);
    assert_sample(&s, &r("ta", "_other"), 1.0);
    assert_sample(&s, &r("_other", "_other"), 1.0);
    assert_sample(&s, &r("_other", "h1"), 1.0);
    assert_eq!(
        s.keys()
            .filter(|k| k.starts_with("net_requests_total"))
            .count(),
        5,
        "{text}"
    );
    assert_sample(&s, r#"net_redirect_total{host="h1"}"#, 2.0);
    assert_sample(&s, r#"net_redirect_total{host="_other"}"#, 2.0);
    assert!(
        !text.contains("\"h3\"") && !text.contains("\"h4\"") && !text.contains("\"tb\""),
        "{text}"
    );
}

#[test]
fn fanout_forwards_every_event_to_every_observer() {
    struct Count(AtomicUsize);
    impl Observer for Count {
        fn on_event(&self, _: &NetEvent<'_>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let metrics = Arc::new(Metrics::new());
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let fanout = Fanout::new().with(metrics.clone()).with(count.clone());
    simple(&fanout, req(1, "a.example", None), ok(), 7);
    assert_eq!(count.0.load(Ordering::Relaxed), 4);
    assert_eq!(metrics.slis().requests, 1);
    assert_eq!(metrics.slis().p50_ms, 7.0);
}
