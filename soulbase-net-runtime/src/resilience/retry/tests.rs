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
        (Outcome::Error(ErrorKind::Dns), |o| o.dns = false),
        (Outcome::Error(ErrorKind::Io), |o| o.io = false),
        (Outcome::Error(ErrorKind::Connect), |o| o.connect = false),
        (Outcome::Error(ErrorKind::Timeout(Phase::Connect)), |o| {
            o.timeout_connect = false
        }),
        (Outcome::Error(ErrorKind::Timeout(Phase::Dns)), |o| {
            o.timeout_connect = false
        }),
        (Outcome::Error(ErrorKind::Timeout(Phase::Tls)), |o| {
            o.timeout_connect = false
        }),
        (Outcome::Error(ErrorKind::Timeout(Phase::Ttfb)), |o| {
            o.timeout_ttfb = false
        }),
        (Outcome::Error(ErrorKind::Timeout(Phase::Read)), |o| {
            o.timeout_read = false
        }),
        (status(500), |o| o.status_5xx = false),
        (status(503), |o| o.status_5xx = false),
        (status(429), |o| o.status_429 = false),
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

/// The README's table "Which errors are retried": one row per kind (or status range) and the
/// `retry_on` switch that covers it.
const README: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));

/// A status as a response and as the error `error_for_status` makes of it.
fn status_both(s: u16) -> [Outcome; 2] {
    let code = StatusCode::from_u16(s).unwrap();
    [status(s), Outcome::Error(ErrorKind::Status(code))]
}

/// The outcomes a first cell of the README's retry table names.
fn named_outcomes(cell: &str) -> Vec<Outcome> {
    let ticked = cell.split('`').skip(1).step_by(2);
    let mut out = Vec::new();
    for name in ticked {
        if name == "Status(5xx)" {
            let codes = (500..=599).filter(|s| *s != 501 && *s != 505);
            out.extend(codes.flat_map(status_both));
        } else if let Some(n) = name
            .strip_prefix("Status(")
            .and_then(|n| n.strip_suffix(')'))
        {
            out.extend(status_both(n.parse().unwrap()));
        } else if let Some(phase) = name
            .strip_prefix("Timeout(")
            .and_then(|p| p.strip_suffix(')'))
        {
            let phase = Phase::ALL
                .into_iter()
                .find(|p| format!("{p:?}") == phase)
                .unwrap_or_else(|| panic!("README.md: `{name}` names no phase"));
            out.push(Outcome::Error(ErrorKind::Timeout(phase)));
        } else {
            let kind = ErrorKind::ALL_SIMPLE
                .into_iter()
                .find(|k| format!("{k:?}") == name)
                .unwrap_or_else(|| panic!("README.md: `{name}` is not an ErrorKind"));
            out.push(Outcome::Error(kind));
        }
    }
    out
}

#[test]
fn the_readme_retry_table_is_the_code() {
    let start = README
        .lines()
        .position(|l| l.trim() == "## Which errors are retried")
        .expect("README.md has a section `## Which errors are retried`");
    let mut listed = Vec::new();
    for line in README.lines().skip(start + 1) {
        if line.starts_with("## ") {
            break;
        }
        if !line.starts_with("| `") {
            continue;
        }
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        let switch = cells[1].trim().trim_matches('`');
        // The switch turned off alone, by its name in a document.
        let off: RetryOn = serde_json::from_value(serde_json::json!({ switch: false }))
            .unwrap_or_else(|e| panic!("README.md: `{switch}` is not a retry_on switch: {e}"));
        for outcome in named_outcomes(cells[0]) {
            assert!(
                is_retryable(&RetryOn::default(), outcome),
                "{outcome:?} is retried by default"
            );
            assert!(
                !is_retryable(&off, outcome),
                "{outcome:?} is not retried with `{switch}` off"
            );
            listed.push(outcome);
        }
    }
    assert!(!listed.is_empty(), "README.md: the retry table has rows");
    // Nothing the table leaves out is retried.
    let every = ErrorKind::ALL_SIMPLE
        .into_iter()
        .chain(Phase::ALL.map(ErrorKind::Timeout))
        .map(Outcome::Error)
        .chain((100..=599).flat_map(status_both));
    for outcome in every {
        if !listed.contains(&outcome) {
            assert!(
                !is_retryable(&RetryOn::default(), outcome),
                "{outcome:?} is retried but the README's table does not say so"
            );
        }
    }
}

#[test]
fn old_switch_names_still_load() {
    let old: RetryOn = serde_json::from_value(serde_json::json!({
        "http_5xx": false, "http_429": false, "dns_err": false, "connect_err": false,
        "connect_timeout": false, "ttfb_timeout": false, "read_timeout": false,
    }))
    .unwrap();
    let mut expected: RetryOn = serde_json::from_value(serde_json::json!({
        "status_5xx": false, "status_429": false, "dns": false, "connect": false,
        "timeout_connect": false, "timeout_ttfb": false, "timeout_read": false,
    }))
    .unwrap();
    assert_eq!(old, expected);
    assert!(
        expected.io,
        "a reset after connecting has its own switch, on by default"
    );
    expected.io = false;
    assert!(!is_retryable(&expected, Outcome::Error(ErrorKind::Io)));
}
