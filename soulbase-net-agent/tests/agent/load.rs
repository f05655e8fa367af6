//! Seed 002's load test: thousands of tasks through control plane → agent → report, with
//! the queue-wait and completion latencies as SLA figures, and the AIMD window against a
//! target that slows down under load.
//!
//! The latencies are measured on one clock (the test's) by a recording proxy between the
//! agent and its control plane: a task is created by the test, claimed when a claim's answer
//! naming it passes the proxy, reported when a report's acknowledgement accepting its lease
//! does.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use soulbase_net_agent::agent;
use soulbase_net_agent::protocol::{
    ClaimResponse, ReportRequest, ReportResponse, TaskKind, TaskSpec, TaskState,
};
use soulbase_net_testkit::{Capacity, FaultServer, MockDns, Reply, Script};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{agent_config, control_plane, task};

/// What the proxy saw, each at the instant it passed.
#[derive(Debug)]
enum Seen {
    /// A claim's answer named the task.
    Claimed(String, Instant),
    /// A report's acknowledgement accepted the task's lease.
    Reported(String, Instant),
}

/// A proxy on loopback in front of `upstream` that passes every call through and tells
/// `seen` of each claimed and reported task; its address.
async fn recording_proxy(upstream: SocketAddr, seen: mpsc::UnboundedSender<Seen>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client: Client<_, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (client, seen) = (client.clone(), seen.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    pass(client.clone(), upstream, req, seen.clone())
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// One call through the proxy.
async fn pass(
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    upstream: SocketAddr,
    req: hyper::Request<hyper::body::Incoming>,
    seen: mpsc::UnboundedSender<Seen>,
) -> Result<hyper::Response<Full<Bytes>>, hyper::Error> {
    let (mut parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let path = parts.uri.path().to_owned();
    parts.uri = format!("http://{upstream}{path}").parse().unwrap();
    let answer = client
        .request(hyper::Request::from_parts(parts, Full::new(body.clone())))
        .await
        .unwrap();
    let (parts, answer) = answer.into_parts();
    let answer = answer.collect().await?.to_bytes();
    let now = Instant::now();
    if parts.status.is_success() {
        match path.as_str() {
            "/v1/leases/claim" => {
                let claim: ClaimResponse = serde_json::from_slice(&answer).unwrap();
                for lease in claim.leases {
                    let _ = seen.send(Seen::Claimed(lease.task_id, now));
                }
            }
            "/v1/leases/report" => {
                let sent: ReportRequest = serde_json::from_slice(&body).unwrap();
                let ack: ReportResponse = serde_json::from_slice(&answer).unwrap();
                for r in sent.reports {
                    if ack.acknowledged && ack.accepted.contains(&r.lease_id) {
                        let _ = seen.send(Seen::Reported(r.task_id, now));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(hyper::Response::from_parts(parts, Full::new(answer)))
}

/// The `q`-quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn http(url: String, timeout_ms: u64) -> TaskSpec {
    TaskSpec::Http {
        url,
        method: None,
        timeout_ms: Some(timeout_ms),
        connect_timeout_ms: None,
        expect_status: None,
    }
}

const TASKS: usize = 3000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_tasks_are_each_reported_once_within_their_sla() {
    let web = FaultServer::http1()
        .route("/ok", Reply::ok("ok"))
        .start()
        .await
        .unwrap();
    let mock = MockDns::start().await.unwrap();
    let control = control_plane(Duration::from_secs(10)).await;
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let proxy = recording_proxy(control.addr(), seen_tx).await;
    let mut config = agent_config(&control, "loaded", mock.addr());
    config.control_plane = format!("http://{proxy}");
    config.max_inflight = 64;
    config.pools.insert(TaskKind::Http, 32);
    config.trace_runtime_workers = 3;
    let a = agent::start(config).await.unwrap();
    assert_eq!(
        a.trace_runtime_workers(),
        3,
        "ping and trace have a runtime of their own"
    );

    // Tasks come at a steady pace, 50 every 100 ms (500 a second), while the agent works.
    let start = Instant::now();
    let mut created = HashMap::with_capacity(TASKS);
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    for i in 0..TASKS {
        if i % 50 == 0 {
            pace.tick().await;
        }
        let id = format!("load-{i}");
        let at = Instant::now();
        task(&control, &id, http(web.url("/ok"), 5_000)).await;
        created.insert(id, at);
    }
    let created_in = start.elapsed();

    // Every report acknowledged, each once: the proxy's account, up to 60 s from the start.
    let mut claimed: HashMap<String, Instant> = HashMap::new();
    let mut reported: HashMap<String, Vec<Instant>> = HashMap::new();
    let deadline = start + Duration::from_secs(60);
    while reported.len() < TASKS {
        let event = tokio::time::timeout_at(deadline, seen.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {TASKS} reported within 60 s", reported.len()))
            .unwrap();
        match event {
            Seen::Claimed(id, at) => {
                let first = claimed.insert(id.clone(), at);
                assert!(first.is_none(), "{id} claimed twice");
            }
            Seen::Reported(id, at) => reported.entry(id).or_default().push(at),
        }
    }
    let all_in = start.elapsed();
    // Anything still in flight through the proxy (a second report of a task) shows now.
    while let Ok(event) = seen.try_recv() {
        if let Seen::Reported(id, at) = event {
            reported.entry(id).or_default().push(at);
        }
    }

    let mut waits = Vec::with_capacity(TASKS);
    let mut completions = Vec::with_capacity(TASKS);
    for (id, at) in &created {
        let reports = &reported[id];
        assert_eq!(reports.len(), 1, "{id} reported {} times", reports.len());
        // Each task's report passed the proxy after its claim (a report before the claim
        // would be the proxy's or the clock's fault, and the waits below would mean nothing).
        assert!(
            reports[0] >= claimed[id],
            "{id} reported before it was claimed"
        );
        waits.push(claimed[id] - *at);
        completions.push(reports[0] - *at);
    }
    // The control plane's own account: each task done, claimed once, one result.
    for id in created.keys() {
        let v = control.task(id).await.unwrap().unwrap();
        assert_eq!(
            (v.state, v.claims, v.results),
            (TaskState::Done, 1, 1),
            "{id}"
        );
    }
    let s = a.stats();
    assert_eq!(
        (s.claimed, s.completed, s.cancelled),
        (TASKS as u64, TASKS as u64, 0)
    );
    waits.sort_unstable();
    completions.sort_unstable();
    let (w50, w99) = (quantile(&waits, 0.5), quantile(&waits, 0.99));
    let (c50, c99) = (quantile(&completions, 0.5), quantile(&completions, 0.99));
    let c = a.concurrency();
    println!(
        "SLA: {TASKS} HTTP tasks created in {created_in:?} (500/s), all reported in {all_in:?}; \
         queue wait (created→claimed) p50 {w50:?} p99 {w99:?} max {:?}; \
         completion (created→reported) p50 {c50:?} p99 {c99:?} max {:?}; \
         windows: global {:?}, http {:?}, target {:?}; waits for a window {}; \
         timers: depth {} max lag {:?} late {}",
        waits[TASKS - 1],
        completions[TASKS - 1],
        c.global,
        c.kinds.get(&TaskKind::Http),
        c.targets.get("127.0.0.1"),
        c.waits,
        s.timer_depth,
        s.timer_max_lag,
        s.timers_late,
    );
    // The SLA, with room for a loaded debug build on two cores: claimed within 2 s and
    // reported within 5 s of creation for 99 % of the tasks.
    assert!(w99 < Duration::from_secs(2), "queue wait p99 {w99:?}");
    assert!(c99 < Duration::from_secs(5), "completion p99 {c99:?}");
    // A healthy target: its window never halved (its limit never fell below where it starts).
    let target = c.targets["127.0.0.1"];
    assert!(target.limit >= 8, "{target:?}");
    assert!(
        s.timer_depth < 16,
        "the timer queue holds a handful: {}",
        s.timer_depth
    );
    let metrics = a.metrics_text();
    for line in [
        "agent_concurrency_window{level=\"global\"} 64".to_owned(),
        format!(
            "agent_concurrency_window{{level=\"target\",target=\"127.0.0.1\"}} {}",
            target.limit
        ),
        "agent_concurrency_inflight{level=\"kind\",kind=\"http\"} 0".to_owned(),
    ] {
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    // The timer queue's depth is exported. Read after the snapshot above, it may differ from
    // it by the agent's own periodic timers re-arming meanwhile (seen: 2, then 3), so the
    // exported figure is held to the same bound rather than to the snapshot's value.
    let exported: usize = metrics
        .lines()
        .find_map(|l| l.strip_prefix("agent_timer_queue_depth "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("agent_timer_queue_depth in\n{metrics}"));
    assert!(
        exported < 16,
        "the exported timer queue holds a handful: {exported}"
    );
    a.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_window_settles_against_a_target_that_slows_under_load() {
    // Two workers, 20 ms a request, the rest queued: with n requests in flight an answer
    // takes about n / 2 × 20 ms, so the 200 ms timeout is reached from about 20 in flight.
    const SETTLE: u32 = 20;
    const CEILING: u32 = 48;
    const N: usize = 1200;
    let cap = Capacity::new(2);
    let web = FaultServer::http1()
        .route(
            "/slows",
            Script::capacity(&cap, Reply::ok("ok").delay(Duration::from_millis(20))),
        )
        .start()
        .await
        .unwrap();
    let mock = MockDns::start().await.unwrap();
    let control = control_plane(Duration::from_secs(10)).await;
    for i in 0..N {
        task(&control, &format!("slow-{i}"), http(web.url("/slows"), 200)).await;
    }
    let mut config = agent_config(&control, "adaptive", mock.addr());
    config.max_inflight = 64;
    config.pools.insert(TaskKind::Http, CEILING);
    config.target_limits.max = CEILING;
    config.pools.insert(TaskKind::Ping, 0);
    config.pools.insert(TaskKind::Trace, 0);
    let a = agent::start(config).await.unwrap();
    assert_eq!(
        a.trace_runtime_workers(),
        0,
        "no ping or trace pool, no runtime for them"
    );

    // The target's window every 25 ms until every task is done (bounded at 60 s).
    let start = Instant::now();
    let mut samples: Vec<(Duration, u32)> = Vec::new();
    let mut every = tokio::time::interval(Duration::from_millis(25));
    loop {
        every.tick().await;
        if let Some(w) = a.concurrency().targets.get("127.0.0.1") {
            samples.push((start.elapsed(), w.limit));
        }
        let s = a.stats();
        if s.reports_accepted == N as u64 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} of {N} reported in 60 s",
            s.reports_accepted
        );
    }
    let took = start.elapsed();
    // Warm-up: until the window first fell (it found the target's limit).
    let first_fall = samples
        .windows(2)
        .position(|w| w[1].1 < w[0].1)
        .expect("the window never fell: the target never slowed it")
        + 1;
    let settled = &samples[first_fall..];
    let lo = settled.iter().map(|s| s.1).min().unwrap();
    let hi = settled.iter().map(|s| s.1).max().unwrap();
    let falls = settled.windows(2).filter(|w| w[1].1 < w[0].1).count();
    let mean = settled.iter().map(|s| f64::from(s.1)).sum::<f64>() / settled.len() as f64;
    let s = a.stats();
    println!(
        "AIMD: {N} tasks against a target slowing from ~{SETTLE} in flight in {took:?}; \
         warm-up {:?} (window {} at first fall); after it, {} samples: window {lo}..={hi} \
         (max/min {:.2}, mean {mean:.1}, {falls} more falls), ceiling {CEILING}; \
         server arrivals {} max queue wait {:?}; agent completed {} cancelled {}",
        samples[first_fall].0,
        samples[first_fall - 1].1,
        settled.len(),
        f64::from(hi) / f64::from(lo),
        cap.arrivals(),
        cap.max_wait(),
        s.completed,
        s.cancelled,
    );
    // Settled: the window keeps within a factor of 3 (×0.5 decreases make the sawtooth's
    // span 2, plus the growth before a timeout is seen), around the target's limit, and
    // below the ceiling; it kept adapting (fell again after the warm-up).
    assert!(falls >= 1, "the window fell only once");
    assert!(hi < CEILING, "the window reached the ceiling: {hi}");
    assert!(u64::from(hi) <= 3 * u64::from(lo), "window {lo}..={hi}");
    assert!(
        (SETTLE / 4..=SETTLE * 2).contains(&lo) && hi <= SETTLE * 2,
        "window {lo}..={hi} around {SETTLE}"
    );
    assert_eq!(s.cancelled, 0);
    a.shutdown(Duration::from_secs(5)).await;
}
