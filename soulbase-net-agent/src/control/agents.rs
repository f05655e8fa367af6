//! What the control plane serves about agents (`GET /v1/agents`): each one's state, live or
//! stale, and the leases it holds.

use serde::{Deserialize, Serialize};

use crate::protocol::RegisterRequest;

/// Whether an agent is heard from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentState {
    /// Its last heartbeat (or registration) is within the stale threshold
    /// ([`ControlConfig::stale_after`](super::ControlConfig::stale_after)).
    Live,
    /// Its heartbeats stopped: its leases are returned to the queue, and it is given none
    /// until it beats again.
    Stale,
}

/// An agent as the control plane sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AgentView {
    /// Its id.
    pub agent_id: String,
    /// Live or stale, on the store's clock now.
    pub state: AgentState,
    /// Its session (1 at the first registration, one more at each resume).
    pub session: u64,
    /// When it first registered (ms since the epoch, the store's clock).
    pub registered_at_ms: i64,
    /// Its last heartbeat or registration (ms since the epoch, the store's clock).
    pub last_seen_ms: i64,
    /// When a sweep found it stale, if it has not beaten since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_since_ms: Option<i64>,
    /// The live leases it holds.
    pub leases: u32,
    /// What it said when it registered last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration: Option<RegisterRequest>,
}

/// The answer of `GET /v1/agents`: every agent, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AgentList {
    /// The agents.
    pub agents: Vec<AgentView>,
}
