use std::time::Duration;

use soulbase_net_agent::protocol::{DnsRecordType, TaskSpec, TaskState};
use soulbase_net_testkit::MockDns;
use tokio::time::Instant;

use super::{
    binary, control_plane, done_ok_by, done_once_by, eventually, loopback_client, start_agent,
    task, view,
};

/// The agent binary, configured by the seed's variables, holds a slow DNS probe's lease past
/// a whole lease (it extends it), is killed with SIGKILL, and an agent started then takes the
/// task within the lease and reports it; the task is recorded done once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_process_killed_with_sigkill_has_its_lease_taken_within_the_lease() {
    let mock = MockDns::start().await.unwrap();
    mock.set_ips("slow.test", &["127.0.0.1".parse().unwrap()], 60);
    mock.delay("slow.test", Duration::from_secs(30));
    let lease = Duration::from_millis(1500);
    let control = control_plane(lease).await;
    let spec = TaskSpec::Dns {
        name: "slow.test".into(),
        record_types: vec![DnsRecordType::A],
        timeout_ms: Some(20_000),
    };
    task(&control, "slow-dns", spec).await;

    let mut child = binary::agent(&control.url(), "proc-agent", &mock.addr().to_string())
        .env("AGENT_POOL_DNS_SIZE", "2")
        .spawn()
        .unwrap();
    let holder = || async { view(&control, "slow-dns").await.agent_id };
    eventually(
        "the process holds the task",
        Duration::from_secs(20),
        || async { (holder().await.as_deref() == Some("proc-agent")).then_some(()) },
    )
    .await;
    // An observation window longer than the lease: only extensions keep it held.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    assert_eq!(
        holder().await.as_deref(),
        Some("proc-agent"),
        "extended by the process"
    );

    // Another agent, claiming already (the task is not free for it yet); answers come at
    // once from now on (the process's query, in flight, stays delayed).
    mock.delay("slow.test", Duration::ZERO);
    let b = start_agent(&control, "agent-b", mock.addr()).await;
    child.start_kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    let status = child.wait().await.unwrap();
    assert!(!status.success());
    // Taken (or, as its probe is quick now, already done) by agent-b.
    eventually(
        "agent-b takes the task",
        Duration::from_secs(10),
        || async {
            let v = view(&control, "slow-dns").await;
            (v.agent_id.as_deref() == Some("agent-b") || v.state == TaskState::Done).then_some(())
        },
    )
    .await;
    let took_over = killed.elapsed();
    assert!(
        took_over <= lease + Duration::from_millis(600),
        "taken over after {took_over:?}"
    );
    done_ok_by(&control, "slow-dns", "agent-b").await;
    let v = view(&control, "slow-dns").await;
    assert_eq!((v.claims, v.results), (2, 1));
    println!("a SIGKILLed agent process's lease taken over after {took_over:?} (lease {lease:?})");
    b.shutdown(Duration::from_secs(2)).await;
}

/// Both sides as processes, as `docs/agent.md` runs them: the control plane on a SQLite file,
/// a task created over HTTP, an agent configured by the seed's variables; the result read
/// back over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binaries_run_a_task_end_to_end() {
    let dir = std::env::temp_dir().join(format!("agent-binaries-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut command = binary::control();
    command
        .args(["--lease-secs", "5", "--database"])
        .arg(dir.join("control.db"))
        .env("AGENT_ADMIN_TOKEN", "admin-secret");
    let (mut control, url) = binary::spawn_control(&mut command, false).await;

    let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = open.local_addr().unwrap().port();
    let http = loopback_client();
    let created = http
        .send(
            soulbase_net_core::NetRequest::post(format!("{url}/v1/tasks"))
                .header("authorization", "Bearer admin-secret")
                .json(&serde_json::json!({
                    "spec": {"kind": "tcp", "host": "127.0.0.1", "port": port},
                    "id": "tcp-open"
                }))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(created.status.as_u16(), 201);

    let _agent = binary::agent(&url, "proc-agent", "127.0.0.1:9")
        .spawn()
        .unwrap();
    let view: serde_json::Value =
        eventually("the task is done", Duration::from_secs(20), || async {
            let res = http
                .send(
                    soulbase_net_core::NetRequest::get(format!("{url}/v1/tasks/tcp-open"))
                        .header("authorization", "Bearer admin-secret"),
                )
                .await
                .ok()?;
            let view: serde_json::Value = res.json().await.ok()?;
            (view["state"] == "done").then_some(view)
        })
        .await;
    assert_eq!(view["results"], 1);
    assert_eq!(view["last"]["agent_id"], "proc-agent");
    assert_eq!(view["last"]["status"], "ok");
    let connected = view["last"]["observations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "connected")
        .cloned();
    assert_eq!(connected.unwrap()["value"], true);
    let _ = control.start_kill();
    let _ = control.wait().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sends SIGTERM to `child` (by `kill -TERM`, as an operator, systemd or a container runtime
/// would).
fn sigterm(child: &tokio::process::Child) {
    let pid = child.id().expect("the process is running");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -TERM {pid}: {status}");
}

/// SIGTERM stops the agent binary as Ctrl-C does: it stops claiming, lets the probe in
/// flight finish and its report be acknowledged, then exits 0. The probe is a DNS query the
/// mock holds 2 s; SIGTERM comes while it is held. Without a SIGTERM handler the process
/// would die by the signal (not a success) and the task stay unreported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_process_stops_gracefully_on_sigterm() {
    let mock = MockDns::start().await.unwrap();
    mock.set_ips("held.test", &["127.0.0.1".parse().unwrap()], 60);
    let hold = Duration::from_secs(2);
    mock.delay("held.test", hold);
    let control = control_plane(Duration::from_secs(10)).await;
    let spec = TaskSpec::Dns {
        name: "held.test".into(),
        record_types: vec![DnsRecordType::A],
        timeout_ms: Some(10_000),
    };
    task(&control, "held-dns", spec).await;

    let mut child = binary::agent(&control.url(), "term-agent", &mock.addr().to_string())
        .spawn()
        .unwrap();
    eventually(
        "the process holds the task",
        Duration::from_secs(20),
        || async {
            let v = view(&control, "held-dns").await;
            (v.agent_id.as_deref() == Some("term-agent")).then_some(())
        },
    )
    .await;
    // The probe's query is held by the mock now (or about to be): the report is in flight.
    assert_ne!(
        view(&control, "held-dns").await.state,
        TaskState::Done,
        "the probe is still running when SIGTERM comes"
    );
    sigterm(&child);
    let sent = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("the agent exits within 15 s of SIGTERM")
        .unwrap();
    let took = sent.elapsed();
    assert!(status.success(), "exit status after SIGTERM: {status}");
    // The in-flight probe's report was delivered before the process exited.
    done_once_by(&control, "held-dns", "term-agent").await;
    assert!(
        took < hold + Duration::from_secs(8),
        "exited {took:?} after SIGTERM"
    );
    println!(
        "agent process: SIGTERM → report delivered, exit 0 after {took:?} (probe held {hold:?})"
    );
}

/// SIGTERM stops an agent still trying to register (its control plane unreachable) at once,
/// and with exit 0: the handlers are installed before anything else, and the registration
/// loop waits on them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_still_registering_stops_on_sigterm() {
    // A port with nothing on it: every registration is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let mut command = binary::agent(&url, "unregistered", "127.0.0.1:9");
    command.env_remove("RUST_LOG");
    let (mut child, _) = binary::spawn_until(
        &mut command,
        "the agent",
        "registration failed; retrying",
        false,
    )
    .await;
    sigterm(&child);
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("the agent exits within 5 s of SIGTERM")
        .unwrap();
    assert!(status.success(), "exit status after SIGTERM: {status}");
}

/// SIGTERM stops the control-plane binary as Ctrl-C does: it closes and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_process_stops_gracefully_on_sigterm() {
    let (mut control, url) = binary::spawn_control(&mut binary::control(), false).await;
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    // It serves until SIGTERM.
    tokio::net::TcpStream::connect(&addr).await.unwrap();
    sigterm(&control);
    let status = tokio::time::timeout(Duration::from_secs(10), control.wait())
        .await
        .expect("the control plane exits within 10 s of SIGTERM")
        .unwrap();
    assert!(status.success(), "exit status after SIGTERM: {status}");
    assert!(
        tokio::net::TcpStream::connect(&addr).await.is_err(),
        "closed after SIGTERM"
    );
}

/// `RUST_LOG` filters the binary's logs: a one-off ping logs each echo reply at `debug` (its
/// default level), and none under `RUST_LOG=warn`; the probe's result is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_log_filters_the_binary_s_logs() {
    let spec = r#"{"kind":"ping","host":"127.0.0.1","count":2,"interval_ms":50}"#;
    let run = |rust_log: Option<&'static str>| async move {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_soulbase-net-agent"));
        command.args(["probe", spec]).env_remove("RUST_LOG");
        if let Some(filter) = rust_log {
            command.env("RUST_LOG", filter);
        }
        let out = tokio::time::timeout(Duration::from_secs(20), command.output())
            .await
            .expect("the probe ends within 20 s")
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    let default = run(None).await;
    assert_eq!(default.matches("echo reply").count(), 2, "{default}");
    let warn = run(Some("warn")).await;
    assert!(!warn.contains("echo reply"), "{warn}");
    let targeted = run(Some("warn,soulbase_net_agent::workers::ping=debug")).await;
    assert_eq!(targeted.matches("echo reply").count(), 2, "{targeted}");
}
