use std::time::Duration;

use serde_json::json;
use soulbase_net_agent::agent;
use soulbase_net_agent::protocol::{DnsRecordType, ReportStatus, TaskSpec, TaskState};
use soulbase_net_testkit::{refused_addr, FaultServer, Gate, MockDns, Reply};
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::{agent_config, control_plane, done, eventually, obs, task};

fn http(url: String) -> TaskSpec {
    TaskSpec::Http {
        url,
        method: None,
        timeout_ms: Some(20_000),
        connect_timeout_ms: None,
        expect_status: None,
    }
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
    let a = agent::start(agent_config(&control, "agent-a", mock.addr()))
        .await
        .unwrap();
    let b = agent::start(agent_config(&control, "agent-b", mock.addr()))
        .await
        .unwrap();
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
    let mut policy = soulbase_net_policy::NetPolicy::default();
    policy.security.grants.cidrs = vec!["127.0.0.1/32".parse().unwrap()];
    let scraper = soulbase_net_runtime::Client::builder()
        .policy(policy)
        .build()
        .unwrap();
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
    let gate = Gate::new();
    let web = FaultServer::http1()
        .route("/slow", Reply::ok("late").after(&gate))
        .start()
        .await
        .unwrap();
    let mock = MockDns::start().await.unwrap();
    let lease = Duration::from_secs(1);
    let control = control_plane(lease).await;
    for id in ["slow-1", "slow-2"] {
        task(&control, id, http(web.url("/slow"))).await;
    }
    let a = agent::start(agent_config(&control, "agent-a", mock.addr()))
        .await
        .unwrap();
    eventually("agent-a holds both", Duration::from_secs(10), || async {
        for id in ["slow-1", "slow-2"] {
            let v = control.task(id).await.unwrap().unwrap();
            if v.agent_id.as_deref() != Some("agent-a") {
                return None;
            }
        }
        Some(())
    })
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
    let b = agent::start(agent_config(&control, "agent-b", mock.addr()))
        .await
        .unwrap();
    // Dead: no more extensions, no report.
    a.kill();
    let killed = Instant::now();
    eventually("agent-b takes both", Duration::from_secs(10), || async {
        for id in ["slow-1", "slow-2"] {
            let v = control.task(id).await.unwrap().unwrap();
            if v.agent_id.as_deref() != Some("agent-b") {
                return None;
            }
        }
        Some(())
    })
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
        let r = done(&control, id).await;
        assert_eq!(r.agent_id, "agent-b");
        assert_eq!(r.status, ReportStatus::Ok);
        let v = control.task(id).await.unwrap().unwrap();
        assert_eq!((v.claims, v.results), (2, 1));
    }
    println!("leases of a killed agent taken over after {took_over:?} (lease {lease:?})");
    b.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_is_cancelled_and_not_reported_done() {
    let gate = Gate::new();
    let web = FaultServer::http1()
        .route("/slow", Reply::ok("late").after(&gate))
        .start()
        .await
        .unwrap();
    let mock = MockDns::start().await.unwrap();
    let control = control_plane(Duration::from_millis(1500)).await;
    task(&control, "slow", http(web.url("/slow"))).await;
    let a = agent::start(agent_config(&control, "agent-a", mock.addr()))
        .await
        .unwrap();
    let revoked = eventually("leased", Duration::from_secs(10), || async {
        let v = control.task("slow").await.unwrap().unwrap();
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
    let gate = Gate::new();
    let web = FaultServer::http1()
        .route("/slow", Reply::ok("late").after(&gate))
        .start()
        .await
        .unwrap();
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
    let gate = Gate::new();
    let web = FaultServer::http1()
        .route("/slow", Reply::ok("late").after(&gate))
        .start()
        .await
        .unwrap();
    let mock = MockDns::start().await.unwrap();
    let control = ControlPlane::start(config.clone()).await.unwrap();
    let addr = control.addr();
    task(&control, "slow", http(web.url("/slow"))).await;
    let a = agent::start(agent_config(&control, "agent-a", mock.addr()))
        .await
        .unwrap();
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
    let r = done(&control, "slow").await;
    assert_eq!(r.agent_id, "agent-a");
    assert_eq!(r.status, ReportStatus::Ok);
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
    let a = agent::start(agent_config(&control, "agent-a", mock.addr()))
        .await
        .unwrap();
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
    let r = done(&control, "tcp-open").await;
    assert_eq!(r.agent_id, "agent-a");
    assert_eq!(r.status, ReportStatus::Ok);
    a.shutdown(Duration::from_secs(2)).await;
}
