//! The chaos traffic: concurrent callers, each drawing target, method, deadline and whether
//! the caller cancels it mid-flight per request from a seeded stream, each call run in its
//! own task and timed from the first byte sent to the last byte read (or the error).

use std::{sync::Arc, time::Duration};

use soulbase_net_core::{http::Method, NetClient, NetRequest};
use soulbase_net_runtime::{CancellationToken, Client};
use soulbase_net_testkit::RandomFaults;
use tokio::time::Instant;

use super::world::{Target, POLICY_TOTAL};

/// The header that marks each request uniquely, so the servers' captures can be counted.
pub(crate) const MARKER: &str = "x-chaos-id";
/// How long past its deadline a call may take before the run stops waiting for it (and
/// counts it as lost).
const GIVE_UP_AFTER: Duration = Duration::from_secs(5);
/// At most this many requests per caller, whatever the duration.
const MAX_PER_CALLER: u64 = 100_000;

/// What kind of request a call was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Get,
    Head,
    /// A POST that must not be repeated (no idempotency key).
    Post,
    /// A POST marked idempotent: retried and hedged under one `Idempotency-Key`.
    IdempotentPost,
    /// A PUT sent without the idempotent flag: never retried by the client.
    Put,
}

impl Kind {
    /// Whether a repeat of this call is allowed to reach the server.
    pub(crate) fn may_repeat(self) -> bool {
        matches!(self, Kind::Get | Kind::Head | Kind::IdempotentPost)
    }

    fn draw(u: f64) -> Kind {
        match u {
            u if u < 0.40 => Kind::Get,
            u if u < 0.45 => Kind::Head,
            u if u < 0.75 => Kind::Post,
            u if u < 0.92 => Kind::IdempotentPost,
            _ => Kind::Put,
        }
    }

    fn request(self, url: &str, id: &str) -> NetRequest {
        let body = format!("{{\"op\":\"{id}\"}}");
        let req = match self {
            Kind::Get => NetRequest::get(url),
            Kind::Head => NetRequest::head(url),
            Kind::Post => NetRequest::post(url).body(body),
            Kind::IdempotentPost => NetRequest::post(url).body(body).idempotent(true),
            Kind::Put => NetRequest::new(Method::PUT, url).body(body),
        };
        req.header(MARKER, id)
    }
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A response with this status, and its whole body read.
    Answered(u16),
    /// An error: its stable code and its kind.
    Failed { code: String, kind: String },
    /// Neither: the call's task died, or it had not returned long after its deadline.
    Lost(String),
}

/// One call of the run.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub(crate) id: String,
    /// When it was sent.
    pub(crate) began: Instant,
    pub(crate) target: usize,
    pub(crate) kind: Kind,
    /// The call's total deadline.
    pub(crate) limit: Duration,
    /// When the caller's cancel really fired, from when the call was sent (zero when before);
    /// `None` when it did not fire before the call ended.
    pub(crate) cancel_after: Option<Duration>,
    /// From `send` to the last body byte or the error.
    pub(crate) wall: Duration,
    pub(crate) attempts: u32,
    pub(crate) outcome: Outcome,
}

/// What one request of a caller is to be.
struct Drawn {
    target: usize,
    kind: Kind,
    /// An own total deadline, or none: the policy's.
    limit: Option<Duration>,
    /// When the caller cancels the call, or never.
    cancel_after: Option<Duration>,
}

/// Draws request `n` of caller `caller`: the target index, the kind, an own total deadline
/// and a cancellation, all from `seed`.
fn draw(rng: &RandomFaults, n: u64, targets: &[Target]) -> Drawn {
    const DRAWS: u64 = 4;
    let total: u32 = targets.iter().map(|t| t.weight).sum();
    let mut pick = (rng.draw(n * DRAWS) * f64::from(total.max(1))) as u32;
    let mut target = targets.len().saturating_sub(1);
    for (i, t) in targets.iter().enumerate() {
        if pick < t.weight {
            target = i;
            break;
        }
        pick -= t.weight;
    }
    let kind = Kind::draw(rng.draw(n * DRAWS + 1));
    // Four calls in ten bring their own deadline, from 300 ms to 1.5 s — some shorter than
    // one attempt, so the call's deadline must cut the attempt short.
    let u = rng.draw(n * DRAWS + 2);
    let limit = (u < 0.4).then(|| Duration::from_millis(300 + (u / 0.4 * 1200.0) as u64));
    // One call in ten is cancelled by its caller, at a moment spread evenly on a log scale
    // from 1 ms to its deadline (most calls take milliseconds, a few take the deadline): while
    // connecting, waiting for the head, between retries, or after it already answered.
    let u = rng.draw(n * DRAWS + 3);
    let cancel_after = (u < CANCELLED_SHARE).then(|| {
        let deadline_ms = limit.unwrap_or(POLICY_TOTAL).as_secs_f64() * 1000.0;
        Duration::from_secs_f64(deadline_ms.max(1.0).powf(u / CANCELLED_SHARE) / 1000.0)
    });
    Drawn {
        target,
        kind,
        limit,
        cancel_after,
    }
}

/// The share of calls their caller cancels mid-flight.
const CANCELLED_SHARE: f64 = 0.1;

/// One call, timed from when it is sent (the clock the client's own deadline runs on): send,
/// then read the whole body. Returns when it began and ended.
async fn call(client: Arc<Client>, req: NetRequest) -> (Outcome, Instant, Instant, u32) {
    let began = Instant::now();
    let result = match client.send(req).await {
        Ok(res) => {
            let (status, attempts) = (res.status.as_u16(), res.attempts);
            res.bytes().await.map(|_| (status, attempts))
        }
        Err(e) => Err(e),
    };
    let ended = Instant::now();
    match result {
        Ok((status, attempts)) => (Outcome::Answered(status), began, ended, attempts),
        Err(e) => (
            Outcome::Failed {
                code: e.code().as_str().to_owned(),
                kind: e.kind().label().to_owned(),
            },
            began,
            ended,
            e.attempts(),
        ),
    }
}

/// One caller: request after request until `until`, each in its own task, so that a panic
/// or a call that never returns is seen rather than taking the caller with it.
pub(crate) async fn caller(
    client: Arc<Client>,
    targets: Arc<Vec<Target>>,
    seed: u64,
    index: u64,
    until: Instant,
) -> Vec<Call> {
    let rng = RandomFaults::seeded(seed.wrapping_add(index.wrapping_mul(0x9E37_79B9)));
    let mut calls = Vec::new();
    let mut n = 0;
    while Instant::now() < until && n < MAX_PER_CALLER {
        let Drawn {
            target,
            kind,
            limit: own_limit,
            cancel_after,
        } = draw(&rng, n, &targets);
        let id = format!("{seed}-{index}-{n}");
        let mut req = kind.request(&targets[target].url, &id);
        if let Some(limit) = own_limit {
            req = req.total_timeout(limit);
        }
        let limit = own_limit.unwrap_or(POLICY_TOTAL);
        let started = Instant::now();
        // When the cancel really fired: a timer that fires late on a loaded machine is the
        // test's lateness, not the client's.
        let fired: Arc<parking_lot::Mutex<Option<Instant>>> = Arc::default();
        if let Some(after) = cancel_after {
            let token = CancellationToken::new();
            req.extensions.insert(token.clone());
            let fired = fired.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(started + after).await;
                *fired.lock() = Some(Instant::now());
                token.cancel();
            });
        }
        let task = tokio::spawn(call(client.clone(), req));
        let abort = task.abort_handle();
        let (outcome, began, ended, attempts) =
            match tokio::time::timeout(limit + GIVE_UP_AFTER, task).await {
                Ok(Ok(done)) => done,
                Ok(Err(e)) => (
                    Outcome::Lost(format!("task ended: {e}")),
                    started,
                    Instant::now(),
                    0,
                ),
                Err(_) => {
                    abort.abort();
                    let waited = Instant::now();
                    (
                        Outcome::Lost("no answer, no error".to_owned()),
                        started,
                        waited,
                        0,
                    )
                }
            };
        // Both from when the call was sent; a cancel that fired before counts as at once.
        let wall = ended.saturating_duration_since(began);
        let cancel_after = (*fired.lock())
            .filter(|at| *at <= ended)
            .map(|at| at.saturating_duration_since(began));
        calls.push(Call {
            id,
            began,
            target,
            kind,
            limit,
            cancel_after,
            wall,
            attempts,
            outcome,
        });
        n += 1;
    }
    calls
}
