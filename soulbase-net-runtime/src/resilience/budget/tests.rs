use std::time::Duration;

use proptest::prelude::*;
use soulbase_net_policy::RetryBudget;
use tokio::time::Instant;

use super::*;

fn cfg(ratio: f64, floor: u32, window_s: u64) -> RetryBudget {
    let mut c = RetryBudget::default();
    c.retry_ratio = ratio;
    c.min_retries_per_sec = floor;
    c.window = Duration::from_secs(window_s);
    c
}

#[test]
fn floor_alone_allows_min_retries_per_sec_times_window() {
    let c = cfg(0.2, 2, 10);
    let t0 = Instant::now();
    let mut b = Budget::new(c.window, t0);
    let granted = (0..100).filter(|_| b.try_withdraw(&c, t0)).count();
    assert_eq!(granted, 20);
}

#[test]
fn ratio_of_deposits_plus_floor() {
    let c = cfg(0.2, 0, 10);
    let t0 = Instant::now();
    let mut b = Budget::new(c.window, t0);
    for _ in 0..50 {
        b.deposit(&c, t0);
    }
    let granted = (0..100).filter(|_| b.try_withdraw(&c, t0)).count();
    assert_eq!(granted, 10, "20 % of 50");
}

#[test]
fn budget_refills_as_the_window_slides() {
    let c = cfg(0.5, 0, 10);
    let t0 = Instant::now();
    let mut b = Budget::new(c.window, t0);
    for _ in 0..10 {
        b.deposit(&c, t0);
    }
    assert_eq!((0..10).filter(|_| b.try_withdraw(&c, t0)).count(), 5);
    // After the window both deposits and withdrawals are gone: nothing to spend.
    let later = t0 + Duration::from_secs(10);
    assert!(!b.try_withdraw(&c, later));
    for _ in 0..4 {
        b.deposit(&c, later);
    }
    assert_eq!((0..10).filter(|_| b.try_withdraw(&c, later)).count(), 2);
}

#[test]
fn tokens_are_the_whole_retries_left_and_follow_the_window() {
    let c = cfg(0.5, 0, 10);
    let t0 = Instant::now();
    let budgets = RetryBudgets::new(10, Duration::from_secs(60));
    let read = |now| {
        let mut seen = Vec::new();
        budgets.read_gauges(now, &mut |g| {
            if let GaugeReading::RetryBudgetTokens {
                host,
                tenant,
                value,
            } = g
            {
                seen.push((host.to_owned(), tenant.map(str::to_owned), value));
            }
        });
        seen.sort();
        seen
    };
    for _ in 0..7 {
        budgets.deposit("h", &c, t0);
    }
    budgets.deposit("h/t1", &c, t0);
    budgets.deposit("h/t1", &c, t0);
    // 0.5 × 7 = 3.5 → 3 whole retries; 0.5 × 2 = 1.
    assert_eq!(
        read(t0),
        vec![
            ("h".to_owned(), None, 3),
            ("h".to_owned(), Some("t1".to_owned()), 1)
        ]
    );
    assert!(budgets.try_withdraw("h", &c, t0));
    assert!(budgets.try_withdraw("h/t1", &c, t0));
    assert!(!budgets.try_withdraw("h/t1", &c, t0));
    assert_eq!(read(t0)[0].2, 2);
    assert_eq!(read(t0)[1].2, 0);
    // The window slides on without any call: everything has left it.
    assert_eq!(read(t0 + Duration::from_secs(10))[0].2, 0);
}

#[test]
fn disabled_budget_always_allows() {
    let mut c = cfg(0.0, 0, 10);
    c.enabled = false;
    let budgets = RetryBudgets::new(10, Duration::from_secs(60));
    let now = Instant::now();
    assert!((0..1_000).all(|_| budgets.try_withdraw("h", &c, now)));
    assert_eq!(budgets.len(), 0, "no state kept when off");
}

#[test]
fn keys_have_separate_budgets() {
    let c = cfg(0.0, 1, 1);
    let budgets = RetryBudgets::new(10, Duration::from_secs(60));
    let now = Instant::now();
    assert!(budgets.try_withdraw("a", &c, now));
    assert!(!budgets.try_withdraw("a", &c, now));
    assert!(budgets.try_withdraw("b", &c, now));
}

#[test]
fn key_map_is_bounded_under_100_000_hosts() {
    let c = RetryBudget::default();
    let budgets = RetryBudgets::new(1_000, Duration::from_secs(600));
    let t0 = Instant::now();
    for i in 0..100_000u64 {
        let now = t0 + Duration::from_millis(i);
        let host = format!("h{i}.example");
        budgets.deposit(&host, &c, now);
        let _ = budgets.try_withdraw(&host, &c, now);
        assert!(budgets.len() <= 1_000);
    }
}

/// Drives `requests` requests at `rps` against an upstream that always fails, each wanting
/// `max_attempts - 1` retries; returns the retries granted.
fn always_failing(c: &RetryBudget, requests: u64, rps: u64, max_attempts: u32) -> u64 {
    let t0 = Instant::now();
    let budgets = RetryBudgets::new(16, Duration::from_secs(600));
    let mut retries = 0;
    for i in 0..requests {
        let now = t0 + Duration::from_nanos(i * 1_000_000_000 / rps);
        budgets.deposit("upstream", c, now);
        for _ in 1..max_attempts {
            if !budgets.try_withdraw("upstream", c, now) {
                break;
            }
            retries += 1;
        }
    }
    retries
}

#[test]
fn full_outage_retries_stay_within_ratio_plus_floor() {
    // 10 000 requests at 100/s: 100s of traffic, 3 attempts each wanted.
    let c = RetryBudget::default();
    let (requests, rps) = (10_000u64, 100u64);
    let retries = always_failing(&c, requests, rps, 3);
    let duration = requests as f64 / rps as f64;
    let floor = f64::from(c.min_retries_per_sec) * (duration + c.window.as_secs_f64());
    let bound = c.retry_ratio + floor / requests as f64 + 0.01;
    let rate = retries as f64 / requests as f64;
    assert!(rate <= bound, "retries/requests {rate} > {bound}");
    // And the budget is actually used: far more than the floor alone.
    assert!(rate >= c.retry_ratio * 0.9, "retries/requests {rate}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn retries_never_exceed_ratio_plus_floor(
        ratio in 0.0f64..=1.0, floor in 0u32..20, window_s in 1u64..30, rps in 10u64..2_000,
        attempts in 2u32..5,
    ) {
        let c = cfg(ratio, floor, window_s);
        let requests = 10_000u64;
        let retries = always_failing(&c, requests, rps, attempts);
        let duration = requests as f64 / rps as f64;
        let floor_allowance = f64::from(floor) * (duration + window_s as f64);
        let bound = ratio * requests as f64 + floor_allowance + 0.01 * requests as f64;
        prop_assert!(retries as f64 <= bound, "{} > {}", retries, bound);
    }
}

#[test]
fn without_a_floor_attempts_per_request_stay_below_one_plus_ratio() {
    let c = cfg(0.2, 0, 10);
    let requests = 10_000u64;
    let retries = always_failing(&c, requests, 100, 3);
    let attempts = (requests + retries) as f64 / requests as f64;
    assert!(attempts <= 1.0 + 0.2 + 0.01, "attempts/request {attempts}");
    assert!(attempts >= 1.19, "the budget is used: {attempts}");
}

#[test]
fn keyed_per_host_or_per_tenant() {
    let mut c = RetryBudget::default();
    assert_eq!(budget_key(&c, "a.example", Some("t")), "a.example");
    c.per_tenant = true;
    assert_eq!(budget_key(&c, "a.example", Some("t")), "a.example/t");
}
