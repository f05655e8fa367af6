//! [`TracingObserver`]: one `tracing` span per request and one per attempt, with the
//! OpenTelemetry HTTP-client field names.
//!
//! Why a map of open spans: the runtime reports a request as separate events, so the observer
//! keeps each request's span (keyed by [`RequestInfo::id`]) between its `RequestStarted` and
//! `RequestFinished`. The map is bounded: if a `RequestFinished` never arrives (a dropped
//! future), the oldest request is closed when the map is full.

use std::{collections::BTreeMap, fmt};

use parking_lot::Mutex;
use soulbase_net_core::{NetEvent, Observer, Outcome, RequestInfo};
use tracing::{field::Empty, Level, Span};

/// How many attempt spans one request keeps open at once (retries and hedges); past it the
/// oldest attempt span is closed.
const MAX_ATTEMPTS: usize = 32;

/// An [`Observer`] that turns events into `tracing` spans.
///
/// - `http.client.request` (INFO), opened at `RequestStarted` as a child of the current span,
///   closed at `RequestFinished`. Fields: `http.request.method`, `server.address`, `url.full` (no userinfo or query),
///   `url.scheme`, `tenant` (when there is one), `request.id`, and at the end
///   `http.response.status_code` (for a response), `error.type` (the error kind's label, or the
///   status code for a 4xx / 5xx, as OpenTelemetry asks) and `http.request.resend_count`
///   (attempts after the first, when there were any).
/// - `http.client.attempt` (INFO), a child of the request span, opened at `AttemptStarted`,
///   closed at `AttemptFinished`. Fields: `attempt`, `hedge`, `http.request.resend_count`
///   (from the second attempt), `http.response.status_code`, `error.type`.
/// - Events inside the request span for retries scheduled, redirects, timeouts, breaker and
///   limit refusals, spent retry budgets and blocked destinations.
///
/// The events carry no headers, bodies, query strings or credentials, so neither do the spans.
///
/// # Examples
/// ```
/// use soulbase_net_observe::TracingObserver;
///
/// let observer = TracingObserver::builder().max_requests(50_000).build();
/// assert_eq!(observer.open_requests(), 0);
/// ```
pub struct TracingObserver {
    max_requests: usize,
    open: Mutex<BTreeMap<u64, RequestSpans>>,
}

/// Configures a [`TracingObserver`]; from [`TracingObserver::builder`].
#[derive(Clone, Debug)]
pub struct TracingObserverBuilder {
    max_requests: usize,
}

struct RequestSpans {
    span: Span,
    attempts: Vec<(u32, Span)>,
}

// === impl TracingObserverBuilder ===

impl TracingObserverBuilder {
    /// How many requests may have an open span at once; past it, the request with the
    /// smallest id (the oldest) is closed. At least 1. Default is 10 000.
    pub fn max_requests(mut self, max: usize) -> Self {
        self.max_requests = max.max(1);
        self
    }

    /// Builds the observer. Every setting is valid, so this cannot fail.
    pub fn build(self) -> TracingObserver {
        TracingObserver {
            max_requests: self.max_requests,
            open: Mutex::new(BTreeMap::new()),
        }
    }
}

// === impl TracingObserver ===

impl TracingObserver {
    /// An observer with the defaults of [`TracingObserverBuilder`].
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder; see its setters for the defaults.
    pub fn builder() -> TracingObserverBuilder {
        TracingObserverBuilder {
            max_requests: 10_000,
        }
    }

    /// How many requests have an open span now.
    pub fn open_requests(&self) -> usize {
        self.open.lock().len()
    }

    fn start_request(&self, req: &RequestInfo<'_>) {
        let span = request_span(req);
        let evicted = {
            let mut open = self.open.lock();
            let replaced = open.insert(
                req.id,
                RequestSpans {
                    span,
                    attempts: Vec::new(),
                },
            );
            let oldest = if open.len() > self.max_requests {
                open.pop_first()
            } else {
                None
            };
            (replaced, oldest)
        };
        // Spans close when dropped: do it outside the lock, the subscriber may do I/O.
        drop(evicted);
    }

    fn start_attempt(&self, req: &RequestInfo<'_>, attempt: u32, hedge: bool) {
        let parent = self.open.lock().get(&req.id).map(|r| r.span.clone());
        let parent = match parent {
            Some(parent) => parent,
            None => {
                // Observed from the middle of a request: open its span now.
                self.start_request(req);
                self.open
                    .lock()
                    .get(&req.id)
                    .map(|r| r.span.clone())
                    .unwrap_or_else(Span::none)
            }
        };
        let span = tracing::span!(
            parent: &parent,
            Level::INFO,
            "http.client.attempt",
            attempt,
            hedge,
            http.request.resend_count = Empty,
            http.response.status_code = Empty,
            error.type = Empty,
        );
        if attempt > 1 {
            span.record("http.request.resend_count", attempt - 1);
        }
        let evicted = {
            let mut open = self.open.lock();
            match open.get_mut(&req.id) {
                Some(r) => {
                    r.attempts.push((attempt, span));
                    (r.attempts.len() > MAX_ATTEMPTS).then(|| r.attempts.remove(0))
                }
                None => Some((attempt, span)),
            }
        };
        drop(evicted);
    }

    fn finish_attempt(&self, req: &RequestInfo<'_>, attempt: u32, outcome: &Outcome) {
        let span = {
            let mut open = self.open.lock();
            open.get_mut(&req.id).and_then(|r| {
                let i = r.attempts.iter().position(|(n, _)| *n == attempt)?;
                Some(r.attempts.remove(i).1)
            })
        };
        if let Some(span) = span {
            record_outcome(&span, outcome);
        }
    }

    fn finish_request(&self, req: &RequestInfo<'_>, outcome: &Outcome, attempts: u32) {
        let Some(spans) = self.open.lock().remove(&req.id) else {
            return;
        };
        record_outcome(&spans.span, outcome);
        if attempts > 1 {
            spans.span.record("http.request.resend_count", attempts - 1);
        }
        // Attempts still open (a hedge that lost) close before their parent.
        drop(spans.attempts);
    }

    /// Runs `f` with the request's span, if it is open.
    fn in_request(&self, req: &RequestInfo<'_>, f: impl FnOnce(&Span)) {
        let span = self.open.lock().get(&req.id).map(|r| r.span.clone());
        if let Some(span) = span {
            f(&span);
        }
    }
}

impl Default for TracingObserver {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for TracingObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TracingObserver")
            .field("max_requests", &self.max_requests)
            .field("open_requests", &self.open_requests())
            .finish()
    }
}

impl Observer for TracingObserver {
    fn on_event(&self, event: &NetEvent<'_>) {
        match *event {
            NetEvent::RequestStarted { req } => self.start_request(&req),
            NetEvent::AttemptStarted { req, attempt, hedge } => {
                self.start_attempt(&req, attempt, hedge);
            }
            NetEvent::AttemptFinished { req, attempt, outcome, .. } => {
                self.finish_attempt(&req, attempt, &outcome);
            }
            NetEvent::RequestFinished { req, outcome, attempts, .. } => {
                self.finish_request(&req, &outcome, attempts);
            }
            NetEvent::RetryScheduled { req, attempt, reason, delay } => self.in_request(&req, |s| {
                let delay_ms = delay.as_millis() as u64;
                tracing::info!(parent: s, attempt, reason = reason.label(), delay_ms, "retry scheduled");
            }),
            NetEvent::RetryBudgetExhausted { req, reason } => self.in_request(&req, |s| {
                tracing::info!(parent: s, reason = reason.label(), "retry budget exhausted");
            }),
            NetEvent::Redirected { req, status, location } => self.in_request(&req, |s| {
                let status = status.as_u16();
                tracing::info!(parent: s, http.response.status_code = status, location, "redirected");
            }),
            NetEvent::TimedOut { req, phase } => self.in_request(&req, |s| {
                tracing::info!(parent: s, phase = phase.as_str(), "timed out");
            }),
            NetEvent::BreakerRejected { req } => self.in_request(&req, |s| {
                tracing::info!(parent: s, "circuit breaker open");
            }),
            NetEvent::RateLimited { req, scope } => self.in_request(&req, |s| {
                tracing::info!(parent: s, scope = ?scope, "rate limited");
            }),
            NetEvent::Blocked { req, rule, .. } => self.in_request(&req, |s| {
                tracing::info!(parent: s, rule, "destination blocked");
            }),
            _ => {}
        }
    }
}

fn request_span(req: &RequestInfo<'_>) -> Span {
    let span = tracing::span!(
        Level::INFO,
        "http.client.request",
        http.request.method = req.method.as_str(),
        server.address = req.host,
        url.scheme = req.scheme,
        url.full = req.url,
        tenant = Empty,
        request.id = req.id,
        http.response.status_code = Empty,
        error.type = Empty,
        http.request.resend_count = Empty,
    );
    if let Some(tenant) = req.tenant {
        span.record("tenant", tenant);
    }
    span
}

fn record_outcome(span: &Span, outcome: &Outcome) {
    match outcome {
        Outcome::Response(status) => {
            span.record("http.response.status_code", status.as_u16());
            if status.as_u16() >= 400 {
                span.record("error.type", status.as_str());
            }
        }
        Outcome::Error(kind) => {
            span.record("error.type", kind.label());
        }
    }
}
