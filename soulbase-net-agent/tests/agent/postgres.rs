//! Several control-plane instances on one PostgreSQL database (cargo feature `postgres`): a
//! throwaway server from the testkit (skipped, saying so, when PostgreSQL is not installed;
//! a failure when `SOULBASE_REQUIRE_POSTGRES` is set).
#![cfg(feature = "postgres")]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use soulbase_net_agent::control::{AgentState, ControlConfig, ControlPlane};
use soulbase_net_agent::protocol::{CreateTask, TaskState};
use soulbase_net_testkit::PostgresServer;
use tokio::time::Instant;

use super::control::{
    a_stopped_agents_lease_is_returned, beat, client, metric, registered, report, tcp_claim,
    tcp_spec,
};
use super::eventually;

/// Two control planes on the database `url`: leases of `lease`, heartbeats every 200 ms
/// (stale after 600 ms). Started together: each migrates the schema under the advisory
/// lock, once.
async fn two_instances(url: &str, lease: Duration) -> (ControlPlane, ControlPlane) {
    let config = || {
        ControlConfig::default()
            .database(url)
            .lease(lease)
            .heartbeat_every(Duration::from_millis(200))
    };
    let (a, b) = tokio::join!(ControlPlane::start(config()), ControlPlane::start(config()));
    (a.unwrap(), b.unwrap())
}

/// What the agents of the fleet test saw.
#[derive(Default)]
struct Ledger {
    /// The lease each task is held under now, by the agents' account.
    held: HashMap<String, String>,
    /// Two live leases of one task at once: should stay empty.
    doubles: Vec<(String, String, String)>,
    /// Every lease handed out, by task.
    leases: HashMap<String, Vec<String>>,
}

const ONE_OFFS: usize = 200;
const AGENTS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_hand_each_task_to_one_lease_and_record_each_report_once() {
    let Some(pg) = PostgresServer::start_or_skip(
        "two_instances_hand_each_task_to_one_lease_and_record_each_report_once",
    ) else {
        return;
    };
    let url = pg.create_database("control").unwrap();
    let (c1, c2) = two_instances(&url, Duration::from_secs(10)).await;
    // One schema version recorded, however many instances migrated together.
    assert_eq!(
        pg.psql(
            "control",
            "SELECT string_agg(version::text, ',' ORDER BY version) FROM control_migrations"
        )
        .unwrap(),
        "1,2"
    );
    let instances = [&c1, &c2];
    for i in 0..ONE_OFFS {
        instances[i % 2]
            .create_task(CreateTask {
                spec: tcp_spec(),
                every_secs: None,
                id: Some(format!("t{i:03}")),
            })
            .await
            .unwrap();
    }
    let periodic = c2
        .create_task(CreateTask {
            spec: tcp_spec(),
            every_secs: Some(1),
            id: Some("every-second".into()),
        })
        .await
        .unwrap();

    // Agents claiming concurrently, half from each instance, each reporting to the other
    // instance; they beat every 100 ms and claim every 20 ms when given nothing.
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut agents = Vec::new();
    for n in 0..AGENTS {
        let id = format!("agent-{n}");
        let (here, there) = (instances[n % 2], instances[(n + 1) % 2]);
        let claimer = registered(here, &id).await;
        let reporter = client(there, &id, &format!("token-of-{id}"));
        let (ledger, stop) = (ledger.clone(), stop.clone());
        agents.push(tokio::spawn(async move {
            let mut last_beat = Instant::now();
            // Each round reports all it claimed: stopped between rounds, the agents leave
            // nothing claimed unreported, and the counts below are exact.
            while !stop.load(Ordering::Relaxed) {
                if last_beat.elapsed() >= Duration::from_millis(100) {
                    beat(&claimer).await;
                    last_beat = Instant::now();
                }
                let leases = claimer.claim(&tcp_claim(8)).await.unwrap().leases;
                if leases.is_empty() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                {
                    let mut l = ledger.lock();
                    for lease in &leases {
                        if let Some(other) =
                            l.held.insert(lease.task_id.clone(), lease.lease_id.clone())
                        {
                            let double = (lease.task_id.clone(), other, lease.lease_id.clone());
                            l.doubles.push(double);
                        }
                        l.leases
                            .entry(lease.task_id.clone())
                            .or_default()
                            .push(lease.lease_id.clone());
                    }
                }
                for lease in leases {
                    // Released from the ledger before the report: once the report is
                    // recorded, the periodic task may be claimed again (a period later).
                    ledger.lock().held.remove(&lease.task_id);
                    let r = reporter
                        .report(&report(&lease.lease_id, &lease.task_id))
                        .await
                        .unwrap();
                    assert_eq!(r.accepted, vec![lease.lease_id.clone()], "{lease:?}");
                }
            }
        }));
    }

    // Every one-off done, and the periodic task run for four periods (or an agent failed).
    eventually("the fleet's work done", Duration::from_secs(60), || async {
        if agents.iter().any(|a| a.is_finished()) {
            return Some(());
        }
        let runs = c1.results(&periodic, 100).await.unwrap().len();
        let l = ledger.lock();
        let one_offs = l.leases.keys().filter(|t| t.starts_with('t')).count();
        (one_offs == ONE_OFFS && runs >= 5).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for agent in agents {
        // An agent's failed assertion fails the test here.
        tokio::time::timeout(Duration::from_secs(20), agent)
            .await
            .expect("the agents stop")
            .unwrap();
    }
    let elapsed = started.elapsed();

    let ledger = std::mem::take(&mut *ledger.lock());
    assert!(
        ledger.doubles.is_empty(),
        "two leases of one task at once: {:?}",
        ledger.doubles
    );
    // Each one-off task: one lease, one result, done — read through either instance.
    for i in 0..ONE_OFFS {
        let id = format!("t{i:03}");
        let leases = &ledger.leases[&id];
        assert_eq!(leases.len(), 1, "task {id} leased once: {leases:?}");
        let v = instances[(i + 1) % 2].task(&id).await.unwrap().unwrap();
        assert_eq!(
            (v.state, v.claims, v.results),
            (TaskState::Done, 1, 1),
            "{id}"
        );
    }

    // A report sent again, to either instance, is acknowledged and never stored twice.
    let (t0, l0) = ("t000", ledger.leases["t000"][0].clone());
    let holder = c1.results(t0, 10).await.unwrap()[0].agent_id.clone();
    for control in instances {
        let again = client(control, &holder, &format!("token-of-{holder}"))
            .report(&report(&l0, t0))
            .await
            .unwrap();
        assert_eq!(again.accepted, vec![l0.clone()]);
    }
    assert_eq!(c2.results(t0, 10).await.unwrap().len(), 1);

    // The periodic task: once per period across both instances — never two runs within a
    // second of each other (the next run is due a period after a report, on the database's
    // clock), and never a period skipped (a run within the period plus a claim interval and
    // room for a loaded machine).
    let runs = c1.results(&periodic, 100).await.unwrap();
    let mut at: Vec<i64> = runs.iter().map(|r| r.reported_at_ms).collect();
    at.reverse();
    let gaps: Vec<i64> = at.windows(2).map(|w| w[1] - w[0]).collect();
    println!(
        "{} one-off tasks and {} periodic runs by {AGENTS} agents on two instances in {elapsed:?}; periodic gaps {gaps:?} ms",
        ONE_OFFS,
        runs.len()
    );
    assert!(gaps.iter().all(|g| *g >= 1000), "{gaps:?}");
    assert!(gaps.iter().all(|g| *g <= 1600), "{gaps:?}");
    let distinct: HashSet<&str> = runs.iter().map(|r| r.lease_id.as_str()).collect();
    assert_eq!(distinct.len(), runs.len(), "one lease per run");
    assert_eq!(
        ledger.leases[&periodic].len(),
        runs.len(),
        "a lease per run"
    );

    // The instances' counters add up to the leases handed out.
    let handed: usize = ledger.leases.values().map(Vec::len).sum();
    let counted = metric(&c1, "agent_control_leases_total").await
        + metric(&c2, "agent_control_leases_total").await;
    assert_eq!(counted as usize, handed);
    let per_instance: BTreeMap<&str, u64> = BTreeMap::from([
        ("c1", metric(&c1, "agent_control_leases_total").await),
        ("c2", metric(&c2, "agent_control_leases_total").await),
    ]);
    assert!(
        per_instance.values().all(|n| *n > 0),
        "both claimed: {per_instance:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_agents_lease_is_returned_across_two_instances() {
    let Some(pg) =
        PostgresServer::start_or_skip("a_stopped_agents_lease_is_returned_across_two_instances")
    else {
        return;
    };
    let url = pg.create_database("control").unwrap();
    let (c1, c2) = two_instances(&url, Duration::from_secs(10)).await;
    let took = a_stopped_agents_lease_is_returned(&[&c1, &c2], Duration::from_millis(600)).await;
    println!("a stopped agent's lease taken over at the other instance {took:?} after its last heartbeat (stale after 600 ms)");
    // A heartbeat at one instance is seen at the other.
    beat(&client(&c2, "stopper", "token-of-stopper")).await;
    let stopper = c1
        .agents()
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.agent_id == "stopper")
        .unwrap();
    assert_eq!(
        stopper.state,
        AgentState::Live,
        "it beat again: {stopper:?}"
    );
    assert_eq!(stopper.leases, 1, "the fresh task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_url_picks_the_engine() {
    let Some(pg) = PostgresServer::start_or_skip("the_database_url_picks_the_engine") else {
        return;
    };
    let url = pg.create_database("control").unwrap();
    let control = ControlPlane::start(ControlConfig::default().database(url.as_str()))
        .await
        .unwrap();
    super::task(&control, "on-pg", tcp_spec()).await;
    control.shutdown().await;
    // The task is in PostgreSQL, not in a file named like the URL.
    assert_eq!(pg.psql("control", "SELECT id FROM tasks").unwrap(), "on-pg");
    // A URL whose credentials are wrong fails, without showing them.
    let wrong = url.replace("soulbase@", "nobody:hunter2@");
    let config = ControlConfig::default().database(wrong.as_str());
    assert!(!format!("{config:?}").contains("hunter2"));
    let err = ControlPlane::start(config).await.unwrap_err();
    assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    // An unknown scheme is refused.
    let err = ControlPlane::start(ControlConfig::default().database("mysql://db/control"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), soulbase_net_core::ErrorKind::InvalidRequest);
}
