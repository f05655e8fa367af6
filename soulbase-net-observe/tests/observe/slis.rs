//! SLIs computed exactly on a known sequence.

use soulbase_net_core::{ErrorKind, NetEvent, Observer, Outcome, Phase};
use soulbase_net_observe::Metrics;

use crate::events::{ms, ok, req, simple, status, timeout};

#[test]
fn slis_on_a_known_sequence() {
    let m = Metrics::new();
    assert_eq!(m.slis().requests, 0);
    assert_eq!(m.slis().p99_ms, 0.0);
    // 100 requests of 1..=100 ms: 3 timeouts, 4 other errors, 5 × 5xx, 4 × 4xx (not errors).
    for id in 1..=100u64 {
        let outcome = match id {
            1..=3 => timeout(Phase::Total),
            4..=7 => Outcome::Error(ErrorKind::Connect),
            8..=12 => status(503),
            13..=16 => status(404),
            _ => ok(),
        };
        let r = req(id, "a.example", None);
        if id % 10 == 0 {
            m.on_event(&NetEvent::RetryScheduled {
                req: r,
                attempt: 1,
                reason: status(502),
                delay: ms(1),
            });
        }
        // Two duplicates answered from IdempotencyKey's window, one cache hit (not a drop),
        // three hedged copies.
        let by = match id {
            20 | 21 => Some("idempotency_key"),
            22 => Some("cache_hook"),
            _ => None,
        };
        if let Some(by) = by {
            m.on_event(&NetEvent::Answered { req: r, by });
        }
        if (30..33).contains(&id) {
            m.on_event(&NetEvent::AttemptStarted {
                req: r,
                attempt: 2,
                hedge: true,
            });
        }
        simple(&m, r, outcome, id);
    }
    let s = m.slis();
    assert_eq!(s.requests, 100);
    assert_eq!(s.retry_rate, 0.1);
    assert_eq!(s.timeout_rate, 0.03);
    assert_eq!(s.error_ratio, 0.12);
    assert_eq!(s.dup_drop_rate, 0.02);
    assert_eq!(s.hedge_rate, 0.03);
    assert_eq!(s.p50_ms, 50.0);
    assert_eq!(s.p99_ms, 99.0);
    let text = m.encode();
    assert!(text.contains("\nnet_sli_dup_drop_rate 0.02\n"), "{text}");
    assert!(text.contains("\nnet_sli_hedge_rate 0.03\n"), "{text}");
    assert!(
        text.contains("\nnet_answered_total{by=\"idempotency_key\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("\nnet_answered_total{by=\"cache_hook\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("\nnet_hedge_total{host=\"a.example\"} 3\n"),
        "{text}"
    );
    assert!(text.contains("\nnet_sli_p99_latency_ms 99.0\n"), "{text}");
}

#[test]
fn percentiles_follow_the_sliding_window() {
    let m = Metrics::builder().latency_window(10).build();
    for id in 1..=10 {
        simple(&m, req(id, "a.example", None), ok(), 10_000);
    }
    for id in 11..=20 {
        simple(&m, req(id, "a.example", None), ok(), id - 10);
    }
    let s = m.slis();
    assert_eq!(s.requests, 20);
    assert_eq!((s.p50_ms, s.p99_ms), (5.0, 10.0));
}

#[test]
fn another_dedup_interceptor_can_be_named() {
    let m = Metrics::builder().dedup_by("my_dedup").build();
    for (id, by) in [
        (1, "my_dedup"),
        (2, "idempotency_key"),
        (3, "cache_hook"),
        (4, ""),
    ] {
        let r = req(id, "a.example", None);
        if !by.is_empty() {
            m.on_event(&NetEvent::Answered { req: r, by });
        }
        simple(&m, r, ok(), 1);
    }
    assert_eq!(m.slis().dup_drop_rate, 0.5);
}
