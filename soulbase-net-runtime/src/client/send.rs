//! One request through the client: validate, resolve the policy, interceptors, the attempt
//! with its phase timeouts, and the events that report it.

use std::{
    borrow::Cow,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    task::Poll,
    time::Duration,
};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Empty, Full};
use soulbase_net_core::{
    parse_retry_after,
    recent::{recall, Recent},
    redact_url, Body, Direction, Elapsed, ErrorKind, LimitScope, NetError, NetEvent, NetRequest,
    NetResponse, Outcome, Phase, RequestInfo, RespBody,
};
use soulbase_net_policy::{NetPolicy, PolicyView};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{field::Empty as Unset, Instrument, Span};
use url::Url;

use super::{
    body::{MeteredBody, OwnedInfo, Progress, SendBody},
    Inner,
};
use crate::{
    body::{check_content_length, decode, LimitedBody},
    pool::ReqBody,
    redirect::{Action, Redirect, RedirectState},
    resilience::{
        breaker_key, budget_key, decide, is_failure, AttemptEnd, FastRand, HedgeSchedule,
        LimitPermit, RetryDecision,
    },
};

/// What stays fixed for one request: its number, labels, timeouts and deadlines.
struct Call<'a> {
    labels: Arc<OwnedInfo>,
    policy: &'a Arc<NetPolicy>,
    /// The policy's timeouts with the request's own applied.
    timeouts: &'a soulbase_net_policy::TimeoutPolicy,
    started: Instant,
    deadline: Instant,
    /// Whether responses are decoded: the client offered the encodings itself (set once the
    /// request's headers are final, see `Inner::default_headers`).
    decoding: AtomicBool,
    /// The host a redirect hop goes to, when it is not the request's own.
    hop_host: Option<&'a str>,
    /// The policy view the call started with, when the resolver can change: redirect hops
    /// resolve through it, so a reload mid-call applies to new calls only.
    view: Option<&'a Arc<dyn PolicyView>>,
    /// The named policy the request asked for, on top of every hop's layers.
    policy_key: Option<&'a str>,
}

/// The attempts of one call: numbered across the call (a resend after `should_resend`
/// continues the count, so every attempt has its own number), limited per send (a resend
/// gets the retry policy's attempts afresh).
#[derive(Default)]
struct Attempts {
    /// Attempts made so far in the call.
    made: u32,
    /// Attempts made so far in this send (redirect hops included).
    this_send: u32,
}

impl Attempts {
    /// Counts one more attempt and returns its number in the call.
    fn next(&mut self) -> u32 {
        self.made += 1;
        self.this_send += 1;
        self.made
    }
}

impl Call<'_> {
    fn info(&self) -> RequestInfo<'_> {
        self.labels.info()
    }

    /// The host this hop goes to (the request's own, or a redirect's): what the breaker,
    /// the learnt timeouts and the endpoints are keyed by.
    fn host(&self) -> &str {
        self.hop_host.unwrap_or(&self.labels.host)
    }

    /// The same call, for a redirect hop to `host` under that host's `policy`. The call's
    /// labels, timeouts and deadline stay.
    fn hop<'h>(&'h self, policy: &'h Arc<NetPolicy>, host: &'h str) -> Call<'h> {
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
        }
    }

    /// `Timeout(phase)`, or `Timeout(Total)` when the total deadline comes first, for a
    /// phase of `limit` starting `now`.
    fn phase_deadline(&self, phase: Phase, now: Instant, limit: Duration) -> (Instant, Phase) {
        let at = now + limit;
        if at >= self.deadline {
            (self.deadline, Phase::Total)
        } else {
            (at, phase)
        }
    }
}

impl Inner {
    pub(super) async fn send(&self, mut req: NetRequest) -> Result<NetResponse, NetError> {
        let started = Instant::now();
        let id = next_request_id();
        let url = match req.validate(u64::MAX) {
            Ok(url) => url,
            Err(e) => return Err(self.fail_early(&req, e).await),
        };
        let host = host_of(&url).to_owned();
        let view = self.resolver.view();
        let policy_key = req.policy_key.clone();
        let Some(policy) = self.policy_for(
            view.as_ref(),
            req.tenant.as_deref(),
            &host,
            policy_key.as_deref(),
        ) else {
            let e = unknown_policy_key(policy_key.as_deref().unwrap_or_default())
                .at(&req.method, &req.url);
            return Err(self.fail_early(&req, e).await);
        };
        let timeouts = policy.timeout.with_request(&req.timeout);
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
                tenant: req.tenant.clone(),
                // Only events carry it: without an observer nobody would read it.
                url: if self.observed {
                    shown_url(&url)
                } else {
                    String::new()
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
        };
        // The call runs inside its span (a child of the caller's), so whatever it logs —
        // here, in interceptors, in observers — is the span's.
        let span = request_span(&req, &url, &call);
        let result = async {
            self.observer
                .on_event(&NetEvent::RequestStarted { req: call.info() });
            // Only a request's own timeouts can break the deadline closure: a policy that cannot
            // keep its own deadline was refused when it was loaded.
            if req.timeout != soulbase_net_core::TimeoutCfg::default() {
                let worst_case = timeouts.worst_case_latency(&policy.retry);
                if worst_case > timeouts.budget() {
                    self.observer.on_event(&NetEvent::DeadlineClamped {
                        req: call.info(),
                        total: timeouts.total,
                        worst_case,
                    });
                }
            }
            let token = req.extensions.get::<CancellationToken>().cloned();
            let work = async {
                let (host, tenant) = (&call.labels.host, call.labels.tenant.as_deref());
                match self.slot(host, tenant, &policy.limits).await {
                    Ok(permit) => {
                        // Inline, not boxed: the call's future is boxed once as a whole by
                        // `NetClient::send`, and measured, a second box here cost more (an
                        // allocation per call) than the larger move it saved.
                        let result = self.run(&mut req, url, &call).await;
                        permit.record(match &result {
                            Ok(res) => Outcome::Response(res.status),
                            Err(e) => Outcome::Error(e.kind()),
                        });
                        result
                    }
                    Err(scope) => {
                        self.observer.on_event(&NetEvent::RateLimited {
                            req: call.info(),
                            scope,
                        });
                        let err = NetError::new(ErrorKind::RateLimited)
                            .with_message(format!("{scope:?} limit reached"))
                            .at(&call.labels.method, &req.url);
                        Err(self.after_error(&req, err).await)
                    }
                }
            };
            // One place for the work future whether or not there is a token: each copy of it
            // would make this future (moved on every call) bigger.
            let cancel = async {
                match &token {
                    Some(token) => token.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            let result = {
                let cancelled = tokio::select! {
                    biased;
                    () = cancel => None,
                    result = work => Some(result),
                };
                match cancelled {
                    Some(result) => result,
                    None => {
                        let err = NetError::new(ErrorKind::Cancelled)
                            .with_message("the cancel token fired")
                            .at(&call.labels.method, &req.url);
                        Err(self.after_error(&req, err).await)
                    }
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
            let elapsed = match &result {
                Ok(res) => res.elapsed,
                Err(_) => Elapsed {
                    total: started.elapsed(),
                    ..Elapsed::default()
                },
            };
            self.observer.on_event(&NetEvent::RequestFinished {
                req: call.info(),
                outcome,
                attempts,
                elapsed,
            });
            record_outcome(&Span::current(), &outcome, attempts);
            result
        }
        .instrument(span)
        .await;
        // The call's hold on its snapshot ends here; if a reload replaced its policy, the
        // policy's transport can go now.
        drop(view);
        self.transports.release(policy);
        result
    }

    /// Interceptors and the attempt; `after` or `on_error` at the end.
    async fn run(
        &self,
        req: &mut NetRequest,
        url: Url,
        call: &Call<'_>,
    ) -> Result<NetResponse, NetError> {
        // What `before` may change that the parsed URL depends on; without interceptors
        // nothing can, and the URL parsed by `send` stands.
        let target =
            (!self.interceptors.before.is_empty()).then(|| (req.url.clone(), req.query.clone()));
        for interceptor in &self.interceptors.before {
            if let Err(e) = interceptor.before(req).await {
                return Err(self.after_error(req, e).await);
            }
        }
        record_trace(req);
        let prepared = prepare_body(req).and_then(|()| {
            let url = match target {
                Some((u, q)) if u != req.url || q != req.query => req.validate(u64::MAX)?,
                Some(_) => {
                    req.check_headers()?;
                    url
                }
                None => url,
            };
            req.check_body_size(call.policy.security.max_req_bytes.as_u64())?;
            ensure_idempotency_key(req)?;
            Ok(url)
        });
        let url = match prepared {
            Ok(url) => url,
            Err(e) => return Err(self.after_error(req, e).await),
        };
        let decoding = self.default_headers(req);
        call.decoding.store(decoding, Ordering::Relaxed);
        for interceptor in &self.interceptors.respond {
            if let Some(answer) = interceptor.respond(req).await {
                return answer;
            }
        }
        let mut attempts = Attempts::default();
        // A resend starts from the request as the caller built it (after `before`), not from
        // the last redirect hop's (which may have turned a POST into a GET, dropped the body
        // or stripped credentials): kept only when an interceptor may ask for a resend.
        let original = if self.interceptors.should_resend.is_empty() {
            None
        } else {
            req.try_clone()
        };
        let mut result = self.follow(req, url.clone(), call, &mut attempts).await;
        if let (Ok(res), Some(mut original)) = (&mut result, original) {
            let mut resend = false;
            for interceptor in &self.interceptors.should_resend {
                if interceptor.should_resend(&mut original, res).await {
                    resend = true;
                    break;
                }
            }
            if resend {
                drop(result);
                *req = original;
                attempts.this_send = 0;
                result = self.follow(req, url, call, &mut attempts).await;
            }
        }
        match result {
            Ok(mut res) => {
                for interceptor in self.interceptors.after.iter().rev() {
                    if let Err(e) = interceptor.after(req, &mut res).await {
                        return Err(self.after_error(req, e).await);
                    }
                }
                Ok(res)
            }
            Err(e) => Err(self.after_error(req, e).await),
        }
    }

    /// The attempt, then every redirect the policy lets it follow. Each hop is a new request
    /// through the connector, so the allow-list and the address guard check it again. A hop
    /// to another host goes under that host's policy (its transport — TLS settings and pins,
    /// proxy, guard, allow-list —, its retry, breaker and size limits, and a slot under its
    /// concurrency and rate limits for the hop); the redirect rules, the timeouts and
    /// deadline, the retry budget and the tenant's slot stay the call's.
    async fn follow(
        &self,
        req: &mut NetRequest,
        mut url: Url,
        call: &Call<'_>,
        attempts: &mut Attempts,
    ) -> Result<NetResponse, NetError> {
        let policy = call.policy;
        // Only retries and hedges spend from the budget: without either, nothing is kept.
        let spends = policy.retry.enabled || policy.hedge.enabled;
        let budget = if policy.retry.budget.enabled && spends {
            let key = budget_key(
                &policy.retry.budget,
                &call.labels.host,
                call.labels.tenant.as_deref(),
            );
            self.budgets
                .deposit(&key, &policy.retry.budget, call.started);
            key
        } else {
            Cow::Borrowed("")
        };
        let mut redirects = RedirectState::new();
        let replayable = req.body.is_replayable();
        // The policy and host of a hop to another host than the request's.
        let mut elsewhere: Option<(Arc<NetPolicy>, String)> = None;
        loop {
            let res = match &elsewhere {
                None => {
                    self.with_retries(req, &url, call, &budget, attempts)
                        .await?
                }
                Some((policy, host)) => {
                    // Boxed: a hop to another host is rare, and its slot's wait would enlarge
                    // every call's future.
                    let hop =
                        Box::pin(self.hop(req, &url, call.hop(policy, host), &budget, attempts));
                    hop.await?
                }
            };
            if !res.status.is_redirection() {
                return Ok(res);
            }
            let location = res.headers.get(header::LOCATION).cloned();
            let hop = Redirect {
                status: res.status,
                location: location.as_ref(),
                url: &url,
                method: &req.method,
                body_replayable: replayable,
            };
            let follow = match redirects.next(&policy.redirect, &policy.security, &hop) {
                Ok(Action::Follow(follow)) => follow,
                Ok(Action::Return) => return Ok(res),
                Err(e) => return Err(e.with_attempts(res.attempts)),
            };
            let shown = shown_url(&follow.url);
            self.observer.on_event(&NetEvent::Redirected {
                req: call.info(),
                status: res.status,
                location: &shown,
            });
            drop(res);
            redirects.prepare_headers(&follow, &mut req.headers, &policy.security.strip_headers);
            req.method = follow.method.clone();
            if !follow.keep_body {
                req.body = Body::Empty;
            }
            req.query.clear();
            req.url = follow.url.to_string();
            // A new host: its policy (none to keep when the chain comes back to the request's).
            let next = host_of(&follow.url);
            let this = elsewhere.as_ref().map_or(&*call.labels.host, |(_, h)| h);
            if next != this {
                elsewhere = if next == call.labels.host {
                    None
                } else {
                    let tenant = call.labels.tenant.as_deref();
                    // The key resolved for the request's host, so it is known to the view.
                    let policy = self
                        .policy_for(call.view, tenant, next, call.policy_key)
                        .ok_or_else(|| {
                            unknown_policy_key(call.policy_key.unwrap_or_default())
                                .at(&req.method, &req.url)
                        })?;
                    Some((policy, next.to_owned()))
                };
            }
            url = follow.url;
        }
    }

    /// The policy for `host` on behalf of `tenant`, from the call's view when the resolver
    /// gives one, with the named policy `key` on top when the request names one; `None` when
    /// the resolver knows no such key.
    fn policy_for(
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
    /// free, else after a wait bounded by `limits.max_wait`.
    async fn slot(
        &self,
        host: &str,
        tenant: Option<&str>,
        limits: &soulbase_net_policy::LimitsPolicy,
    ) -> Result<LimitPermit, LimitScope> {
        match self.limiter.acquire_now(host, tenant, limits) {
            Some(acquired) => acquired,
            // Boxed: waiting is rare, and its future would enlarge every call's.
            None => Box::pin(self.limiter.acquire(host, tenant, limits)).await,
        }
    }

    /// A hop to another host than the request's, under that host's limits: it takes a slot
    /// under the host's concurrency, rate and adaptive limits (the tenant's slot is the
    /// call's) for as long as its attempts run, and is refused with `RateLimited` when the
    /// host has none free within `limits.max_wait`.
    async fn hop(
        &self,
        req: &mut NetRequest,
        url: &Url,
        call: Call<'_>,
        budget: &str,
        attempts: &mut Attempts,
    ) -> Result<NetResponse, NetError> {
        let host = call.host();
        let permit = match self.slot(host, None, &call.policy.limits).await {
            Ok(permit) => permit,
            Err(scope) => {
                self.observer.on_event(&NetEvent::RateLimited {
                    req: call.info(),
                    scope,
                });
                return Err(NetError::new(ErrorKind::RateLimited)
                    .with_message(format!(
                        "{scope:?} limit of the redirect target {host} reached"
                    ))
                    .at(&call.labels.method, url.as_str())
                    .with_attempts(attempts.made));
            }
        };
        let result = self.with_retries(req, url, &call, budget, attempts).await;
        permit.record(match &result {
            Ok(res) => Outcome::Response(res.status),
            Err(e) => Outcome::Error(e.kind()),
        });
        result
    }

    /// Attempts to `url` until one succeeds or the policy stops retrying: breaker admission
    /// before each, the retry decision (retryable outcome, replayable request, attempts left,
    /// `Retry-After`, deadline) and the retry budget after each.
    async fn with_retries(
        &self,
        req: &mut NetRequest,
        url: &Url,
        call: &Call<'_>,
        budget: &str,
        attempts: &mut Attempts,
    ) -> Result<NetResponse, NetError> {
        let policy = call.policy;
        let replayable = req.is_replayable();
        let breaker = if policy.cbreaker.enabled {
            breaker_key(&policy.cbreaker, call.host(), call.labels.tenant.as_deref())
        } else {
            Cow::Borrowed("")
        };
        loop {
            let now = Instant::now();
            let permit = match self.breakers.admit(&breaker, &policy.cbreaker, now) {
                Ok(permit) => permit,
                Err(rejected) => {
                    self.observer
                        .on_event(&NetEvent::BreakerRejected { req: call.info() });
                    return Err(rejected
                        .into_error()
                        .with_message(format!("circuit for {breaker} is open"))
                        .at(&call.labels.method, url.as_str())
                        .with_attempts(attempts.made));
                }
            };
            let target = self.endpoints.target(url, &policy.endpoints, now);
            let learnt =
                self.latencies
                    .timeout(call.host(), &policy.timeout.dynamic, call.timeouts.attempt);
            let began = now;
            let schedule = HedgeSchedule::new(&policy.hedge, replayable, None);
            let result = match schedule {
                // Boxed: a rare path whose future would otherwise enlarge every call's.
                Some(schedule) => {
                    Box::pin(self.hedged(req, &target, call, learnt, attempts, schedule, budget))
                        .await
                }
                None => {
                    let n = attempts.next();
                    for interceptor in &self.interceptors.on_attempt {
                        interceptor.on_attempt(req, n);
                    }
                    self.attempt(req, &target, call, learnt, n, false).await
                }
            };
            match &result {
                Ok(res) if res.status.as_u16() < 500 && policy.timeout.dynamic.enabled => {
                    self.latencies.record(call.host(), res.elapsed.ttfb);
                }
                Err(e) if matches!(e.kind(), ErrorKind::Connect | ErrorKind::Dns) => {
                    self.endpoints
                        .fail(&target, &policy.endpoints, Instant::now());
                }
                _ => {}
            }
            let outcome = match &result {
                Ok(res) => Outcome::Response(res.status),
                Err(e) => Outcome::Error(e.kind()),
            };
            let failure = is_failure(outcome, policy.cbreaker.count_5xx);
            let ended = Instant::now();
            permit.record(failure, ended.saturating_duration_since(began), ended);
            let end = AttemptEnd {
                attempt: attempts.this_send,
                outcome,
                // Looked for only on an answer that may be retried; the wall clock is read
                // only for one that names a time.
                retry_after: result
                    .as_ref()
                    .ok()
                    .filter(|_| !outcome.is_success())
                    .and_then(|r| r.headers.get(header::RETRY_AFTER))
                    .and_then(|v| parse_retry_after(v, std::time::SystemTime::now())),
                time_left: call
                    .deadline
                    .saturating_duration_since(ended)
                    .saturating_sub(call.timeouts.margin),
                attempt_timeout: learnt,
            };
            let delay = match decide(&policy.retry, replayable, &end, &mut FastRand) {
                RetryDecision::Stop(_) => return result,
                RetryDecision::Retry { delay, .. } => delay,
            };
            if !self
                .budgets
                .try_withdraw(budget, &policy.retry.budget, Instant::now())
            {
                self.observer.on_event(&NetEvent::RetryBudgetExhausted {
                    req: call.info(),
                    reason: outcome,
                });
                return result;
            }
            self.observer.on_event(&NetEvent::RetryScheduled {
                req: call.info(),
                attempt: attempts.made,
                reason: outcome,
                delay,
            });
            drop(result);
            // Boxed: waiting to retry is rare, and a timer would enlarge every call's future.
            Box::pin(tokio::time::sleep(delay)).await;
        }
    }

    /// The attempt and its hedged copies (seed 001): after each `hedge.delay` without a
    /// successful answer, another copy of the request starts (while the deadline leaves
    /// room and the retry budget allows), up to `max_hedges`. The first success wins; the
    /// other copies are dropped, which cancels them. All copies carry the same
    /// `Idempotency-Key`, set before the first attempt.
    #[allow(
        clippy::too_many_arguments,
        reason = "the pipeline's state for one attempt group"
    )]
    async fn hedged(
        &self,
        req: &mut NetRequest,
        url: &Url,
        call: &Call<'_>,
        limit: Duration,
        attempts: &mut Attempts,
        schedule: HedgeSchedule,
        budget: &str,
    ) -> Result<NetResponse, NetError> {
        type Attempt<'f> = Pin<Box<dyn Future<Output = Result<NetResponse, NetError>> + Send + 'f>>;
        let time_left = call.deadline.saturating_duration_since(Instant::now());
        let starts: Vec<Duration> = schedule.starts_within(time_left, limit).collect();
        let mut copies: Vec<NetRequest> = Vec::with_capacity(starts.len() + 1);
        copies.push(std::mem::replace(req, NetRequest::get(String::new())));
        for _ in &starts {
            match copies[0].try_clone() {
                Some(copy) => copies.push(copy),
                None => break,
            }
        }
        let began = Instant::now();
        let interceptors = &self.interceptors.on_attempt;
        let start = |copy: &'_ mut NetRequest, attempts: &mut Attempts| {
            let n = attempts.next();
            for interceptor in interceptors {
                interceptor.on_attempt(copy, n);
            }
            n
        };
        let mut pending = copies.iter_mut();
        let mut running: Vec<Attempt<'_>> = Vec::new();
        if let Some(first) = pending.next() {
            let n = start(first, attempts);
            running.push(Box::pin(self.attempt(first, url, call, limit, n, false)));
        }
        let mut last: Option<Result<NetResponse, NetError>> = None;
        let mut hedges = 0usize;
        let mut next_start = starts.first().map(|d| began + *d);
        let mut timer = Box::pin(tokio::time::sleep_until(
            next_start.unwrap_or(call.deadline),
        ));
        let winner = std::future::poll_fn(|cx| loop {
            let mut i = 0;
            while i < running.len() {
                if let Poll::Ready(result) = running[i].as_mut().poll(cx) {
                    drop(running.swap_remove(i));
                    let won =
                        matches!(&result, Ok(r) if r.status.as_u16() < 500 && r.status != 429);
                    if won {
                        return Poll::Ready(Some(result));
                    }
                    last = Some(result);
                    continue;
                }
                i += 1;
            }
            // Every copy failed: the retry loop decides what comes next.
            if running.is_empty() {
                return Poll::Ready(None);
            }
            if next_start.is_none() || timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            hedges += 1;
            let allowed =
                self.budgets
                    .try_withdraw(budget, &call.policy.retry.budget, Instant::now());
            if allowed {
                if let Some(copy) = pending.next() {
                    let n = start(copy, attempts);
                    running.push(Box::pin(self.attempt(copy, url, call, limit, n, true)));
                }
            }
            next_start = starts.get(hedges).map(|d| began + *d);
            if let Some(at) = next_start {
                timer.as_mut().reset(at);
            }
        })
        .await;
        let result = winner.or(last).unwrap_or_else(|| {
            Err(NetError::timeout(Phase::Total).with_message("no hedged attempt could start"))
        });
        drop(running);
        drop(pending);
        if let Some(first) = copies.into_iter().next() {
            *req = first;
        }
        result
    }

    /// One attempt: connect (or reuse), write, wait for the head, hand over the body; `limit`
    /// bounds the attempt (the policy's attempt timeout, or the one learnt from latencies).
    async fn attempt(
        &self,
        req: &mut NetRequest,
        url: &Url,
        call: &Call<'_>,
        limit: Duration,
        attempt: u32,
        hedge: bool,
    ) -> Result<NetResponse, NetError> {
        let began = Instant::now();
        let span = tracing::info_span!(
            "http.client.attempt",
            attempt,
            hedge,
            http.request.resend_count = Unset,
            http.response.status_code = Unset,
            error.type = Unset,
        );
        if attempt > 1 {
            span.record("http.request.resend_count", attempt - 1);
        }
        span.in_scope(|| {
            self.observer.on_event(&NetEvent::AttemptStarted {
                req: call.info(),
                attempt,
                hedge,
            });
        });
        let result = self
            .exchange(req, url, call, limit, began)
            .instrument(span.clone())
            .await;
        let result = result.map(|mut res| {
            res.attempts = attempt;
            res
        });
        let result = result.map_err(|e| {
            if let ErrorKind::Timeout(phase) = e.kind() {
                self.observer.on_event(&NetEvent::TimedOut {
                    req: call.info(),
                    phase,
                });
            }
            if e.kind() == ErrorKind::Blocked {
                let denied = e.find_source::<soulbase_net_policy::Denied>();
                self.observer.on_event(&NetEvent::Blocked {
                    req: call.info(),
                    addr: denied.and_then(|d| d.addr),
                    rule: denied.map_or("address_guard", |d| d.rule.as_str()),
                });
            }
            e.at(&call.labels.method, url.as_str())
                .with_attempts(attempt)
        });
        let (outcome, elapsed) = match &result {
            Ok(res) => (Outcome::Response(res.status), res.elapsed),
            Err(e) => (
                Outcome::Error(e.kind()),
                Elapsed {
                    total: began.elapsed(),
                    ..Elapsed::default()
                },
            ),
        };
        record_outcome(&span, &outcome, 1);
        let _inside = span.enter();
        self.observer.on_event(&NetEvent::AttemptFinished {
            req: call.info(),
            attempt,
            outcome,
            elapsed,
        });
        result
    }

    async fn exchange(
        &self,
        req: &mut NetRequest,
        url: &Url,
        call: &Call<'_>,
        limit: Duration,
        began: Instant,
    ) -> Result<NetResponse, NetError> {
        let timeouts = call.timeouts;
        let transport = self.transports.get(call.policy)?;
        let progress = Arc::new(Progress::new(began));
        let limits = (
            call.policy.security.max_req_bytes.as_u64(),
            timeouts.write,
            progress.clone(),
        );
        let mut http_req = self.http_request(req, url, limits)?;
        let decoding = call.decoding.load(Ordering::Relaxed);
        if let Some(auth) = proxy_auth(&transport, http_req.uri()) {
            http_req
                .headers_mut()
                .insert(header::PROXY_AUTHORIZATION, auth);
        }
        let request = transport.pool.send(http_req);
        tokio::pin!(request);
        // The first-byte clock starts when the connection takes the request (the body tells,
        // see `Progress`); until then only the total deadline applies (the connector bounds
        // connecting by itself). One timer: set to the earliest moment the first-byte phase
        // could end, and when it fires, either that is a timeout or it is set again — to the
        // phase's real end once the request was taken, else one first-byte timeout later.
        // Nothing on the connection's side has to wake this task.
        let ttfb_from = |taken: Instant| {
            let left_in_attempt = limit.saturating_sub(taken.saturating_duration_since(began));
            call.phase_deadline(Phase::Ttfb, taken, timeouts.ttfb.min(left_in_attempt))
        };
        let timer = tokio::time::sleep_until(ttfb_from(began).0);
        tokio::pin!(timer);
        let (res, connect) = std::future::poll_fn(|cx| {
            if let Poll::Ready(res) = request.as_mut().poll(cx) {
                return Poll::Ready(res);
            }
            loop {
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let now = Instant::now();
                let (at, phase) = match progress.taken_at() {
                    Some(taken) => ttfb_from(taken),
                    // Not taken yet, so no first-byte timeout has begun (this `at` is in the
                    // future unless it is the total deadline): look again one timeout later.
                    None => {
                        let recheck = timeouts.ttfb.max(RECHECK_MIN);
                        call.phase_deadline(Phase::Ttfb, now, recheck)
                    }
                };
                if now >= at {
                    return Poll::Ready(Err(NetError::timeout(phase)));
                }
                timer.as_mut().reset(at);
            }
        })
        .await?;
        let head_at = Instant::now();
        let ttfb = head_at.saturating_duration_since(began);
        let (mut parts, body) = res.into_parts();
        let max = call.policy.security.max_resp_bytes.as_u64();
        check_content_length(&parts.headers, max)?;
        let limited = LimitedBody::new(body, max)
            .read_timeout(timeouts.read)
            .deadline(call.deadline);
        // Body bytes only: a request without a body reports none.
        let sent = progress.sent();
        if sent > 0 {
            self.observer.on_event(&NetEvent::Bytes {
                req: call.info(),
                dir: Direction::Out,
                bytes: sent,
            });
        }
        // The byte meter wraps whatever the body is, unboxed: one box per response.
        let (observer, labels) = (&self.observer, &call.labels);
        let body = if decoding && parts.headers.contains_key(header::CONTENT_ENCODING) {
            let decoded = decode(limited, &mut parts.headers, max, decoding)?;
            if self.observed {
                MeteredBody::new(decoded, observer.clone(), labels.clone()).boxed_unsync()
            } else {
                decoded
            }
        } else if self.observed {
            MeteredBody::new(limited, observer.clone(), labels.clone()).boxed_unsync()
        } else {
            limited.boxed_unsync()
        };
        Ok(NetResponse {
            status: parts.status,
            content_type: parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            headers: parts.headers,
            body: RespBody::Stream(body),
            elapsed: Elapsed {
                connect,
                ttfb,
                total: head_at.saturating_duration_since(call.started),
            },
            bytes_in: 0,
            attempts: 1,
            url: url.as_str().to_owned(),
        })
    }

    /// The client's own headers, set once per call on the request (so every attempt's copy of
    /// the headers has them without growing): the `User-Agent` when the request has none, and
    /// `Accept-Encoding` when the client decompresses and the request asks for no encoding
    /// itself. Returns whether responses are to be decoded (the client offered the encodings).
    fn default_headers(&self, req: &mut NetRequest) -> bool {
        req.headers
            .entry(header::USER_AGENT)
            .or_insert_with(|| self.user_agent.clone());
        let decoding = self.decompress && !req.headers.contains_key(header::ACCEPT_ENCODING);
        if decoding {
            req.headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static(ACCEPT_ENCODING),
            );
        }
        decoding
    }

    /// The hyper request for one attempt.
    fn http_request(
        &self,
        req: &mut NetRequest,
        url: &Url,
        limits: (u64, Duration, Arc<Progress>),
    ) -> Result<Request<ReqBody>, NetError> {
        let uri = request_uri(url).map_err(|e| {
            NetError::invalid_request("url is not a valid request target").with_source(e)
        })?;
        let (max, write_timeout, progress) = limits;
        // Every body goes through `SendBody`, which tells the attempt when the connection
        // took the request; boxed once.
        let body: ReqBody = match &req.body {
            Body::Bytes(b) => send_body(Full::new(b.clone()), max, write_timeout, progress),
            Body::Json(_) | Body::Stream(_) => match std::mem::take(&mut req.body) {
                Body::Stream(s) => send_body(s.into_inner(), max, write_timeout, progress),
                other => {
                    let bytes = other.to_bytes()?.unwrap_or_default();
                    req.body = Body::Bytes(bytes.clone());
                    send_body(Full::new(bytes), max, write_timeout, progress)
                }
            },
            _ => send_body(Empty::new(), max, write_timeout, progress),
        };
        // Built in place: the builder would check again what `validate` and the parse of
        // `uri` already did.
        let mut http_req = Request::new(body);
        *http_req.method_mut() = req.method.clone();
        *http_req.uri_mut() = uri;
        *http_req.headers_mut() = req.headers.clone();
        // Proxy credentials come from the proxy policy and go to the proxy only; one set on
        // the request would otherwise reach the origin.
        http_req.headers_mut().remove(header::PROXY_AUTHORIZATION);
        Ok(http_req)
    }

    async fn fail_early(&self, req: &NetRequest, e: NetError) -> NetError {
        self.after_error(req, e).await
    }

    async fn after_error(&self, req: &NetRequest, e: NetError) -> NetError {
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
/// interceptor set one.
fn request_span(req: &NetRequest, url: &Url, call: &Call<'_>) -> Span {
    let span = tracing::info_span!(
        "http.client.request",
        otel.kind = "client",
        otel.name = req.method.as_str(),
        http.request.method = req.method.as_str(),
        server.address = call.labels.host.as_str(),
        server.port = url.port_or_known_default(),
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
    // Only for a subscriber that wants the span: these allocate.
    if !span.is_disabled() {
        span.record("url.full", shown_url(url));
        if let Some(tenant) = &req.tenant {
            span.record("tenant", tenant.as_str());
        }
    }
    span
}

/// Records how a call or an attempt ended on its span.
fn record_outcome(span: &Span, outcome: &Outcome, attempts: u32) {
    if span.is_disabled() {
        return;
    }
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
    if attempts > 1 {
        span.record("http.request.resend_count", attempts - 1);
    }
}

/// Records the trace the request is sent in (its `traceparent`, W3C: `00-<trace>-<span>-<flags>`)
/// on the current span, so that a log of the span can be found from the upstream's trace.
fn record_trace(req: &NetRequest) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    let Some(tp) = req.headers.get("traceparent").and_then(|v| v.to_str().ok()) else {
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
fn unknown_policy_key(key: &str) -> NetError {
    NetError::invalid_request(format!(
        "unknown policy key `{key}`: the policy document has no [keys.{key}] section"
    ))
}

/// Gives an idempotent POST or PATCH an `Idempotency-Key` when it has none, so that every
/// copy of the call (retries, hedges, a resend) carries the same key and the server can drop
/// duplicates — whatever the retry setting: hedged copies are copies too. The key comes from
/// the OS CSPRNG ([`soulbase_net_core::new_idempotency_key`]).
fn ensure_idempotency_key(req: &mut NetRequest) -> Result<(), NetError> {
    const IDEMPOTENCY_KEY: &str = "idempotency-key";
    let wants_key = req.idempotent && matches!(req.method, Method::POST | Method::PATCH);
    if !wants_key || req.headers.contains_key(IDEMPOTENCY_KEY) {
        return Ok(());
    }
    let key = soulbase_net_core::new_idempotency_key()?;
    // 32 hex digits: always a valid header value.
    if let Ok(value) = HeaderValue::from_str(&key) {
        req.headers.insert(IDEMPOTENCY_KEY, value);
    }
    Ok(())
}

/// Serialises a JSON body once (so every attempt sends the same bytes) and sets its
/// `Content-Type` when the request has none.
fn prepare_body(req: &mut NetRequest) -> Result<(), NetError> {
    if let Body::Json(_) = &req.body {
        let bytes: Bytes = req.body.to_bytes()?.unwrap_or_default();
        req.headers
            .entry(header::CONTENT_TYPE)
            .or_insert(HeaderValue::from_static("application/json"));
        req.body = Body::Bytes(bytes);
    }
    Ok(())
}

/// The proxy credentials for an `http` request that goes to a proxy in absolute form; the
/// proxy consumes them. `https` requests carry none (the tunnel was authorised by CONNECT).
fn proxy_auth(transport: &super::transport::Transport, uri: &http::Uri) -> Option<HeaderValue> {
    if uri.scheme_str() != Some("http") {
        return None;
    }
    transport
        .proxy
        .as_ref()?
        .intercept(uri)?
        .basic_auth()
        .cloned()
}

thread_local! {
    /// The last URLs this thread turned into request targets.
    static RECENT_URIS: Recent<http::Uri> = const { Recent::new(Vec::new()) };
}

/// The request target of `url`, remembered per thread for the last few URLs (a hit is a
/// compare and a few reference counts instead of a parse and a copy).
fn request_uri(url: &Url) -> Result<http::Uri, http::uri::InvalidUri> {
    recall(&RECENT_URIS, 8, url.as_str(), str::parse)
}

/// The host of a URL as policies and keys name it: without an IPv6 literal's brackets.
fn host_of(url: &Url) -> &str {
    url.host_str()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']')
}

/// The URL as events show it: without userinfo, query or fragment. `validate` refuses
/// userinfo, so this is the parsed URL up to its path, cut without searching again.
fn shown_url(url: &Url) -> String {
    if url.username().is_empty() && url.password().is_none() {
        url[..url::Position::AfterPath].to_owned()
    } else {
        redact_url(url.as_str())
    }
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

/// `body` as sent for one attempt (see `SendBody`), boxed.
fn send_body<B>(body: B, max: u64, write_timeout: Duration, progress: Arc<Progress>) -> ReqBody
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<soulbase_net_core::BoxError>,
{
    SendBody::new(body, max, write_timeout, progress).boxed_unsync()
}

/// The least time before a first-byte timer that fired while the connection had not taken
/// the request yet looks again (a zero first-byte timeout would otherwise spin).
const RECHECK_MIN: Duration = Duration::from_millis(1);

/// The encodings the client decodes when it offers them itself.
const ACCEPT_ENCODING: &str = "gzip, br, zstd";

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
    fn shown_urls_drop_query_and_fragment() {
        let url = Url::parse("https://api.example:8443/a/b?token=1#f").unwrap();
        assert_eq!(shown_url(&url), "https://api.example:8443/a/b");
    }
}
