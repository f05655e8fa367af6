//! The reporter: sends finished leases' reports in batches, retried until the control plane
//! acknowledges them, then tells the extender to stop tracking them.
//!
//! Until then the extender keeps their leases alive, so a report held up by a slow control
//! plane does not let its lease run out. A report whose lease is lost meanwhile (cancelled by
//! the extender) is dropped, not sent: another agent may hold the task by now, and the
//! control plane would refuse it anyway.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use soulbase_net_runtime::CancellationToken;
use tokio::sync::mpsc;

use super::backoff::Backoff;
use super::client::ControlClient;
use super::extender::Command;
use crate::protocol::{LeaseReport, ReportRequest};

/// The most reports in one request.
const MAX_BATCH: usize = 100;

/// A finished lease's report, and the token that says its lease was lost.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) report: LeaseReport,
    pub(crate) cancel: CancellationToken,
}

/// What the reporter counts.
#[derive(Debug, Default)]
pub(crate) struct ReporterStats {
    pub(crate) accepted: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) errors: AtomicU64,
}

/// The reporter's loop; ends when every sender of `reports` is gone and all is sent.
pub(crate) async fn run(
    client: ControlClient,
    mut reports: mpsc::UnboundedReceiver<Pending>,
    extender: mpsc::UnboundedSender<Command>,
    backoff: (Duration, Duration),
    stats: Arc<ReporterStats>,
) {
    while let Some(first) = reports.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match reports.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let mut wait = Backoff::new(backoff.0, backoff.1);
        loop {
            batch.retain(|p| {
                let lost = p.cancel.is_cancelled();
                if lost {
                    tracing::info!(lease = %p.report.lease_id, "report dropped: its lease was lost");
                    stats.dropped.fetch_add(1, Ordering::Relaxed);
                    let _ = extender.send(Command::Finish(p.report.lease_id.clone()));
                }
                !lost
            });
            if batch.is_empty() {
                break;
            }
            let request = ReportRequest {
                reports: batch.iter().map(|p| p.report.clone()).collect(),
            };
            match client.report(&request).await {
                Ok(answer) if answer.acknowledged => {
                    for id in &answer.refused {
                        tracing::warn!(lease = %id, "report refused: the lease is no longer this agent's");
                    }
                    stats
                        .accepted
                        .fetch_add(answer.accepted.len() as u64, Ordering::Relaxed);
                    stats
                        .refused
                        .fetch_add(answer.refused.len() as u64, Ordering::Relaxed);
                    for p in &batch {
                        let _ = extender.send(Command::Finish(p.report.lease_id.clone()));
                    }
                    break;
                }
                Ok(_) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("report not acknowledged; retrying");
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "report failed; retrying");
                }
            }
            tokio::time::sleep(wait.next_delay()).await;
        }
    }
}
