//! `xtask bench` end to end: the server in its own process, every scenario, the JSON's shape.
#![allow(clippy::unwrap_used, reason = "a test: a failure is the report")]

use std::process::Command;

use serde_json::Value;

/// A tiny run of every scenario (4 callers each, 0.2 s per client, 3 rounds): every client
/// answers without errors; HTTP/2 clients use one connection; ratios are paired; the
/// failing-upstream figures hold.
#[test]
fn a_short_bench_measures_every_scenario() {
    let dir = std::env::temp_dir().join(format!("xtask-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("bench.json");
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args([
            "bench",
            "--secs",
            "0.2",
            "--rounds",
            "3",
            "--concurrency",
            "4",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let svg = std::fs::read_to_string(json.with_extension("svg")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let scenarios = report["scenarios"].as_object().unwrap();
    let names: Vec<&str> = scenarios.keys().map(String::as_str).collect();
    for name in [
        "h1-256",
        "h1-16",
        "h1-1",
        "h2c-256",
        "h2-tls-256",
        "body-1m",
        "hosts-10k",
    ] {
        assert!(names.contains(&name), "{name} missing: {names:?}");
    }
    for (name, s) in scenarios {
        let clients = s["clients"].as_object().unwrap();
        let expected = if name == "h2-tls-256" { 3 } else { 4 };
        assert_eq!(clients.len(), expected, "{name}: {clients:?}");
        for (key, c) in clients {
            assert!(c["ok"].as_u64().unwrap() > 0, "{name} {key}: {c}");
            assert_eq!(c["errors"], 0, "{name} {key}: {c}");
            assert!(c["cpu_us_per_req"]["median"].as_f64().unwrap() > 0.0);
            let vs = &c["vs_limit"];
            if key == "hyper" {
                assert!(vs.is_null(), "{name}: {c}");
            } else {
                assert!(
                    vs["rps"]["median"].as_f64().unwrap() > 0.0,
                    "{name} {key}: {c}"
                );
                assert!(vs["rps"]["q1"].as_f64() <= vs["rps"]["q3"].as_f64());
            }
        }
        if name.starts_with("h2") {
            // The limit is hyper's h2 client on one connection; soulbase-net's pool shares
            // one connection too.
            assert_eq!(clients["hyper"]["conns"], 1.0, "{name}");
        }
        if name == "hosts-10k" {
            // Every request went to another host: at least one connection per request sent
            // while fewer than 10 000 had been made.
            let hyper = &clients["hyper"];
            let conns = hyper["conns"].as_f64().unwrap();
            assert!(conns > 4.0, "{hyper}");
        }
    }
    assert_eq!(report["breaker"]["attempts_off"], 500);
    assert!(report["breaker"]["reduction"].as_f64().unwrap() >= 0.9);
    // Without a budget every request makes its 3 attempts; with it, retries add at most
    // 20 % of the requests plus 10 a second over the 10 s window.
    assert_eq!(report["retry_budget"]["attempts_off"], 1500);
    let on = report["retry_budget"]["attempts_on"].as_u64().unwrap();
    assert!((500..=700).contains(&on), "{on}");
    // With redis-server installed (CI installs it), the fleet row: the shared limit never
    // refused (its rate is far above the load) and leases spared Redis.
    if !report["fleet"].is_null() {
        let f = &report["fleet"];
        assert_eq!(f["shared"]["errors"], 0, "{f}");
        assert!(f["redis_calls_per_request"].as_f64().unwrap() <= 0.1, "{f}");
    }
    assert!(stdout.contains("| soulbase-net full |"), "{stdout}");
}
