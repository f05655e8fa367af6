//! A script writer: builds the `NetEvent`s a client would send for common request shapes.

use std::time::Duration;

use soulbase_net_core::{
    http::{Method, StatusCode},
    Elapsed, ErrorKind, NetEvent, Observer, Outcome, Phase, RequestInfo,
};

pub(crate) static GET: Method = Method::GET;

pub(crate) fn req<'a>(id: u64, host: &'a str, tenant: Option<&'a str>) -> RequestInfo<'a> {
    RequestInfo {
        id,
        method: &GET,
        scheme: "https",
        host,
        tenant,
        url: "https://example/",
    }
}

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(crate) fn ok() -> Outcome {
    Outcome::Response(StatusCode::OK)
}

pub(crate) fn status(code: u16) -> Outcome {
    Outcome::Response(StatusCode::from_u16(code).unwrap())
}

pub(crate) fn timeout(phase: Phase) -> Outcome {
    Outcome::Error(ErrorKind::Timeout(phase))
}

/// Sends the events of one attempt: started, then finished with `outcome`.
pub(crate) fn attempt(
    obs: &dyn Observer,
    req: RequestInfo<'_>,
    n: u32,
    outcome: Outcome,
    connect_ms: u64,
    ttfb_ms: u64,
) {
    obs.on_event(&NetEvent::AttemptStarted {
        req,
        attempt: n,
        hedge: false,
    });
    obs.on_event(&NetEvent::AttemptFinished {
        req,
        attempt: n,
        outcome,
        elapsed: Elapsed::default()
            .with_connect(ms(connect_ms))
            .with_ttfb(ms(ttfb_ms))
            .with_total(ms(ttfb_ms)),
    });
}

pub(crate) fn started(obs: &dyn Observer, req: RequestInfo<'_>) {
    obs.on_event(&NetEvent::RequestStarted { req });
}

pub(crate) fn finished(
    obs: &dyn Observer,
    req: RequestInfo<'_>,
    outcome: Outcome,
    attempts: u32,
    total_ms: u64,
) {
    obs.on_event(&NetEvent::RequestFinished {
        req,
        outcome,
        attempts,
        elapsed: Elapsed::default()
            .with_ttfb(ms(total_ms))
            .with_total(ms(total_ms)),
        version: outcome_version(&outcome),
    });
}

/// A whole one-attempt request.
pub(crate) fn simple(obs: &dyn Observer, req: RequestInfo<'_>, outcome: Outcome, total_ms: u64) {
    started(obs, req);
    attempt(obs, req, 1, outcome, 0, total_ms);
    finished(obs, req, outcome, 1, total_ms);
}

/// The version of a call's final response in these tests: HTTP/1.1 when there was one.
fn outcome_version(outcome: &Outcome) -> Option<soulbase_net_core::http::Version> {
    matches!(outcome, Outcome::Response(_)).then_some(soulbase_net_core::http::Version::HTTP_11)
}
