use std::time::Duration;

use proptest::prelude::*;
use soulbase_net_core::http::StatusCode;
use soulbase_net_core::{ErrorKind, Outcome, Phase};
use soulbase_net_policy::{JitterMode, RetryOn, RetryPolicy};

use super::*;

const SEC: Duration = Duration::from_secs(1);

fn status(s: u16) -> Outcome {
    Outcome::Response(StatusCode::from_u16(s).unwrap())
}

fn end(attempt: u32, outcome: Outcome) -> AttemptEnd {
    AttemptEnd {
        attempt,
        outcome,
        retry_after: None,
        time_left: 30 * SEC,
        attempt_timeout: 9 * SEC,
    }
}

/// The default policy (100ms × 2ⁿ, full jitter, cap 5s, 3 attempts) with the draw fixed at 1,
/// so the delay is the ceiling.
fn run(policy: &RetryPolicy, replayable: bool, e: &AttemptEnd) -> RetryDecision {
    decide(policy, replayable, e, &mut || 1.0)
}

#[test]
fn get_on_503_is_retried_with_backoff() {
    let p = RetryPolicy::default();
    let d = run(&p, true, &end(1, status(503)));
    assert_eq!(
        d,
        RetryDecision::Retry {
            delay: Duration::from_millis(100),
            reason: status(503)
        }
    );
    let d = run(&p, true, &end(2, status(503)));
    assert!(matches!(d, RetryDecision::Retry { delay, .. } if delay == Duration::from_millis(200)));
}

#[test]
fn success_and_redirects_stop() {
    let p = RetryPolicy::default();
    for s in [200, 204, 302] {
        assert_eq!(
            run(&p, true, &end(1, status(s))),
            RetryDecision::Stop(StopReason::Succeeded)
        );
    }
}

#[test]
fn non_replayable_requests_are_never_retried() {
    let p = RetryPolicy::default();
    assert_eq!(
        run(&p, false, &end(1, status(503))),
        RetryDecision::Stop(StopReason::NotReplayable)
    );
}

#[test]
fn client_errors_other_than_429_stop() {
    let p = RetryPolicy::default();
    for s in [400, 401, 403, 404, 409, 422] {
        assert_eq!(
            run(&p, true, &end(1, status(s))),
            RetryDecision::Stop(StopReason::ClientError),
            "{s}"
        );
    }
    assert!(matches!(
        run(&p, true, &end(1, status(429))),
        RetryDecision::Retry { .. }
    ));
}

#[test]
fn disabled_and_spent_attempts_stop() {
    let mut p = RetryPolicy::default();
    assert_eq!(
        run(&p, true, &end(3, status(503))),
        RetryDecision::Stop(StopReason::AttemptsExhausted)
    );
    p.enabled = false;
    assert_eq!(
        run(&p, true, &end(1, status(503))),
        RetryDecision::Stop(StopReason::Disabled)
    );
}

#[test]
fn retry_after_replaces_backoff_up_to_the_cap() {
    let p = RetryPolicy::default();
    let mut e = end(1, status(503));
    e.retry_after = Some(2 * SEC);
    assert!(matches!(run(&p, true, &e), RetryDecision::Retry { delay, .. } if delay == 2 * SEC));
    e.retry_after = Some(5 * SEC);
    assert!(matches!(run(&p, true, &e), RetryDecision::Retry { delay, .. } if delay == 5 * SEC));
    e.retry_after = Some(6 * SEC);
    assert_eq!(
        run(&p, true, &e),
        RetryDecision::Stop(StopReason::RetryAfterTooLong(6 * SEC))
    );
    let mut ignore = p.clone();
    ignore.respect_retry_after = false;
    assert!(matches!(
        run(&ignore, true, &e),
        RetryDecision::Retry { delay, .. } if delay == Duration::from_millis(100)
    ));
}

#[test]
fn retry_after_zero_retries_at_once() {
    let mut e = end(1, status(429));
    e.retry_after = Some(Duration::ZERO);
    assert!(matches!(
        run(&RetryPolicy::default(), true, &e),
        RetryDecision::Retry { delay, .. } if delay.is_zero()
    ));
}

#[test]
fn deadline_stops_an_attempt_that_cannot_finish() {
    let p = RetryPolicy::default();
    let mut e = end(1, Outcome::Error(ErrorKind::Connect));
    // 100ms backoff + 9s attempt = 9.1s.
    e.time_left = Duration::from_millis(9_100);
    assert!(matches!(run(&p, true, &e), RetryDecision::Retry { .. }));
    e.time_left = Duration::from_millis(9_099);
    assert_eq!(run(&p, true, &e), RetryDecision::Stop(StopReason::Deadline));
    // A Retry-After that fits the cap but not the deadline stops too.
    let mut e = end(1, status(503));
    e.retry_after = Some(4 * SEC);
    e.time_left = 12 * SEC;
    assert_eq!(run(&p, true, &e), RetryDecision::Stop(StopReason::Deadline));
}

#[test]
fn retry_on_maps_outcomes_to_flags() {
    type Flag = fn(&mut RetryOn);
    let table: [(Outcome, Flag); 11] = [
        (Outcome::Error(ErrorKind::Dns), |o| o.dns_err = false),
        (Outcome::Error(ErrorKind::Io), |o| o.connect_err = false),
        (Outcome::Error(ErrorKind::Connect), |o| {
            o.connect_err = false
        }),
        (Outcome::Error(ErrorKind::Timeout(Phase::Connect)), |o| {
            o.connect_timeout = false
        }),
        (Outcome::Error(ErrorKind::Timeout(Phase::Dns)), |o| {
            o.connect_timeout = false
        }),
        (Outcome::Error(ErrorKind::Timeout(Phase::Tls)), |o| {
            o.connect_timeout = false
        }),
        (Outcome::Error(ErrorKind::Timeout(Phase::Ttfb)), |o| {
            o.ttfb_timeout = false
        }),
        (Outcome::Error(ErrorKind::Timeout(Phase::Read)), |o| {
            o.read_timeout = false
        }),
        (status(500), |o| o.http_5xx = false),
        (status(503), |o| o.http_5xx = false),
        (status(429), |o| o.http_429 = false),
    ];
    for (outcome, turn_off) in table {
        let mut on = RetryOn::default();
        assert!(is_retryable(&on, outcome), "{outcome:?} retried by default");
        turn_off(&mut on);
        assert!(
            !is_retryable(&on, outcome),
            "{outcome:?} not retried once off"
        );
    }
}

#[test]
fn some_outcomes_are_never_retried() {
    let on = RetryOn::default();
    let never = [
        Outcome::Error(ErrorKind::Blocked),
        Outcome::Error(ErrorKind::TlsVerify),
        Outcome::Error(ErrorKind::Tls),
        Outcome::Error(ErrorKind::InvalidRequest),
        Outcome::Error(ErrorKind::TooLarge),
        Outcome::Error(ErrorKind::RedirectLimit),
        Outcome::Error(ErrorKind::Timeout(Phase::Total)),
        Outcome::Error(ErrorKind::Timeout(Phase::Write)),
        Outcome::Error(ErrorKind::CircuitOpen),
        Outcome::Error(ErrorKind::RateLimited),
        status(501),
        status(505),
        status(404),
    ];
    for o in never {
        assert!(!is_retryable(&on, o), "{o:?}");
        let d = run(&RetryPolicy::default(), true, &end(1, o));
        assert!(matches!(d, RetryDecision::Stop(_)), "{o:?}");
    }
    assert!(is_retryable(
        &on,
        Outcome::Error(ErrorKind::Status(http::StatusCode::BAD_GATEWAY))
    ));
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Error(ErrorKind::Dns)),
        Just(Outcome::Error(ErrorKind::Connect)),
        Just(Outcome::Error(ErrorKind::Timeout(Phase::Connect))),
        Just(Outcome::Error(ErrorKind::Timeout(Phase::Ttfb))),
        Just(Outcome::Error(ErrorKind::Timeout(Phase::Read))),
        Just(Outcome::Error(ErrorKind::Blocked)),
        (200u16..600).prop_map(status),
    ]
}

fn mode() -> impl Strategy<Value = JitterMode> {
    prop_oneof![
        Just(JitterMode::Full),
        Just(JitterMode::Equal),
        Just(JitterMode::None)
    ]
}

prop_compose! {
    fn policy()(
        attempts in 1u32..8, base in 0u64..2_000, factor in 1.0f64..4.0, extra in 0u64..10_000,
        jitter in 0.0f64..=1.0, mode in mode(), respect in any::<bool>(),
    ) -> RetryPolicy {
        let mut p = RetryPolicy::default();
        p.max_attempts = attempts;
        p.backoff.base = Duration::from_millis(base);
        p.backoff.factor = factor;
        p.backoff.cap = Duration::from_millis(base + extra);
        p.backoff.jitter = jitter;
        p.backoff.mode = mode;
        p.respect_retry_after = respect;
        p
    }
}

proptest! {
    #[test]
    fn never_schedules_past_the_deadline(
        p in policy(), o in outcome(), attempt in 1u32..10, left_ms in 0u64..60_000,
        timeout_ms in 0u64..20_000, ra in proptest::option::of(0u64..20_000), r in 0.0f64..1.0,
    ) {
        let e = AttemptEnd {
            attempt,
            outcome: o,
            retry_after: ra.map(Duration::from_millis),
            time_left: Duration::from_millis(left_ms),
            attempt_timeout: Duration::from_millis(timeout_ms),
        };
        if let RetryDecision::Retry { delay, reason } = decide(&p, true, &e, &mut || r) {
            prop_assert!(delay + e.attempt_timeout <= e.time_left);
            prop_assert!(delay <= p.backoff.cap);
            prop_assert_eq!(reason, o);
            prop_assert!(attempt < p.max_attempts);
        }
    }

    /// A whole call on a simulated clock: attempts last up to the attempt timeout, the
    /// decision schedules the retries. The total never exceeds the deadline, nor S75-1's
    /// bound `timeout × attempts + Σ backoff`.
    #[test]
    fn a_call_keeps_its_deadline_and_s75_1(
        p in policy(), total_ms in 1u64..60_000, timeout_ms in 1u64..10_000,
        faults in proptest::collection::vec((outcome(), 0.0f64..=1.0, 0.0f64..1.0), 1..10),
    ) {
        let total = Duration::from_millis(total_ms);
        let timeout = Duration::from_millis(timeout_ms).min(total);
        let mut elapsed = Duration::ZERO;
        let mut attempts = 0u32;
        let mut pending = Duration::ZERO;
        for (o, took, r) in faults {
            // The scheduled wait is spent only when another attempt follows.
            elapsed += std::mem::take(&mut pending);
            attempts += 1;
            elapsed += timeout.mul_f64(took);
            prop_assert!(elapsed <= total);
            let e = AttemptEnd {
                attempt: attempts,
                outcome: o,
                retry_after: None,
                time_left: total.saturating_sub(elapsed),
                attempt_timeout: timeout,
            };
            match decide(&p, true, &e, &mut || r) {
                RetryDecision::Retry { delay, .. } => pending = delay,
                RetryDecision::Stop(_) => break,
            }
        }
        prop_assert!(elapsed <= total);
        let bound = timeout * attempts + p.backoff.total_max_delay(attempts.saturating_sub(1));
        prop_assert!(elapsed <= bound);
    }
}
