//! The control plane's Prometheus metrics, in the text exposition format: counters kept as
//! it works (by this instance: with several instances on one database, sum them), task and
//! agent gauges read from the store at scrape time (the same on every instance).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::store::Counts;

/// The counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) created: AtomicU64,
    pub(crate) registered: AtomicU64,
    pub(crate) heartbeats: AtomicU64,
    pub(crate) claims: AtomicU64,
    pub(crate) leased: AtomicU64,
    pub(crate) extended: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) reported: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) revoked: AtomicU64,
    pub(crate) unauthorized: AtomicU64,
    /// Agents found stale by this instance's sweeps.
    pub(crate) stale: AtomicU64,
    /// Leases of stale agents this instance's sweeps returned to the queue.
    pub(crate) returned: AtomicU64,
}

impl Metrics {
    /// Counts one.
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `n`.
    pub(crate) fn add_n(counter: &AtomicU64, n: usize) {
        counter.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The exposition, with the store's `counts` when it answered.
    pub(crate) fn render(&self, counts: Option<Counts>) -> String {
        let mut out = String::with_capacity(2048);
        let counters: [(&str, &str, &AtomicU64); 14] = [
            (
                "agent_control_tasks_created_total",
                "Tasks created.",
                &self.created,
            ),
            (
                "agent_control_registrations_total",
                "Agent registrations and resumes.",
                &self.registered,
            ),
            (
                "agent_control_heartbeats_total",
                "Agent heartbeats.",
                &self.heartbeats,
            ),
            (
                "agent_control_claims_total",
                "Claim requests.",
                &self.claims,
            ),
            (
                "agent_control_leases_total",
                "Leases handed out.",
                &self.leased,
            ),
            (
                "agent_control_extended_total",
                "Leases extended.",
                &self.extended,
            ),
            (
                "agent_control_lost_total",
                "Extensions refused: the lease was no longer the agent's.",
                &self.lost,
            ),
            (
                "agent_control_reports_total",
                "Reports recorded.",
                &self.reported,
            ),
            (
                "agent_control_duplicate_reports_total",
                "Reports recorded by an earlier copy.",
                &self.duplicates,
            ),
            (
                "agent_control_refused_reports_total",
                "Reports of a lease not (or no longer) the agent's: nothing changed.",
                &self.refused,
            ),
            (
                "agent_control_revoked_total",
                "Leases revoked.",
                &self.revoked,
            ),
            (
                "agent_control_unauthorized_total",
                "Requests refused for a missing or wrong token.",
                &self.unauthorized,
            ),
            (
                "agent_control_stale_agents_total",
                "Agents found stale (no heartbeat within the threshold) by this instance.",
                &self.stale,
            ),
            (
                "agent_control_returned_leases_total",
                "Leases of stale agents returned to the queue by this instance.",
                &self.returned,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        if let Some(c) = counts {
            let _ = writeln!(
                out,
                "# HELP agent_control_tasks Tasks by state.\n# TYPE agent_control_tasks gauge"
            );
            for (state, n) in [
                ("pending", c.pending),
                ("leased", c.leased),
                ("done", c.done),
                ("cancelled", c.cancelled),
            ] {
                let _ = writeln!(out, "agent_control_tasks{{state=\"{state}\"}} {n}");
            }
            let _ = writeln!(out, "# HELP agent_control_agents Agents registered.\n# TYPE agent_control_agents gauge\nagent_control_agents {}", c.agents);
            let _ = writeln!(out, "# HELP agent_control_agents_live Agents heard from within the stale threshold.\n# TYPE agent_control_agents_live gauge\nagent_control_agents_live {}", c.agents_live);
            let _ = writeln!(out, "# HELP agent_control_agents_stale Agents not heard from within the stale threshold.\n# TYPE agent_control_agents_stale gauge\nagent_control_agents_stale {}", c.agents - c.agents_live);
        }
        out
    }
}
