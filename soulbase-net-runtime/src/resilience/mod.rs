//! Governance around each attempt: retry decisions, retry budgets, circuit breakers, limits,
//! endpoint freezing, hedging and dynamic timeouts (DESIGN §4, seeds 000 §5/§7, 001, 002, 004).
//!
//! Every part is a state machine without I/O that takes the time as an argument (`now`, a
//! `tokio::time::Instant`), so its rules are tested on a controlled clock, and the client's
//! send pipeline calls them around each attempt:
//!
//! 1. [`Limiter::acquire`] for the host and tenant (concurrency, AIMD window, GCRA rate,
//!    bounded wait) → `RateLimited` with its [`LimitScope`](soulbase_net_core::LimitScope);
//!    the [`LimitPermit`] is held for the whole request and released on drop.
//! 2. The budget records the request once: [`RetryBudgets::deposit`] for the [`budget_key`].
//! 3. For each attempt:
//!    - [`Breakers::admit`] for the [`breaker_key`] → `CircuitOpen` with the rest of the
//!      cooldown ([`Rejected::into_error`](breaker::Rejected::into_error));
//!    - choose the endpoint: [`Freezer::choose`] over the base URLs, and over the resolved
//!      addresses (which the resolver has shuffled already when the DNS policy says so);
//!    - the attempt runs with [`attempt_timeout`] (the dynamic timeout, learnt from a
//!      host's [`LatencyHistogram`]) and, when hedged, extra copies at [`HedgeSchedule::start_of`];
//!    - record: [`BreakerPermit::record`](breaker::BreakerPermit::record) with [`is_failure`], [`LimitPermit::record`] for
//!      AIMD, the latency into the window, and [`Freezer::freeze`] on a connect/DNS error;
//!    - [`decide`] → [`RetryDecision::Retry`] or [`RetryDecision::Stop`] (emit
//!      `RetryScheduled` with the delay and reason);
//!    - on `Retry`, [`RetryBudgets::try_withdraw`] (hedges withdraw too); refused → stop with
//!      the last outcome and `RetryBudgetExhausted`; then sleep the delay, then loop.
//!
//! Breaker transitions reach the client through the [`Listener`] given to [`Breakers::new`]
//! (it emits `BreakerTransition`). Cancellation needs no support here: dropping the request
//! future drops the permits, which give their slots back (a probe's included) without
//! counting anything, and no further attempt is scheduled.
//!
//! Random draws (jitter) come from a [`Random`](random::Random) source: [`FastRand`] in
//! production, fixed draws in tests.
//!
//! The SLO controller ([`SloControllers`], policy `slo`) counts each attempt
//! ([`SloControllers::record`]) and, while a host misses its SLO targets, stretches the wait
//! before each retry ([`Factors::stretch`](slo::Factors::stretch)) and each hedged copy
//! ([`HedgeSchedule::stretched`]), thins retries and hedges from one credit
//! ([`SloControllers::admit_retry`], [`SloControllers::admit_hedge`]) and scales the host's
//! AIMD ceiling and rate ([`Factors::limits`](slo::Factors::limits)).
//!
//! The limiter's and budgets' gauges reach metrics through the client's `GaugeSource`
//! ([`Limiter::read_gauges`], [`RetryBudgets::read_gauges`]), read at scrape time.

mod backoff;
mod breaker;
mod budget;
mod dynamic;
mod freeze;
mod hedge;
mod histogram;
mod keymap;
mod latency;
mod limiter;
mod random;
mod retry;
mod slo;
mod window;

pub(crate) use self::backoff::backoff_delay;
pub(crate) use self::breaker::{breaker_key, is_failure, Breakers, Listener, Transition};
pub(crate) use self::budget::{budget_key, RetryBudgets};
pub(crate) use self::dynamic::attempt_timeout;
pub(crate) use self::freeze::Freezer;
pub(crate) use self::hedge::HedgeSchedule;
pub(crate) use self::histogram::LatencyHistogram;
pub(crate) use self::keymap::passed;
pub(crate) use self::latency::LatencyWindow;
pub use self::limiter::{AimdLimit, AimdLimitPermit};
pub(crate) use self::limiter::{LimitPermit, Limiter};
pub(crate) use self::random::FastRand;
pub(crate) use self::retry::{decide, AttemptEnd, RetryDecision};
pub(crate) use self::slo::{Sample, SloControllers};

#[cfg(test)]
mod tests;
