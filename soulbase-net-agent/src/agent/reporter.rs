//! The reporter: sends finished leases' reports in batches, retried until the control plane
//! acknowledges them, then tells the extender to stop tracking them.
//!
//! Until then the extender keeps their leases alive, so a report held up by a slow control
//! plane does not let its lease run out. A report whose lease is lost meanwhile (cancelled by
//! the extender) is dropped, not sent: another agent may hold the task by now, and the
//! control plane would refuse it anyway.
//!
//! Its back-off between attempts waits on the agent's timer service, as the claim loop's,
//! the heartbeat's and the extender's waits do: a starved runtime shows in the timers' lag.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use soulbase_net_runtime::CancellationToken;
use tokio::sync::mpsc;

use super::backoff::Backoff;
use super::client::ControlClient;
use super::extender::Command;
use super::timer::TimerService;
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

/// The reporter's loop; ends when every sender of `reports` is gone and all is sent. A failed
/// or unacknowledged batch is sent again after a back-off from `backoff.0` doubling to
/// `backoff.1`, waited on `timers`.
pub(crate) async fn run(
    client: ControlClient,
    mut reports: mpsc::UnboundedReceiver<Pending>,
    extender: mpsc::UnboundedSender<Command>,
    backoff: (Duration, Duration),
    timers: TimerService,
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
            timers.sleep(wait.next_delay()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AgentConfig;
    use crate::protocol::ReportStatus;
    use tokio::time::Instant;

    #[tokio::test]
    async fn a_failed_report_waits_on_the_timer_service_before_it_is_sent_again() {
        // A port with nothing on it: every report fails at once.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let config = AgentConfig::new(format!("http://127.0.0.1:{port}"), "agent-1", "token");
        let client = ControlClient::new(&config).unwrap();
        let (timers, driver) = TimerService::new();
        let driver = tokio::spawn(driver);
        let (reports, rx) = mpsc::unbounded_channel();
        let (extender, _commands) = mpsc::unbounded_channel();
        let stats = Arc::new(ReporterStats::default());
        let ms = Duration::from_millis;
        let reporter = tokio::spawn(run(
            client,
            rx,
            extender,
            (ms(5), ms(10)),
            timers.clone(),
            stats.clone(),
        ));
        reports
            .send(Pending {
                report: LeaseReport {
                    lease_id: "l1".into(),
                    task_id: "t1".into(),
                    status: ReportStatus::Ok,
                    observations: Vec::new(),
                    error: None,
                },
                cancel: CancellationToken::new(),
            })
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.errors.load(Ordering::Relaxed) < 3 {
            assert!(Instant::now() < deadline, "the report was not retried");
            tokio::time::sleep(ms(5)).await;
        }
        // Each attempt after the first came after a back-off fired by the timer service.
        assert!(timers.stats().fired.load(Ordering::Relaxed) >= 2);
        assert_eq!(stats.accepted.load(Ordering::Relaxed), 0);
        reporter.abort();
        driver.abort();
    }
}
