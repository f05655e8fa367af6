//! The retry decision after each attempt (seed 000 §5.1, seed 001 §VI, DESIGN §4 "Retry").
//!
//! Pure: the caller passes what it knows about the attempt that just ended and gets back
//! either "retry after this delay" or the reason to stop. The retry budget and the breaker
//! are asked separately, after a `Retry` (see the module docs of `resilience`).

use std::time::Duration;

use soulbase_net_core::{ErrorKind, Outcome, Phase};
use soulbase_net_policy::{RetryOn, RetryPolicy};

use super::backoff::backoff_delay;
use super::random::Random;

/// What the caller knows when an attempt has ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttemptEnd {
    /// The attempt that ended, from 1.
    pub(crate) attempt: u32,
    /// How it ended.
    pub(crate) outcome: Outcome,
    /// The response's `Retry-After`, already parsed (`parse_retry_after`), if any.
    pub(crate) retry_after: Option<Duration>,
    /// Time left until the total deadline (the caller subtracts its margin first).
    pub(crate) time_left: Duration,
    /// The timeout the next attempt would run with.
    pub(crate) attempt_timeout: Duration,
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RetryDecision {
    /// Wait `delay`, then attempt again; `reason` is the failed attempt's outcome (for the
    /// `RetryScheduled` event).
    Retry {
        /// The wait before the next attempt.
        delay: Duration,
        /// Why: the outcome being retried.
        reason: Outcome,
    },
    /// Do not retry; return the last outcome.
    Stop(StopReason),
}

/// Why no retry follows an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// The attempt succeeded (a response below 400).
    Succeeded,
    /// Retries are turned off (`retry.enabled = false`).
    Disabled,
    /// The method is not idempotent (and the request not flagged), or the body is a stream.
    NotReplayable,
    /// A 4xx other than 429: the request itself is wrong, retrying cannot help.
    ClientError,
    /// The outcome is not one `retry_on` lists (or is never retried, e.g. `Blocked`).
    NotRetryable,
    /// `max_attempts` attempts were made.
    AttemptsExhausted,
    /// The server asked to wait longer than `backoff.cap`.
    RetryAfterTooLong(Duration),
    /// The next attempt could not finish before the total deadline.
    Deadline,
}

/// Decides whether to retry after `end`, for a request that is `replayable`
/// (`NetRequest::is_replayable`: retryable method and a replayable body).
///
/// In order: success stops; retries off, a non-replayable request, a 4xx other than 429 and
/// an outcome outside `retry_on` stop; then spent attempts; then the delay — `Retry-After`
/// when `respect_retry_after` and the outcome is a response (stop when it exceeds
/// `backoff.cap`), else [`backoff_delay`] for retry `end.attempt` — and finally the deadline:
/// stop when `delay + attempt_timeout > time_left`, so a retry never starts an attempt that
/// cannot finish in time.
pub(crate) fn decide(
    policy: &RetryPolicy,
    replayable: bool,
    end: &AttemptEnd,
    rng: &mut dyn Random,
) -> RetryDecision {
    use RetryDecision::Stop;
    let outcome = end.outcome;
    if outcome.is_success() {
        return Stop(StopReason::Succeeded);
    }
    if !policy.enabled {
        return Stop(StopReason::Disabled);
    }
    if !replayable {
        return Stop(StopReason::NotReplayable);
    }
    if status_of(outcome).is_some_and(|s| (400..500).contains(&s) && s != 429) {
        return Stop(StopReason::ClientError);
    }
    if !is_retryable(&policy.retry_on, outcome) {
        return Stop(StopReason::NotRetryable);
    }
    if end.attempt >= policy.effective_attempts() {
        return Stop(StopReason::AttemptsExhausted);
    }
    let server_wait = end
        .retry_after
        .filter(|_| policy.respect_retry_after && status_of(outcome).is_some());
    let delay = match server_wait {
        Some(wait) if wait > policy.backoff.cap => {
            return Stop(StopReason::RetryAfterTooLong(wait))
        }
        Some(wait) => wait,
        None => backoff_delay(&policy.backoff, end.attempt, rng),
    };
    if delay.saturating_add(end.attempt_timeout) > end.time_left {
        return Stop(StopReason::Deadline);
    }
    RetryDecision::Retry {
        delay,
        reason: outcome,
    }
}

/// Whether `retry_on` lists `outcome`.
///
/// Each switch is named after the label of the kinds it covers:
/// - `dns` → [`ErrorKind::Dns`]; `connect` → [`ErrorKind::Connect`]; `io` →
///   [`ErrorKind::Io`] (the connection reset or closed before the response was complete, as
///   Envoy's `reset`): the request may have reached the server, which is safe only because
///   retries are for idempotent, replayable requests;
/// - `timeout_connect` → a timeout in the DNS, connect or TLS phase; `timeout_ttfb`,
///   `timeout_read` → those phases;
/// - `status_5xx` → 500–599 except 501 (Not Implemented) and 505 (HTTP Version Not
///   Supported), which the server will answer the same way every time;
/// - `status_429` → 429.
///
/// Never: TLS failures (handshake failures are version or cipher mismatches that repeat;
/// verification failures are security decisions), write and total timeouts, `Blocked`,
/// `InvalidRequest`, `TooLarge`, `RedirectLimit`, `CircuitOpen`, `RateLimited` and the rest.
pub(crate) fn is_retryable(on: &RetryOn, outcome: Outcome) -> bool {
    if let Some(s) = status_of(outcome) {
        return match s {
            429 => on.status_429,
            501 | 505 => false,
            500..=599 => on.status_5xx,
            _ => false,
        };
    }
    match outcome {
        Outcome::Error(ErrorKind::Dns) => on.dns,
        Outcome::Error(ErrorKind::Connect) => on.connect,
        Outcome::Error(ErrorKind::Io) => on.io,
        Outcome::Error(ErrorKind::Timeout(Phase::Dns | Phase::Connect | Phase::Tls)) => {
            on.timeout_connect
        }
        Outcome::Error(ErrorKind::Timeout(Phase::Ttfb)) => on.timeout_ttfb,
        Outcome::Error(ErrorKind::Timeout(Phase::Read)) => on.timeout_read,
        _ => false,
    }
}

/// The HTTP status of a response outcome (or of an `ErrorKind::Status` error).
pub(crate) fn status_of(outcome: Outcome) -> Option<u16> {
    match outcome {
        Outcome::Response(s) => Some(s.as_u16()),
        Outcome::Error(ErrorKind::Status(s)) => Some(s.as_u16()),
        Outcome::Error(_) => None,
    }
}

#[cfg(test)]
mod tests;
