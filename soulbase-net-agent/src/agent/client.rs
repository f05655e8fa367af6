//! [`ControlClient`]: the agent's calls to its control plane, over the soulbase-net client
//! (its policy, retries of idempotent calls, breaker and timeouts), with `X-Agent-Id` and
//! `X-Agent-Token` on each.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use soulbase_net_core::{ErrorKind, NetError, NetRequest, TimeoutCfg};
use soulbase_net_observe::Metrics;
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;

use super::AgentConfig;
use crate::protocol::{
    ClaimRequest, ClaimResponse, ErrorBody, ExtendRequest, ExtendResponse, HeartbeatRequest,
    HeartbeatResponse, RegisterRequest, RegisterResponse, ReportRequest, ReportResponse,
    AGENT_ID_HEADER, AGENT_TOKEN_HEADER,
};

/// The agent's side of the control-plane protocol. Its `Debug` leaves the token out.
#[derive(Clone)]
pub struct ControlClient {
    client: Client,
    /// The client's own metrics (requests, latency, retries, breaker transitions) of the
    /// calls to the control plane.
    metrics: Arc<Metrics>,
    base: String,
    agent_id: String,
    token: String,
    timeout: Duration,
}

impl std::fmt::Debug for ControlClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlClient")
            .field("base", &self.base)
            .field("agent_id", &self.agent_id)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The default policy of the control-plane calls: the workspace's defaults, with the control
/// plane's host granted through the address guard (it is usually on a private network).
fn control_policy(base: &str) -> NetPolicy {
    let mut policy = NetPolicy::default();
    let host = base
        .split_once("://")
        .map_or(base, |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    // `host:port`, `[v6]:port` or a bare host.
    let host = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => {
            if let Ok(net) = format!("{ip}/32").parse() {
                policy.security.grants.cidrs.push(net);
            }
        }
        Ok(IpAddr::V6(ip)) => {
            if let Ok(net) = format!("{ip}/128").parse() {
                policy.security.grants.cidrs.push(net);
            }
        }
        Err(_) => policy.security.grants.hosts.push(host.to_owned()),
    }
    policy
}

impl ControlClient {
    /// A client for `config`'s control plane, under `config.control_policy` (or the default
    /// that grants the control plane's host).
    ///
    /// # Errors
    /// `InvalidRequest` when the policy does not validate.
    pub fn new(config: &AgentConfig) -> Result<Self, NetError> {
        let base = config.control_plane.trim_end_matches('/').to_owned();
        let policy = match &config.control_policy {
            Some(p) => p.clone(),
            None => control_policy(&base),
        };
        let metrics = Arc::new(Metrics::new());
        let client = Client::builder()
            .policy(policy)
            .observer_arc(metrics.clone())
            .build()?;
        Ok(Self {
            client,
            metrics,
            base,
            agent_id: config.agent_id.clone(),
            token: config.token.clone(),
            timeout: config.call_timeout,
        })
    }

    /// The soulbase-net client's metrics of the calls to the control plane (requests by
    /// outcome, latency, retries, breaker transitions), served by the agent at
    /// `/metrics/client`.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// `POST path` with `body`; the answer as `R`. `idempotent` calls are retried by the
    /// client's policy.
    async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        idempotent: bool,
    ) -> Result<R, NetError> {
        let mut timeout = TimeoutCfg::default();
        timeout.total = Some(self.timeout);
        let req = NetRequest::post(format!("{}{path}", self.base))
            .header(AGENT_ID_HEADER, &self.agent_id)
            .header(AGENT_TOKEN_HEADER, &self.token)
            .json(body)?
            .timeout(timeout)
            .idempotent(idempotent);
        let res = self.client.send(req).await?;
        let status = res.status;
        if status.is_success() {
            return res.json::<R>().await;
        }
        let text = res.text().await.unwrap_or_default();
        let message = serde_json::from_str::<ErrorBody>(&text)
            .map(|e| format!("{}: {}", e.code, e.message))
            .unwrap_or(text);
        let err = if status.as_u16() == 401 || status.as_u16() == 403 {
            NetError::new(ErrorKind::Blocked)
        } else {
            NetError::status(status)
        };
        Err(err.with_message(format!("control plane {path}: {status} {message}")))
    }

    /// Registers, or resumes the agent's session.
    ///
    /// # Errors
    /// `Blocked` when the id is registered with another token; the client's errors.
    pub async fn register(&self, req: &RegisterRequest) -> Result<RegisterResponse, NetError> {
        self.call("/v1/agents/register", req, true).await
    }

    /// Sends a heartbeat.
    ///
    /// # Errors
    /// `Blocked` when the agent is not registered; the client's errors.
    pub async fn heartbeat(&self, req: &HeartbeatRequest) -> Result<HeartbeatResponse, NetError> {
        self.call("/v1/agents/heartbeat", req, true).await
    }

    /// Claims leases. Not retried by the client: a claim whose answer was lost holds its
    /// leases until they run out, and a retry would take more.
    ///
    /// # Errors
    /// The client's errors, and the control plane's.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<ClaimResponse, NetError> {
        self.call("/v1/leases/claim", req, false).await
    }

    /// Extends leases.
    ///
    /// # Errors
    /// The client's errors, and the control plane's.
    pub async fn extend(&self, req: &ExtendRequest) -> Result<ExtendResponse, NetError> {
        self.call("/v1/leases/extend", req, true).await
    }

    /// Reports results (idempotent: a report recorded already is accepted again).
    ///
    /// # Errors
    /// The client's errors, and the control plane's.
    pub async fn report(&self, req: &ReportRequest) -> Result<ReportResponse, NetError> {
        self.call("/v1/leases/report", req, true).await
    }
}
