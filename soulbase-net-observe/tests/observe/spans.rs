//! Tracing spans: one per request, one per attempt, with OpenTelemetry field names; the map of
//! open spans stays bounded.

use soulbase_net_core::{http::Method, Elapsed, NetEvent, Observer, Phase, RequestInfo};
use soulbase_net_observe::TracingObserver;

use crate::{
    capture::Capture,
    events::{attempt, finished, ms, ok, req, started, status, timeout, POST},
};

fn post(id: u64) -> RequestInfo<'static> {
    RequestInfo {
        id,
        method: &POST,
        scheme: "https",
        host: "a.example",
        tenant: Some("t1"),
        url: "https://a.example/orders",
    }
}

#[test]
fn one_request_span_and_one_span_per_attempt() {
    let capture = Capture::default();
    let obs = TracingObserver::new();
    tracing::subscriber::with_default(capture.clone(), || {
        let r = post(7);
        started(&obs, r);
        attempt(&obs, r, 1, status(503), 2, 10);
        obs.on_event(&NetEvent::RetryScheduled {
            req: r,
            attempt: 1,
            reason: status(503),
            delay: ms(250),
        });
        attempt(&obs, r, 2, ok(), 0, 12);
        finished(&obs, r, ok(), 2, 300);
    });
    let state = &capture.0;
    let reqs = state.named("http.client.request");
    assert_eq!(reqs.len(), 1);
    let rs = &reqs[0];
    let f = |k: &str| rs.fields.get(k).map(String::as_str);
    assert_eq!(f("http.request.method"), Some("POST"));
    assert_eq!(f("server.address"), Some("a.example"));
    assert_eq!(f("url.full"), Some("https://a.example/orders"));
    assert_eq!(f("url.scheme"), Some("https"));
    assert_eq!(f("tenant"), Some("t1"));
    assert_eq!(f("request.id"), Some("7"));
    assert_eq!(f("http.response.status_code"), Some("200"));
    assert_eq!(f("http.request.resend_count"), Some("1"));
    assert_eq!(f("error.type"), None);
    assert!(rs.closed);

    let attempts = state.named("http.client.attempt");
    assert_eq!(attempts.len(), 2);
    for (a, n) in attempts.iter().zip(["1", "2"]) {
        assert_eq!(a.parent, Some(rs.id));
        assert_eq!(a.fields.get("attempt").map(String::as_str), Some(n));
        assert!(a.closed, "attempt {n} left open");
    }
    let a1 = &attempts[0].fields;
    assert_eq!(
        a1.get("http.response.status_code").map(String::as_str),
        Some("503")
    );
    assert_eq!(a1.get("error.type").map(String::as_str), Some("503"));
    assert_eq!(a1.get("http.request.resend_count"), None);
    let a2 = &attempts[1].fields;
    assert_eq!(
        a2.get("http.response.status_code").map(String::as_str),
        Some("200")
    );
    assert_eq!(
        a2.get("http.request.resend_count").map(String::as_str),
        Some("1")
    );

    let events = state.events.lock();
    let retry = events
        .iter()
        .find(|e| e.fields.get("message").map(String::as_str) == Some("retry scheduled"))
        .unwrap();
    assert_eq!(retry.parent, Some(rs.id));
    assert_eq!(
        retry.fields.get("reason").map(String::as_str),
        Some("status_5xx")
    );
    assert_eq!(
        retry.fields.get("delay_ms").map(String::as_str),
        Some("250")
    );
    assert_eq!(obs.open_requests(), 0);
}

#[test]
fn errors_set_error_type_and_a_lost_hedge_is_closed() {
    let capture = Capture::default();
    let obs = TracingObserver::new();
    tracing::subscriber::with_default(capture.clone(), || {
        let r = req(1, "b.example", None);
        started(&obs, r);
        obs.on_event(&NetEvent::AttemptStarted {
            req: r,
            attempt: 1,
            hedge: false,
        });
        obs.on_event(&NetEvent::AttemptStarted {
            req: r,
            attempt: 2,
            hedge: true,
        });
        obs.on_event(&NetEvent::AttemptFinished {
            req: r,
            attempt: 2,
            outcome: timeout(Phase::Ttfb),
            elapsed: Elapsed::default(),
        });
        finished(&obs, r, timeout(Phase::Ttfb), 2, 900);
        let once = req(2, "b.example", None);
        started(&obs, once);
        attempt(&obs, once, 1, status(404), 0, 3);
        finished(&obs, once, status(404), 1, 3);
    });
    let once = &capture.0.named("http.client.request")[1];
    assert_eq!(
        once.fields.get("error.type").map(String::as_str),
        Some("404")
    );
    assert_eq!(
        once.fields
            .get("http.response.status_code")
            .map(String::as_str),
        Some("404")
    );
    assert_eq!(once.fields.get("http.request.resend_count"), None);
    let rs = &capture.0.named("http.client.request")[0];
    assert_eq!(
        rs.fields.get("error.type").map(String::as_str),
        Some("timeout_ttfb")
    );
    assert_eq!(rs.fields.get("http.response.status_code"), None);
    assert_eq!(rs.fields.get("tenant"), None);
    assert_eq!(
        rs.fields.get("http.request.method").map(String::as_str),
        Some(Method::GET.as_str())
    );
    let attempts: Vec<_> = capture
        .0
        .named("http.client.attempt")
        .into_iter()
        .filter(|a| a.parent == Some(rs.id))
        .collect();
    assert_eq!(attempts.len(), 2);
    assert!(attempts.iter().all(|a| a.closed));
    assert_eq!(
        attempts[1].fields.get("hedge").map(String::as_str),
        Some("true")
    );
    assert_eq!(
        attempts[1].fields.get("error.type").map(String::as_str),
        Some("timeout_ttfb")
    );
    assert!(rs.closed);
}

#[test]
fn the_span_map_stays_bounded_when_requests_never_finish() {
    let capture = Capture::default();
    let obs = TracingObserver::builder().max_requests(3).build();
    tracing::subscriber::with_default(capture.clone(), || {
        for id in 1..=10 {
            let r = req(id, "a.example", None);
            started(&obs, r);
            obs.on_event(&NetEvent::AttemptStarted {
                req: r,
                attempt: 1,
                hedge: false,
            });
        }
    });
    assert_eq!(obs.open_requests(), 3);
    let reqs = capture.0.named("http.client.request");
    assert_eq!(reqs.len(), 10);
    let open: Vec<&str> = reqs
        .iter()
        .filter(|s| !s.closed)
        .map(|s| s.fields["request.id"].as_str())
        .collect();
    assert_eq!(open, ["8", "9", "10"]);
    let open_attempts = capture
        .0
        .named("http.client.attempt")
        .iter()
        .filter(|s| !s.closed)
        .count();
    assert_eq!(open_attempts, 3);
    drop(obs);
    assert!(capture.0.spans.lock().iter().all(|s| s.closed));
}

#[test]
fn events_for_unknown_requests_are_ignored() {
    let capture = Capture::default();
    let obs = TracingObserver::new();
    tracing::subscriber::with_default(capture.clone(), || {
        let r = req(42, "a.example", None);
        finished(&obs, r, ok(), 1, 1);
        obs.on_event(&NetEvent::AttemptFinished {
            req: r,
            attempt: 1,
            outcome: ok(),
            elapsed: Elapsed::default(),
        });
        obs.on_event(&NetEvent::TimedOut {
            req: r,
            phase: Phase::Read,
        });
    });
    assert!(capture.0.spans.lock().is_empty());
    assert!(capture.0.events.lock().is_empty());
    assert_eq!(obs.open_requests(), 0);
}
