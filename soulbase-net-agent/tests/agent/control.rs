use std::collections::BTreeMap;
use std::time::Duration;

use soulbase_net_agent::agent::{AgentConfig, ControlClient};
use soulbase_net_agent::control::{AgentList, AgentState, ControlConfig, ControlPlane};
use soulbase_net_agent::protocol::{
    ClaimRequest, ExtendRequest, HeartbeatRequest, LeaseReport, Observation, RegisterRequest,
    ReportRequest, ReportStatus, TaskKind, TaskSpec, TaskState, TaskView,
};
use soulbase_net_core::{ErrorKind, NetRequest};

use super::{control_plane, eventually, loopback_client, task};

pub(super) fn client(control: &ControlPlane, id: &str, token: &str) -> ControlClient {
    ControlClient::new(&AgentConfig::new(control.url(), id, token)).unwrap()
}

pub(super) async fn registered(control: &ControlPlane, id: &str) -> ControlClient {
    let c = client(control, id, &format!("token-of-{id}"));
    c.register(&register()).await.unwrap();
    c
}

/// A heartbeat: what keeps an agent live (its leases kept, its claims answered).
pub(super) async fn beat(agent: &ControlClient) {
    agent.heartbeat(&HeartbeatRequest::default()).await.unwrap();
}

fn register() -> RegisterRequest {
    RegisterRequest {
        version: "test".into(),
        kinds: vec![TaskKind::Tcp],
        max_inflight: 4,
        hostname: None,
    }
}

pub(super) fn tcp_claim(n: u32) -> ClaimRequest {
    ClaimRequest {
        capacity: BTreeMap::from([(TaskKind::Tcp, n)]),
    }
}

pub(super) fn report(lease_id: &str, task_id: &str) -> ReportRequest {
    ReportRequest {
        reports: vec![LeaseReport {
            lease_id: lease_id.into(),
            task_id: task_id.into(),
            status: ReportStatus::Ok,
            observations: vec![Observation::with_unit("connect_ms", 0.25, "ms")],
            error: None,
        }],
    }
}

pub(super) fn tcp_spec() -> TaskSpec {
    TaskSpec::Tcp {
        host: "127.0.0.1".into(),
        port: 9,
        timeout_ms: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_binds_the_token_and_resumes_with_it() {
    let control = control_plane(Duration::from_secs(10)).await;
    let first = client(&control, "a1", "first-token");
    let r = first.register(&register()).await.unwrap();
    assert_eq!((r.session, r.resumed), (1, false));
    assert_eq!(r.lease_ms, 10_000);
    let again = first.register(&register()).await.unwrap();
    assert_eq!((again.session, again.resumed), (2, true));

    // Another token for the same id: refused, and it cannot claim either.
    let impostor = client(&control, "a1", "other-token");
    let err = impostor.register(&register()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked);
    let err = impostor.claim(&tcp_claim(1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked);
    // Nor can an agent never registered.
    let stranger = client(&control, "a9", "stranger-token");
    assert_eq!(
        stranger.claim(&tcp_claim(1)).await.unwrap_err().kind(),
        ErrorKind::Blocked
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_or_foreign_report_changes_nothing_and_a_task_is_done_once() {
    let control = control_plane(Duration::from_millis(300)).await;
    let a1 = registered(&control, "a1").await;
    let a2 = registered(&control, "a2").await;
    let id = task(&control, "t1", tcp_spec()).await;

    let first = a1.claim(&tcp_claim(5)).await.unwrap().leases;
    assert_eq!(first.len(), 1);
    let l1 = first[0].lease_id.clone();
    assert_eq!(first[0].attempt, 1);
    // Held: nothing for a2.
    assert!(a2.claim(&tcp_claim(5)).await.unwrap().leases.is_empty());

    // a1 stops extending; the lease runs out on the store's clock and a2 takes the task.
    let second = eventually("a2 takes the task", Duration::from_secs(5), || async {
        beat(&a2).await;
        let leases = a2.claim(&tcp_claim(5)).await.unwrap().leases;
        (!leases.is_empty()).then_some(leases)
    })
    .await;
    let l2 = second[0].lease_id.clone();
    assert_ne!(l1, l2, "a new lease, under a new token");
    assert_eq!(second[0].attempt, 2);

    // a1's extension and report come too late: refused, nothing recorded.
    let ext = a1
        .extend(&ExtendRequest {
            lease_ids: vec![l1.clone()],
        })
        .await
        .unwrap();
    assert_eq!(ext.lost, vec![l1.clone()]);
    let stale = a1.report(&report(&l1, &id)).await.unwrap();
    assert!(stale.acknowledged);
    assert_eq!(stale.refused, vec![l1.clone()]);
    // a1 cannot report a2's lease either (foreign).
    let foreign = a1.report(&report(&l2, &id)).await.unwrap();
    assert_eq!(foreign.refused, vec![l2.clone()]);
    assert!(control.results(&id, 10).await.unwrap().is_empty());

    // a2's report is recorded, once, however often it is sent.
    let ok = a2.report(&report(&l2, &id)).await.unwrap();
    assert_eq!(ok.accepted, vec![l2.clone()]);
    let again = a2.report(&report(&l2, &id)).await.unwrap();
    assert_eq!(
        again.accepted,
        vec![l2.clone()],
        "a repeated report is acknowledged"
    );
    let results = control.results(&id, 10).await.unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].agent_id, "a2");
    let view = control.task(&id).await.unwrap().unwrap();
    assert_eq!(view.state, TaskState::Done);
    assert_eq!((view.claims, view.results), (2, 1));
    // Done: never claimed again (by a live agent, which would be given a due task).
    beat(&a1).await;
    assert!(a1.claim(&tcp_claim(5)).await.unwrap().leases.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_is_lost_at_its_next_extension_and_its_report_refused() {
    let control = control_plane(Duration::from_secs(10)).await;
    let a1 = registered(&control, "a1").await;
    let id = task(&control, "t1", tcp_spec()).await;
    let lease = a1.claim(&tcp_claim(1)).await.unwrap().leases.remove(0);
    let view = control.task(&id).await.unwrap().unwrap();
    assert_eq!(view.state, TaskState::Leased);
    assert_eq!(view.lease_id.as_deref(), Some(lease.lease_id.as_str()));

    assert!(control.revoke(&lease.lease_id).await.unwrap());
    assert!(!control.revoke(&lease.lease_id).await.unwrap(), "once");
    let ext = a1
        .extend(&ExtendRequest {
            lease_ids: vec![lease.lease_id.clone()],
        })
        .await
        .unwrap();
    assert_eq!(ext.lost, vec![lease.lease_id.clone()]);
    let r = a1.report(&report(&lease.lease_id, &id)).await.unwrap();
    assert_eq!(r.refused, vec![lease.lease_id.clone()]);
    // The task is due again, under a new lease.
    beat(&a1).await;
    let again = a1.claim(&tcp_claim(1)).await.unwrap().leases;
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].lease_id, lease.lease_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_task_is_due_again_a_period_after_its_report() {
    let control = control_plane(Duration::from_secs(10)).await;
    let a1 = registered(&control, "a1").await;
    let id = control
        .create_task(soulbase_net_agent::protocol::CreateTask {
            spec: tcp_spec(),
            every_secs: Some(1),
            id: None,
        })
        .await
        .unwrap();
    let lease = a1.claim(&tcp_claim(1)).await.unwrap().leases.remove(0);
    a1.report(&report(&lease.lease_id, &id)).await.unwrap();
    let view = control.task(&id).await.unwrap().unwrap();
    assert_eq!(view.state, TaskState::Pending);
    assert_eq!(view.every_secs, Some(1));
    // Not due at once.
    assert!(a1.claim(&tcp_claim(1)).await.unwrap().leases.is_empty());
    let start = tokio::time::Instant::now();
    let next = eventually("the next run is due", Duration::from_secs(5), || async {
        // The agent beats as it waits: past the stale threshold (600 ms here) a silent one
        // is given nothing.
        beat(&a1).await;
        let leases = a1.claim(&tcp_claim(1)).await.unwrap().leases;
        (!leases.is_empty()).then_some(leases)
    })
    .await;
    let waited = start.elapsed();
    assert!(
        waited <= Duration::from_millis(1500),
        "due after {waited:?}"
    );
    assert_eq!(next[0].attempt, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_api_over_http_needs_the_admin_token() {
    let control = ControlPlane::start(ControlConfig::default().admin_token("admin-secret"))
        .await
        .unwrap();
    let http = loopback_client();
    let body =
        serde_json::json!({"spec": {"kind": "tcp", "host": "127.0.0.1", "port": 9}, "id": "t1"});

    let refused = http
        .send(
            NetRequest::post(format!("{}/v1/tasks", control.url()))
                .json(&body)
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(refused.status.as_u16(), 403);
    assert!(
        control.task("t1").await.unwrap().is_none(),
        "nothing stored"
    );

    let created = http
        .send(
            NetRequest::post(format!("{}/v1/tasks", control.url()))
                .header("authorization", "Bearer admin-secret")
                .json(&body)
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(created.status.as_u16(), 201);
    let created: serde_json::Value = created.json().await.unwrap();
    assert_eq!(created["task_id"], "t1");

    let view = http
        .send(
            NetRequest::get(format!("{}/v1/tasks/t1", control.url()))
                .header("authorization", "Bearer admin-secret"),
        )
        .await
        .unwrap();
    assert_eq!(view.status.as_u16(), 200);
    let view: TaskView = view.json().await.unwrap();
    assert_eq!(view.state, TaskState::Pending);

    let metrics = http
        .send(NetRequest::get(format!("{}/metrics", control.url())))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("agent_control_tasks{state=\"pending\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("agent_control_unauthorized_total 1"),
        "{metrics}"
    );
    let health = http
        .send(NetRequest::get(format!("{}/health", control.url())))
        .await
        .unwrap();
    assert_eq!(health.status.as_u16(), 200);

    let cancelled = http
        .send(
            NetRequest::new(
                soulbase_net_core::http::Method::DELETE,
                format!("{}/v1/tasks/t1", control.url()),
            )
            .header("authorization", "Bearer admin-secret"),
        )
        .await
        .unwrap();
    assert_eq!(cancelled.status.as_u16(), 200);
    assert_eq!(
        control.task("t1").await.unwrap().unwrap().state,
        TaskState::Cancelled
    );
    let results = http
        .send(
            NetRequest::get(format!("{}/v1/tasks/t1/results?limit=5", control.url()))
                .header("authorization", "Bearer admin-secret"),
        )
        .await
        .unwrap();
    let results: serde_json::Value = results.json().await.unwrap();
    assert_eq!(results["results"], serde_json::json!([]));
}

/// The value of the metric line `name` (a counter or an unlabelled gauge) at `control`.
pub(super) async fn metric(control: &ControlPlane, name: &str) -> u64 {
    let http = loopback_client();
    let text = http
        .send(NetRequest::get(format!("{}/metrics", control.url())))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in {text}"))
}

/// The agents `control` serves over HTTP (`GET /v1/agents`).
async fn agents_over_http(control: &ControlPlane) -> AgentList {
    let http = loopback_client();
    let res = http
        .send(NetRequest::get(format!("{}/v1/agents", control.url())))
        .await
        .unwrap();
    assert_eq!(res.status.as_u16(), 200);
    res.json().await.unwrap()
}

/// An agent holding a lease stops beating; another, beating, takes the task once the first is
/// stale (`stale_after` after its last heartbeat), within a sweep's period (a quarter of it)
/// and one claim interval (10 ms) of that; the stopped agent's late extension and report are
/// refused, it is served as stale and given nothing until it beats again; each stale agent
/// and each returned lease is counted once across `instances`. The stopped agent claims from
/// `instances[0]`, the other from the last one; with one instance, that is the same. How
/// long after the stopped agent's last heartbeat the other took its task.
pub(super) async fn a_stopped_agents_lease_is_returned(
    instances: &[&ControlPlane],
    stale_after: Duration,
) -> Duration {
    let (first, last) = (instances[0], instances[instances.len() - 1]);
    let stopper = registered(first, "stopper").await;
    let stopper_elsewhere = client(last, "stopper", "token-of-stopper");
    let beater = registered(last, "beater").await;
    // The other agent beats all along, every 100 ms, until the test ends (a failed beat is
    // not fatal here: it shows as that agent given nothing below).
    let beating = {
        let beater = client(last, "beater", "token-of-beater");
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(100));
            loop {
                every.tick().await;
                let _ = beater.heartbeat(&HeartbeatRequest::default()).await;
            }
        })
    };
    // Stopped with the test, also when an assertion fails first.
    struct Abort(tokio::task::JoinHandle<()>);
    impl Drop for Abort {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _beating = Abort(beating);
    let id = task(first, "held", tcp_spec()).await;
    let last_beat = tokio::time::Instant::now();
    beat(&stopper).await;
    let held = stopper.claim(&tcp_claim(1)).await.unwrap().leases;
    assert_eq!(held.len(), 1, "the live agent is given the task");
    let l1 = held[0].lease_id.clone();
    assert!(
        beater.claim(&tcp_claim(1)).await.unwrap().leases.is_empty(),
        "held by a live agent: nothing for the other"
    );

    // The stopper beats no more (and extends nothing): its lease comes back once it is stale.
    let taken = eventually(
        "the other agent takes the stopped agent's task",
        stale_after * 4,
        || async {
            let leases = beater.claim(&tcp_claim(1)).await.unwrap().leases;
            (!leases.is_empty()).then_some(leases)
        },
    )
    .await;
    let took = last_beat.elapsed();
    let lease_ms = taken[0].lease_ms;
    assert!(
        took >= stale_after - Duration::from_millis(20),
        "returned only once stale: {took:?}"
    );
    // The threshold, a sweep's period, a claim interval, and room for a loaded machine; far
    // within the lease, which is not what returned it.
    assert!(
        took <= stale_after + stale_after / 4 + Duration::from_millis(400),
        "taken over {took:?} after the last heartbeat"
    );
    assert!(u128::from(lease_ms) > took.as_millis() * 3);
    assert_eq!(taken[0].task_id, id);
    assert_ne!(taken[0].lease_id, l1, "under a new token");
    assert_eq!(taken[0].attempt, 2);

    // The stopped agent's extension and report come too late, at either instance: refused.
    let ext = stopper_elsewhere
        .extend(&ExtendRequest {
            lease_ids: vec![l1.clone()],
        })
        .await
        .unwrap();
    assert_eq!(
        (ext.extended.len(), ext.lost.clone()),
        (0, vec![l1.clone()])
    );
    let late = stopper.report(&report(&l1, &id)).await.unwrap();
    assert_eq!(late.refused, vec![l1.clone()]);
    assert!(late.accepted.is_empty());
    assert!(first.results(&id, 10).await.unwrap().is_empty());

    // Served as stale (over HTTP), holding nothing; the other live, holding the task.
    let agents = agents_over_http(first).await.agents;
    let view = |id: &str| agents.iter().find(|a| a.agent_id == id).unwrap().clone();
    let (s, b) = (view("stopper"), view("beater"));
    assert_eq!((s.state, s.leases), (AgentState::Stale, 0), "{s:?}");
    assert!(s.stale_since_ms.is_some(), "found by a sweep: {s:?}");
    assert_eq!((b.state, b.leases), (AgentState::Live, 1), "{b:?}");
    assert_eq!(b.stale_since_ms, None);
    // Found stale once, its one lease returned once, across the instances.
    let mut counted = (0, 0);
    for control in instances {
        counted.0 += metric(control, "agent_control_stale_agents_total").await;
        counted.1 += metric(control, "agent_control_returned_leases_total").await;
    }
    assert_eq!(counted, (1, 1));
    assert_eq!(metric(first, "agent_control_agents_stale").await, 1);

    // Stale, it is given nothing, even a due task; once it beats, it is live again.
    let fresh = task(first, "fresh", tcp_spec()).await;
    assert!(stopper
        .claim(&tcp_claim(1))
        .await
        .unwrap()
        .leases
        .is_empty());
    beat(&stopper).await;
    let again = stopper.claim(&tcp_claim(1)).await.unwrap().leases;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].task_id, fresh);
    // Its old lease stays lost.
    let ext = stopper
        .extend(&ExtendRequest {
            lease_ids: vec![l1.clone()],
        })
        .await
        .unwrap();
    assert_eq!(ext.lost, vec![l1.clone()]);

    // The new holder's report is recorded, once.
    let ok = beater
        .report(&report(&taken[0].lease_id, &id))
        .await
        .unwrap();
    assert_eq!(ok.accepted, vec![taken[0].lease_id.clone()]);
    let results = last.results(&id, 10).await.unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].agent_id, "beater");
    let v = first.task(&id).await.unwrap().unwrap();
    assert_eq!((v.state, v.claims, v.results), (TaskState::Done, 2, 1));
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_agents_lease_is_returned_and_its_late_report_refused() {
    // Heartbeats every 200 ms (the helper's), stale after three missed; leases of 10 s.
    let control = control_plane(Duration::from_secs(10)).await;
    let took = a_stopped_agents_lease_is_returned(&[&control], Duration::from_millis(600)).await;
    println!(
        "a stopped agent's lease taken over {took:?} after its last heartbeat (stale after 600 ms)"
    );
}
