//! The HTTP probe: one request through the soulbase-net client, under the agent's probe
//! policy (its address guard, limits and retries) and the task's own timeouts.

use std::time::Duration;

use soulbase_net_core::{http::Method, NetRequest, TimeoutCfg};
use soulbase_net_runtime::Client;
use tokio::time::Instant;

use super::{millis, ProbeResult};
use crate::protocol::Observation;

/// An HTTP task's parameters.
#[derive(Debug)]
pub(super) struct HttpTask<'a> {
    pub(super) url: &'a str,
    pub(super) method: Option<&'a str>,
    pub(super) timeout: Option<Duration>,
    pub(super) connect_timeout: Option<Duration>,
    pub(super) expect_status: Option<u16>,
}

/// Sends the request and reads the whole body. Observations: `status`, `total_ms`,
/// `connect_ms`, `ttfb_ms`, `body_bytes` (bytes), `attempts`; or, when no response came,
/// `error_kind` (the client's stable label, `blocked` for the address guard), `error_code`
/// and `elapsed_ms`.
pub(super) async fn probe(client: &Client, task: HttpTask<'_>) -> ProbeResult {
    let method = match task.method {
        None => Method::GET,
        Some(m) => match Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
            Ok(m) => m,
            Err(_) => {
                return ProbeResult::error(Vec::new(), format!("`{m}` is not an HTTP method"))
            }
        },
    };
    let mut timeout = TimeoutCfg::default();
    timeout.total = task.timeout;
    timeout.connect = task.connect_timeout;
    let start = Instant::now();
    let req = NetRequest::new(method, task.url).timeout(timeout);
    match client.send(req).await {
        Ok(res) => {
            let status = res.status.as_u16();
            let elapsed = res.elapsed;
            let attempts = res.attempts;
            let body = res.bytes().await;
            let total = start.elapsed();
            let mut observations = vec![
                Observation::new("status", status),
                Observation::with_unit("total_ms", millis(total), "ms"),
                Observation::with_unit("connect_ms", millis(elapsed.connect()), "ms"),
                Observation::with_unit("ttfb_ms", millis(elapsed.ttfb()), "ms"),
                Observation::new("attempts", attempts),
            ];
            let body = match body {
                Ok(b) => b,
                Err(e) => {
                    observations.push(Observation::new("error_kind", e.kind().label()));
                    return ProbeResult::error(observations, format!("reading the body: {e}"));
                }
            };
            observations.push(Observation::with_unit("body_bytes", body.len(), "bytes"));
            let expected = match task.expect_status {
                Some(want) => status == want,
                None => (200..300).contains(&status),
            };
            if expected {
                ProbeResult::ok(observations)
            } else {
                ProbeResult::error(observations, format!("unexpected status {status}"))
            }
        }
        Err(e) => ProbeResult::error(
            vec![
                Observation::new("error_kind", e.kind().label()),
                Observation::new("error_code", e.code().as_str()),
                Observation::with_unit("elapsed_ms", millis(start.elapsed()), "ms"),
            ],
            e.to_string(),
        ),
    }
}
