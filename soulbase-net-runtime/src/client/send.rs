//! One call through the client: validation, the policy (and its view for the whole call), the
//! call's span, cancellation, the limiter slot, and the events that open and close it. The
//! stages after that have their own files: `intercept` (interceptors and the request's final
//! checks), `follow` (redirects), `retries` (between two attempts), `hedged` (hedged copies),
//! `attempt` (one attempt and its exchange).

use std::{
    future::Future,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    task::Poll,
    time::Duration,
};

use soulbase_net_core::{
    Elapsed, ErrorKind, LimitScope, NetError, NetEvent, NetRequest, NetResponse, Outcome, Phase,
    RequestInfo, Takes,
};
use soulbase_net_policy::{NetPolicy, PolicyView};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{field::Empty as Unset, Span};
use url::Url;

use super::span::in_span;
use super::urls::{host_span, shown_url};
use super::{body::OwnedInfo, Inner};
use crate::resilience::LimitPermit;

/// Why a call or a hop got no slot under its limits.
pub(super) enum NoSlot {
    /// A limit refused it (at once, or after `limits.max_wait`).
    Limited(LimitScope),
    /// The call's deadline came while it waited.
    Deadline,
}

/// The call's S75-4 segments that are measured while it runs (see `Elapsed`), in nanoseconds:
/// atomics, because hedged attempts and redirect hops add to the same call's. Only a wait
/// that happened, or a hook that ran, reads the clock for them.
#[derive(Default)]
pub(super) struct Segments {
    queue_in: AtomicU64,
    processing: AtomicU64,
}

impl Segments {
    /// Adds the time since `from` to the wait for slots (`W_q_in`).
    pub(super) fn queued_since(&self, from: Instant) {
        add_since(&self.queue_in, from);
    }

    /// Adds the time since `from` to the time in hooks (`w(proc)`).
    pub(super) fn processed_since(&self, from: Instant) {
        add_since(&self.processing, from);
    }

    /// `elapsed` with the call's segments.
    pub(super) fn fill(&self, elapsed: Elapsed) -> Elapsed {
        let read = |n: &AtomicU64| Duration::from_nanos(n.load(Ordering::Relaxed));
        elapsed
            .with_queue_in(read(&self.queue_in))
            .with_processing(read(&self.processing))
    }
}

fn add_since(to: &AtomicU64, from: Instant) {
    let nanos = u64::try_from(from.elapsed().as_nanos()).unwrap_or(u64::MAX / 4);
    to.fetch_add(nanos, Ordering::Relaxed);
}

/// Times the interceptors' hooks of a call (`w(proc)`) until it is stopped or dropped, so
/// that every way out of them (an error, an answer from `respond`) is counted; idle when
/// the hooks are empty.
pub(super) struct Processing<'a> {
    segments: &'a Segments,
    from: Option<Instant>,
}

impl<'a> Processing<'a> {
    /// Starts timing when `hooks` is true.
    pub(super) fn start(segments: &'a Segments, hooks: bool) -> Self {
        Processing {
            segments,
            from: hooks.then(Instant::now),
        }
    }

    /// Stops timing (once).
    pub(super) fn stop(&mut self) {
        if let Some(from) = self.from.take() {
            self.segments.processed_since(from);
        }
    }
}

impl Drop for Processing<'_> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the layers of a call hand up to `send`: the response boxed once, where the attempt
/// builds it. Each layer (attempt, retries, redirects, interceptors, the call) keeps its
/// result across an `await` and returns it; unboxed, that moved the response's few hundred
/// bytes a dozen times and more per call. Measured: one allocation costs less. `send`
/// unboxes it for the caller.
pub(super) type Answer = Result<Box<NetResponse>, NetError>;

/// Feeds a call's (or a redirect hop's) outcome to its host's AIMD window — except a request a
/// GOAWAY raced (`classify::is_server_going_away`): the server only closed a connection, as it
/// routinely does, which says nothing of its load.
pub(super) fn record_limit(permit: &LimitPermit, result: &Answer) {
    match result {
        Ok(res) => permit.record(Outcome::Response(res.status)),
        Err(e) if crate::classify::is_server_going_away(e) => {}
        Err(e) => permit.record(Outcome::Error(e.kind())),
    }
}

/// What stays fixed for one request: its number, labels, timeouts and deadlines.
pub(super) struct Call<'a> {
    pub(super) labels: Arc<OwnedInfo>,
    pub(super) policy: &'a Arc<NetPolicy>,
    /// The policy's timeouts with the request's own applied.
    pub(super) timeouts: &'a soulbase_net_policy::TimeoutPolicy,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    /// Whether responses are decoded: the client offered the encodings itself (set once the
    /// request's headers are final, see `Inner::default_headers`).
    pub(super) decoding: AtomicBool,
    /// The host a redirect hop goes to, when it is not the request's own.
    pub(super) hop_host: Option<&'a str>,
    /// The policy view the call started with, when the resolver can change: redirect hops
    /// resolve through it, so a reload mid-call applies to new calls only.
    pub(super) view: Option<&'a Arc<dyn PolicyView>>,
    /// The named policy the request asked for, on top of every hop's layers.
    pub(super) policy_key: Option<&'a str>,
    /// The call's S75-4 segments measured so far.
    pub(super) segments: &'a Segments,
}

/// The attempts of one call: numbered across the call (a resend after `should_resend`
/// continues the count, so every attempt has its own number), limited per send (a resend
/// gets the retry policy's attempts afresh).
#[derive(Default)]
pub(super) struct Attempts {
    /// Attempts made so far in the call.
    pub(super) made: u32,
    /// Attempts made so far in this send (redirect hops included).
    pub(super) this_send: u32,
}

impl Attempts {
    /// Counts one more attempt and returns its number in the call.
    pub(super) fn next(&mut self) -> u32 {
        self.made += 1;
        self.this_send += 1;
        self.made
    }
}

impl Call<'_> {
    pub(super) fn info(&self) -> RequestInfo<'_> {
        self.labels.info()
    }

    /// The host this hop goes to (the request's own, or a redirect's): what the breaker,
    /// the learnt timeouts and the endpoints are keyed by.
    pub(super) fn host(&self) -> &str {
        self.hop_host.unwrap_or(self.labels.host())
    }

    /// The same call, for a redirect hop to `host` under that host's `policy`. The call's
    /// labels, timeouts and deadline stay.
    pub(super) fn hop<'h>(&'h self, policy: &'h Arc<NetPolicy>, host: &'h str) -> Call<'h> {
        Call {
            labels: self.labels.clone(),
            policy,
            timeouts: self.timeouts,
            started: self.started,
            deadline: self.deadline,
            decoding: AtomicBool::new(self.decoding.load(Ordering::Relaxed)),
            hop_host: Some(host),
            view: self.view,
            policy_key: self.policy_key,
            segments: self.segments,
        }
    }

    /// `Timeout(phase)`, or `Timeout(Total)` when the total deadline comes first, for a
    /// phase of `limit` starting `now`.
    pub(super) fn phase_deadline(
        &self,
        phase: Phase,
        now: Instant,
        limit: Duration,
    ) -> (Instant, Phase) {
        let at = now + limit;
        if at >= self.deadline {
            (self.deadline, Phase::Total)
        } else {
            (at, phase)
        }
    }
}

impl Inner {
    /// Reports the event `event` builds to the observer — built only when the client has an
    /// observer: without one, building each event (its labels, timings and outcome) would be
    /// work nobody reads.
    #[inline]
    pub(super) fn emit<'e>(&self, event: impl FnOnce() -> NetEvent<'e>) {
        if self.observed {
            self.observer.on_event(&event());
        }
    }

    /// As `emit`, for one of the events an observer may go without (`takes`): built only
    /// when an observer takes it.
    #[inline]
    pub(super) fn emit_taken<'e>(&self, takes: Takes, event: impl FnOnce() -> NetEvent<'e>) {
        if self.takes.contains(takes) {
            self.observer.on_event(&event());
        }
    }

    /// One call. `reserved` is the in-flight slot the tower face's `poll_ready` took for it,
    /// if any (see `in_flight.rs`).
    ///
    /// Not an `async fn`: the future of an `async fn` keeps its arguments twice (as captured
    /// and as moved into the body), and the request is a few hundred bytes copied with the
    /// future on every call; an `async move` block uses the captured request in place.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn's future holds its arguments twice (see above)"
    )]
    pub(super) fn send(
        &self,
        mut req: NetRequest,
        reserved: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> impl Future<Output = Result<NetResponse, NetError>> + Send + '_ {
        async move {
            let started = Instant::now();
            let id = next_request_id();
            let url = match req.validate_shared(u64::MAX) {
                Ok(url) => url,
                Err(e) => return Err(self.fail_early(&req, e).await),
            };
            let view = self.resolver.view();
            let policy_key = req.policy_key.clone();
            // Found once: the policy's host here, the call's host label below.
            let host = host_span(&url);
            let Some(policy) = self.policy_for(
                view.as_ref(),
                req.tenant.as_deref(),
                url.as_str().get(host.clone()).unwrap_or_default(),
                policy_key.as_deref(),
            ) else {
                let e = unknown_policy_key(policy_key.as_deref().unwrap_or_default())
                    .at(&req.method, &req.url);
                return Err(self.fail_early(&req, e).await);
            };
            let timeouts = policy.timeout.with_request(&req.timeout);
            let segments = Segments::default();
            let call = Call {
                labels: Arc::new(OwnedInfo {
                    id,
                    method: req.method.clone(),
                    // `validate` admits only these two.
                    scheme: if url.scheme() == "https" {
                        "https"
                    } else {
                        "http"
                    },
                    host,
                    target: url.clone(),
                    tenant: req.tenant.clone(),
                    // Only events show it: without an observer nobody would read it.
                    shown: if self.observed {
                        super::body::Shown::of(&url)
                    } else {
                        super::body::Shown::Prefix(0)
                    },
                }),
                policy: &policy,
                timeouts: &timeouts,
                started,
                deadline: started + timeouts.total,
                decoding: AtomicBool::new(false),
                hop_host: None,
                view: view.as_ref(),
                policy_key: policy_key.as_deref(),
                segments: &segments,
            };
            // The call runs inside its span (a child of the caller's), so whatever it logs —
            // here, in interceptors, in observers — is the span's.
            let span = request_span(&req, &url, &call);
            // The span the outcome is recorded on.
            let recorded = span.clone();
            let result = in_span(
                async {
                    self.emit_taken(Takes::REQUEST_STARTED, || NetEvent::RequestStarted {
                        req: call.info(),
                    });
                    // Only a request's own timeouts can break the deadline closure: a policy that cannot
                    // keep its own deadline was refused when it was loaded.
                    if req.timeout != soulbase_net_core::TimeoutCfg::default() {
                        let worst_case = timeouts.worst_case_latency(&policy.retry);
                        if worst_case > timeouts.budget() {
                            self.emit(|| NetEvent::DeadlineClamped {
                                req: call.info(),
                                total: timeouts.total,
                                worst_case,
                            });
                        }
                    }
                    let token = req.extensions.get::<CancellationToken>().cloned();
                    // One place for the work future whether or not there is a token: each copy of it
                    // would make this future (moved on every call) bigger.
                    let cancel = async {
                        match &token {
                            Some(token) => token.cancelled().await,
                            None => std::future::pending().await,
                        }
                    };
                    let cancelled = {
                        let mut work = std::pin::pin!(async {
                            // Held until the call ends: the client's cap counts calls, not attempts.
                            let _in_flight =
                                match self.in_flight_slot(reserved, &policy.limits, &call).await {
                                    Ok(permit) => permit,
                                    Err(no) => {
                                        let err = self
                                            .no_slot(&call, no, "the client")
                                            .at(&call.labels.method, &req.url);
                                        return Err(self.after_error(&req, err).await);
                                    }
                                };
                            let (host, tenant) =
                                (call.labels.host(), call.labels.tenant.as_deref());
                            match self
                                .slot(host, tenant, &policy.limits, &policy.slo, &call, started)
                                .await
                            {
                                Ok(permit) => {
                                    if let Some(global) = &policy.limits.global {
                                        let from = Instant::now();
                                        // Boxed: a store round trip would enlarge every call's future.
                                        let shared =
                                            Box::pin(self.admit_global(global, &call)).await;
                                        segments.queued_since(from);
                                        if let Err(err) = shared {
                                            let err = err.at(&call.labels.method, &req.url);
                                            return Err(self.after_error(&req, err).await);
                                        }
                                    }
                                    // Inline, not boxed: the call's future is boxed once as a whole by
                                    // `NetClient::send`, and measured, a second box here cost more (an
                                    // allocation per call) than the larger move it saved.
                                    let result = self.run(&mut req, url, &call).await;
                                    record_limit(&permit, &result);
                                    result
                                }
                                Err(no) => {
                                    let err = self
                                        .no_slot(&call, no, host)
                                        .at(&call.labels.method, &req.url);
                                    Err(self.after_error(&req, err).await)
                                }
                            }
                        });
                        // Polled in place (`select!` moved the whole call's work into its own
                        // tuple first: a copy of a few kilobytes per call); the token first.
                        let mut cancel = std::pin::pin!(cancel);
                        std::future::poll_fn(|cx| {
                            if cancel.as_mut().poll(cx).is_ready() {
                                return Poll::Ready(None);
                            }
                            work.as_mut().poll(cx).map(Some)
                        })
                        .await
                    };
                    let result = match cancelled {
                        Some(result) => result,
                        None => {
                            let err = NetError::new(ErrorKind::Cancelled)
                                .with_message("the cancel token fired")
                                .at(&call.labels.method, &req.url);
                            Err(self.after_error(&req, err).await)
                        }
                    };
                    let outcome = match &result {
                        Ok(res) => Outcome::Response(res.status),
                        Err(e) => Outcome::Error(e.kind()),
                    };
                    let attempts = match &result {
                        Ok(res) => res.attempts,
                        Err(e) => e.attempts(),
                    };
                    let mut result = result;
                    let elapsed = match &mut result {
                        Ok(res) => {
                            res.elapsed = segments.fill(res.elapsed);
                            res.elapsed
                        }
                        Err(_) => segments.fill(Elapsed::default().with_total(started.elapsed())),
                    };
                    self.emit(|| NetEvent::RequestFinished {
                        req: call.info(),
                        outcome,
                        attempts,
                        elapsed,
                        version: result.as_ref().ok().map(|res| res.version),
                    });
                    record_outcome(recorded.as_ref(), &outcome, attempts);
                    result
                },
                span,
            )
            .await;
            // The call's hold on its snapshot ends here; if a reload replaced its policy, the
            // policy's transport can go now.
            drop(view);
            self.transports.release(policy);
            result.map(|res| *res)
        }
    }

    /// The policy for `host` on behalf of `tenant`, from the call's view when the resolver
    /// gives one, with the named policy `key` on top when the request names one; `None` when
    /// the resolver knows no such key.
    pub(super) fn policy_for(
        &self,
        view: Option<&Arc<dyn PolicyView>>,
        tenant: Option<&str>,
        host: &str,
        key: Option<&str>,
    ) -> Option<Arc<NetPolicy>> {
        match (view, key) {
            (Some(view), None) => Some(view.resolve(tenant, host)),
            (Some(view), Some(key)) => view.resolve_key(tenant, host, key),
            (None, None) => Some(self.resolver.resolve(tenant, host)),
            (None, Some(key)) => self.resolver.resolve_key(tenant, host, key),
        }
    }

    /// A slot under `limits` for `host` (and `tenant`'s, when given): at once when one is
    /// free, else after a wait bounded by `limits.max_wait`. While the SLO controller slows
    /// the host down (`slo`), its AIMD ceiling and rate are scaled by the rate factor.
    ///
    /// The wait never outlasts the call: past `deadline` it ends with [`NoSlot::Deadline`].
    pub(super) async fn slot(
        &self,
        host: &str,
        tenant: Option<&str>,
        limits: &soulbase_net_policy::LimitsPolicy,
        slo: &soulbase_net_policy::SloPolicy,
        call: &Call<'_>,
        now: Instant,
    ) -> Result<LimitPermit, NoSlot> {
        let factors = self.slo.factors(host, slo);
        let limits = factors.limits(limits);
        let limits = &*limits;
        match self.limiter.acquire_now(host, tenant, limits, now) {
            Some(acquired) => acquired.map_err(NoSlot::Limited),
            // Boxed: waiting is rare, and its future would enlarge every call's.
            None => {
                let from = Instant::now();
                let wait = Box::pin(self.limiter.acquire(host, tenant, limits));
                let waited = tokio::time::timeout_at(call.deadline, wait).await;
                call.segments.queued_since(from);
                match waited {
                    Ok(acquired) => acquired.map_err(NoSlot::Limited),
                    Err(_) => Err(NoSlot::Deadline),
                }
            }
        }
    }

    /// A token under the fleet's shared rate (`limits.global`): from a lease or the rate
    /// store, or as `on_store_error` says when the store is away.
    async fn admit_global(
        &self,
        global: &soulbase_net_policy::GlobalLimit,
        call: &Call<'_>,
    ) -> Result<(), NetError> {
        let key = crate::fleet::GlobalLimiter::key(
            global,
            call.labels.tenant.as_deref(),
            call.labels.host(),
        );
        let refused = match self
            .global
            .admit(global, &key, &*self.observer, call.info())
            .await
        {
            Ok(()) => return Ok(()),
            Err(refused) => refused,
        };
        self.emit(|| NetEvent::RateLimited {
            req: call.info(),
            scope: LimitScope::GlobalRate,
        });
        let err = NetError::new(ErrorKind::RateLimited)
            .with_message(format!("{} for {key}", refused.message()));
        Err(match refused.retry_after {
            Some(after) if !after.is_zero() => err.with_retry_after(after),
            _ => err,
        })
    }

    /// The error (and events) for a call or hop that got no slot.
    pub(super) fn no_slot(&self, call: &Call<'_>, no: NoSlot, what: &str) -> NetError {
        match no {
            NoSlot::Limited(scope) => {
                self.emit(|| NetEvent::RateLimited {
                    req: call.info(),
                    scope,
                });
                NetError::new(ErrorKind::RateLimited)
                    .with_message(format!("{scope:?} limit of {what} reached"))
            }
            NoSlot::Deadline => {
                self.emit(|| NetEvent::TimedOut {
                    req: call.info(),
                    phase: Phase::Total,
                });
                NetError::timeout(Phase::Total).with_message(format!(
                    "no slot under the limits of {what} before the call's deadline"
                ))
            }
        }
    }

    pub(super) async fn fail_early(&self, req: &NetRequest, e: NetError) -> NetError {
        self.after_error(req, e).await
    }

    pub(super) async fn after_error(&self, req: &NetRequest, e: NetError) -> NetError {
        for interceptor in self.interceptors.on_error.iter().rev() {
            interceptor.on_error(req, &e).await;
        }
        e
    }
}

/// The span a call runs in: `http.client.request` with the OpenTelemetry HTTP client field
/// names (`http.request.method`, `server.address`, `server.port`, `url.scheme`, `url.full`
/// without userinfo, query or fragment), `tenant` and `request.id`; at the end
/// `http.response.status_code`, `error.type` (the error kind, or the status of a 4xx/5xx) and
/// `http.request.resend_count`; and `trace_id`/`span_id` of the `traceparent` sent, when an
/// interceptor set one. Exported through OpenTelemetry it is an INTERNAL span (the logical
/// call); its attempts are the CLIENT spans, one per request on the wire (`attempt_span`).
fn request_span(req: &NetRequest, url: &Url, call: &Call<'_>) -> Option<Span> {
    // No subscriber takes INFO spans: nothing to build. (Checked before the macro: with
    // `tracing`'s `log` bridge compiled in, a disabled span still evaluates and formats its
    // fields for `log`, a few hundred instructions per call.)
    if !tracing::level_enabled!(tracing::Level::INFO) {
        return None;
    }
    let span = tracing::info_span!(
        "http.client.request",
        otel.kind = "internal",
        otel.name = req.method.as_str(),
        otel.status_code = Unset,
        http.request.method = req.method.as_str(),
        server.address = call.labels.host(),
        server.port = url.port_or_known_default().map(i64::from),
        url.scheme = call.labels.scheme,
        url.full = Unset,
        tenant = Unset,
        request.id = call.labels.id,
        http.response.status_code = Unset,
        error.type = Unset,
        http.request.resend_count = Unset,
        trace_id = Unset,
        span_id = Unset,
    );
    // No subscriber wants it: no span (see `super::span`).
    if span.is_disabled() {
        return None;
    }
    // Only for a subscriber that wants the span: these allocate.
    span.record("url.full", shown_url(url));
    if let Some(tenant) = &req.tenant {
        span.record("tenant", tenant.as_str());
    }
    Some(span)
}

/// Records how a call or an attempt ended on its span; a 4xx, a 5xx or an error also sets
/// the OpenTelemetry status to error (HTTP client semantic conventions). Numbers the
/// conventions type as integers are recorded as `i64`: tracing-opentelemetry exports a `u64`
/// as a string.
pub(super) fn record_outcome(span: Option<&Span>, outcome: &Outcome, attempts: u32) {
    let Some(span) = span.filter(|span| !span.is_disabled()) else {
        return;
    };
    match outcome {
        Outcome::Response(status) => {
            span.record("http.response.status_code", i64::from(status.as_u16()));
            if status.as_u16() >= 400 {
                span.record("error.type", status.as_str());
                span.record("otel.status_code", "error");
            }
        }
        Outcome::Error(kind) => {
            span.record("error.type", kind.label());
            span.record("otel.status_code", "error");
        }
    }
    if attempts > 1 {
        span.record("http.request.resend_count", i64::from(attempts - 1));
    }
}

/// Records the trace the request is sent in (its `traceparent`, W3C: `00-<trace>-<span>-<flags>`)
/// on the current span, so that a log of the span can be found from the upstream's trace.
pub(super) fn record_trace(req: &NetRequest) {
    if !tracing::level_enabled!(tracing::Level::INFO) {
        return;
    }
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    // A `HeaderName` made once: a `&str` key is parsed into one on every lookup.
    static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
    let Some(tp) = req.headers.get(&TRACEPARENT).and_then(|v| v.to_str().ok()) else {
        return;
    };
    let mut parts = tp.split('-');
    if let (Some(_version), Some(trace), Some(parent)) = (parts.next(), parts.next(), parts.next())
    {
        span.record("trace_id", trace);
        span.record("span_id", parent);
    }
}

/// The error for a request naming a policy key the policy does not define.
pub(super) fn unknown_policy_key(key: &str) -> NetError {
    NetError::invalid_request(format!(
        "unknown policy key `{key}`: the policy document has no [keys.{key}] section"
    ))
}

/// A request number unique in the process (so one observer can serve several clients).
/// Each thread takes a block of numbers at a time: the shared counter is touched once per
/// block rather than once per request.
fn next_request_id() -> u64 {
    const BLOCK: u64 = 1024;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static RANGE: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    RANGE
        .try_with(|range| {
            let (next, end) = range.get();
            if next < end {
                range.set((next + 1, end));
                next
            } else {
                let start = NEXT.fetch_add(BLOCK, Ordering::Relaxed);
                range.set((start + 1, start + BLOCK));
                start
            }
        })
        .unwrap_or_else(|_| NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_unique_across_threads_and_rise_within_one() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..3_000).map(|_| next_request_id()).collect()))
            .collect();
        let per_thread: Vec<Vec<u64>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for ids in &per_thread {
            assert!(ids.windows(2).all(|w| w[0] < w[1]));
        }
        let mut all: Vec<u64> = per_thread.into_iter().flatten().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 12_000);
        assert!(all[0] > 0);
    }

    #[test]
    fn events_show_the_url_a_slice_of_the_calls_url_gives_or_its_redacted_copy() {
        use super::super::body::{OwnedInfo, Shown};
        for raw in [
            "https://api.example:8443/a/b?token=1#f",
            "http://[::1]:8080/x",
            "https://user:secret@api.example/a?b=c",
        ] {
            let url = Arc::new(Url::parse(raw).unwrap());
            let info = OwnedInfo {
                id: 1,
                method: http::Method::GET,
                scheme: "https",
                host: host_span(&url),
                target: url.clone(),
                tenant: None,
                shown: Shown::of(&url),
            };
            assert_eq!(info.info().url, shown_url(&url), "{raw}");
            assert!(!info.info().url.contains("secret"), "{raw}");
        }
    }
}
