//! The sweep for stale agents: each instance's periodic task that finds agents whose
//! heartbeats stopped and returns their leases to the queue.

use std::sync::Arc;

use tokio::sync::watch;

use super::metrics::Metrics;
use super::Inner;

/// Sweeps for stale agents every [`ControlConfig::sweep_every`](super::ControlConfig::sweep_every) until told to stop. Every
/// instance sweeps; the statements are conditional, so each agent is found stale, and each
/// lease returned, by one of them (and counted there).
///
/// The first sweep comes a whole threshold after the start: agents that could not beat while
/// the control plane was down (restarted on its file, say) have had the time to beat again,
/// rather than being found stale together and losing the leases whose reports they are
/// retrying.
pub(super) async fn run(inner: Arc<Inner>, mut stopped: watch::Receiver<bool>) {
    let stale_after = inner.config.stale_after();
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + stale_after,
        inner.config.sweep_every(),
    );
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            _ = ticker.tick() => {}
        }
        match inner.store.sweep(stale_after).await {
            Ok(swept) => {
                for agent in &swept.stale {
                    tracing::warn!(agent = %agent, ?stale_after, "agent stale: no heartbeat");
                }
                if !swept.returned.is_empty() {
                    tracing::warn!(
                        tasks = ?swept.returned,
                        "leases of stale agents returned to the queue"
                    );
                }
                Metrics::add_n(&inner.metrics.stale, swept.stale.len());
                Metrics::add_n(&inner.metrics.returned, swept.returned.len());
            }
            Err(e) => tracing::warn!(error = %e, "sweeping for stale agents failed"),
        }
    }
}
