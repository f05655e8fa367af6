//! What the runtime reports as it works: [`NetEvent`]s delivered to an [`Observer`].
//!
//! Why a trait and not a metrics library: the runtime stays free of any metrics or tracing
//! backend; `soulbase-net-observe` turns these events into Prometheus metrics, spans and
//! SLIs, and a test can count them directly.

use std::{net::IpAddr, sync::Arc, time::Duration};

use http::{Method, StatusCode};

use crate::{
    error::{ErrorKind, Phase},
    response::Elapsed,
};

/// Receives every [`NetEvent`]. Called inline on the request's task: keep it fast and
/// non-blocking (count, record, send to a channel).
pub trait Observer: Send + Sync {
    /// Handles one event.
    fn on_event(&self, event: &NetEvent<'_>);

    /// Called once by a client when it is built, with a handle on the state it keeps (limiter
    /// occupancy, AIMD windows, retry budgets), to be read when needed — e.g. at scrape time.
    ///
    /// The client owns the handle: keep a [`Weak`](std::sync::Weak) (`Arc::downgrade`) so that the client's
    /// gauges go away with it. Default ignores it.
    fn on_gauges(&self, source: &Arc<dyn GaugeSource>) {
        let _ = source;
    }

    /// Which of the events a client may leave out this observer takes (see [`Takes`]); the
    /// client builds one of those only when one of its observers takes it. Default: all of
    /// them, as before the choice existed.
    fn takes(&self) -> Takes {
        Takes::ALL
    }
}

/// The events an observer may go without: the two that only say that something starts,
/// which every call emits and which a metrics observer has no use for. Every other event
/// is delivered to every observer; a client delivers one of these only when some observer
/// of it takes it ([`Observer::takes`]), and then to every observer, as before.
///
/// Why: a client builds each event it emits (its [`RequestInfo`] and all), and an observer
/// that ignores it still costs the call. Measured, with the metrics observer over
/// HTTP/1.1: the two events cost about 200 instructions of a call's 33 000.
///
/// # Examples
/// ```
/// use soulbase_net_core::{NetEvent, Observer, Takes};
///
/// struct Finished;
/// impl Observer for Finished {
///     fn on_event(&self, event: &NetEvent<'_>) {
///         if let NetEvent::RequestFinished { outcome, .. } = event {
///             let _ = outcome;
///         }
///     }
///     fn takes(&self) -> Takes {
///         Takes::NONE
///     }
/// }
///
/// assert!(Takes::ALL.contains(Takes::REQUEST_STARTED));
/// assert!(!Finished.takes().contains(Takes::ATTEMPT_STARTED));
/// assert_eq!(Takes::NONE | Takes::REQUEST_STARTED, Takes::REQUEST_STARTED);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Takes(u8);

impl Takes {
    /// None of them: the observer gets only the events every observer gets.
    pub const NONE: Takes = Takes(0);
    /// [`NetEvent::RequestStarted`].
    pub const REQUEST_STARTED: Takes = Takes(1);
    /// [`NetEvent::AttemptStarted`] of an attempt that is not a hedge; a hedge's is always
    /// delivered (hedges are counted from it).
    pub const ATTEMPT_STARTED: Takes = Takes(2);
    /// All of them.
    pub const ALL: Takes = Takes(3);

    /// Whether every event of `other` is in `self`.
    pub const fn contains(self, other: Takes) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Takes {
    type Output = Takes;

    fn bitor(self, other: Takes) -> Takes {
        Takes(self.0 | other.0)
    }
}

/// State a client keeps whose current value matters more than its changes: read at the
/// moment it is wanted (a scrape) instead of pushed as [`NetEvent`]s.
///
/// Why not events: these values move without any event (a retry budget's window slides with
/// time), and reading them costs nothing on the request path.
pub trait GaugeSource: Send + Sync {
    /// Calls `visit` with each current reading, in no particular order. Takes short locks
    /// of the client's limiter, budgets and connection pools; call it from a scrape, not per
    /// request.
    fn read_gauges(&self, visit: &mut dyn FnMut(GaugeReading<'_>));
}

/// One current value from a [`GaugeSource`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum GaugeReading<'a> {
    /// Calls holding one of a host's concurrency slots now.
    LimiterInFlight {
        /// The host (lowercase; IPv6 without brackets).
        host: &'a str,
        /// How many.
        value: u64,
    },
    /// Calls holding one of a tenant's concurrency slots now (across hosts).
    TenantInFlight {
        /// The tenant.
        tenant: &'a str,
        /// How many.
        value: u64,
    },
    /// Calls waiting for a place under a host's limits (only with a bounded `max_wait`).
    LimiterQueued {
        /// The host.
        host: &'a str,
        /// How many.
        value: u64,
    },
    /// The calls the AIMD window allows in flight now.
    LimiterWindow {
        /// The host, or `None` for the client-wide window (global scope).
        host: Option<&'a str>,
        /// The window.
        value: u64,
    },
    /// The retries (and hedges) a retry budget allows now.
    RetryBudgetTokens {
        /// The host.
        host: &'a str,
        /// The tenant, when the budget is kept per (host, tenant).
        tenant: Option<&'a str>,
        /// Whole retries available.
        value: u64,
    },
    /// Connections the client holds open to a host now, in use or idle (HTTP/1.1 and
    /// HTTP/2, opening ones included), summed over the host's ports and schemes.
    PoolOpen {
        /// The host.
        host: &'a str,
        /// How many.
        value: u64,
    },
    /// Idle HTTP/1.1 connections the client keeps to a host, ready for the next request.
    PoolIdle {
        /// The host.
        host: &'a str,
        /// How many.
        value: u64,
    },
    /// The SLO controller's factors for a host (policy `slo`): what it multiplies the
    /// host's backoff by (≥ 1) and its rate by (≤ 1). Reported only for hosts whose factors
    /// have moved at least once.
    SloFactors {
        /// The host.
        host: &'a str,
        /// The backoff factor, 1 when the controller is not slowing the host down.
        backoff: f64,
        /// The rate factor, 1 when the controller is not slowing the host down.
        rate: f64,
    },
    /// Items waiting in an outbox.
    OutboxPending {
        /// How many.
        value: u64,
    },
    /// How long the oldest item due has waited past its time, in seconds.
    OutboxOldestPendingAge {
        /// Seconds.
        value: u64,
    },
}

/// An observer that ignores everything; the default of a client without one.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopObserver;

impl Observer for NoopObserver {
    fn on_event(&self, _event: &NetEvent<'_>) {}

    fn takes(&self) -> Takes {
        Takes::NONE
    }
}

impl<T: Observer + ?Sized> Observer for Arc<T> {
    fn on_event(&self, event: &NetEvent<'_>) {
        (**self).on_event(event);
    }

    fn on_gauges(&self, source: &Arc<dyn GaugeSource>) {
        (**self).on_gauges(source);
    }

    fn takes(&self) -> Takes {
        (**self).takes()
    }
}

/// The request an event belongs to: the labels of the seed's metrics.
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo<'a> {
    /// A number the client gives each request, to tie attempts to their request.
    pub id: u64,
    /// The method.
    pub method: &'a Method,
    /// `http` or `https`.
    pub scheme: &'a str,
    /// The host (lowercase; IPv6 without brackets).
    pub host: &'a str,
    /// The tenant, if any.
    pub tenant: Option<&'a str>,
    /// The URL of the request without userinfo, query or fragment (so no credential or
    /// token reaches a log or trace through it).
    pub url: &'a str,
}

/// How an attempt or a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A response arrived with this status.
    Response(StatusCode),
    /// It failed with this kind of error.
    Error(ErrorKind),
}

impl Outcome {
    /// A stable label for metrics: `"ok"` for 1xx–3xx, `"status_4xx"`, `"status_429"`,
    /// `"status_5xx"`, or the error kind's label (e.g. `"timeout_ttfb"`).
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Response(s) if s.as_u16() < 400 => "ok",
            Outcome::Response(s) => ErrorKind::Status(*s).label(),
            Outcome::Error(kind) => kind.label(),
        }
    }

    /// Whether this is a response with a status below 400.
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Response(s) if s.as_u16() < 400)
    }
}

/// The three states of a circuit breaker: closed (calls pass), open (calls fail fast) and
/// half-open (a few probes decide).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls pass; failures are counted.
    Closed,
    /// Calls fail fast until the cooldown ends.
    Open,
    /// A few probes pass to test recovery.
    HalfOpen,
}

impl BreakerState {
    /// A stable lowercase label.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// What happened to an outbox item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutboxStep {
    /// Stored durably.
    Enqueued,
    /// Delivered and acknowledged.
    Delivered,
    /// Failed; rescheduled.
    Retried,
    /// Given up: moved to the dead letters.
    Dead,
}

/// Which limit refused a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LimitScope {
    /// Per-host concurrency.
    HostConcurrency,
    /// Per-tenant concurrency.
    TenantConcurrency,
    /// Per-host rate.
    HostRate,
    /// The adaptive (AIMD) window.
    Adaptive,
    /// A byte or request quota.
    Quota,
    /// A rate shared across the fleet (`limits.global`).
    GlobalRate,
    /// The client's own cap on calls in flight, all hosts and tenants together
    /// (`ClientBuilder::max_in_flight` in the runtime).
    ClientConcurrency,
}

/// Where a DNS answer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DnsSource {
    /// A fresh lookup.
    Lookup,
    /// The cache, within its TTL.
    Cache,
    /// The cache past its TTL, because the lookup failed (serve-stale).
    Stale,
    /// A static override.
    Static,
    /// An IP literal in the URL; no lookup.
    Literal,
}

/// The direction of bytes on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Received.
    In,
    /// Sent.
    Out,
}

impl Direction {
    /// `"in"` or `"out"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
        }
    }
}

/// Why the pool retired a connection: it takes no new request, and closes once the requests
/// on it are done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetireReason {
    /// The server is closing it (an HTTP/2 GOAWAY).
    GoAway,
    /// Its host name no longer resolves to the address it was opened to (a DNS move).
    DnsMoved,
    /// It was the least recently used idle connection when the client's idle connections
    /// went over the pool's total budget (`pool_max_idle`).
    IdleBudget,
}

impl RetireReason {
    /// `"goaway"`, `"dns_moved"` or `"idle_budget"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RetireReason::GoAway => "goaway",
            RetireReason::DnsMoved => "dns_moved",
            RetireReason::IdleBudget => "idle_budget",
        }
    }
}

/// Something the runtime did, as it happened.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum NetEvent<'a> {
    /// A request passed validation and starts.
    RequestStarted {
        /// The request.
        req: RequestInfo<'a>,
    },
    /// An attempt starts (the first, a retry, or a hedge).
    AttemptStarted {
        /// The request.
        req: RequestInfo<'a>,
        /// The attempt number, from 1.
        attempt: u32,
        /// Whether it is a hedged copy running beside another attempt.
        hedge: bool,
    },
    /// An attempt ended.
    AttemptFinished {
        /// The request.
        req: RequestInfo<'a>,
        /// The attempt number, from 1.
        attempt: u32,
        /// How it ended.
        outcome: Outcome,
        /// Its timings.
        elapsed: Elapsed,
    },
    /// A retry is scheduled after a failed attempt.
    RetryScheduled {
        /// The request.
        req: RequestInfo<'a>,
        /// The attempt that failed.
        attempt: u32,
        /// Why it is retried: the failed attempt's outcome.
        reason: Outcome,
        /// The wait before the next attempt.
        delay: Duration,
    },
    /// An attempt the server provably did not process (`ErrorKind::NotProcessed`: past a
    /// GOAWAY, a refused stream, a connection that closed before the request was written)
    /// goes again at once on another connection. Not a retry: it costs no attempt of the
    /// policy's and nothing of the retry budget, and the breaker does not count it.
    Resent {
        /// The request.
        req: RequestInfo<'a>,
        /// The attempt the server did not process.
        attempt: u32,
    },
    /// The pool retired a connection (see [`RetireReason`]).
    ConnectionRetired {
        /// The host of the connection's origin.
        host: &'a str,
        /// Why.
        reason: RetireReason,
    },
    /// A retry was wanted but the retry budget is spent.
    RetryBudgetExhausted {
        /// The request.
        req: RequestInfo<'a>,
        /// The outcome that would have been retried.
        reason: Outcome,
    },
    /// A circuit breaker changed state.
    BreakerTransition {
        /// The breaker's key (host, or host and tenant).
        key: &'a str,
        /// The state it left.
        from: BreakerState,
        /// The state it entered.
        to: BreakerState,
    },
    /// An open breaker refused a call.
    BreakerRejected {
        /// The request.
        req: RequestInfo<'a>,
    },
    /// A limit refused or delayed a call.
    RateLimited {
        /// The request.
        req: RequestInfo<'a>,
        /// Which limit.
        scope: LimitScope,
    },
    /// A redirect was followed.
    Redirected {
        /// The request.
        req: RequestInfo<'a>,
        /// The redirect status.
        status: StatusCode,
        /// Where to, without userinfo or query.
        location: &'a str,
    },
    /// A host name was resolved.
    DnsResolved {
        /// The name.
        host: &'a str,
        /// The addresses, in the order they will be tried.
        addrs: &'a [IpAddr],
        /// Where the answer came from.
        source: DnsSource,
        /// How long it took.
        elapsed: Duration,
    },
    /// The address guard or allow-list refused a destination; nothing was dialled.
    Blocked {
        /// The request.
        req: RequestInfo<'a>,
        /// The refused address, when the refusal is about an address.
        addr: Option<IpAddr>,
        /// The rule that refused it, e.g. `"private"`, `"allow_hosts"`.
        rule: &'a str,
    },
    /// Body bytes went over the wire for a request: once per direction, when the body is
    /// done, and only when it had at least one byte.
    Bytes {
        /// The request.
        req: RequestInfo<'a>,
        /// In or out.
        dir: Direction,
        /// How many.
        bytes: u64,
    },
    /// A timeout fired.
    TimedOut {
        /// The request.
        req: RequestInfo<'a>,
        /// Which phase.
        phase: Phase,
    },
    /// The request's own timeouts are shorter than the policy's retry schedule needs
    /// (`attempts × attempt timeout + backoff` over the request's total, less the margin):
    /// the call runs, and its total deadline bounds it — retries that cannot finish in time
    /// are not started. Policies themselves are refused when they cannot keep their deadline;
    /// a request's own total only clamps.
    DeadlineClamped {
        /// The request.
        req: RequestInfo<'a>,
        /// The call's total deadline (the request's own).
        total: Duration,
        /// The longest the policy's schedule could take with the request's timeouts.
        worst_case: Duration,
    },
    /// An interceptor's `respond` hook answered the call, so nothing was sent: a fresh cache
    /// entry, or a duplicate inside a dedup window. `RequestFinished` follows with the
    /// answer, as for any other call.
    Answered {
        /// The request.
        req: RequestInfo<'a>,
        /// The answering interceptor's [`Interceptor::name`](crate::Interceptor::name):
        /// `"idempotency_key"` for a duplicate answered from `IdempotencyKey`'s dedup window,
        /// `"cache_hook"` for a `CacheHook` hit. Names are static, so they make bounded
        /// labels.
        by: &'static str,
    },
    /// A shared store (a fleet's rate limits, dedup window or cache, e.g. on Redis) failed or
    /// did not answer in time; what the call got instead follows the policy
    /// (`on_store_error`).
    StoreError {
        /// The request, when the failure happened for one.
        req: Option<RequestInfo<'a>>,
        /// Which store: `"rate"`, `"dedup"`, `"cache"`.
        store: &'static str,
        /// What was asked of it: `"take"`, `"get"`, `"set"`, …; `"skip"` when it was not
        /// asked because it failed moments ago (it is asked again after a short back-off).
        op: &'static str,
        /// Whether it timed out (else it failed).
        timed_out: bool,
    },
    /// Something happened to an outbox item (durable delivery, `soulbase-net-outbox`).
    Outbox {
        /// What.
        step: OutboxStep,
        /// For a delivery: how late it went out (actual − `deliver_at`).
        lateness: Option<Duration>,
    },
    /// The SLO controller changed a host's factors: an SLI
    /// was over its target for a whole window (the factors tighten), or every SLI was under
    /// its target for a whole window (they step back toward 1).
    PolicyChange {
        /// The host.
        host: &'a str,
        /// The SLI that decided: `"retry_rate"`, `"timeout_rate"`, `"error_ratio"` or
        /// `"p99"`. When the factors step back, the SLI nearest its target.
        sli: &'static str,
        /// Its value over the window (a ratio, or milliseconds for `p99`).
        value: f64,
        /// Its target (same unit).
        target: f64,
        /// Whether the SLI was over its target (the factors tightened).
        breached: bool,
        /// The host's new backoff factor (≥ 1).
        backoff_factor: f64,
        /// The host's new rate factor (≤ 1).
        rate_factor: f64,
    },
    /// A request ended.
    RequestFinished {
        /// The request.
        req: RequestInfo<'a>,
        /// How it ended.
        outcome: Outcome,
        /// Attempts made.
        attempts: u32,
        /// Its timings.
        elapsed: Elapsed,
        /// The HTTP version of the final response; `None` when the call ended without one.
        version: Option<http::Version>,
    },
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn outcome_labels_match_the_metrics_vocabulary() {
        assert_eq!(Outcome::Response(StatusCode::OK).label(), "ok");
        assert_eq!(Outcome::Response(StatusCode::NOT_MODIFIED).label(), "ok");
        assert_eq!(
            Outcome::Response(StatusCode::NOT_FOUND).label(),
            "status_4xx"
        );
        assert_eq!(
            Outcome::Response(StatusCode::TOO_MANY_REQUESTS).label(),
            "status_429"
        );
        assert_eq!(
            Outcome::Response(StatusCode::BAD_GATEWAY).label(),
            "status_5xx"
        );
        assert_eq!(
            Outcome::Error(ErrorKind::Timeout(Phase::Ttfb)).label(),
            "timeout_ttfb"
        );
        assert_eq!(Outcome::Error(ErrorKind::Blocked).label(), "blocked");
        assert!(Outcome::Response(StatusCode::OK).is_success());
        assert!(!Outcome::Response(StatusCode::BAD_GATEWAY).is_success());
        assert!(!Outcome::Error(ErrorKind::Dns).is_success());
    }

    #[test]
    fn observers_behind_arcs_receive_events() {
        struct Count(AtomicUsize);
        impl Observer for Count {
            fn on_event(&self, event: &NetEvent<'_>) {
                if let NetEvent::RequestStarted { req } = event {
                    assert_eq!(req.host, "h.example");
                    self.0.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let obs: Arc<dyn Observer> = count.clone();
        let method = Method::GET;
        let req = RequestInfo {
            id: 1,
            method: &method,
            scheme: "https",
            host: "h.example",
            tenant: None,
            url: "https://h.example/",
        };
        obs.on_event(&NetEvent::RequestStarted { req });
        obs.on_event(&NetEvent::TimedOut {
            req,
            phase: Phase::Read,
        });
        NoopObserver.on_event(&NetEvent::RequestStarted { req });
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        assert_eq!(BreakerState::HalfOpen.as_str(), "half_open");
        assert_eq!(Direction::Out.as_str(), "out");
    }
}
