//! The agent's concurrency (seed 002's `concurrency`): AIMD windows at three levels — the
//! whole agent, each task kind, each target — that every probe enters before it runs and
//! feeds its outcome back to when it ends.
//!
//! The windows are the runtime's ([`AimdLimit`], the client limiter's window on its own):
//! +1 per window's worth of successes, ×0.5 on a timeout or an error, at most one decrease
//! per window of calls in flight. The ceilings are the configuration's: `max_inflight`
//! (`AGENT_MAX_INFLIGHT`) for the global window, the kind's pool (`AGENT_POOL_<KIND>_SIZE`)
//! for a kind's, [`TargetLimits::max`] for a target's.
//!
//! What an outcome feeds back ([`Feedback::of`]):
//! - a success (the probe succeeded, or its target answered — an HTTP status other than 429
//!   and 5xx, a DNS answer such as NXDOMAIN) adds at every level;
//! - a timeout decreases every level: it may be the agent's own overload (its CPU, its
//!   sockets, its link);
//! - an error (refused, reset, 429, 5xx) decreases the target's window only: one target's
//!   failure says nothing about the agent's capacity, and a few dead targets must not throttle
//!   every other probe (the seed decreases every level on an error too; this is the one
//!   departure);
//! - an outcome that says nothing of the target — a local refusal (the address guard, an
//!   invalid task, an unsupported kind), a capability the agent lacks (`permission`: no raw
//!   socket for ping and trace) — or a cancelled probe counts nothing.
//!
//! A probe takes its places narrowest first (target, kind, global), so that one waiting for
//! a slow target's window holds no place of the wider windows meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use soulbase_net_policy::AimdPolicy;
use soulbase_net_runtime::layer::{AimdLimit, AimdLimitPermit};
use tokio::time::Instant;

use crate::protocol::{ReportStatus, TaskKind, TaskSpec};
use crate::workers::ProbeResult;

/// The per-target windows' settings (see [`AgentConfig::target_limits`](super::AgentConfig::target_limits)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TargetLimits {
    /// The window of a target seen for the first time. Default is 8.
    pub initial: u32,
    /// The largest window of one target (`AGENT_TARGET_MAX_INFLIGHT`). Default is 32; the
    /// kind's pool and `max_inflight` bound it too.
    pub max: u32,
    /// The most targets with a window: beyond it, the windows idle longest (no probe in them
    /// or waiting) are forgotten. Default is 4096.
    pub max_targets: usize,
}

impl Default for TargetLimits {
    fn default() -> Self {
        Self {
            initial: 8,
            max: 32,
            max_targets: 4096,
        }
    }
}

/// One window's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowSnapshot {
    /// Probes allowed in the window now.
    pub limit: u32,
    /// Probes in the window now.
    pub in_flight: u32,
    /// The window's ceiling.
    pub max: u32,
}

/// The agent's windows now (see [`AgentHandle::concurrency`](super::AgentHandle::concurrency)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConcurrencySnapshot {
    /// The whole agent's window.
    pub global: Option<WindowSnapshot>,
    /// Each kind's window.
    pub kinds: BTreeMap<TaskKind, WindowSnapshot>,
    /// Each target's window (targets forgotten when idle are absent).
    pub targets: BTreeMap<String, WindowSnapshot>,
    /// Probes that found a window full and waited (the seed's `concurrency.backpressure`).
    pub waits: u64,
    /// Idle target windows forgotten to keep within `max_targets`.
    pub evicted: u64,
}

/// What a probe's outcome says about its target and the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Feedback {
    /// Add at every level.
    Success,
    /// Decrease every level.
    Timeout,
    /// Decrease the target's level.
    Error,
    /// Count nothing.
    Ignore,
}

/// `error_kind` values that say nothing of the target: the agent's own refusals (its address
/// guard, its client's limits, breaker and interceptors, a task that does not read) and what
/// it cannot do itself (`permission`: no raw socket for ping and trace without root or
/// `CAP_NET_RAW`). Every probe of every target would fail alike, so no window shrinks.
const LOCAL: [&str; 10] = [
    "blocked",
    "invalid_request",
    "cancelled",
    "rate_limited",
    "circuit_open",
    "budget_exhausted",
    "quota_exceeded",
    "unsupported",
    "interceptor",
    "permission",
];

impl Feedback {
    /// The feedback of a probe's result (see the module's documentation).
    pub(crate) fn of(result: &ProbeResult) -> Self {
        if result.status == ReportStatus::Ok {
            return Self::Success;
        }
        let text = |name: &str| {
            result
                .observations
                .iter()
                .find(|o| o.name == name)
                .and_then(|o| o.value.as_str())
        };
        if let Some(kind) = text("error_kind") {
            if kind.starts_with("timeout") {
                return Self::Timeout;
            }
            if LOCAL.contains(&kind) {
                return Self::Ignore;
            }
        }
        if result.observations.iter().any(|o| o.name == "unsupported") {
            return Self::Ignore;
        }
        if result
            .observations
            .iter()
            .any(|o| o.name.ends_with("_error") && o.value.as_str() == Some("timeout"))
        {
            return Self::Timeout;
        }
        if let Some(status) = result
            .observations
            .iter()
            .find(|o| o.name == "status")
            .and_then(|o| o.value.as_u64())
        {
            return if status == 429 || (500..600).contains(&status) {
                Self::Error
            } else {
                Self::Success
            };
        }
        if text("rcode").is_some() {
            return Self::Success;
        }
        if result.observations.is_empty() && result.error.is_some() {
            // Nothing was sent (a task that does not read, such as an unknown method).
            return Self::Ignore;
        }
        Self::Error
    }
}

/// The target of a task: the host of an HTTP URL, the host of a TCP, ping or trace task,
/// the name of a DNS task; lowercased.
pub(crate) fn target_of(spec: &TaskSpec) -> String {
    let host = match spec {
        TaskSpec::Http { url, .. } => url_host(url),
        TaskSpec::Tcp { host, .. } | TaskSpec::Ping { host, .. } | TaskSpec::Trace { host, .. } => {
            host.trim_matches(['[', ']'])
        }
        TaskSpec::Dns { name, .. } => name.trim_end_matches('.'),
    };
    host.to_ascii_lowercase()
}

/// The host of an absolute URL (`scheme://[user@]host[:port]/…`), without brackets.
fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or_default();
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

/// The windows.
#[derive(Debug)]
pub(crate) struct Limits {
    global: AimdLimit,
    kinds: BTreeMap<TaskKind, AimdLimit>,
    targets: Mutex<Targets>,
    target: TargetLimits,
    waits: AtomicU64,
    evicted: AtomicU64,
}

#[derive(Debug)]
struct Targets {
    map: HashMap<String, Target>,
    /// The size at which idle windows are forgotten next.
    prune_at: usize,
}

#[derive(Debug)]
struct Target {
    /// Shared with the probes using it: one not held elsewhere, with nothing in flight, is
    /// idle.
    limit: Arc<AimdLimit>,
    last_used: Instant,
}

/// A probe's places in its three windows; dropped, they are given back and count nothing.
#[derive(Debug)]
pub(crate) struct Places {
    target: AimdLimitPermit,
    kind: Option<AimdLimitPermit>,
    global: AimdLimitPermit,
}

fn policy(initial: u32, max: u32) -> AimdPolicy {
    let mut p = AimdPolicy::default();
    p.enabled = true;
    p.max = max.max(1);
    p.initial = initial.clamp(1, p.max);
    p.min = 1;
    p.increase = 1;
    p.decrease_factor = 0.5;
    p
}

impl Limits {
    /// Windows with `max_inflight` as the global ceiling and `pools` as each kind's.
    pub(crate) fn new(
        max_inflight: u32,
        pools: &BTreeMap<TaskKind, u32>,
        target: TargetLimits,
    ) -> Self {
        let kinds = pools
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(&k, &n)| (k, AimdLimit::new(policy(n, n))))
            .collect();
        Self {
            global: AimdLimit::new(policy(max_inflight, max_inflight)),
            kinds,
            targets: Mutex::new(Targets {
                map: HashMap::new(),
                prune_at: target.max_targets.max(1),
            }),
            target,
            waits: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    /// Places in the windows of `spec`'s target, kind, and the agent, waiting for room (drop
    /// the future to give up: what was taken is given back).
    pub(crate) async fn enter(&self, spec: &TaskSpec) -> Places {
        let target_limit = self.target(&target_of(spec));
        let target = self.take(&target_limit).await;
        drop(target_limit);
        let kind = match self.kinds.get(&spec.kind()) {
            Some(limit) => Some(self.take(limit).await),
            None => None,
        };
        let global = self.take(&self.global).await;
        Places {
            target,
            kind,
            global,
        }
    }

    async fn take(&self, limit: &AimdLimit) -> AimdLimitPermit {
        if let Some(p) = limit.try_acquire() {
            return p;
        }
        self.waits.fetch_add(1, Ordering::Relaxed);
        limit.acquire().await
    }

    /// The window of `target`, made if it has none (forgetting idle ones when full).
    fn target(&self, target: &str) -> Arc<AimdLimit> {
        let now = Instant::now();
        let mut targets = self.targets.lock();
        if let Some(t) = targets.map.get_mut(target) {
            t.last_used = now;
            return t.limit.clone();
        }
        if targets.map.len() >= targets.prune_at {
            let forgotten = targets.prune(self.target.max_targets);
            self.evicted.fetch_add(forgotten as u64, Ordering::Relaxed);
        }
        let max = self.target.max;
        let limit = Arc::new(AimdLimit::new(policy(self.target.initial, max)));
        targets.map.insert(
            target.to_owned(),
            Target {
                limit: limit.clone(),
                last_used: now,
            },
        );
        limit
    }

    /// The windows now.
    pub(crate) fn snapshot(&self) -> ConcurrencySnapshot {
        let window = |l: &AimdLimit| WindowSnapshot {
            limit: l.limit(),
            in_flight: l.in_flight(),
            max: l.policy().max,
        };
        let targets = self
            .targets
            .lock()
            .map
            .iter()
            .map(|(k, t)| (k.clone(), window(&t.limit)))
            .collect();
        ConcurrencySnapshot {
            global: Some(window(&self.global)),
            kinds: self.kinds.iter().map(|(&k, l)| (k, window(l))).collect(),
            targets,
            waits: self.waits.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }
}

impl Targets {
    /// Forgets the idle windows used longest ago, down to three quarters of `max` when
    /// enough are idle; the next pruning waits until the map has doubled past what stayed.
    /// How many were forgotten.
    fn prune(&mut self, max: usize) -> usize {
        let mut idle: Vec<(Instant, String)> = self
            .map
            .iter()
            .filter(|(_, t)| Arc::strong_count(&t.limit) == 1 && t.limit.in_flight() == 0)
            .map(|(k, t)| (t.last_used, k.clone()))
            .collect();
        idle.sort_unstable();
        let keep = max - max / 4;
        let excess = self.map.len().saturating_sub(keep);
        let mut forgotten = 0;
        for (_, key) in idle.into_iter().take(excess) {
            self.map.remove(&key);
            forgotten += 1;
        }
        self.prune_at = if self.map.len() < max {
            max.max(1)
        } else {
            self.map.len().saturating_mul(2)
        };
        forgotten
    }
}

impl Places {
    /// Feeds `feedback` to the windows and gives the places back.
    pub(crate) fn record(self, feedback: Feedback) {
        let Self {
            target,
            kind,
            global,
        } = self;
        match feedback {
            Feedback::Success => {
                target.record_success();
                if let Some(kind) = kind {
                    kind.record_success();
                }
                global.record_success();
            }
            Feedback::Timeout => {
                target.record_timeout();
                if let Some(kind) = kind {
                    kind.record_timeout();
                }
                global.record_timeout();
            }
            Feedback::Error => target.record_error(),
            Feedback::Ignore => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Observation;

    fn result(ok: bool, obs: &[(&str, serde_json::Value)]) -> ProbeResult {
        ProbeResult {
            status: if ok {
                ReportStatus::Ok
            } else {
                ReportStatus::Error
            },
            observations: obs
                .iter()
                .map(|(n, v)| Observation::new(*n, v.clone()))
                .collect(),
            error: (!ok).then(|| "failed".to_owned()),
        }
    }

    #[test]
    fn outcomes_are_read_as_success_timeout_error_or_nothing() {
        use serde_json::json;
        use Feedback::*;
        let cases = [
            (result(true, &[]), Success),
            (result(false, &[("status", json!(418))]), Success),
            (result(false, &[("status", json!(503))]), Error),
            (result(false, &[("status", json!(429))]), Error),
            (
                result(false, &[("error_kind", json!("timeout_ttfb"))]),
                Timeout,
            ),
            (result(false, &[("error_kind", json!("timeout"))]), Timeout),
            (result(false, &[("error_kind", json!("refused"))]), Error),
            (result(false, &[("error_kind", json!("blocked"))]), Ignore),
            (result(false, &[("unsupported", json!(true))]), Ignore),
            (result(false, &[("a_error", json!("timeout"))]), Timeout),
            (result(false, &[("rcode", json!("NXDOMAIN"))]), Success),
            (result(false, &[]), Ignore),
        ];
        for (r, want) in cases {
            assert_eq!(Feedback::of(&r), want, "{r:?}");
        }
    }

    #[test]
    fn outcomes_that_say_nothing_of_the_target_leave_its_window_alone() {
        use serde_json::json;
        // A ping without CAP_NET_RAW, an interceptor's refusal: every target would fail alike.
        for kind in ["permission", "interceptor", "blocked", "invalid_request"] {
            let r = result(false, &[("error_kind", json!(kind))]);
            assert_eq!(Feedback::of(&r), Feedback::Ignore, "{kind}");
        }
        // What the target (or the path to it) did still counts against it.
        for kind in ["unreachable", "refused", "io", "dns"] {
            let r = result(false, &[("error_kind", json!(kind))]);
            assert_eq!(Feedback::of(&r), Feedback::Error, "{kind}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_without_a_raw_socket_does_not_shrink_its_targets_window() {
        let pools = BTreeMap::from([(TaskKind::Ping, 2)]);
        let limits = Limits::new(8, &pools, TargetLimits::default());
        let ping = TaskSpec::Ping {
            host: "192.0.2.1".into(),
            count: None,
            timeout_ms: None,
            interval_ms: None,
        };
        let before = limits.snapshot().targets.get("192.0.2.1").copied();
        for _ in 0..3 {
            let denied = result(false, &[("error_kind", serde_json::json!("permission"))]);
            limits.enter(&ping).await.record(Feedback::of(&denied));
        }
        let s = limits.snapshot();
        assert_eq!(before, None);
        assert_eq!(
            s.targets["192.0.2.1"].limit,
            TargetLimits::default().initial
        );
        assert_eq!(s.kinds[&TaskKind::Ping].limit, 2);
        assert_eq!(s.global.unwrap().limit, 8);
    }

    #[test]
    fn targets_are_hosts_and_names() {
        let http = |url: &str| TaskSpec::Http {
            url: url.into(),
            method: None,
            timeout_ms: None,
            connect_timeout_ms: None,
            expect_status: None,
        };
        assert_eq!(target_of(&http("http://U@Web.Test:8080/x?y")), "web.test");
        assert_eq!(target_of(&http("https://[::1]:443/")), "::1");
        assert_eq!(target_of(&http("http://127.0.0.1/")), "127.0.0.1");
        let tcp = TaskSpec::Tcp {
            host: "[::1]".into(),
            port: 1,
            timeout_ms: None,
        };
        assert_eq!(target_of(&tcp), "::1");
    }

    fn tcp(host: &str) -> TaskSpec {
        TaskSpec::Tcp {
            host: host.into(),
            port: 80,
            timeout_ms: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn three_levels_move_as_their_feedback_says_and_idle_targets_are_forgotten() {
        let pools = BTreeMap::from([(TaskKind::Tcp, 4)]);
        let target = TargetLimits {
            initial: 2,
            max: 4,
            max_targets: 4,
        };
        let limits = Limits::new(8, &pools, target);
        let a = limits.enter(&tcp("a")).await;
        let a2 = limits.enter(&tcp("a")).await;
        let s = limits.snapshot();
        assert_eq!(
            s.targets["a"],
            WindowSnapshot {
                limit: 2,
                in_flight: 2,
                max: 4
            }
        );
        assert_eq!(
            (
                s.kinds[&TaskKind::Tcp].in_flight,
                s.global.unwrap().in_flight
            ),
            (2, 2)
        );
        // A third probe of `a` waits for its target's window, holding nothing wider.
        let third_spec = tcp("a");
        let waiting = limits.enter(&third_spec);
        tokio::pin!(waiting);
        assert!(futures_poll_pending(waiting.as_mut()));
        assert_eq!(limits.snapshot().waits, 1);
        assert_eq!(limits.snapshot().kinds[&TaskKind::Tcp].in_flight, 2);
        // An error decreases the target's window only.
        a.record(Feedback::Error);
        let s = limits.snapshot();
        assert_eq!(
            (
                s.targets["a"].limit,
                s.kinds[&TaskKind::Tcp].limit,
                s.global.unwrap().limit
            ),
            (1, 4, 8)
        );
        // A timeout of a place taken after it decreases every level.
        a2.record(Feedback::Success);
        let third = waiting.await;
        third.record(Feedback::Timeout);
        let s = limits.snapshot();
        assert_eq!(
            (
                s.targets["a"].limit,
                s.kinds[&TaskKind::Tcp].limit,
                s.global.unwrap().limit
            ),
            (1, 2, 4)
        );
        // Idle targets beyond `max_targets` are forgotten, the oldest first.
        for t in ["b", "c", "d", "e"] {
            limits.enter(&tcp(t)).await.record(Feedback::Success);
            tokio::time::advance(std::time::Duration::from_millis(1)).await;
        }
        let s = limits.snapshot();
        assert!(s.evicted >= 1, "{s:?}");
        assert!(s.targets.len() <= 4, "{s:?}");
        assert!(
            s.targets.contains_key("e") && !s.targets.contains_key("a"),
            "{s:?}"
        );
    }

    /// Polls `fut` once; whether it is still pending.
    fn futures_poll_pending<F: std::future::Future>(fut: std::pin::Pin<&mut F>) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        fut.poll(&mut cx).is_pending()
    }
}
