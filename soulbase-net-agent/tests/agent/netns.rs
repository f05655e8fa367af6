//! Ping and trace over a path of real routers: a chain of network namespaces the test builds
//! (client — r1 — r2 — target, joined by veth pairs, forwarding in r1 and r2), each probe run
//! by the agent binary's `probe` subcommand inside the client's namespace. The namespaces
//! have no link to the host's network, so nothing a probe sends can leave the machine.
//!
//! Needs root (namespaces, raw sockets) and `ip` (iproute2); without them the tests fail,
//! they never skip. No `netem` in this kernel: loss is made by blackhole routes, switched on
//! mid-ping for partial loss.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::{timeout, Instant};

use super::ns::{ip, ip_in, Chain, R1_NEAR, R1_NEAR_V6, R2_NEAR, R2_NEAR_V6, TARGET, TARGET_V6};

/// The agent binary.
const AGENT: &str = env!("CARGO_BIN_EXE_soulbase-net-agent");

/// The agent's `probe` subcommand, run in namespace `ns` for `spec`.
fn probe_command(ns: &str, spec: &Value) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("ip");
    cmd.args(["netns", "exec", ns, AGENT, "probe", &spec.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// The result the probe printed, with its exit code checked against its status.
fn result_of(out: &std::process::Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "probe printed no result ({e}; {}): {stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let ok = result["status"] == json!("ok");
    assert_eq!(out.status.code(), Some(if ok { 0 } else { 1 }), "{result}");
    result
}

/// Runs `spec` in namespace `ns` (within 30 s); the result it printed.
async fn probe(ns: &str, spec: Value) -> Value {
    let out = timeout(Duration::from_secs(30), probe_command(ns, &spec).output())
        .await
        .expect("the probe ends within 30 s")
        .expect("`ip netns exec` runs");
    let result = result_of(&out);
    eprintln!("probe in {ns}: {spec}\n  -> {result}");
    result
}

/// The value of observation `name`.
fn value<'a>(result: &'a Value, name: &str) -> &'a Value {
    &observation(result, name)["value"]
}

/// Observation `name` of a result printed by `probe`.
fn observation<'a>(result: &'a Value, name: &str) -> &'a Value {
    result["observations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == name)
        .unwrap_or_else(|| panic!("no observation `{name}` in {result}"))
}

/// The hops of a trace: (address or `None`, RTT in ms or `None`), in TTL order from 1.
fn hops(result: &Value) -> Vec<(Option<String>, Option<f64>)> {
    assert_eq!(observation(result, "hops")["unit"], "ms");
    value(result, "hops")
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, hop)| {
            assert_eq!(hop["ttl"], json!(i + 1), "{result}");
            (
                hop["address"].as_str().map(str::to_owned),
                hop["rtt_ms"].as_f64(),
            )
        })
        .collect()
}

#[tokio::test]
async fn ping_across_two_routers_gets_every_reply_with_its_rtt() {
    let chain = Chain::build("all");
    let before = chain.echoes_at_target();
    let r = probe(
        &chain.client,
        json!({"kind": "ping", "host": TARGET, "count": 5, "interval_ms": 20, "timeout_ms": 2000}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(value(&r, "address"), TARGET);
    assert_eq!(value(&r, "sent"), 5);
    assert_eq!(value(&r, "received"), 5);
    assert_eq!(value(&r, "loss"), 0.0);
    assert_eq!(observation(&r, "loss")["unit"], "%");
    let rtts: Vec<f64> = value(&r, "rtts")
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(rtts.len(), 5, "{r}");
    assert!(rtts.iter().all(|&ms| ms > 0.0 && ms < 2000.0), "{r}");
    let (min, avg, max) = (
        value(&r, "rtt_min_ms").as_f64().unwrap(),
        value(&r, "rtt_avg_ms").as_f64().unwrap(),
        value(&r, "rtt_max_ms").as_f64().unwrap(),
    );
    for name in ["rtts", "rtt_min_ms", "rtt_avg_ms", "rtt_max_ms"] {
        assert_eq!(observation(&r, name)["unit"], "ms");
    }
    assert_eq!(min, rtts.iter().copied().fold(f64::MAX, f64::min));
    assert_eq!(max, rtts.iter().copied().fold(0.0, f64::max));
    assert!(min <= avg && avg <= max, "{r}");
    // The five echoes crossed both routers: the target's kernel counted exactly them.
    assert_eq!(chain.echoes_at_target() - before, 5);
}

#[tokio::test]
async fn two_pings_and_a_trace_at_once_each_take_only_their_own_answers() {
    let chain = Chain::build("many");
    let before = chain.echoes_at_target();
    let ping =
        json!({"kind": "ping", "host": TARGET, "count": 10, "interval_ms": 10, "timeout_ms": 2000});
    let trace = json!({"kind": "trace", "host": TARGET, "max_hops": 8, "timeout_ms": 2000});
    // Three raw sockets in one namespace: each sees every ICMP message of the others.
    let (a, b, t) = tokio::join!(
        probe(&chain.client, ping.clone()),
        probe(&chain.client, ping),
        probe(&chain.client, trace),
    );
    for r in [&a, &b] {
        assert_eq!(value(r, "sent"), 10, "{r}");
        assert_eq!(value(r, "received"), 10, "{r}");
        assert!(
            value(r, "rtts")
                .as_array()
                .unwrap()
                .iter()
                .all(Value::is_number),
            "{r}"
        );
    }
    let addresses: Vec<_> = hops(&t).into_iter().map(|(a, _)| a).collect();
    assert_eq!(
        addresses,
        [R1_NEAR, R2_NEAR, TARGET].map(|a| Some(a.to_owned())),
        "{t}"
    );
    // Twenty echoes, and the trace's third probe (the first two expired on the way).
    assert_eq!(chain.echoes_at_target() - before, 21);
}

#[tokio::test]
async fn ping_through_a_blackholing_router_loses_every_echo() {
    let chain = Chain::build("lost");
    chain.blackhole_at_r2();
    let start = Instant::now();
    let r = probe(
        &chain.client,
        json!({"kind": "ping", "host": TARGET, "count": 3, "interval_ms": 50, "timeout_ms": 300}),
    )
    .await;
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(value(&r, "sent"), 3);
    assert_eq!(value(&r, "received"), 0);
    assert_eq!(value(&r, "loss"), 100.0);
    assert_eq!(value(&r, "rtts"), &json!([null, null, null]));
    assert_eq!(value(&r, "error_kind"), "timeout");
    assert!(r["error"].as_str().unwrap().contains("all lost"), "{r}");
    assert!(r["observations"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["name"] != "rtt_avg_ms"));
    // Two intervals and one timeout, not three timeouts in a row (and well short of 3 s).
    assert!(start.elapsed() < Duration::from_secs(3), "{r}");
    assert_eq!(chain.echoes_at_target(), 0, "r2 dropped every echo");
}

#[tokio::test]
async fn a_blackhole_switched_on_mid_ping_loses_every_echo_after_it() {
    let chain = Chain::build("part");
    let count = 30;
    let spec = json!({"kind": "ping", "host": TARGET, "count": count, "interval_ms": 100, "timeout_ms": 500});
    let mut child = probe_command(&chain.client, &spec).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // The agent logs each reply as it comes: the third one switches the blackhole on.
    timeout(Duration::from_secs(10), async {
        let mut replies = 0;
        while replies < 3 {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("the agent's log ended before three replies");
            replies += usize::from(line.contains("echo reply"));
        }
    })
    .await
    .expect("three replies within 10 s");
    chain.blackhole_at_r2();
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let out = timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the ping ends within 30 s")
        .unwrap();
    drain.await.unwrap();
    let r = result_of(&out);
    eprintln!("probe in {}: {spec}\n  -> {r}", chain.client);
    assert_eq!(r["status"], "ok", "some came back: {r}");
    assert_eq!(value(&r, "sent"), count);
    let received = value(&r, "received").as_u64().unwrap();
    // Three before the switch; the last dozen of the 3 s run surely after it.
    assert!((3..count - 12).contains(&received), "{r}");
    let rtts = value(&r, "rtts").as_array().unwrap();
    let (answered, lost) = rtts.split_at(received as usize);
    assert!(answered.iter().all(Value::is_number), "replies first: {r}");
    assert!(lost.iter().all(Value::is_null), "then only losses: {r}");
    let expected_loss = ((count - received) as f64 * 10_000.0 / count as f64).round() / 100.0;
    assert_eq!(value(&r, "loss").as_f64().unwrap(), expected_loss);
    assert_eq!(chain.echoes_at_target(), received);
}

#[tokio::test]
async fn trace_names_every_router_in_order_then_reaches_the_target() {
    let chain = Chain::build("trace");
    let r = probe(
        &chain.client,
        json!({"kind": "trace", "host": TARGET, "max_hops": 8, "timeout_ms": 2000}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(value(&r, "reached"), true);
    assert_eq!(value(&r, "hop_count"), 3);
    let hops = hops(&r);
    let addresses: Vec<_> = hops.iter().map(|(a, _)| a.as_deref()).collect();
    assert_eq!(addresses, [Some(R1_NEAR), Some(R2_NEAR), Some(TARGET)]);
    assert!(
        hops.iter()
            .all(|(_, rtt)| rtt.is_some_and(|ms| ms > 0.0 && ms < 2000.0)),
        "{r}"
    );
}

#[tokio::test]
async fn trace_past_a_blackholing_router_lists_silent_hops_up_to_max_hops() {
    let chain = Chain::build("silent");
    chain.blackhole_at_r2();
    let start = Instant::now();
    let r = probe(
        &chain.client,
        json!({"kind": "trace", "host": TARGET, "max_hops": 4, "timeout_ms": 300}),
    )
    .await;
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(value(&r, "reached"), false);
    assert_eq!(value(&r, "hop_count"), 4);
    assert_eq!(value(&r, "error_kind"), "timeout");
    // r2 drops a probe before its TTL is looked at: only r1 answers.
    let hops = hops(&r);
    assert_eq!(hops[0].0.as_deref(), Some(R1_NEAR), "{r}");
    assert!(hops[0].1.is_some(), "{r}");
    assert!(hops[1..].iter().all(|h| *h == (None, None)), "{r}");
    assert!(start.elapsed() < Duration::from_secs(4), "{r}");
}

#[tokio::test]
async fn an_unreachable_route_stops_the_trace_and_fails_the_ping_with_who_said_so() {
    let chain = Chain::build("unreach");
    ip(&[
        "-n",
        &chain.r2,
        "route",
        "add",
        "unreachable",
        "10.9.3.2/32",
    ]);
    let r = probe(
        &chain.client,
        json!({"kind": "trace", "host": TARGET, "max_hops": 8, "timeout_ms": 2000}),
    )
    .await;
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(value(&r, "reached"), false);
    // Stopped where the route ends, not at max_hops.
    assert_eq!(value(&r, "hop_count"), 2);
    let hops = hops(&r);
    assert_eq!(hops[0].0.as_deref(), Some(R1_NEAR));
    assert_eq!(hops[1].0.as_deref(), Some(R2_NEAR));
    assert_eq!(value(&r, "unreachable_from"), R2_NEAR);
    assert_eq!(value(&r, "unreachable_code"), 1, "host unreachable");
    assert_eq!(value(&r, "error_kind"), "unreachable");

    let r = probe(
        &chain.client,
        json!({"kind": "ping", "host": TARGET, "count": 2, "interval_ms": 50, "timeout_ms": 500}),
    )
    .await;
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(value(&r, "received"), 0);
    assert_eq!(value(&r, "unreachable_from"), R2_NEAR);
    assert_eq!(value(&r, "error_kind"), "unreachable");
    assert!(
        r["error"].as_str().unwrap().contains("host unreachable"),
        "{r}"
    );
}

#[tokio::test]
async fn without_a_route_every_echo_is_lost_and_the_trace_fails_at_once() {
    // r1 has no default route: 192.0.2.1 (TEST-NET-1) is unroutable there, each send refused.
    let chain = Chain::build("noroute");
    let r = probe(
        &chain.r1,
        json!({"kind": "ping", "host": "192.0.2.1", "count": 3, "interval_ms": 20, "timeout_ms": 200}),
    )
    .await;
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(value(&r, "sent"), 3);
    assert_eq!(value(&r, "received"), 0);
    assert_eq!(value(&r, "loss"), 100.0);
    assert_eq!(value(&r, "error_kind"), "unreachable");
    let error = r["error"].as_str().unwrap();
    assert!(
        error.contains("sending to 192.0.2.1") && error.contains("unreachable"),
        "{r}"
    );

    let r = probe(
        &chain.r1,
        json!({"kind": "trace", "host": "192.0.2.1", "max_hops": 8, "timeout_ms": 200}),
    )
    .await;
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(value(&r, "error_kind"), "unreachable");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .starts_with("tracing 192.0.2.1"),
        "{r}"
    );
}

#[tokio::test]
async fn over_ipv6_ping_and_trace_cross_the_same_routers() {
    let chain = Chain::build("v6");
    let r = probe(
        &chain.client,
        json!({"kind": "ping", "host": TARGET_V6, "count": 3, "interval_ms": 20, "timeout_ms": 2000}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(value(&r, "address"), TARGET_V6);
    assert_eq!(value(&r, "received"), 3);
    assert_eq!(value(&r, "loss"), 0.0);
    assert!(value(&r, "rtt_max_ms").as_f64().unwrap() > 0.0, "{r}");

    let r = probe(
        &chain.client,
        json!({"kind": "trace", "host": TARGET_V6, "max_hops": 8, "timeout_ms": 2000}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(value(&r, "reached"), true);
    let hops = hops(&r);
    let addresses: Vec<_> = hops.iter().map(|(a, _)| a.as_deref()).collect();
    assert_eq!(
        addresses,
        [Some(R1_NEAR_V6), Some(R2_NEAR_V6), Some(TARGET_V6)]
    );
    assert!(hops.iter().all(|(_, rtt)| rtt.is_some()), "{r}");

    // A prohibit route in r2: ICMPv6 code 1, administratively prohibited (code 1 of ICMPv4
    // would be host unreachable).
    ip_in(&chain.r2, "-6 route add prohibit fd00:9:3::2/128");
    let r = probe(
        &chain.client,
        json!({"kind": "trace", "host": TARGET_V6, "max_hops": 8, "timeout_ms": 2000}),
    )
    .await;
    assert_eq!(value(&r, "reached"), false, "{r}");
    assert_eq!(value(&r, "hop_count"), 2);
    assert_eq!(value(&r, "unreachable_from"), R2_NEAR_V6);
    assert_eq!(value(&r, "unreachable_code"), 1);
    let error = r["error"].as_str().unwrap();
    assert!(error.ends_with("administratively prohibited"), "{r}");
}

#[tokio::test]
async fn without_cap_net_raw_a_ping_is_an_error_that_says_why() {
    // As nobody, with no capabilities (and unprivileged ping sockets off here), to loopback.
    let out = timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                AGENT,
                "probe",
                r#"{"kind": "ping", "host": "127.0.0.1", "count": 1}"#,
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap()
    .expect("setpriv (util-linux) runs");
    let r = result_of(&out);
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(value(&r, "error_kind"), "permission");
    assert!(r["error"].as_str().unwrap().contains("CAP_NET_RAW"), "{r}");
}

#[tokio::test]
async fn a_count_or_max_hops_out_of_range_is_refused_before_anything_is_sent() {
    for spec in [
        json!({"kind": "ping", "host": "127.0.0.1", "count": 0}),
        json!({"kind": "ping", "host": "127.0.0.1", "count": 65_537}),
        json!({"kind": "trace", "host": "127.0.0.1", "max_hops": 0}),
    ] {
        let mut cmd = tokio::process::Command::new(AGENT);
        cmd.args(["probe", &spec.to_string()]).kill_on_drop(true);
        let out = timeout(Duration::from_secs(30), cmd.output())
            .await
            .unwrap()
            .unwrap();
        let r = result_of(&out);
        assert_eq!(r["status"], "error", "{r}");
        assert_eq!(value(&r, "error_kind"), "invalid_request", "{r}");
        assert_eq!(r["observations"].as_array().unwrap().len(), 1, "{r}");
    }
}
