//! The parts together, as the client's send pipeline will call them, on a simulated clock.

use std::time::Duration;

use soulbase_net_core::http::StatusCode;
use soulbase_net_core::Outcome;
use soulbase_net_policy::{CircuitBreakerPolicy, RetryPolicy};
use tokio::time::Instant;

use super::keymap::scoped_key;
use super::*;

const ATTEMPT: Duration = Duration::from_secs(9);
const TOTAL: Duration = Duration::from_secs(30);

struct Sim {
    retry: RetryPolicy,
    breaker: CircuitBreakerPolicy,
    budgets: RetryBudgets,
    breakers: Breakers,
    t0: Instant,
    hits: u64,
}

impl Sim {
    fn new(breaker_on: bool) -> Self {
        let mut breaker = CircuitBreakerPolicy::default();
        breaker.enabled = breaker_on;
        Self {
            retry: RetryPolicy::default(),
            budgets: RetryBudgets::new(100, Duration::from_secs(600)),
            breakers: Breakers::new(100, breaker.idle_evict, None),
            breaker,
            t0: Instant::now(),
            hits: 0,
        }
    }

    /// One request starting at `start` to an upstream that answers every attempt with 503
    /// after 20ms; returns when it ended. Requests overlap (each has its own timeline, a few
    /// hundred milliseconds long), as concurrent requests do.
    fn request(&mut self, start: Instant) -> Instant {
        let key = scoped_key("api.example", None, false);
        let mut now = start;
        self.budgets.deposit(&key, &self.retry.budget, now);
        for attempt in 1.. {
            let Ok(permit) = self.breakers.admit(&key, &self.breaker, now) else {
                return now; // CircuitOpen: fails fast, nothing sent
            };
            self.hits += 1;
            now += Duration::from_millis(20);
            let outcome = Outcome::Response(StatusCode::SERVICE_UNAVAILABLE);
            permit.record(is_failure(outcome, true), Duration::from_millis(20), now);
            let end = AttemptEnd {
                attempt,
                outcome,
                retry_after: None,
                time_left: TOTAL.saturating_sub(now - start),
                attempt_timeout: ATTEMPT,
            };
            match decide(&self.retry, true, &end, &mut FastRand) {
                RetryDecision::Retry { delay, .. }
                    if self.budgets.try_withdraw(&key, &self.retry.budget, now) =>
                {
                    now += delay;
                }
                _ => return now,
            }
        }
        now
    }
}

#[test]
fn a_breaker_cuts_traffic_to_a_failing_upstream_by_over_90_percent() {
    let run = |breaker_on| {
        let mut sim = Sim::new(breaker_on);
        // 100 requests per second for two minutes.
        for i in 0..12_000u32 {
            sim.request(sim.t0 + Duration::from_millis(10) * i);
        }
        sim.hits
    };
    let (off, on) = (run(false), run(true));
    assert!(off >= 12_000, "every request reaches the server: {off}");
    assert!(
        off <= 12_000 * 13 / 10 + 10 * 130,
        "the budget holds retries: {off}"
    );
    assert!(on * 10 <= off, "breaker on: {on} hits vs {off} off");
}

#[test]
fn retries_stay_within_the_budget_and_the_deadline() {
    let mut sim = Sim::new(false);
    let mut last = sim.t0;
    for i in 0..10_000u32 {
        let start = sim.t0 + Duration::from_millis(10) * i;
        let end = sim.request(start);
        assert!(end - start <= TOTAL);
        last = last.max(end);
    }
    // 20 % of requests plus 10/s over the run and one window.
    let secs = (last - sim.t0).as_secs_f64() + 10.0;
    let bound = 10_000.0 * 1.2 + 10.0 * secs;
    assert!(
        (sim.hits as f64) <= bound,
        "{} attempts > {bound}",
        sim.hits
    );
}
