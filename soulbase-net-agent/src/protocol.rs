//! The wire types between an agent and its control plane (seed 002's `control_plane` module):
//! JSON bodies in `snake_case`, one type per request and answer, with the seed's names.
//!
//! Every agent request carries `X-Agent-Id` and `X-Agent-Token` ([`AGENT_ID_HEADER`],
//! [`AGENT_TOKEN_HEADER`]). The schema, with an example of each body, is in `docs/agent.md`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The header naming the agent on every agent request.
pub const AGENT_ID_HEADER: &str = "x-agent-id";

/// The header carrying the agent's token on every agent request.
pub const AGENT_TOKEN_HEADER: &str = "x-agent-token";

/// What a task probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// A DNS lookup of one name, for one or more record types.
    Dns,
    /// An HTTP request.
    Http,
    /// A TCP connect.
    Tcp,
    /// ICMP echo: round-trip times and loss.
    Ping,
    /// TTL-limited probes along a path: each hop's address and round-trip time.
    Trace,
}

impl TaskKind {
    /// Every kind, in the order of the dispatcher's queues.
    pub const ALL: [TaskKind; 5] = [
        TaskKind::Dns,
        TaskKind::Http,
        TaskKind::Tcp,
        TaskKind::Ping,
        TaskKind::Trace,
    ];

    /// The kind's name on the wire (`dns`, `http`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::Dns => "dns",
            TaskKind::Http => "http",
            TaskKind::Tcp => "tcp",
            TaskKind::Ping => "ping",
            TaskKind::Trace => "trace",
        }
    }

    /// The kind named `s` (as [`as_str`](Self::as_str) spells it, any case).
    pub fn parse(s: &str) -> Option<TaskKind> {
        TaskKind::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A DNS record type a DNS task asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum DnsRecordType {
    /// IPv4 addresses.
    A,
    /// IPv6 addresses.
    Aaaa,
    /// Mail exchangers.
    Mx,
    /// Name servers.
    Ns,
    /// Text records.
    Txt,
}

impl DnsRecordType {
    /// The type's name as DNS spells it (`A`, `AAAA`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            DnsRecordType::A => "A",
            DnsRecordType::Aaaa => "AAAA",
            DnsRecordType::Mx => "MX",
            DnsRecordType::Ns => "NS",
            DnsRecordType::Txt => "TXT",
        }
    }
}

/// What to probe and how: the task's kind and its parameters, tagged by `kind`.
///
/// Every timeout is in milliseconds and optional; the worker's default applies without one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TaskSpec {
    /// Look `name` up for each of `record_types` (default `["A"]`).
    Dns {
        /// The name to look up.
        name: String,
        /// The record types to ask for. Default is `["A"]`.
        #[serde(default = "default_record_types")]
        record_types: Vec<DnsRecordType>,
        /// The whole lookup's timeout. Default is 5 s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// Send `method` (default `GET`) to `url` through the soulbase-net client, under the
    /// agent's probe policy (its address guard included).
    Http {
        /// The absolute `http`/`https` URL.
        url: String,
        /// The method. Default is `GET`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        method: Option<String>,
        /// The total timeout of the request. Default is the probe policy's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// The connect timeout. Default is the probe policy's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        connect_timeout_ms: Option<u64>,
        /// The status that counts as success. Default is any 2xx.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect_status: Option<u16>,
    },
    /// Connect to `host:port` over TCP and measure how long it took.
    Tcp {
        /// An IP address or a name (looked up through the agent's DNS servers).
        host: String,
        /// The port.
        port: u16,
        /// The connect timeout. Default is 5 s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// ICMP echo to `host` (IPv4 or IPv6), `count` times, one every `interval_ms`, over a
    /// raw socket (root or `CAP_NET_RAW`).
    Ping {
        /// An IP address or a name.
        host: String,
        /// How many echoes, 1 to 65 536. Default is 3.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        count: Option<u32>,
        /// The timeout of each echo, from its sending. Default is 1 s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// The time between two echoes' sending. Default is 1 s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interval_ms: Option<u64>,
    },
    /// ICMP echo probes towards `host` (IPv4 or IPv6) with TTL 1, 2, … up to `max_hops`, one
    /// probe per hop, until the target answers, over a raw socket (root or `CAP_NET_RAW`).
    Trace {
        /// An IP address or a name.
        host: String,
        /// The most hops. Default is 30.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_hops: Option<u8>,
        /// The timeout of each hop's probe. Default is 1 s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
}

fn default_record_types() -> Vec<DnsRecordType> {
    vec![DnsRecordType::A]
}

impl TaskSpec {
    /// The task's kind.
    pub fn kind(&self) -> TaskKind {
        match self {
            TaskSpec::Dns { .. } => TaskKind::Dns,
            TaskSpec::Http { .. } => TaskKind::Http,
            TaskSpec::Tcp { .. } => TaskKind::Tcp,
            TaskSpec::Ping { .. } => TaskKind::Ping,
            TaskSpec::Trace { .. } => TaskKind::Trace,
        }
    }
}

/// One task leased to one agent until it reports, or the lease runs out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The lease's id: a random token drawn when the task was claimed. Every extension and
    /// the report name it, and change nothing once the task is leased under another.
    pub lease_id: String,
    /// The task leased.
    pub task_id: String,
    /// What to run.
    pub spec: TaskSpec,
    /// How long the lease holds from the claim, unless extended, in milliseconds.
    pub lease_ms: u64,
    /// How many times the task was claimed, this claim included.
    pub attempt: u32,
}

/// `POST /v1/agents/register`: registers an agent, or resumes its session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// The agent's software version.
    pub version: String,
    /// The kinds it runs.
    pub kinds: Vec<TaskKind>,
    /// How many probes it runs at once at most.
    pub max_inflight: u32,
    /// The host it runs on, for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// The answer to [`RegisterRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// The agent's id, as registered.
    pub agent_id: String,
    /// The session's number: 1 at the first registration, one more at each resume.
    pub session: u64,
    /// Whether the agent was known already (a resume).
    pub resumed: bool,
    /// How often the control plane expects a heartbeat, in milliseconds.
    pub heartbeat_ms: u64,
    /// How long a lease holds without extension, in milliseconds.
    pub lease_ms: u64,
}

/// `POST /v1/agents/heartbeat`: the agent is alive, and this is its load.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    /// Probes running now.
    pub inflight: u32,
    /// Leases waiting in the agent's queues.
    pub queued: u32,
    /// Leases the agent holds (queued, running, or waiting for their report to be
    /// acknowledged).
    pub leases: u32,
}

/// The answer to [`HeartbeatRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// The agent's session, as the control plane knows it.
    pub session: u64,
}

/// `POST /v1/leases/claim`: leases for due tasks, at most `capacity[kind]` of each kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRequest {
    /// Free slots per kind: what the agent can take now without its queues overflowing.
    pub capacity: BTreeMap<TaskKind, u32>,
}

/// The answer to [`ClaimRequest`]: the leases taken (none when nothing is due).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimResponse {
    /// The leases, oldest due first within each kind.
    pub leases: Vec<Lease>,
}

/// `POST /v1/leases/extend`: extends the agent's leases by the control plane's lease time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtendRequest {
    /// The leases to extend.
    pub lease_ids: Vec<String>,
}

/// The answer to [`ExtendRequest`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtendResponse {
    /// The leases extended.
    pub extended: Vec<String>,
    /// The leases that are no longer this agent's (revoked, taken over after they ran out,
    /// or already reported): their work must stop, and their reports would be refused.
    pub lost: Vec<String>,
    /// How long an extended lease now holds, in milliseconds.
    pub lease_ms: u64,
}

/// How a probe went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportStatus {
    /// The probe ran and its target answered as expected.
    Ok,
    /// The probe ran and failed (refused, timed out, unexpected status, no such name, …):
    /// its observations say how. The task is done all the same.
    Error,
}

/// One observation of a probe: a name, any JSON value, and its unit when it has one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// What was observed (`connect_ms`, `status`, `a`, …).
    pub name: String,
    /// The value.
    pub value: serde_json::Value,
    /// Its unit (`ms`, `bytes`, `s`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

impl Observation {
    /// An observation without a unit.
    pub fn new(name: impl Into<String>, value: impl Into<serde_json::Value>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
            unit: None,
        }
    }

    /// An observation with a unit.
    pub fn with_unit(
        name: impl Into<String>,
        value: impl Into<serde_json::Value>,
        unit: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
            unit: Some(unit.into()),
        }
    }
}

/// The result of one lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeaseReport {
    /// The lease reported on.
    pub lease_id: String,
    /// Its task.
    pub task_id: String,
    /// How the probe went.
    pub status: ReportStatus,
    /// What it observed.
    pub observations: Vec<Observation>,
    /// Why it failed, for people, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /v1/leases/report`: the results of finished leases.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportRequest {
    /// The reports.
    pub reports: Vec<LeaseReport>,
}

/// The answer to [`ReportRequest`]. A report is final once acknowledged, accepted or not:
/// the agent retries a request until it is acknowledged, never a refused report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportResponse {
    /// Whether the control plane has processed the request.
    pub acknowledged: bool,
    /// The leases whose reports were recorded (now or by an earlier copy of this report).
    pub accepted: Vec<String>,
    /// The leases whose reports changed nothing: not this agent's, or no longer (revoked,
    /// run out and taken by another agent).
    pub refused: Vec<String>,
}

/// `POST /v1/tasks` (admin): a task to run once, or every `every_secs` seconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTask {
    /// What to run.
    pub spec: TaskSpec,
    /// Run it every so many seconds; once without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_secs: Option<u64>,
    /// The task's id. Default is a random one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// The answer to [`CreateTask`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTaskResponse {
    /// The task's id.
    pub task_id: String,
}

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting to be due, or due and not leased.
    Pending,
    /// Leased to an agent.
    Leased,
    /// Run once and reported (one-off tasks only).
    Done,
    /// Cancelled by an operator.
    Cancelled,
}

/// One recorded result of a task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// The lease it was reported under.
    pub lease_id: String,
    /// The agent that ran it.
    pub agent_id: String,
    /// How the probe went.
    pub status: ReportStatus,
    /// What it observed.
    pub observations: Vec<Observation>,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the control plane recorded it, in milliseconds since the Unix epoch (the store's
    /// clock).
    pub reported_at_ms: i64,
}

/// `GET /v1/tasks/{id}` (admin): a task, its state and its last result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskView {
    /// The task's id.
    pub task_id: String,
    /// What it runs.
    pub spec: TaskSpec,
    /// Its period, when it repeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_secs: Option<u64>,
    /// Where it is.
    pub state: TaskState,
    /// How many times it was claimed.
    pub claims: u32,
    /// How many results are recorded.
    pub results: u32,
    /// The agent holding it, while leased.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The lease it is held under, while leased (what `POST /v1/leases/{id}/revoke` takes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// The last result, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<TaskResult>,
}

/// `GET /v1/tasks/{id}/results` (admin): a task's results, newest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskResults {
    /// The results, newest first (at most the `limit` asked for, default 100).
    pub results: Vec<TaskResult>,
}

/// The body of every error answer: a stable code and a message for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The project's stable error code (`AUTH.FORBIDDEN`, `SCHEMA.VALIDATION_FAILED`, …).
    pub code: String,
    /// What went wrong.
    pub message: String,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
