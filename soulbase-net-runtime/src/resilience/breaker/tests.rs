use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use soulbase_net_core::http::StatusCode;
use soulbase_net_core::{BreakerState, ErrorKind, Outcome, Phase};
use soulbase_net_policy::{CircuitBreakerPolicy, SlowCallCfg};
use tokio::time::Instant;

use super::*;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);
const FAST: Duration = Duration::from_millis(10);

type Seen = Arc<Mutex<Vec<(String, BreakerState, BreakerState)>>>;

/// Ratio 0.5 over 10s with ≥ 10 samples, consecutive rule off, 30s cooldown, 3 probes.
fn policy() -> CircuitBreakerPolicy {
    let mut p = CircuitBreakerPolicy::default();
    p.enabled = true;
    p.min_samples = 10;
    p.consecutive_failures = 0;
    p
}

fn breakers() -> (Breakers, Seen) {
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    let listener: Listener =
        Box::new(move |key, t| sink.lock().push((key.to_owned(), t.from, t.to)));
    (
        Breakers::new(1_000, Duration::from_secs(600), Some(listener)),
        seen,
    )
}

fn call(b: &Breakers, p: &CircuitBreakerPolicy, now: Instant, failure: bool) {
    let permit = b.admit("h", p, now).unwrap();
    permit.record(failure, FAST, now);
}

fn open(b: &Breakers, p: &CircuitBreakerPolicy, now: Instant) {
    for _ in 0..p.min_samples {
        call(b, p, now, true);
    }
    assert_eq!(b.state("h", now), BreakerState::Open);
}

#[test]
fn opens_on_ratio_once_min_samples_are_in() {
    let (b, seen) = breakers();
    let p = policy();
    let t0 = Instant::now();
    for i in 0..9 {
        call(&b, &p, t0, i % 2 == 0); // 5 failures, 4 successes
    }
    assert_eq!(b.state("h", t0), BreakerState::Closed, "9 < min_samples");
    call(&b, &p, t0, true); // 6 / 10 ≥ 0.5
    assert_eq!(b.state("h", t0), BreakerState::Open);
    assert_eq!(
        *seen.lock(),
        [("h".to_owned(), BreakerState::Closed, BreakerState::Open)]
    );
}

#[test]
fn does_not_open_below_min_samples() {
    let (b, _) = breakers();
    let mut p = policy();
    p.min_samples = 20;
    let t0 = Instant::now();
    for _ in 0..19 {
        call(&b, &p, t0, true);
    }
    assert_eq!(b.state("h", t0), BreakerState::Closed);
    call(&b, &p, t0, true);
    assert_eq!(b.state("h", t0), BreakerState::Open);
}

#[test]
fn does_not_open_below_the_ratio() {
    let (b, _) = breakers();
    let p = policy();
    let t0 = Instant::now();
    for i in 0..100 {
        // 40 %, spread so the running ratio never reaches 0.5 past 10 samples.
        call(&b, &p, t0, i % 5 == 0 || i % 5 == 3);
    }
    assert_eq!(b.state("h", t0), BreakerState::Closed);
}

#[test]
fn consecutive_failures_open_it() {
    let (b, _) = breakers();
    let mut p = policy();
    p.consecutive_failures = 5;
    p.min_samples = 1_000;
    let t0 = Instant::now();
    for _ in 0..4 {
        call(&b, &p, t0, true);
    }
    call(&b, &p, t0, false); // resets the run
    for _ in 0..4 {
        call(&b, &p, t0, true);
    }
    assert_eq!(b.state("h", t0), BreakerState::Closed);
    call(&b, &p, t0, true);
    assert_eq!(b.state("h", t0), BreakerState::Open);
}

#[test]
fn failures_leave_with_the_window() {
    let (b, _) = breakers();
    let p = policy();
    let t0 = Instant::now();
    for _ in 0..9 {
        call(&b, &p, t0, true);
    }
    // 10s later those nine are out of the window: one more failure is 1 sample.
    let t1 = t0 + p.window;
    call(&b, &p, t1, true);
    assert_eq!(b.state("h", t1), BreakerState::Closed);
}

#[test]
fn open_fails_fast_with_the_rest_of_the_cooldown() {
    let (b, _) = breakers();
    let p = policy();
    let t0 = Instant::now();
    open(&b, &p, t0);
    let err = b.admit("h", &p, t0 + 10 * SEC).unwrap_err();
    assert_eq!(
        err,
        Rejected {
            state: BreakerState::Open,
            retry_after: Some(20 * SEC)
        }
    );
    let err = b.admit("h", &p, t0 + 30 * SEC - MS).unwrap_err();
    assert_eq!(err.retry_after, Some(MS));
}

#[test]
fn cooldown_elapses_into_half_open_with_exactly_n_probes() {
    let (b, seen) = breakers();
    let p = policy();
    let t0 = Instant::now();
    open(&b, &p, t0);
    let t1 = t0 + p.cooldown;
    assert_eq!(b.state("h", t1), BreakerState::HalfOpen);
    let probes: Vec<_> = (0..10).filter_map(|_| b.admit("h", &p, t1).ok()).collect();
    assert_eq!(probes.len(), 3, "only half_open_probes probes are admitted");
    assert!(probes.iter().all(BreakerPermit::is_probe));
    let err = b.admit("h", &p, t1).unwrap_err();
    assert_eq!(err.state, BreakerState::HalfOpen);
    assert_eq!(err.retry_after, None);
    assert_eq!(
        seen.lock().last().map(|s| (s.1, s.2)),
        Some((BreakerState::Open, BreakerState::HalfOpen))
    );
    for p_ in probes {
        p_.record(false, FAST, t1);
    }
}

#[test]
fn closes_when_all_probes_succeed() {
    let (b, seen) = breakers();
    let p = policy();
    let t0 = Instant::now();
    open(&b, &p, t0);
    let t1 = t0 + p.cooldown;
    let mut probes: Vec<_> = (0..3).map(|_| b.admit("h", &p, t1).unwrap()).collect();
    let last = probes.pop().unwrap();
    for probe in probes {
        probe.record(false, FAST, t1);
    }
    assert_eq!(
        b.state("h", t1),
        BreakerState::HalfOpen,
        "2 of 3 is not enough"
    );
    last.record(false, FAST, t1);
    assert_eq!(b.state("h", t1), BreakerState::Closed);
    let states: Vec<_> = seen.lock().iter().map(|s| (s.1, s.2)).collect();
    assert_eq!(
        states,
        [
            (BreakerState::Closed, BreakerState::Open),
            (BreakerState::Open, BreakerState::HalfOpen),
            (BreakerState::HalfOpen, BreakerState::Closed),
        ]
    );
    // Closed again with a fresh window: nine failures do not reopen it.
    for _ in 0..9 {
        call(&b, &p, t1, true);
    }
    assert_eq!(b.state("h", t1), BreakerState::Closed);
}

#[test]
fn a_success_ratio_below_one_closes_despite_a_failed_probe() {
    // 4 probes, half must succeed: one failure is tolerated, three are not.
    let (b, _) = breakers();
    let mut p = policy();
    p.half_open_probes = 4;
    p.half_open_success_ratio = 0.5;
    let t0 = Instant::now();
    open(&b, &p, t0);
    let t1 = t0 + p.cooldown;
    let probes: Vec<_> = (0..4).map(|_| b.admit("h", &p, t1).unwrap()).collect();
    let mut probes = probes.into_iter();
    probes.next().unwrap().record(true, FAST, t1);
    assert_eq!(b.state("h", t1), BreakerState::HalfOpen, "1 failure of 4");
    probes.next().unwrap().record(false, FAST, t1);
    assert_eq!(
        b.state("h", t1),
        BreakerState::HalfOpen,
        "1 success of 2 needed"
    );
    probes.next().unwrap().record(false, FAST, t1);
    assert_eq!(b.state("h", t1), BreakerState::Closed, "2 of 4 succeeded");

    // Three failures of four: two successes can no longer come.
    let t2 = t1 + SEC;
    open(&b, &p, t2);
    let t3 = t2 + p.cooldown;
    let probes: Vec<_> = (0..4).map(|_| b.admit("h", &p, t3).unwrap()).collect();
    let mut probes = probes.into_iter();
    probes.next().unwrap().record(true, FAST, t3);
    probes.next().unwrap().record(true, FAST, t3);
    assert_eq!(b.state("h", t3), BreakerState::HalfOpen, "2 failures of 4");
    probes.next().unwrap().record(true, FAST, t3);
    assert_eq!(b.state("h", t3), BreakerState::Open, "3 failures of 4");
}

#[test]
fn any_probe_failure_reopens_and_late_probes_are_ignored() {
    let (b, seen) = breakers();
    let p = policy();
    let t0 = Instant::now();
    open(&b, &p, t0);
    let t1 = t0 + p.cooldown;
    let first = b.admit("h", &p, t1).unwrap();
    let second = b.admit("h", &p, t1).unwrap();
    first.record(true, FAST, t1 + SEC);
    assert_eq!(b.state("h", t1 + SEC), BreakerState::Open);
    // The new cooldown runs from the probe failure.
    let err = b.admit("h", &p, t1 + SEC).unwrap_err();
    assert_eq!(err.retry_after, Some(p.cooldown));
    // The other probe's success belongs to the old half-open period.
    second.record(false, FAST, t1 + SEC);
    assert_eq!(b.state("h", t1 + SEC), BreakerState::Open);
    assert_eq!(
        seen.lock().last().map(|s| (s.1, s.2)),
        Some((BreakerState::HalfOpen, BreakerState::Open))
    );
}

#[test]
fn a_dropped_or_released_probe_gives_its_slot_to_the_next_call() {
    let (b, seen) = breakers();
    let mut p = policy();
    p.half_open_probes = 1;
    let t0 = Instant::now();
    open(&b, &p, t0);
    let t1 = t0 + p.cooldown;
    // The caller cancelled its probe: the circuit stays half-open, and the next call probes.
    drop(b.admit("h", &p, t1).unwrap());
    let transitions = seen.lock().len();
    assert_eq!(b.state("h", t1), BreakerState::HalfOpen);
    // The server did not process the next one (GOAWAY): the same.
    let probe = b.admit("h", &p, t1).unwrap();
    assert!(probe.is_probe());
    assert!(b.admit("h", &p, t1).is_err(), "one probe at a time");
    probe.release();
    assert_eq!(b.state("h", t1), BreakerState::HalfOpen);
    assert_eq!(seen.lock().len(), transitions, "no transition");
    // A probe that answers closes it.
    let probe = b.admit("h", &p, t1).unwrap();
    assert!(probe.is_probe());
    probe.record(false, Duration::from_millis(1), t1);
    assert_eq!(b.state("h", t1), BreakerState::Closed);
}

#[test]
fn released_normal_calls_are_ignored() {
    let (b, _) = breakers();
    let mut p = policy();
    p.consecutive_failures = 1;
    let t0 = Instant::now();
    for _ in 0..100 {
        b.admit("h", &p, t0).unwrap().release();
    }
    assert_eq!(b.state("h", t0), BreakerState::Closed);
}

#[test]
fn a_dropped_normal_call_is_ignored() {
    let (b, _) = breakers();
    let mut p = policy();
    p.consecutive_failures = 1;
    let t0 = Instant::now();
    for _ in 0..100 {
        drop(b.admit("h", &p, t0).unwrap());
    }
    assert_eq!(b.state("h", t0), BreakerState::Closed);
}

#[test]
fn results_from_before_a_transition_are_ignored() {
    let (b, _) = breakers();
    let p = policy();
    let t0 = Instant::now();
    let early = b.admit("h", &p, t0).unwrap();
    open(&b, &p, t0);
    let t1 = t0 + p.cooldown;
    let probes: Vec<_> = (0..3).map(|_| b.admit("h", &p, t1).unwrap()).collect();
    early.record(true, FAST, t1); // admitted while closed: not a probe result
    assert_eq!(b.state("h", t1), BreakerState::HalfOpen);
    for probe in probes {
        probe.record(false, FAST, t1);
    }
    assert_eq!(b.state("h", t1), BreakerState::Closed);
}

#[test]
fn slow_calls_open_it() {
    let (b, _) = breakers();
    let mut p = policy();
    p.min_samples = 4;
    let mut slow = SlowCallCfg::default();
    slow.threshold = SEC;
    p.slow_call = Some(slow);
    let t0 = Instant::now();
    for elapsed in [FAST, SEC, FAST] {
        b.admit("h", &p, t0).unwrap().record(false, elapsed, t0);
    }
    assert_eq!(b.state("h", t0), BreakerState::Closed, "3 < min_samples");
    b.admit("h", &p, t0).unwrap().record(false, 2 * SEC, t0); // 2 slow of 4
    assert_eq!(b.state("h", t0), BreakerState::Open);
}

#[test]
fn a_slow_probe_reopens_it() {
    let (b, _) = breakers();
    let mut p = policy();
    p.slow_call = Some(SlowCallCfg::default()); // 5s
    let t0 = Instant::now();
    open(&b, &p, t0);
    let t1 = t0 + p.cooldown;
    b.admit("h", &p, t1).unwrap().record(false, 6 * SEC, t1);
    assert_eq!(b.state("h", t1), BreakerState::Open);
}

#[test]
fn disabled_admits_everything_and_keeps_nothing() {
    let (b, _) = breakers();
    let mut p = policy();
    p.enabled = false;
    let t0 = Instant::now();
    for _ in 0..1_000 {
        call(&b, &p, t0, true);
    }
    assert_eq!(b.len(), 0);
}

#[test]
fn keys_are_independent() {
    let (b, seen) = breakers();
    let p = policy();
    let t0 = Instant::now();
    open(&b, &p, t0);
    assert!(b.admit("other", &p, t0).is_ok());
    assert_eq!(seen.lock()[0].0, "h");
}

#[test]
fn key_map_is_bounded_under_100_000_hosts() {
    let (b, _) = breakers();
    let p = policy();
    let t0 = Instant::now();
    for i in 0..100_000u64 {
        let now = t0 + Duration::from_micros(i);
        let host = format!("h{i}.example");
        b.admit(&host, &p, now)
            .unwrap()
            .record(i % 3 == 0, FAST, now);
        assert!(b.len() <= 1_000);
    }
}

#[test]
fn open_circuits_are_not_evicted_while_cooling_down() {
    let b = Breakers::new(4, Duration::from_secs(600), None);
    let mut p = policy();
    p.consecutive_failures = 1;
    let t0 = Instant::now();
    for i in 0..4 {
        b.admit(&format!("bad{i}"), &p, t0)
            .unwrap()
            .record(true, FAST, t0);
    }
    // The map is full of open circuits: new hosts pass untracked, the open ones stay open.
    for i in 0..100 {
        let key = format!("new{i}");
        let permit = b.admit(&key, &p, t0 + SEC).unwrap();
        permit.record(true, FAST, t0 + SEC);
    }
    assert_eq!(b.len(), 4);
    for i in 0..4 {
        assert_eq!(b.state(&format!("bad{i}"), t0 + SEC), BreakerState::Open);
    }
    // Once their cooldown is over they may go.
    let later = t0 + p.cooldown;
    assert!(b.admit("fresh", &p, later).is_ok());
    assert_eq!(b.state("fresh", later), BreakerState::Closed);
    assert!(b.len() <= 4);
}

#[test]
fn what_counts_as_failure() {
    let s = |c: u16| Outcome::Response(StatusCode::from_u16(c).unwrap());
    let e = Outcome::Error;
    for o in [
        e(ErrorKind::Dns),
        e(ErrorKind::Connect),
        e(ErrorKind::Tls),
        e(ErrorKind::Io),
        e(ErrorKind::Timeout(Phase::Connect)),
        e(ErrorKind::Timeout(Phase::Ttfb)),
        e(ErrorKind::Timeout(Phase::Read)),
        s(500),
        s(503),
    ] {
        assert!(is_failure(o, true), "{o:?}");
    }
    for o in [
        s(200),
        s(404),
        s(429),
        e(ErrorKind::TlsVerify),
        e(ErrorKind::Blocked),
        e(ErrorKind::InvalidRequest),
        e(ErrorKind::Timeout(Phase::Total)),
        e(ErrorKind::RateLimited),
        e(ErrorKind::CircuitOpen),
    ] {
        assert!(!is_failure(o, true), "{o:?}");
    }
    assert!(!is_failure(s(503), false), "count_5xx off");
}

#[test]
fn a_half_open_circuit_is_kept_until_idle() {
    let b = Breakers::new(1, Duration::from_secs(600), None);
    let mut p = policy();
    p.consecutive_failures = 1;
    let t0 = Instant::now();
    b.admit("h", &p, t0).unwrap().record(true, FAST, t0);
    let t1 = t0 + p.cooldown;
    b.admit("h", &p, t1).unwrap().record(false, FAST, t1); // 1 probe of 3
    assert_eq!(b.state("h", t1), BreakerState::HalfOpen);
    // Full map, the half-open circuit stays: "other" passes untracked.
    b.admit("other", &p, t1 + SEC)
        .unwrap()
        .record(true, FAST, t1 + SEC);
    assert_eq!(b.state("h", t1 + SEC), BreakerState::HalfOpen);
    assert_eq!(b.state("other", t1 + SEC), BreakerState::Closed);
    // Idle for idle_evict, it may go.
    let later = t1 + Duration::from_secs(600);
    b.admit("other", &p, later)
        .unwrap()
        .record(true, FAST, later);
    assert_eq!(b.len(), 1);
    assert_eq!(b.state("other", later), BreakerState::Open);
}

#[test]
fn only_n_probes_across_threads() {
    let (b, _) = breakers();
    let p = policy();
    let t0 = Instant::now();
    open(&b, &p, t0);
    let t1 = t0 + p.cooldown;
    let admitted = std::sync::atomic::AtomicUsize::new(0);
    let permits = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..100 {
                    if let Ok(permit) = b.admit("h", &p, t1) {
                        admitted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        permits.lock().push(permit);
                    }
                }
            });
        }
    });
    assert_eq!(admitted.into_inner(), 3);
    for permit in permits.into_inner() {
        permit.record(false, FAST, t1);
    }
    assert_eq!(b.state("h", t1), BreakerState::Closed);
}

#[test]
fn keys_and_errors() {
    let mut p = policy();
    assert_eq!(breaker_key(&p, "a.example", Some("t")), "a.example");
    p.key_by = soulbase_net_policy::CbKey::HostTenant;
    assert_eq!(breaker_key(&p, "a.example", Some("t")), "a.example/t");
    let open = Rejected {
        state: BreakerState::Open,
        retry_after: Some(SEC),
    };
    let err = open.into_error();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(err.code().as_str(), "PROVIDER.UNAVAILABLE");
    assert_eq!(err.retry_after(), Some(SEC));
    let half = Rejected {
        state: BreakerState::HalfOpen,
        retry_after: None,
    };
    assert_eq!(half.into_error().retry_after(), None);
}

/// A circuit the key map drops or replaces while not closed is reported as closed: its next
/// call starts closed, and a listener that followed its transitions must not keep it open.
#[test]
fn a_circuit_forgotten_while_not_closed_is_reported_closed() {
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    let listener: Listener =
        Box::new(move |key, t| sink.lock().push((key.to_owned(), t.from, t.to)));
    let idle = Duration::from_secs(600);
    // One key at most: a second key makes room by dropping the first.
    let b = Breakers::new(1, idle, Some(listener));
    let p = policy();
    let t0 = Instant::now();
    open(&b, &p, t0);
    seen.lock().clear();
    // Still in its cooldown: it may not go, so the other key is not tracked.
    drop(b.admit("other", &p, t0 + MS).unwrap());
    assert!(seen.lock().is_empty(), "{:?}", seen.lock());
    // Past its cooldown it may go: reported as leaving (half-)open for closed.
    let later = t0 + p.cooldown + SEC;
    drop(b.admit("other", &p, later).unwrap());
    assert_eq!(
        *seen.lock(),
        [("h".to_owned(), BreakerState::HalfOpen, BreakerState::Closed)]
    );

    // Replaced by a fresh circuit after the idle period: reported the same way.
    seen.lock().clear();
    let (b, seen) = breakers();
    open(&b, &p, t0);
    seen.lock().clear();
    let much_later = t0 + p.cooldown + idle + SEC;
    drop(b.admit("h", &p, much_later).unwrap());
    assert_eq!(
        *seen.lock(),
        [("h".to_owned(), BreakerState::HalfOpen, BreakerState::Closed)]
    );
    assert_eq!(b.state("h", much_later), BreakerState::Closed);
}
