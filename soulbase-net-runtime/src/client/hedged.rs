//! Hedging: the attempt and its copies started after `hedge.delay` without an answer; the
//! first success wins and the others are dropped.

use std::{future::Future, pin::Pin, task::Poll, time::Duration};

use soulbase_net_core::{NetError, NetRequest, Phase};
use tokio::time::Instant;
use url::Url;

use super::send::{Answer, Attempts, Call};
use super::Inner;
use crate::resilience::HedgeSchedule;

impl Inner {
    /// The attempt and its hedged copies (seed 001): after each `hedge.delay` without a
    /// successful answer, another copy of the request starts (while the deadline leaves
    /// room, the SLO controller admits it and the retry budget allows), up to `max_hedges`;
    /// `schedule` is already stretched by the controller's backoff factor. The first
    /// success wins; the other copies are dropped, which cancels them. All copies carry the
    /// same `Idempotency-Key`, set before the first attempt.
    #[allow(
        clippy::too_many_arguments,
        reason = "the pipeline's state for one attempt group"
    )]
    pub(super) async fn hedged(
        &self,
        req: &mut NetRequest,
        url: &Url,
        call: &Call<'_>,
        limit: Duration,
        attempts: &mut Attempts,
        schedule: HedgeSchedule,
        budget: &str,
    ) -> Answer {
        type Attempt<'f> = Pin<Box<dyn Future<Output = Answer> + Send + 'f>>;
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
        let mut pending = copies.iter_mut();
        let mut running: Vec<Attempt<'_>> = Vec::new();
        if let Some(first) = pending.next() {
            let n = attempts.next();
            running.push(Box::pin(
                self.attempt(first, url, call, limit, n, false, began),
            ));
        }
        let mut last: Option<Answer> = None;
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
            // The SLO controller thins hedges like retries, before the budget is asked so
            // that a copy it holds back spends nothing.
            let allowed = self.slo.admit_hedge(call.host(), &call.policy.slo)
                && self
                    .budgets
                    .try_withdraw(budget, &call.policy.retry.budget, Instant::now());
            if allowed {
                if let Some(copy) = pending.next() {
                    let n = attempts.next();
                    running.push(Box::pin(self.attempt(
                        copy,
                        url,
                        call,
                        limit,
                        n,
                        true,
                        Instant::now(),
                    )));
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
}
