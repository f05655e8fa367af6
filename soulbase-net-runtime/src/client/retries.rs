//! Between two attempts: breaker admission, the retry decision (outcome, replayable request,
//! attempts left, `Retry-After`, deadline), the SLO controller (a longer wait, thinned
//! retries, later hedges), the retry budget, and the wait. A request the server did not
//! process goes again outside that accounting; a tower-face request that is not idempotent
//! goes again only then, or when an attempt never left the client. An attempt a GOAWAY
//! raced (`classify::raced_by_goaway`) is the caller's `Io`, but neither the breaker nor the
//! SLO controller counts it.

use std::borrow::Cow;

use http::header;
use soulbase_net_core::{parse_retry_after, ErrorKind, NetEvent, NetRequest, Outcome};
use soulbase_net_policy::{FreezeOn, Semantics};
use tokio::time::Instant;
use url::Url;

use super::replay::{never_sent, TowerCall};
use super::send::{Answer, Attempts, Call};
use super::Inner;
use crate::resilience::{
    breaker_key, decide, is_failure, AttemptEnd, FastRand, HedgeSchedule, RetryDecision, Sample,
};

impl Inner {
    /// Attempts to `url` until one succeeds or the policy stops retrying: breaker admission
    /// before each, the retry decision (retryable outcome, replayable request, attempts left,
    /// `Retry-After`, deadline) and the retry budget after each.
    pub(super) async fn with_retries(
        &self,
        req: &mut NetRequest,
        url: &Url,
        call: &Call<'_>,
        budget: &str,
        attempts: &mut Attempts,
    ) -> Answer {
        let policy = call.policy;
        // Read before the first attempt: a stream body is taken by it.
        let body_replayable = req.body.is_replayable();
        // The declared semantics (seed 001 §VIII): at least once retries a request whose
        // copies the server can tell apart by its key, whatever its method; at most once
        // resends only what was never sent (below).
        let sem = policy.delivery.sem;
        let at_most_once = sem == Some(Semantics::AtMostOnce);
        let replayable = !at_most_once
            && (req.is_replayable()
                || (sem.is_some_and(Semantics::needs_key)
                    && body_replayable
                    && req.headers.contains_key("idempotency-key")));
        // A request from the tower face (a gRPC call is a POST) whose body was kept may go
        // again when an attempt never left the client (`replay::never_sent`), whatever its
        // method: nothing of it reached a server.
        let unsent_replayable =
            !replayable && body_replayable && req.extensions.get::<TowerCall>().is_some();
        let breaker = if policy.cbreaker.enabled {
            breaker_key(
                &policy.cbreaker,
                origin_of(url),
                call.labels.tenant.as_deref(),
            )
        } else {
            Cow::Borrowed("")
        };
        // Requests the server did not process, sent again so far (see `MAX_RESENDS`).
        let mut resends = 0;
        loop {
            let now = Instant::now();
            let permit = match self.breakers.admit(&breaker, &policy.cbreaker, now) {
                Ok(permit) => permit,
                Err(rejected) => {
                    self.emit(|| NetEvent::BreakerRejected { req: call.info() });
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
            // Whether this attempt (or attempt group, when hedged) is a retry: decided before
            // it starts, so that its own hedged copies do not make it one.
            let retry = attempts.this_send > 0;
            // While the SLO controller slows the host down, copies start later (and are
            // thinned in `hedged`, like retries).
            let schedule = HedgeSchedule::new(&policy.hedge, replayable, None)
                .map(|s| s.stretched(self.slo.factors(call.host(), &policy.slo)));
            let hedged = schedule.is_some();
            let result = match schedule {
                // Boxed: a rare path whose future would otherwise enlarge every call's.
                Some(schedule) => {
                    Box::pin(self.hedged(req, &target, call, learnt, attempts, schedule, budget))
                        .await
                }
                None => {
                    let n = attempts.next();
                    self.attempt(req, &target, call, learnt, n, false, began)
                        .await
                }
            };
            if let Ok(res) = &result {
                if res.status.as_u16() < 500 && policy.timeout.dynamic.enabled {
                    self.latencies.record(call.host(), res.elapsed.ttfb());
                }
            }
            // The server did not process it (RFC 9113 §8.7): it goes again at once on another
            // connection whatever its method, as if this attempt had not been made — no retry
            // attempt or budget spent, nothing told to the breaker or the SLO controller.
            if let Err(e) = &result {
                if e.kind() == ErrorKind::NotProcessed {
                    let time_left = call
                        .deadline
                        .saturating_duration_since(Instant::now())
                        .saturating_sub(call.timeouts.margin);
                    if body_replayable && resends < MAX_RESENDS && !time_left.is_zero() {
                        resends += 1;
                        permit.release();
                        attempts.this_send = attempts.this_send.saturating_sub(1);
                        self.emit(|| NetEvent::Resent {
                            req: call.info(),
                            attempt: attempts.made,
                        });
                        continue;
                    }
                    // It cannot go again: the caller gets it, and nothing counts it a failure.
                    permit.release();
                    return result;
                }
            }
            // The failures that freeze a base URL (`endpoints.freeze_on`); a change of the
            // frozen set is saved in the background when the client persists it.
            let freeze_on = match &result {
                Ok(res) if res.status.is_server_error() => Some(FreezeOn::Status5xx),
                Err(e) => match e.kind() {
                    ErrorKind::Dns => Some(FreezeOn::Dns),
                    ErrorKind::Connect | ErrorKind::Tls => Some(FreezeOn::Connect),
                    ErrorKind::Timeout(_) => Some(FreezeOn::Timeout),
                    _ => None,
                },
                Ok(_) => None,
            };
            if let Some(on) = freeze_on {
                if self
                    .endpoints
                    .fail(&target, &policy.endpoints, on, Instant::now())
                {
                    // Handed to the persistence writer and not waited for: the next attempt
                    // never waits for a disk. Writes stay in order; a failed one is logged.
                    if let Some(save) = self.endpoints.save() {
                        crate::dns::write_behind("the frozen endpoints file", save);
                    }
                }
            }
            let outcome = match &result {
                Ok(res) => Outcome::Response(res.status),
                Err(e) => Outcome::Error(e.kind()),
            };
            // The attempt's end and length, for whoever takes them: the breaker, the SLO
            // controller, or the retry decision of an attempt that did not succeed. Worked
            // out once, and only then. A response of a single attempt carries its length
            // already: its first-byte time runs from `began` to its head, where the attempt
            // ended. Otherwise (an error, a hedged group whose copies began later) the clock
            // is read.
            let clock = || {
                let answered = match &result {
                    Ok(res) if !hedged => {
                        let took = res.elapsed.ttfb();
                        began.checked_add(took).map(|ended| (ended, took))
                    }
                    _ => None,
                };
                answered.unwrap_or_else(|| {
                    let ended = Instant::now();
                    (ended, ended.saturating_duration_since(began))
                })
            };
            let mut read = None;
            if result
                .as_ref()
                .is_err_and(crate::classify::is_server_going_away)
            {
                // A GOAWAY raced a request that may have been processed: `Io` for the caller
                // (and the retry rules of its method below), but the server only closed a
                // connection, as it routinely does — nothing is learnt of the upstream.
                permit.release();
            } else if permit.is_tracked() || policy.slo.enabled {
                let (ended, took) = *read.get_or_insert_with(clock);
                permit.record(is_failure(outcome, policy.cbreaker.count_5xx), took, ended);
                if policy.slo.enabled {
                    self.slo_record(call, retry, outcome, took, ended);
                }
            }
            // A success is never retried (`decide`): the rest is for the others.
            if outcome.is_success() {
                return result;
            }
            let (ended, _) = read.unwrap_or_else(clock);
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
            let may_replay = if at_most_once {
                body_replayable && never_sent(outcome)
            } else {
                replayable || (unsent_replayable && never_sent(outcome))
            };
            let delay = match decide(&policy.retry, may_replay, &end, &mut FastRand) {
                RetryDecision::Stop(_) => return result,
                RetryDecision::Retry { delay, .. } => delay,
            };
            // The SLO controller only takes away: a longer wait (and no retry when the longer
            // wait leaves no time for the attempt before the deadline), and fewer retries.
            let delay = self.slo.factors(call.host(), &policy.slo).stretch(delay);
            if delay.saturating_add(learnt) > end.time_left
                || !self.slo.admit_retry(call.host(), &policy.slo)
            {
                return result;
            }
            if !self
                .budgets
                .try_withdraw(budget, &policy.retry.budget, Instant::now())
            {
                self.emit(|| NetEvent::RetryBudgetExhausted {
                    req: call.info(),
                    reason: outcome,
                });
                return result;
            }
            self.emit(|| NetEvent::RetryScheduled {
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

    /// Counts an attempt for the host's SLO controller, and reports a change of its factors
    /// as `PolicyChange` (seed 001 `eid_policy_change`).
    fn slo_record(
        &self,
        call: &Call<'_>,
        retry: bool,
        outcome: Outcome,
        elapsed: std::time::Duration,
        now: Instant,
    ) {
        let sample = Sample {
            retry,
            outcome,
            elapsed,
        };
        let host = call.host();
        if let Some(change) = self.slo.record(host, &call.policy.slo, sample, now) {
            self.emit(|| NetEvent::PolicyChange {
                host,
                sli: change.sli,
                value: change.value,
                target: change.target,
                breached: change.breached,
                backoff_factor: change.factors.backoff,
                rate_factor: change.factors.rate,
            });
        }
    }
}

/// How many times in a row one call sends again a request the server did not process: a
/// server that refuses everything (every connection going away at once) cannot hold a call
/// in a loop, and the caller then gets `NotProcessed`.
const MAX_RESENDS: u32 = 8;

/// The origin of a validated URL, as it is written (`scheme://host[:port]`, the default port
/// left out, no userinfo): what the breaker is keyed by, like the pool.
pub(super) fn origin_of(url: &Url) -> &str {
    &url[..url::Position::BeforePath]
}
