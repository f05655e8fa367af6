//! Redirects: the attempts to one URL, then every hop the policy lets the call follow, each
//! under the policy of the host it goes to (a slot under that host's limits included).

use std::{borrow::Cow, sync::Arc};

use http::header;
use soulbase_net_core::{Body, NetEvent, NetRequest};
use soulbase_net_policy::NetPolicy;
use url::Url;

use super::send::{unknown_policy_key, Answer, Attempts, Call};
use super::urls::{host_of, shown_url};
use super::Inner;
use crate::{
    redirect::{Action, Redirect, RedirectState},
    resilience::budget_key,
};

/// The caller's request and its URL, kept for a resend once a redirect is about to change
/// them (see `Inner::run`).
pub(super) type Kept = Option<Box<(NetRequest, Arc<Url>)>>;

impl Inner {
    /// The attempt, then every redirect the policy lets it follow. Each hop is a new request
    /// through the connector, so the allow-list and the address guard check it again. A hop
    /// to another host goes under that host's policy (its transport — TLS settings and pins,
    /// proxy, guard, allow-list —, its retry, breaker and size limits, and a slot under its
    /// concurrency and rate limits for the hop); the redirect rules, the timeouts and
    /// deadline, the retry budget and the tenant's slot stay the call's. `keep`, when given,
    /// gets a copy of the request and its URL just before the first redirect changes them.
    pub(super) async fn follow(
        &self,
        req: &mut NetRequest,
        mut url: Arc<Url>,
        call: &Call<'_>,
        attempts: &mut Attempts,
        mut keep: Option<&mut Kept>,
    ) -> Answer {
        let policy = call.policy;
        // Only retries and hedges spend from the budget: without either, nothing is kept.
        let spends = policy.retry.enabled || policy.hedge.enabled;
        let budget = if policy.retry.budget.enabled && spends {
            let key = budget_key(
                &policy.retry.budget,
                call.labels.host(),
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
            self.emit(|| NetEvent::Redirected {
                req: call.info(),
                status: res.status,
                location: &shown,
            });
            drop(res);
            // The request is about to change: the caller wants it as it was (see `run`).
            if let Some(slot) = keep.take() {
                *slot = req.try_clone().map(|r| Box::new((r, url.clone())));
            }
            redirects.prepare_headers(
                &follow,
                &mut req.headers,
                &policy.security.cross_origin_strip_headers,
            );
            req.method = follow.method.clone();
            if !follow.keep_body {
                req.body = Body::Empty;
            }
            req.query.clear();
            req.url = follow.url.to_string();
            // A new host: its policy (none to keep when the chain comes back to the request's).
            let next = host_of(&follow.url);
            let this = elsewhere.as_ref().map_or(call.labels.host(), |(_, h)| h);
            if next != this {
                elsewhere = if next == call.labels.host() {
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
            url = Arc::new(follow.url);
        }
    }

    /// A hop to another host than the request's, under that host's limits: it takes a slot
    /// under the host's concurrency, rate and adaptive limits (the tenant's slot is the
    /// call's) for as long as its attempts run, and is refused with `RateLimited` when the
    /// host has none free within `limits.max_wait`.
    pub(super) async fn hop(
        &self,
        req: &mut NetRequest,
        url: &Url,
        call: Call<'_>,
        budget: &str,
        attempts: &mut Attempts,
    ) -> Answer {
        let host = call.host();
        let permit = match self
            .slot(
                host,
                None,
                &call.policy.limits,
                &call.policy.slo,
                &call,
                tokio::time::Instant::now(),
            )
            .await
        {
            Ok(permit) => permit,
            Err(no) => {
                let what = format!("the redirect target {host}");
                return Err(self
                    .no_slot(&call, no, &what)
                    .at(&call.labels.method, url.as_str())
                    .with_attempts(attempts.made));
            }
        };
        let result = self.with_retries(req, url, &call, budget, attempts).await;
        super::send::record_limit(&permit, &result);
        result
    }
}
