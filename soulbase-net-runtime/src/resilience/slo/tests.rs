use std::time::Duration;

use http::StatusCode;
use soulbase_net_core::{ErrorKind, Outcome, Phase};
use soulbase_net_policy::{LimitsPolicy, SloPolicy};
use tokio::time::Instant;

use super::*;

fn policy() -> SloPolicy {
    let mut p = SloPolicy::default();
    p.enabled = true;
    p.window = Duration::from_secs(5);
    p.interval = Duration::from_secs(1);
    p.min_samples = 10;
    p
}

const OK: Outcome = Outcome::Response(StatusCode::OK);
const TIMEOUT: Outcome = Outcome::Error(ErrorKind::Timeout(Phase::Ttfb));

fn sample(outcome: Outcome) -> Sample {
    Sample {
        retry: false,
        outcome,
        elapsed: Duration::from_millis(5),
    }
}

/// Feeds 20 attempts per second from `from` for `secs` seconds, `bad` of each 10 timing
/// out; every change seen.
fn feed(
    c: &SloControllers,
    p: &SloPolicy,
    t0: Instant,
    from: u64,
    secs: u64,
    bad: u32,
) -> Vec<(u64, Change)> {
    let mut changes = Vec::new();
    for ms in (from * 1000..(from + secs) * 1000).step_by(50) {
        let i = (ms / 50) % 10;
        let outcome = if (i as u32) < bad { TIMEOUT } else { OK };
        if let Some(ch) = c.record("h", p, sample(outcome), t0 + Duration::from_millis(ms)) {
            changes.push((ms, ch));
        }
    }
    changes
}

#[test]
fn a_healthy_host_never_moves() {
    let (c, p, t0) = (SloControllers::new(10), policy(), Instant::now());
    assert!(feed(&c, &p, t0, 0, 60, 0).is_empty());
    assert_eq!(c.factors("h", &p), Factors::NONE);
    let mut seen = 0;
    c.read_gauges(&mut |_| seen += 1);
    assert_eq!(seen, 0, "unmoved hosts are not reported");
}

#[test]
fn a_breach_tightens_within_a_window_up_to_the_bounds_then_heals_back_to_one() {
    let (c, p, t0) = (SloControllers::new(10), policy(), Instant::now());
    assert!(feed(&c, &p, t0, 0, 10, 0).is_empty());
    // 30 % timeouts from t = 10 s.
    let storm = feed(&c, &p, t0, 10, 20, 3);
    let (at, first) = storm[0];
    assert!(at <= 15_000 + 1_000, "tightened at {at} ms");
    assert!(first.breached);
    assert_eq!(first.sli, "timeout_rate");
    // The window slides: the breach shows as soon as the window's share passes the target.
    assert!(first.value > 0.05 && first.value <= 0.3, "{}", first.value);
    assert_eq!(first.target, 0.05);
    assert_eq!(
        first.factors,
        Factors {
            backoff: 2.0,
            rate: 0.5
        }
    );
    let last = storm.last().unwrap().1;
    assert_eq!(
        last.factors,
        Factors {
            backoff: 4.0,
            rate: 0.25
        }
    );
    assert_eq!(storm.len(), 2, "no event while at the bounds: {storm:?}");
    // Healed at t = 30 s: back to 1 within (⌈1 / 0.25⌉ + 1) windows plus an interval.
    let heal = feed(&c, &p, t0, 30, 30, 0);
    assert!(heal.iter().all(|(_, ch)| !ch.breached));
    let (back, end) = *heal.last().unwrap();
    assert_eq!(end.factors, Factors::NONE);
    assert!(back <= 30_000 + 5 * 5_000 + 1_000, "back to 1 at {back} ms");
    assert_eq!(c.factors("h", &p), Factors::NONE);
    let mut gauges = Vec::new();
    c.read_gauges(&mut |r| {
        if let GaugeReading::SloFactors { backoff, rate, .. } = r {
            gauges.push((backoff, rate));
        }
    });
    assert_eq!(gauges, [(1.0, 1.0)], "a host that moved stays reported");
}

#[test]
fn off_means_no_factors_no_thinning_and_no_state() {
    let c = SloControllers::new(10);
    let mut p = policy();
    let t0 = Instant::now();
    feed(&c, &p, t0, 0, 20, 5);
    assert_ne!(c.factors("h", &p), Factors::NONE);
    p.enabled = false;
    assert_eq!(c.factors("h", &p), Factors::NONE);
    assert!((0..10).all(|_| c.admit_retry("h", &p)));
    assert!(c.record("other", &p, sample(TIMEOUT), t0).is_none());
    assert!(!c.hosts.lock().map.contains_key("other"));
}

#[test]
fn retries_are_thinned_to_the_rate_factor() {
    let (c, p, t0) = (SloControllers::new(10), policy(), Instant::now());
    feed(&c, &p, t0, 0, 20, 5);
    let f = c.factors("h", &p);
    assert_eq!(f.rate, 0.25);
    let admitted = (0..100).filter(|_| c.admit_retry("h", &p)).count();
    assert_eq!(admitted, 25);
    assert!(c.admit_retry("unknown", &p));
}

#[test]
fn hedges_are_thinned_with_retries_from_one_credit() {
    let (c, mut p, t0) = (SloControllers::new(10), policy(), Instant::now());
    // Healthy: every hedge goes.
    feed(&c, &p, t0, 0, 10, 0);
    assert!((0..20).all(|_| c.admit_hedge("h", &p)));
    feed(&c, &p, t0, 10, 20, 5);
    assert_eq!(c.factors("h", &p).rate, 0.25);
    assert_eq!((0..100).filter(|_| c.admit_hedge("h", &p)).count(), 25);
    // Retries and hedges draw on the same credit: together, one extra attempt in four.
    let mixed = (0..100)
        .filter(|i| {
            if i % 2 == 0 {
                c.admit_retry("h", &p)
            } else {
                c.admit_hedge("h", &p)
            }
        })
        .count();
    assert_eq!(mixed, 25);
    p.enabled = false;
    assert!((0..10).all(|_| c.admit_hedge("h", &p)));
}

#[test]
fn too_few_samples_is_no_evidence_of_a_breach() {
    let (c, p, t0) = (SloControllers::new(10), policy(), Instant::now());
    // One attempt a second, all timing out: 5 per window, under min_samples.
    for s in 0..30 {
        let at = t0 + Duration::from_secs(s);
        assert!(c.record("h", &p, sample(TIMEOUT), at).is_none());
    }
}

#[test]
fn p99_and_retry_rate_are_checked() {
    let (c, mut p, t0) = (SloControllers::new(10), policy(), Instant::now());
    p.p99 = Some(Duration::from_millis(50));
    p.retry_rate = 1.0;
    p.error_ratio = 1.0;
    p.timeout_rate = 1.0;
    let mut changes = Vec::new();
    for ms in (0..8_000).step_by(50) {
        let s = Sample {
            retry: false,
            outcome: OK,
            elapsed: Duration::from_millis(200),
        };
        changes.extend(c.record("h", &p, s, t0 + Duration::from_millis(ms)));
    }
    assert_eq!(changes[0].sli, "p99");
    assert!(changes[0].value >= 200.0 && changes[0].value < 240.0);
    assert_eq!(changes[0].target, 50.0);
}

#[test]
fn a_long_idle_host_returns_to_the_policy() {
    let (c, p, t0) = (SloControllers::new(10), policy(), Instant::now());
    feed(&c, &p, t0, 0, 20, 5);
    assert_ne!(c.factors("h", &p), Factors::NONE);
    let later = t0 + Duration::from_secs(3600);
    let ch = c.record("h", &p, sample(OK), later).unwrap();
    assert_eq!(ch.factors, Factors::NONE);
    assert_eq!(c.factors("h", &p), Factors::NONE);
}

#[test]
fn stretch_only_lengthens_and_limits_only_lower() {
    let f = Factors {
        backoff: 3.0,
        rate: 0.25,
    };
    assert_eq!(
        f.stretch(Duration::from_millis(100)),
        Duration::from_millis(300)
    );
    assert_eq!(
        Factors::NONE.stretch(Duration::from_millis(100)),
        Duration::from_millis(100)
    );
    assert_eq!(f.stretch(Duration::MAX), Duration::MAX);
    let mut l = LimitsPolicy::default();
    assert!(matches!(f.limits(&l), Cow::Borrowed(_)));
    l.aimd.enabled = true;
    l.per_host_rate_rps = Some(2);
    let s = f.limits(&l);
    assert_eq!(s.aimd.max, 64);
    assert_eq!(s.per_host_rate_rps, Some(1));
    assert!(s.aimd.initial <= s.aimd.max);
    assert!(matches!(Factors::NONE.limits(&l), Cow::Borrowed(_)));
}

#[test]
fn the_latency_buckets_bound_their_times() {
    for ms in [0u64, 1, 2, 3, 50, 199, 200, 201, 1000, 65_000, 1_000_000] {
        let i = latency_bucket(Duration::from_millis(ms));
        assert!(
            bucket_edge_ms(i) >= ms as f64 || i == LATENCY_BUCKETS - 1,
            "{ms}"
        );
        if i > 0 && i < LATENCY_BUCKETS - 1 {
            assert!(bucket_edge_ms(i - 1) < ms as f64, "{ms}");
        }
    }
}
