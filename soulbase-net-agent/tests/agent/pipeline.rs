use std::time::Duration;

use serde_json::json;
use soulbase_net_agent::agent;
use soulbase_net_agent::control::ControlPlane;
use soulbase_net_agent::protocol::{DnsRecordType, ReportStatus, TaskSpec, TaskState};
use soulbase_net_testkit::{refused_addr, FaultServer, Gate, MockDns, Reply};
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::{
    agent_config, control_plane, done, done_ok_by, done_once_by, eventually, loopback_client, obs,
    start_agent, task, view,
};

fn http(url: String) -> TaskSpec {
    TaskSpec::Http {
        url,
        method: None,
        timeout_ms: Some(20_000),
        connect_timeout_ms: None,
        expect_status: None,
    }
}

/// A web server whose `/slow` answers only once the gate returned with it is open.
async fn slow_web() -> (Gate, FaultServer) {
    let gate = Gate::new();
    let web = FaultServer::http1()
        .route("/slow", Reply::ok("late").after(&gate))
        .start()
        .await
        .unwrap();
    (gate, web)
}

/// Waits (for at most 10 s, as `what`) until every task of `ids` is held by `agent`.
async fn held_by(control: &ControlPlane, what: &str, ids: &[&str], agent: &str) {
    eventually(what, Duration::from_secs(10), || async {
        for id in ids {
            if view(control, id).await.agent_id.as_deref() != Some(agent) {
                return None;
            }
        }
        Some(())
    })
    .await;
}

fn dns(name: &str, types: &[DnsRecordType]) -> TaskSpec {
    TaskSpec::Dns {
        name: name.into(),
        record_types: types.to_vec(),
        timeout_ms: Some(3000),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_run_every_kind_and_report_each_task_once() {
    let web = FaultServer::http1()
        .route("/ok", Reply::ok("hello"))
        .route("/teapot", Reply::status(418))
        .start()
        .await
        .unwrap();
    let mock = MockDns::start().await.unwrap();
    mock.set_ips(
        "probe.test",
        &["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
        300,
    );
    mock.set_ips("web.test", &["127.0.0.1".parse().unwrap()], 300);
    mock.set_ips("big.test", &["127.0.0.1".parse().unwrap()], 60);
    mock.truncate_udp("big.test", true);
    let open = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open_port = open.local_addr().unwrap().port();
    let closed = refused_addr().await.unwrap();
    let port = web.addr().port();

    let control = control_plane(Duration::from_secs(5)).await;
    let tasks = [
        ("http-ok", http(web.url("/ok"))),
        ("http-by-name", http(format!("http://web.test:{port}/ok"))),
        ("http-418", http(web.url("/teapot"))),
        // The address guard: only 127.0.0.1 is granted, so 127.0.0.2 is never dialled.
        ("http-blocked", http(format!("http://127.0.0.2:{port}/ok"))),
        (
            "tcp-open",
            TaskSpec::Tcp {
                host: "127.0.0.1".into(),
                port: open_port,
                timeout_ms: Some(2000),
            },
        ),
        (
            "tcp-closed",
            TaskSpec::Tcp {
                host: "127.0.0.1".into(),
                port: closed.port(),
                timeout_ms: Some(2000),
            },
        ),
        (
            "tcp-by-name",
            TaskSpec::Tcp {
                host: "web.test".into(),
                port: open_port,
                timeout_ms: Some(2000),
            },
        ),
        (
            "dns-a-aaaa",
            dns("probe.test", &[DnsRecordType::A, DnsRecordType::Aaaa]),
        ),
        (
            "dns-mx-none",
            dns(
                "probe.test",
                &[DnsRecordType::Mx, DnsRecordType::Ns, DnsRecordType::Txt],
            ),
        ),
        ("dns-nxdomain", dns("missing.test", &[DnsRecordType::A])),
        ("dns-truncated", dns("big.test", &[DnsRecordType::A])),
        (
            "ping",
            TaskSpec::Ping {
                host: "127.0.0.1".into(),
                count: Some(3),
                timeout_ms: None,
                interval_ms: Some(100),
            },
        ),
        (
            "trace",
            TaskSpec::Trace {
                host: "127.0.0.1".into(),
                max_hops: None,
                timeout_ms: None,
            },
        ),
    ];
    // Both agents claiming before the tasks come, so that both take some.
    let a = start_agent(&control, "agent-a", mock.addr()).await;
    let b = start_agent(&control, "agent-b", mock.addr()).await;
    let start = Instant::now();
    for (id, spec) in &tasks {
        task(&control, id, spec.clone()).await;
    }

    let r = done(&control, "http-ok").await;
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    assert_eq!(obs(&r, "status").value, json!(200));
    assert_eq!(obs(&r, "body_bytes").value, json!(5));
    assert_eq!(obs(&r, "body_bytes").unit.as_deref(), Some("bytes"));
    assert_eq!(obs(&r, "total_ms").unit.as_deref(), Some("ms"));

    let r = done(&control, "http-by-name").await;
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    assert_eq!(obs(&r, "status").value, json!(200));
    assert_eq!(
        web.hits("/ok"),
        2,
        "the two HTTP probes of /ok, and nothing more"
    );

    let r = done(&control, "http-418").await;
    assert_eq!(r.status, ReportStatus::Error);
    assert_eq!(obs(&r, "status").value, json!(418));

    let r = done(&control, "http-blocked").await;
    assert_eq!(r.status, ReportStatus::Error);
    assert_eq!(obs(&r, "error_kind").value, json!("blocked"));
    assert_eq!(obs(&r, "error_code").value, json!("AUTH.FORBIDDEN"));

    let r = done(&control, "tcp-open").await;
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    assert_eq!(obs(&r, "connected").value, json!(true));
    assert_eq!(obs(&r, "connect_ms").unit.as_deref(), Some("ms"));
    let connect_ms = obs(&r, "connect_ms").value.as_f64().unwrap();

    let r = done(&control, "tcp-closed").await;
    assert_eq!(r.status, ReportStatus::Error);
    assert_eq!(obs(&r, "connected").value, json!(false));
    assert_eq!(obs(&r, "error_kind").value, json!("refused"));

    let r = done(&control, "tcp-by-name").await;
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    assert_eq!(
        obs(&r, "address").value,
        json!(format!("127.0.0.1:{open_port}"))
    );
    assert_eq!(obs(&r, "resolve_ms").unit.as_deref(), Some("ms"));

    let r = done(&control, "dns-a-aaaa").await;
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    assert_eq!(obs(&r, "a").value, json!(["127.0.0.1"]));
    assert_eq!(obs(&r, "aaaa").value, json!(["::1"]));
    assert_eq!(obs(&r, "a_ttl_s").value, json!(300));
    assert_eq!(obs(&r, "a_ttl_s").unit.as_deref(), Some("s"));

    // The name exists without MX, NS or TXT records: empty answers, not failures.
    let r = done(&control, "dns-mx-none").await;
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    for t in ["mx", "ns", "txt"] {
        assert_eq!(obs(&r, t).value, json!([]), "{t}");
    }

    let r = done(&control, "dns-nxdomain").await;
    assert_eq!(r.status, ReportStatus::Error);
    assert_eq!(obs(&r, "rcode").value, json!("NXDOMAIN"));

    // Truncated over UDP: the answer came over TCP.
    let r = done(&control, "dns-truncated").await;
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    assert_eq!(obs(&r, "a").value, json!(["127.0.0.1"]));
    assert!(
        mock.queries()
            .iter()
            .any(|q| q.name == "big.test." && q.tcp),
        "a TCP query followed the truncated answer"
    );

    // Ping and trace of loopback (raw ICMP sockets: the tests run as root).
    let r = done(&control, "ping").await;
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    assert_eq!(obs(&r, "received").value, json!(3));
    assert_eq!(obs(&r, "loss").value, json!(0.0));
    let r = done(&control, "trace").await;
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    assert_eq!(obs(&r, "reached").value, json!(true));
    assert_eq!(obs(&r, "hops").value[0]["address"], json!("127.0.0.1"));
    let all = start.elapsed();

    // Every report acknowledged; both agents idle, holding nothing.
    let (sa, sb) = eventually("both agents idle", Duration::from_secs(5), || async {
        let (sa, sb) = (a.stats(), b.stats());
        (sa.held == 0 && sb.held == 0).then_some((sa, sb))
    })
    .await;
    assert_eq!(sa.claimed + sb.claimed, tasks.len() as u64);
    assert_eq!(
        sa.reports_accepted + sb.reports_accepted,
        tasks.len() as u64
    );
    assert_eq!(sa.reports_refused + sb.reports_refused, 0);
    assert_eq!(sa.cancelled + sb.cancelled, 0);
    let mut a = a;
    let metrics_addr = a
        .serve_metrics("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let scraper = loopback_client();
    let text = scraper
        .send(soulbase_net_core::NetRequest::get(format!(
            "http://{metrics_addr}/metrics"
        )))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("agent_dispatcher_queue_fill{kind=\"dns\"} 0"),
        "{text}"
    );
    assert!(text.contains("agent_reports_refused_total 0"), "{text}");
    println!(
        "{} tasks of 5 kinds done by two agents in {all:?} (a: {}, b: {}); tcp connect {connect_ms} ms; longest queue wait {:?}",
        tasks.len(),
        sa.claimed,
        sb.claimed,
        sa.max_queue_wait.max(sb.max_queue_wait)
    );
    a.shutdown(Duration::from_secs(2)).await;
    b.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agent_s_leases_are_taken_by_the_other_within_the_lease() {
    let (gate, web) = slow_web().await;
    let mock = MockDns::start().await.unwrap();
    let lease = Duration::from_secs(1);
    let control = control_plane(lease).await;
    for id in ["slow-1", "slow-2"] {
        task(&control, id, http(web.url("/slow"))).await;
    }
    let a = start_agent(&control, "agent-a", mock.addr()).await;
    held_by(
        &control,
        "agent-a holds both",
        &["slow-1", "slow-2"],
        "agent-a",
    )
    .await;
    // Held past several extensions while the probes wait at the gate.
    let held_since = Instant::now();
    eventually("agent-a extends", Duration::from_secs(5), || async {
        (a.stats().extended >= 8).then_some(())
    })
    .await;
    assert!(held_since.elapsed() < Duration::from_secs(5));
    assert_eq!(
        control
            .task("slow-1")
            .await
            .unwrap()
            .unwrap()
            .agent_id
            .as_deref(),
        Some("agent-a"),
        "still a's after more than a lease, thanks to its extensions"
    );

    // Another agent, claiming already: the tasks are not free for it while a holds them.
    let b = start_agent(&control, "agent-b", mock.addr()).await;
    // Dead: no more extensions, no report.
    a.kill();
    let killed = Instant::now();
    held_by(
        &control,
        "agent-b takes both",
        &["slow-1", "slow-2"],
        "agent-b",
    )
    .await;
    let took_over = killed.elapsed();
    // The lease, counted from a's last extension (at most a third of a lease before the
    // kill), plus one claim back-off of b's (≤ 100 ms) and room for a loaded machine.
    assert!(
        took_over <= lease + Duration::from_millis(600),
        "taken over after {took_over:?}"
    );
    gate.open();
    for id in ["slow-1", "slow-2"] {
        done_ok_by(&control, id, "agent-b").await;
        let v = view(&control, id).await;
        assert_eq!((v.claims, v.results), (2, 1));
    }
    println!("leases of a killed agent taken over after {took_over:?} (lease {lease:?})");
    b.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_is_cancelled_and_not_reported_done() {
    let (gate, web) = slow_web().await;
    let mock = MockDns::start().await.unwrap();
    let control = control_plane(Duration::from_millis(1500)).await;
    task(&control, "slow", http(web.url("/slow"))).await;
    let a = start_agent(&control, "agent-a", mock.addr()).await;
    let revoked = eventually("leased", Duration::from_secs(10), || async {
        let v = view(&control, "slow").await;
        v.lease_id.filter(|_| v.state == TaskState::Leased)
    })
    .await;
    // The probe is running: its request reached the server and waits at the gate.
    eventually(
        "the probe's request arrives",
        Duration::from_secs(5),
        || async { (web.hits("/slow") == 1).then_some(()) },
    )
    .await;
    let at = Instant::now();
    assert!(control.revoke(&revoked).await.unwrap());
    eventually("the probe is cancelled", Duration::from_secs(5), || async {
        let s = a.stats();
        (s.lost == 1 && s.cancelled == 1).then_some(())
    })
    .await;
    let cancelled_after = at.elapsed();
    assert!(
        cancelled_after <= a.lease() / 3 + Duration::from_millis(300),
        "cancelled {cancelled_after:?} after the revocation"
    );
    // The agent claims the task again (it is due) under a new lease; that one finishes.
    gate.open();
    let r = done(&control, "slow").await;
    assert_ne!(
        r.lease_id, revoked,
        "the revoked lease was never reported done"
    );
    let s = a.stats();
    assert_eq!(
        s.reports_refused, 0,
        "nothing was even sent for the revoked lease"
    );
    println!("a revoked lease's probe cancelled {cancelled_after:?} after the revocation");
    a.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_loop_stops_claiming_while_the_queues_are_full() {
    let (gate, web) = slow_web().await;
    let mock = MockDns::start().await.unwrap();
    let control = control_plane(Duration::from_secs(5)).await;
    for i in 0..10 {
        task(&control, &format!("slow-{i}"), http(web.url("/slow"))).await;
    }
    let mut config = agent_config(&control, "agent-a", mock.addr());
    // One HTTP probe at a time, one more queued: two leases held, no more.
    config
        .pools
        .insert(soulbase_net_agent::protocol::TaskKind::Http, 1);
    let a = agent::start(config).await.unwrap();
    eventually("two held", Duration::from_secs(10), || async {
        (a.stats().claimed == 2).then_some(())
    })
    .await;
    // Give the claim loop several back-off periods: it must not claim more.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = a.stats();
    assert_eq!(s.claimed, 2, "{s:?}");
    assert_eq!((s.inflight, s.queued), (1, 1));
    assert!(!a
        .free_capacity()
        .contains_key(&soulbase_net_agent::protocol::TaskKind::Http));
    gate.open();
    for i in 0..10 {
        done(&control, &format!("slow-{i}")).await;
    }
    assert_eq!(a.stats().claimed, 10);
    a.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_is_retried_until_the_control_plane_is_back() {
    use soulbase_net_agent::control::{ControlConfig, ControlPlane};

    let dir = std::env::temp_dir().join(format!("agent-report-retry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("control.db");
    let config = ControlConfig::default()
        .database(&db)
        .lease(Duration::from_secs(10))
        .heartbeat_every(Duration::from_millis(200));
    let (gate, web) = slow_web().await;
    let mock = MockDns::start().await.unwrap();
    let control = ControlPlane::start(config.clone()).await.unwrap();
    let addr = control.addr();
    task(&control, "slow", http(web.url("/slow"))).await;
    let a = start_agent(&control, "agent-a", mock.addr()).await;
    eventually(
        "the probe's request arrives",
        Duration::from_secs(10),
        || async { (web.hits("/slow") == 1).then_some(()) },
    )
    .await;

    // The control plane goes away while the probe runs; the probe ends meanwhile.
    control.shutdown().await;
    gate.open();
    eventually("the probe ends", Duration::from_secs(5), || async {
        (a.stats().completed == 1).then_some(())
    })
    .await;
    assert_eq!(a.stats().reports_accepted, 0);

    // Back on the same address and file: the report, retried, is recorded once.
    let control = ControlPlane::start(config.listen(addr)).await.unwrap();
    done_ok_by(&control, "slow", "agent-a").await;
    eventually("acknowledged", Duration::from_secs(5), || async {
        (a.stats().reports_accepted == 1).then_some(())
    })
    .await;
    a.shutdown(Duration::from_secs(2)).await;
    control.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_registers_again_with_a_control_plane_that_forgot_it() {
    use soulbase_net_agent::control::{ControlConfig, ControlPlane};

    let mock = MockDns::start().await.unwrap();
    let open = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = open.local_addr().unwrap().port();
    let control = control_plane(Duration::from_secs(5)).await;
    let addr = control.addr();
    let a = start_agent(&control, "agent-a", mock.addr()).await;
    assert_eq!(a.registration().session, 1);
    // A new control plane on the same address, its database in memory: the agent is unknown.
    control.shutdown().await;
    let control = ControlPlane::start(
        ControlConfig::default()
            .listen(addr)
            .heartbeat_every(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let spec = TaskSpec::Tcp {
        host: "127.0.0.1".into(),
        port,
        timeout_ms: Some(2000),
    };
    task(&control, "tcp-open", spec).await;
    done_ok_by(&control, "tcp-open", "agent-a").await;
    a.shutdown(Duration::from_secs(2)).await;
}

/// A TCP relay on loopback in front of `upstream` that the test can cut: while cut, it
/// closes the connections it relays and every connection it accepts (a network cut between
/// an agent and its control plane, the control plane itself still up); healed, it relays
/// again.
struct CuttableRelay {
    addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl CuttableRelay {
    async fn start(upstream: std::net::SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, _) = tokio::sync::watch::channel(false);
        let watch = cut.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let mut is_cut = watch.subscribe();
                if *is_cut.borrow_and_update() {
                    continue; // dropped: closed at once
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = is_cut.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self { addr, cut, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }

    fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for CuttableRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A claim the control plane has answered, its answer still on the way when the agent is
/// told to stop: `shutdown` waits for the answer, runs the leased probe and reports it. The
/// answers are held by a relay (1.5 s each), so the stop falls between the lease, recorded
/// at the control plane, and its answer; given up there, the task would stay leased to an
/// agent that never knew of it until the lease ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_while_the_agent_stops_is_run_and_reported() {
    use soulbase_net_agent::control::{ControlConfig, ControlPlane};
    use soulbase_net_testkit::LatencyRelay;

    let mock = MockDns::start().await.unwrap();
    mock.set_ips("late.test", &["127.0.0.1".parse().unwrap()], 60);
    // Heartbeats come every 1.5 s through the relay: stale only after 3 × 2 s.
    let control = ControlPlane::start(
        ControlConfig::default()
            .lease(Duration::from_secs(30))
            .heartbeat_every(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let hold = Duration::from_millis(1500);
    let relay = LatencyRelay::answers(control.addr(), hold..=hold, 1)
        .await
        .unwrap();
    let mut config = agent_config(&control, "agent-late", mock.addr());
    config.control_plane = format!("http://{}", relay.addr());
    let a = agent::start(config).await.unwrap();
    task(&control, "late-dns", dns("late.test", &[DnsRecordType::A])).await;
    held_by(&control, "the task leased", &["late-dns"], "agent-late").await;
    assert_eq!(a.stats().claimed, 0, "the claim's answer is still held");

    a.shutdown(Duration::from_secs(10)).await;
    done_once_by(&control, "late-dns", "agent-late").await;
    assert!(
        relay.chunks() >= 3,
        "registration, claim and report answered through the relay"
    );
}

/// A lease the agent cannot extend (the network to the control plane is cut) runs out on
/// the agent's side: its probe is cancelled (the held HTTP request's connection closes), it
/// is counted `expired` (`agent_leases_expired_total`), and it is never reported — once the
/// network is back the task is claimed again under a new lease, and that lease's report is
/// the task's only result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_cannot_be_extended_runs_out_and_is_never_reported() {
    use soulbase_net_agent::control::{ControlConfig, ControlPlane};

    let (gate, web) = slow_web().await;
    let mock = MockDns::start().await.unwrap();
    let lease = Duration::from_secs(1);
    let extend_every = Duration::from_millis(200);
    // Heartbeats fail too while the network is cut: the agent is not made stale meanwhile
    // (20 s of missed heartbeats), so the control plane's lease runs out by its time alone.
    let control = ControlPlane::start(
        ControlConfig::default()
            .lease(lease)
            .heartbeat_every(Duration::from_millis(200))
            .missed_heartbeats(100),
    )
    .await
    .unwrap();
    let relay = CuttableRelay::start(control.addr()).await;
    let mut config = agent_config(&control, "agent-a", mock.addr());
    config.control_plane = relay.url();
    config.extend_every = extend_every;
    config.call_timeout = Duration::from_millis(500);
    task(&control, "held", http(web.url("/slow"))).await;
    let a = agent::start(config).await.unwrap();
    let first = eventually("leased to agent-a", Duration::from_secs(10), || async {
        let v = view(&control, "held").await;
        (v.state == TaskState::Leased && v.agent_id.as_deref() == Some("agent-a"))
            .then_some(v.lease_id)
            .flatten()
    })
    .await;
    // The probe runs: its request waits at the gate, its connection open.
    eventually(
        "the probe's request arrives",
        Duration::from_secs(5),
        || async { (web.hits("/slow") == 1 && web.open_connections() == 1).then_some(()) },
    )
    .await;
    // Held past a whole lease by its extensions.
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let s = a.stats();
    assert!(s.extended >= 3, "extended {} times", s.extended);
    assert_eq!((s.expired, s.cancelled), (0, 0), "{s:?}");

    relay.cut();
    let cut = Instant::now();
    eventually(
        "the lease runs out on the agent's side",
        Duration::from_secs(5),
        || async { (a.stats().expired >= 1).then_some(()) },
    )
    .await;
    let expired_after = cut.elapsed();
    // Extended until the cut (every 200 ms), so it runs out about a lease after it: not
    // much earlier (it was extended), not much later (the extender's timer).
    assert!(
        expired_after >= lease / 2 && expired_after <= lease + Duration::from_millis(700),
        "ran out {expired_after:?} after the cut (lease {lease:?})"
    );
    // Its probe is cancelled: the held request's connection closes, the gate still shut.
    tokio::time::timeout(Duration::from_secs(5), web.wait_for_open_at_most(0))
        .await
        .expect("the cancelled probe's connection closes");
    eventually("counted cancelled", Duration::from_secs(5), || async {
        (a.stats().cancelled == 1).then_some(())
    })
    .await;
    let s = a.stats();
    assert_eq!((s.expired, s.completed, s.held), (1, 0, 0), "{s:?}");
    assert!(
        a.metrics_text()
            .lines()
            .any(|l| l == "agent_leases_expired_total 1"),
        "{}",
        a.metrics_text()
    );
    // Nothing recorded meanwhile.
    assert!(control.results("held", 10).await.unwrap().is_empty());

    // The network is back: the control plane's lease has run out too, so the task is
    // claimed again under a new lease, and that run (the gate open now) is its only result.
    relay.heal();
    let second = eventually(
        "claimed again under a new lease",
        Duration::from_secs(10),
        || async {
            let v = view(&control, "held").await;
            v.lease_id
                .filter(|id| *id != first && v.state == TaskState::Leased)
        },
    )
    .await;
    gate.open();
    let r = done(&control, "held").await;
    assert_eq!(r.lease_id, second);
    assert_ne!(
        r.lease_id, first,
        "the expired lease was never reported done"
    );
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    let v = view(&control, "held").await;
    assert_eq!((v.claims, v.results), (2, 1), "{v:?}");
    let s = a.stats();
    assert_eq!(
        (s.reports_refused, s.reports_dropped, s.expired),
        (0, 0, 1),
        "nothing was sent for the expired lease: {s:?}"
    );
    println!(
        "a lease not extended ran out {expired_after:?} after the network cut (lease {lease:?}); \
         re-run under a new lease once healed"
    );
    a.shutdown(Duration::from_secs(2)).await;
}

/// Watches the ICMP echo requests to `to` on loopback (a raw ICMP socket: the tests run as
/// root) on a thread of its own, outside any runtime: each one seen is sent on the channel
/// returned, until `stop` is set.
fn watch_echo_requests(
    to: std::net::Ipv4Addr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::sync::mpsc::Receiver<()> {
    use socket2::{Domain, Protocol, Socket, Type};

    let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let socket = std::net::UdpSocket::from(socket);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok(n) = socket.recv(&mut buf) else {
                continue;
            };
            // An IPv4 header (its length in its first byte), then ICMP: type 8 is a request.
            let header = usize::from(buf[0] & 0x0f) * 4;
            if n > header && buf[16..20] == to.octets() && buf[header] == 8 {
                let _ = tx.send(());
            }
        }
    });
    rx
}

/// Ping and trace run on a runtime of their own (`AGENT_TRACE_RUNTIME_WORKERS` threads, at
/// least 2): asked for 1, the agent starts 2; and a ping keeps sending its echoes on
/// schedule while the agent's own runtime (single-threaded here) is blocked. The test blocks
/// that runtime once the ping's first echo request is seen on the wire, until its other two
/// are: a ping run on the agent's runtime could not send them (it would fail after 3 s).
#[tokio::test(flavor = "current_thread")]
async fn ping_runs_on_the_trace_runtime_while_the_agent_s_runtime_is_blocked() {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use soulbase_net_agent::agent::AgentConfig;
    use soulbase_net_agent::protocol::TaskKind;

    // The variable reads as it is given; the agent raises it to 2 when it starts.
    let from_env = AgentConfig::from_vars(|name| {
        match name {
            "AGENT_CONTROL_PLANE" => Some("http://127.0.0.1:7070"),
            "AGENT_ID" => Some("probe-1"),
            "AGENT_AUTH_TOKEN" => Some("s3cret-token"),
            "AGENT_TRACE_RUNTIME_WORKERS" => Some("1"),
            _ => None,
        }
        .map(str::to_owned)
    })
    .unwrap();
    assert_eq!(from_env.trace_runtime_workers, 1);

    // 127.0.0.7: loopback answers it, and no other test pings it.
    let target = std::net::Ipv4Addr::new(127, 0, 0, 7);
    let stop = Arc::new(AtomicBool::new(false));
    let echoes = watch_echo_requests(target, stop.clone());
    let mock = MockDns::start().await.unwrap();
    let control = control_plane(Duration::from_secs(10)).await;
    let mut config = agent_config(&control, "agent-a", mock.addr());
    config.trace_runtime_workers = from_env.trace_runtime_workers;
    config.pools = BTreeMap::from([(TaskKind::Ping, 1)]);
    let a = agent::start(config).await.unwrap();
    assert_eq!(a.trace_runtime_workers(), 2, "raised to the seed's minimum");
    let spec = TaskSpec::Ping {
        host: target.to_string(),
        count: Some(3),
        timeout_ms: Some(1000),
        interval_ms: Some(300),
    };
    task(&control, "ping", spec).await;
    eventually(
        "the first echo request is sent",
        Duration::from_secs(10),
        || async { echoes.try_recv().is_ok().then_some(()) },
    )
    .await;
    // Blocking the agent's only runtime thread (no await until both are seen).
    let blocked = Instant::now();
    for i in 2..=3 {
        echoes
            .recv_timeout(Duration::from_secs(3).saturating_sub(blocked.elapsed()))
            .unwrap_or_else(|_| {
                panic!("echo request {i} not sent while the agent's runtime was blocked")
            });
    }
    let sent_in = blocked.elapsed();
    stop.store(true, Ordering::Relaxed);
    // Unblocked: the result, ready meanwhile, is reported.
    let r = done(&control, "ping").await;
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    assert_eq!(obs(&r, "received").value, json!(3), "{r:?}");
    println!("two echo requests sent in {sent_in:?} while the agent's runtime was blocked");
    a.shutdown(Duration::from_secs(2)).await;
}
