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
        simple(&m, r, outcome, id);
    }
    m.record_dedup(1, 50);
    let s = m.slis();
    assert_eq!(s.requests, 100);
    assert_eq!(s.retry_rate, 0.1);
    assert_eq!(s.timeout_rate, 0.03);
    assert_eq!(s.error_ratio, 0.12);
    assert_eq!(s.dup_drop_rate, Some(0.02));
    assert_eq!(s.p50_ms, 50.0);
    assert_eq!(s.p99_ms, 99.0);
    let text = m.encode();
    assert!(text.contains("\nnet_sli_dup_drop_rate 0.02\n"), "{text}");
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
