//! TracingObserver: the client's events as `tracing` events in the span they were reported
//! from (the client runs each call in its own span; see the interceptors' `spans` test for
//! that, through a real client).

use soulbase_net_core::{http::StatusCode, LimitScope, NetEvent, Observer, Phase};
use soulbase_net_observe::TracingObserver;

use crate::{
    capture::Capture,
    events::{ms, req, status},
};

#[test]
fn events_land_in_the_current_span_with_their_fields() {
    let capture = Capture::default();
    let obs = TracingObserver::new();
    tracing::subscriber::with_default(capture.clone(), || {
        let call = tracing::info_span!("http.client.request");
        let _in = call.enter();
        let r = req(1, "a.example", Some("t1"));
        obs.on_event(&NetEvent::RetryScheduled {
            req: r,
            attempt: 1,
            reason: status(503),
            delay: ms(250),
        });
        obs.on_event(&NetEvent::Redirected {
            req: r,
            status: StatusCode::FOUND,
            location: "https://b.example/next",
        });
        obs.on_event(&NetEvent::TimedOut {
            req: r,
            phase: Phase::Ttfb,
        });
        obs.on_event(&NetEvent::RateLimited {
            req: r,
            scope: LimitScope::HostConcurrency,
        });
        obs.on_event(&NetEvent::DeadlineClamped {
            req: r,
            total: ms(300),
            worst_case: ms(6400),
        });
        obs.on_event(&NetEvent::Answered {
            req: r,
            by: "cache_hook",
        });
        // Events the spans already say (starts and ends) are not logged again.
        obs.on_event(&NetEvent::RequestStarted { req: r });
    });
    let spans = capture.0.named("http.client.request");
    let call = spans[0].id;
    let events = capture.0.events.lock().clone();
    let messages: Vec<&str> = events
        .iter()
        .map(|e| e.fields["message"].as_str())
        .collect();
    assert_eq!(
        messages,
        [
            "retry scheduled",
            "redirected",
            "timed out",
            "rate limited",
            "deadline clamped",
            "answered without sending"
        ]
    );
    assert!(events.iter().all(|e| e.parent == Some(call)), "{events:?}");
    assert_eq!(events[0].fields["delay_ms"], "250");
    assert_eq!(events[1].fields["http.response.status_code"], "302");
    assert_eq!(events[2].fields["phase"], "ttfb");
    assert_eq!(events[4].fields["worst_case_ms"], "6400");
    assert_eq!(events[5].fields["by"], "cache_hook");
}
