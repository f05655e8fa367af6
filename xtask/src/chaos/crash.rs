//! The outbox crash loop of `cargo xtask chaos`: a worker *process* (`xtask outbox-worker`)
//! delivering a SQLite outbox to a loopback receiver is killed with SIGKILL at seeded moments
//! — each after a seeded number of deliveries seen at the receiver — and started again each
//! time, until nothing is pending. Then what the receiver applied (deduplicating by
//! `Idempotency-Key`, as a real one would) says whether an item was lost or applied twice.
//!
//! Why a process and SIGKILL: a crash is what the outbox's durability is for, and only a
//! process killed without warning leaves claims half-done (items delivered but not yet
//! acknowledged come back after their lease, and arrive again: the copies on the wire that the
//! receiver's dedup absorbs).

use std::{path::PathBuf, process::Stdio, time::Duration};

use serde_json::{json, Value};
use soulbase_net_core::NetError;
use soulbase_net_outbox::OutboxStore;
use soulbase_net_testkit::{FaultServer, RandomFaults, Reply};
use tokio::{process::Command, time::Instant};

use crate::{
    outbox_kit::{self, Applied, TempDir},
    table::{row, Row},
};

/// The receiver's path.
const PATH: &str = "/effect";
/// Deliveries the worker process has in flight at once (`xtask outbox-worker`'s `workers`).
const WORKER_IN_FLIGHT: usize = 16;
/// At most this many items can be delivered but not acknowledged when the worker is killed:
/// those in flight, those whose acknowledgement waits, and those in the commit under way
/// (the outbox commits acknowledgements in batches of up to `workers`).
const UNACKED_AT_KILL: usize = 3 * WORKER_IN_FLIGHT;

/// How big a crash loop is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    /// Items in the outbox.
    pub(crate) items: usize,
    /// Worker processes killed before the last one is let finish.
    pub(crate) kills: u32,
    /// Seeds the kill moments.
    pub(crate) seed: u64,
    /// The loop fails (rather than hangs) past this.
    pub(crate) within: Duration,
}

impl Plan {
    /// The loop of `cargo xtask chaos`: 500 items and 3 kills, bounded by 60 s. It takes a
    /// few seconds (about 2.5 s here: the last worker waits out the lease, 2 s, of the claims
    /// the last killed one held), whatever `--secs` says, so CI's short run keeps it whole.
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            items: 500,
            kills: 3,
            seed,
            within: Duration::from_secs(60),
        }
    }

    /// How many deliveries the `k`th worker makes (as seen at the receiver) before its kill:
    /// seeded, between 5 % of the items and an equal share of them, so every worker delivers
    /// something and the last one has work left.
    fn kill_after(&self, k: u32) -> u64 {
        let items = self.items as u64;
        let lo = (items / 20).max(1);
        let hi = (items / u64::from(self.kills + 1)).max(lo + 1);
        let draw = RandomFaults::seeded(self.seed ^ 0x0B0C_5EED).draw(u64::from(k));
        lo + ((hi - lo) as f64 * draw) as u64
    }
}

/// Starts one worker process on the outbox at `db` that gives up after `secs`.
pub(crate) type StartWorker<'a> = &'a (dyn Fn(&str, Duration) -> Command + Sync);

/// `xtask outbox-worker --db DB --secs S` of `program` (a copy of the running xtask).
pub(crate) fn xtask_worker(program: PathBuf) -> impl Fn(&str, Duration) -> Command + Sync {
    move |db, secs| {
        let mut cmd = Command::new(&program);
        cmd.args(["outbox-worker", "--db", db, "--secs"])
            .arg(format!("{:.1}", secs.as_secs_f64()));
        cmd
    }
}

/// What one crash loop did.
#[derive(Debug)]
pub(crate) struct CrashRun {
    plan: Plan,
    /// Per killed worker: the deliveries seen at the receiver from its start to its kill.
    pub(crate) kills: Vec<u64>,
    /// What the receiver applied.
    pub(crate) applied: Applied,
    /// Dead letters left in the outbox.
    pub(crate) dead: usize,
    /// Items still pending at the end.
    pub(crate) pending: u64,
    /// The whole loop, from filling the outbox to the last worker's exit.
    pub(crate) took: Duration,
    /// Why the loop did not run to its end (a worker stuck, or gone by itself), if so.
    pub(crate) failure: Option<String>,
}

/// Fills an outbox with `plan.items` items, then kills worker processes (started by `start`)
/// `plan.kills` times and lets the last one drain it.
///
/// # Errors
/// Only when the loop cannot be set up (the receiver, the database, a process that does not
/// start); a loop that breaks a promise is a failed row of [`CrashRun::rows`].
pub(crate) async fn crash_loop(plan: Plan, start: StartWorker<'_>) -> Result<CrashRun, String> {
    let started = Instant::now();
    let deadline = started + plan.within;
    let left = || deadline.saturating_duration_since(Instant::now());
    let srv = FaultServer::http1()
        .route(PATH, Reply::ok("applied"))
        .start()
        .await
        .map_err(|e| format!("outbox crash loop: receiver: {e}"))?;
    let dir = TempDir::new("chaos-outbox")?;
    let db = dir.file("outbox.db");
    let store = outbox_kit::fill(&db, &srv.url(PATH), plan.items).await?;
    let mut kills = Vec::new();
    let mut failure = None;
    for k in 0..plan.kills {
        let base = srv.hits(PATH);
        let n = plan.kill_after(k);
        let mut worker = spawn(start, &db, left())?;
        let reached = tokio::time::timeout(left(), srv.wait_for_hits(PATH, base + n)).await;
        // Gone by itself before its kill: a worker that crashed, not the one we killed.
        if let Ok(Some(status)) = worker.try_wait() {
            failure = Some(format!("worker {} exited by itself ({status})", k + 1));
            break;
        }
        worker
            .kill()
            .await
            .map_err(|e| format!("outbox crash loop: SIGKILL: {e}"))?;
        if reached.is_err() {
            failure = Some(format!(
                "worker {} made {} of its {n} deliveries within {:.0}s",
                k + 1,
                srv.hits(PATH) - base,
                plan.within.as_secs_f64()
            ));
            break;
        }
        kills.push(srv.hits(PATH) - base);
    }
    if failure.is_none() {
        failure = finish(start, &db, &*store, left()).await?;
    }
    let applied = Applied::of(&srv.requests(PATH));
    let dead = store.dead_letters().await.map_err(store_err)?.len();
    let pending = store.pending().await.map_err(store_err)?;
    srv.join().await;
    Ok(CrashRun {
        plan,
        kills,
        applied,
        dead,
        pending,
        took: started.elapsed(),
        failure,
    })
}

/// The last worker, left alone: it drains the outbox (the dead workers' claims come back
/// after their lease) and exits by itself. `Some(why)` when it does not, within `left`.
async fn finish(
    start: StartWorker<'_>,
    db: &str,
    store: &dyn OutboxStore,
    left: Duration,
) -> Result<Option<String>, String> {
    let until = Instant::now() + left;
    let mut worker = spawn(start, db, left)?;
    if let Err(why) = outbox_kit::drained(store, left).await {
        return Ok(Some(format!("the last worker: {why}")));
    }
    let rest = until.saturating_duration_since(Instant::now());
    Ok(match tokio::time::timeout(rest, worker.wait()).await {
        Ok(Ok(status)) if status.success() => None,
        Ok(Ok(status)) => Some(format!("the last worker ended with {status}")),
        Ok(Err(e)) => Some(format!("the last worker: {e}")),
        Err(_) => Some("the last worker drained the outbox but did not exit".to_owned()),
    })
}

/// Starts a worker; it is killed if dropped (an early return never leaves one running).
fn spawn(
    start: StartWorker<'_>,
    db: &str,
    secs: Duration,
) -> Result<tokio::process::Child, String> {
    start(db, secs)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("outbox crash loop: starting a worker: {e}"))
}

fn store_err(e: NetError) -> String {
    format!("outbox crash loop: the store: {e}")
}

impl CrashRun {
    /// One line for the report.
    pub(crate) fn line(&self) -> String {
        let a = &self.applied;
        format!(
            "outbox crash loop: {} items, {} SIGKILLs (after {} deliveries), restarted each time; {}/{} items applied, {} effects, {} duplicates on the wire, {} dead, {} pending, in {:.1}s{}",
            self.plan.items,
            self.kills.len(),
            self.kill_list(),
            a.items,
            self.plan.items,
            a.effects,
            a.duplicates_on_wire(),
            self.dead,
            self.pending,
            self.took.as_secs_f64(),
            self.failure
                .as_ref()
                .map_or(String::new(), |f| format!("; FAILED: {f}"))
        )
    }

    fn kill_list(&self) -> String {
        if self.kills.is_empty() {
            return "-".to_owned();
        }
        let each: Vec<String> = self.kills.iter().map(u64::to_string).collect();
        each.join(", ")
    }

    /// The loop's invariants, as rows of the chaos table.
    pub(crate) fn rows(&self) -> Vec<Row> {
        let (a, items) = (&self.applied, self.plan.items);
        vec![
            row(
                "chaos.outbox_crash_loop",
                format!(
                    "{} SIGKILLs at seeded moments, restarted until drained, < {:.0}s",
                    self.plan.kills,
                    self.plan.within.as_secs_f64()
                ),
                match &self.failure {
                    None => format!(
                        "{} kills (after {} deliveries), drained in {:.1}s",
                        self.kills.len(),
                        self.kill_list(),
                        self.took.as_secs_f64()
                    ),
                    Some(why) => why.clone(),
                },
                self.failure.is_none() && self.kills.len() == self.plan.kills as usize,
            ),
            row(
                "chaos.outbox_lost",
                format!("{items}/{items} items at the receiver"),
                format!("{}/{items}", a.items),
                a.items == items,
            ),
            row(
                "chaos.outbox_effects_once",
                "each item applied once (dedup by key)",
                format!(
                    "{} effects, {} twice, {} keys shared; {} copies on the wire",
                    a.effects,
                    a.duplicated_effects(),
                    a.shared_keys,
                    a.duplicates_on_wire()
                ),
                a.duplicated_effects() == 0 && a.shared_keys == 0 && a.effects == items,
            ),
            row(
                "chaos.outbox_dead_letters",
                "0 dead letters, 0 pending",
                format!("{} dead, {} pending", self.dead, self.pending),
                self.dead == 0 && self.pending == 0,
            ),
        ]
    }

    /// The figures, for `--json`.
    pub(crate) fn json(&self) -> Value {
        json!({
            "items": self.plan.items,
            "kills": self.kills,
            "items_applied": self.applied.items,
            "effects": self.applied.effects,
            "duplicated_effects": self.applied.duplicated_effects(),
            "duplicates_on_wire": self.applied.duplicates_on_wire(),
            "max_duplicates_on_wire": UNACKED_AT_KILL * self.kills.len(),
            "dead": self.dead,
            "pending": self.pending,
            "secs": self.took.as_secs_f64(),
            "failure": self.failure,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `outbox-worker` arguments of the test binary started as a worker process.
    const WORKER_ARGS: &str = "XTASK_CHAOS_WORKER_ARGS";

    /// Not a check: the worker process of the loop's test below. A unit test has no `xtask`
    /// binary to start, so the test binary starts itself running only this test, with
    /// `outbox-worker`'s arguments in `XTASK_CHAOS_WORKER_ARGS`; run by `cargo test` without
    /// them, it returns at once.
    #[test]
    fn outbox_worker_process() {
        if let Ok(args) = std::env::var(WORKER_ARGS) {
            let args: Vec<String> = args.split('\n').map(str::to_owned).collect();
            crate::outbox::worker(&args).expect("the worker delivers");
        }
    }

    /// What [`xtask_worker`] starts, in the test binary: `outbox-worker --db DB --secs S`.
    fn this_test_binary(db: &str, secs: Duration) -> Command {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut cmd = Command::new(exe);
        cmd.args([
            "chaos::crash::tests::outbox_worker_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            WORKER_ARGS,
            format!("--db\n{db}\n--secs\n{:.1}", secs.as_secs_f64()),
        );
        cmd
    }

    #[test]
    fn kill_moments_are_seeded_and_leave_work_for_the_last_worker() {
        let plan = Plan::new(7);
        let moments: Vec<u64> = (0..plan.kills).map(|k| plan.kill_after(k)).collect();
        assert_eq!(
            moments,
            (0..plan.kills)
                .map(|k| plan.kill_after(k))
                .collect::<Vec<_>>()
        );
        assert!(
            moments.iter().all(|&n| (25..125).contains(&n)),
            "{moments:?}"
        );
        assert!(moments.iter().sum::<u64>() < plan.items as u64);
        let other = Plan::new(8);
        assert_ne!(
            moments,
            (0..plan.kills)
                .map(|k| other.kill_after(k))
                .collect::<Vec<_>>()
        );
    }

    /// Three SIGKILLs of a worker process: every item applied once, none dead, and the copies
    /// on the wire no more than the deliveries unacknowledged at the kills.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_killed_three_times_loses_nothing_and_applies_each_item_once() {
        let _turn = crate::HEAVY.lock().await;
        let plan = Plan::new(0x5EED_0010);
        let run = crash_loop(plan, &this_test_binary)
            .await
            .expect("the loop sets up");
        eprintln!("{}", run.line());
        let broken: Vec<_> = run.rows().into_iter().filter(|r| !r.passed).collect();
        assert!(broken.is_empty(), "{broken:?}\n{}", run.line());
        assert_eq!(run.kills.len(), 3);
        assert_eq!(run.applied.items, plan.items);
        assert!(
            run.applied.duplicates_on_wire() <= UNACKED_AT_KILL * run.kills.len(),
            "{}",
            run.line()
        );
    }
}
