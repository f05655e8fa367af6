//! The lease extender (seed 002's `lease_extender`): tracks every lease the agent holds,
//! extends them all on schedule, and cancels the work of a lease that is lost.
//!
//! Commands arrive on a channel: `Track` (a lease claimed, with its cancellation token),
//! `Finish` (its report was acknowledged, or its work ended without one), `Revoke` (stop its
//! work now). Every `extend_every`, one `ExtendRequest` names every tracked lease; what the
//! control plane says is no longer the agent's is cancelled at once. A lease is counted as
//! running out at the time the last successful extension was *sent* plus the lease time — an
//! estimate on the agent's clock that errs early, never late — and a lease not extended by
//! then is cancelled too: its work stops and it is never reported done, since another agent
//! may hold it by now.
//!
//! Its waits (the next extension, the earliest lease running out) are one timer of the
//! agent's timer service at a time, made again only when the instant moves earlier, so that
//! a stream of commands does not fill the timer queue.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use soulbase_net_runtime::CancellationToken;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::client::ControlClient;
use super::timer::TimerService;
use crate::protocol::ExtendRequest;

/// A command to the extender.
#[derive(Debug)]
pub(crate) enum Command {
    /// Track a lease claimed at `until - lease`, cancelled through `cancel` when lost.
    Track {
        lease_id: String,
        cancel: CancellationToken,
        until: Instant,
    },
    /// Stop tracking a lease (its report was acknowledged, or its work was dropped).
    Finish(String),
    /// Cancel a lease's work and stop tracking it.
    Revoke(String),
}

/// What the extender counts.
#[derive(Debug, Default)]
pub(crate) struct ExtenderStats {
    pub(crate) tracked: AtomicUsize,
    pub(crate) extended: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) errors: AtomicU64,
}

struct Tracked {
    cancel: CancellationToken,
    until: Instant,
}

/// The extender's loop, extending every `every` leases held for `lease`; ends when every
/// sender of `commands` is gone.
pub(crate) async fn run(
    client: ControlClient,
    mut commands: mpsc::UnboundedReceiver<Command>,
    (every, lease): (Duration, Duration),
    timers: TimerService,
    stats: Arc<ExtenderStats>,
) {
    let mut leases: HashMap<String, Tracked> = HashMap::new();
    let mut next = Instant::now() + every;
    // The one timer waited on, and its instant.
    let mut wake_at = next;
    let mut wake = Box::pin(timers.sleep_until(wake_at));
    loop {
        let due = leases
            .values()
            .map(|t| t.until)
            .min()
            .map_or(next, |e| e.min(next));
        if due < wake_at {
            wake_at = due;
            wake = Box::pin(timers.sleep_until(wake_at));
        }
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { break };
                match command {
                    Command::Track { lease_id, cancel, until } => {
                        leases.insert(lease_id, Tracked { cancel, until });
                    }
                    Command::Finish(id) => {
                        leases.remove(&id);
                    }
                    Command::Revoke(id) => {
                        if let Some(t) = leases.remove(&id) {
                            t.cancel.cancel();
                        }
                    }
                }
            }
            () = &mut wake => {
                let now = Instant::now();
                if now >= next {
                    next = now + every;
                    if !leases.is_empty() {
                        extend(&client, &mut leases, lease, every, &stats).await;
                    }
                }
                // Waiting next for the extension or the earliest lease, whichever comes first.
                wake_at = leases.values().map(|t| t.until).min().map_or(next, |e| e.min(next));
                wake = Box::pin(timers.sleep_until(wake_at));
            }
        }
        expire(&mut leases, &stats);
        stats.tracked.store(leases.len(), Ordering::Relaxed);
    }
    // The agent is going away: whatever still runs stops.
    for t in leases.into_values() {
        t.cancel.cancel();
    }
    stats.tracked.store(0, Ordering::Relaxed);
}

/// One extension of every tracked lease, within `every` (a slow control plane must not keep
/// the extender from cancelling what runs out).
async fn extend(
    client: &ControlClient,
    leases: &mut HashMap<String, Tracked>,
    lease: Duration,
    every: Duration,
    stats: &ExtenderStats,
) {
    let lease_ids: Vec<String> = leases.keys().cloned().collect();
    let sent = Instant::now();
    let answer = tokio::time::timeout(every, client.extend(&ExtendRequest { lease_ids })).await;
    match answer {
        Ok(Ok(answer)) => {
            let held = if answer.lease_ms > 0 {
                Duration::from_millis(answer.lease_ms)
            } else {
                lease
            };
            for id in &answer.extended {
                if let Some(t) = leases.get_mut(id) {
                    t.until = sent + held;
                }
            }
            stats
                .extended
                .fetch_add(answer.extended.len() as u64, Ordering::Relaxed);
            for id in &answer.lost {
                if let Some(t) = leases.remove(id) {
                    tracing::info!(lease = %id, "lease lost (revoked, or taken over): its work stops");
                    t.cancel.cancel();
                    stats.lost.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(Err(e)) => {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "extending leases failed");
        }
        Err(_) => {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("extending leases timed out");
        }
    }
}

/// Cancels the leases that ran out before they could be extended.
fn expire(leases: &mut HashMap<String, Tracked>, stats: &ExtenderStats) {
    let now = Instant::now();
    leases.retain(|id, t| {
        if t.until > now {
            return true;
        }
        tracing::warn!(lease = %id, "lease ran out before it could be extended: its work stops, unreported");
        t.cancel.cancel();
        stats.expired.fetch_add(1, Ordering::Relaxed);
        false
    });
}
