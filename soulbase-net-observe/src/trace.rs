//! [`TracingObserver`]: the client's events as `tracing` events, in the span of the call
//! that reported them.
//!
//! Why no spans here: the client runs each call inside its own `http.client.request` span
//! and each attempt inside an `http.client.attempt` span (OpenTelemetry HTTP client field
//! names; see the runtime's `Client`), so logs from the call — interceptors, observers, the
//! connection code — nest under them. An observer sees events only after they happened and
//! could only build spans beside the call, never around it. What this observer adds is the
//! things spans do not say: retries scheduled, redirects, timeouts, refusals, calls answered
//! without sending.

use std::fmt;

use soulbase_net_core::{NetEvent, Observer, Takes};

/// An [`Observer`] that logs the client's events with `tracing` (INFO), each in the current
/// span — the call's or the attempt's, since the client reports them from inside those:
///
/// - `retry scheduled` (`attempt`, `reason`, `delay_ms`), `retry budget exhausted` (`reason`);
/// - `redirected` (`http.response.status_code`, `location` without query);
/// - `timed out` (`phase`), `circuit breaker open`, `rate limited` (`scope`),
///   `destination blocked` (`rule`);
/// - `deadline clamped` (`total_ms`, `worst_case_ms`): the request's own total cuts the
///   policy's retry schedule short;
/// - `answered without sending` (`by`: the interceptor, e.g. `cache_hook` for a cache hit,
///   `idempotency_key` for a duplicate dropped by the dedup window).
///
/// The events carry no headers, bodies, query strings or credentials, so neither do the logs.
/// Exported through OpenTelemetry (feature `otel`), they are events of the call's or the
/// attempt's span, their numbers integers.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use soulbase_net_observe::{Fanout, Metrics, TracingObserver};
///
/// let observer = Fanout::new()
///     .with(Arc::new(Metrics::new()))
///     .with(Arc::new(TracingObserver::new()));
/// # let _ = observer;
/// ```
#[derive(Clone, Copy, Default)]
pub struct TracingObserver {
    _private: (),
}

impl TracingObserver {
    /// The observer.
    pub fn new() -> Self {
        Self::default()
    }
}

impl fmt::Debug for TracingObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TracingObserver")
    }
}

impl Observer for TracingObserver {
    /// None of the events that only say something starts: the call's and the attempt's
    /// spans say so already.
    fn takes(&self) -> Takes {
        Takes::NONE
    }

    fn on_event(&self, event: &NetEvent<'_>) {
        match *event {
            NetEvent::RetryScheduled {
                attempt,
                reason,
                delay,
                ..
            } => {
                let (attempt, delay_ms) = (i64::from(attempt), millis(delay));
                tracing::info!(
                    attempt,
                    reason = reason.label(),
                    delay_ms,
                    "retry scheduled"
                );
            }
            NetEvent::ConnectionRetired { host, reason } => {
                tracing::debug!(
                    server.address = host,
                    reason = reason.as_str(),
                    "connection retired"
                );
            }
            NetEvent::Resent { attempt, .. } => {
                tracing::info!(attempt, "not processed by the server: sent again");
            }
            NetEvent::RetryBudgetExhausted { reason, .. } => {
                tracing::info!(reason = reason.label(), "retry budget exhausted");
            }
            NetEvent::Redirected {
                status, location, ..
            } => {
                let status = i64::from(status.as_u16());
                tracing::info!(http.response.status_code = status, location, "redirected");
            }
            NetEvent::TimedOut { phase, .. } => {
                tracing::info!(phase = phase.as_str(), "timed out");
            }
            NetEvent::BreakerRejected { .. } => tracing::info!("circuit breaker open"),
            NetEvent::RateLimited { scope, .. } => tracing::info!(scope = ?scope, "rate limited"),
            NetEvent::Blocked { rule, .. } => tracing::info!(rule, "destination blocked"),
            NetEvent::Answered { by, .. } => tracing::info!(by, "answered without sending"),
            NetEvent::DeadlineClamped {
                total, worst_case, ..
            } => {
                let (total_ms, worst_case_ms) = (millis(total), millis(worst_case));
                tracing::info!(total_ms, worst_case_ms, "deadline clamped");
            }
            _ => {}
        }
    }
}

/// Whole milliseconds as an `i64`: numbers go out as `i64` because tracing-opentelemetry
/// exports a `u64` field as a string.
fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
