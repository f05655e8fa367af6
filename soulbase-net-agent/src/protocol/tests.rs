use serde::de::DeserializeOwned;
use serde_json::json;

use super::*;

/// `value` reads as `T`, and `T` writes back exactly `value`.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + fmt::Debug>(
    value: serde_json::Value,
) -> T {
    let t: T = serde_json::from_value(value.clone()).unwrap();
    assert_eq!(serde_json::to_value(&t).unwrap(), value);
    t
}

#[test]
fn task_kind_is_snake_case() {
    for kind in TaskKind::ALL {
        let k: TaskKind = round_trip(json!(kind.as_str()));
        assert_eq!(k, kind);
        assert_eq!(TaskKind::parse(&kind.as_str().to_uppercase()), Some(kind));
    }
    assert_eq!(TaskKind::parse("icmp"), None);
}

#[test]
fn task_spec_of_each_kind() {
    let dns: TaskSpec = round_trip(
        json!({"kind": "dns", "name": "example.test", "record_types": ["A", "AAAA", "MX", "NS", "TXT"], "timeout_ms": 500}),
    );
    assert_eq!(dns.kind(), TaskKind::Dns);
    let http: TaskSpec = round_trip(
        json!({"kind": "http", "url": "http://127.0.0.1:1/", "method": "HEAD", "timeout_ms": 1000, "connect_timeout_ms": 200, "expect_status": 204}),
    );
    assert_eq!(http.kind(), TaskKind::Http);
    let tcp: TaskSpec = round_trip(json!({"kind": "tcp", "host": "127.0.0.1", "port": 80}));
    assert_eq!(tcp.kind(), TaskKind::Tcp);
    let ping: TaskSpec = round_trip(json!({"kind": "ping", "host": "127.0.0.1", "count": 3}));
    assert_eq!(ping.kind(), TaskKind::Ping);
    let trace: TaskSpec = round_trip(json!({"kind": "trace", "host": "127.0.0.1", "max_hops": 8}));
    assert_eq!(trace.kind(), TaskKind::Trace);
    // Defaults: record types are A.
    let dns: TaskSpec = serde_json::from_value(json!({"kind": "dns", "name": "x.test"})).unwrap();
    assert!(
        matches!(dns, TaskSpec::Dns { ref record_types, .. } if record_types == &[DnsRecordType::A])
    );
    // Unknown fields and kinds are refused.
    assert!(serde_json::from_value::<TaskSpec>(
        json!({"kind": "tcp", "host": "h", "port": 1, "x": 1})
    )
    .is_err());
    assert!(serde_json::from_value::<TaskSpec>(json!({"kind": "icmp", "host": "h"})).is_err());
}

#[test]
fn lease() {
    let l: Lease = round_trip(
        json!({"lease_id": "ab12", "task_id": "t1", "spec": {"kind": "tcp", "host": "127.0.0.1", "port": 9}, "lease_ms": 10000, "attempt": 1}),
    );
    assert_eq!(l.spec.kind(), TaskKind::Tcp);
}

#[test]
fn claim_request_and_response() {
    let c: ClaimRequest = round_trip(json!({"capacity": {"dns": 4, "http": 2}}));
    assert_eq!(c.capacity[&TaskKind::Http], 2);
    let r: ClaimResponse = round_trip(
        json!({"leases": [{"lease_id": "l", "task_id": "t", "spec": {"kind": "dns", "name": "a.test", "record_types": ["A"]}, "lease_ms": 5000, "attempt": 2}]}),
    );
    assert_eq!(r.leases.len(), 1);
}

#[test]
fn extend_request_and_response() {
    let e: ExtendRequest = round_trip(json!({"lease_ids": ["a", "b"]}));
    assert_eq!(e.lease_ids.len(), 2);
    let r: ExtendResponse =
        round_trip(json!({"extended": ["a"], "lost": ["b"], "lease_ms": 10000}));
    assert_eq!(r.lost, ["b"]);
}

#[test]
fn report_request_and_response() {
    let r: ReportRequest = round_trip(json!({"reports": [{
        "lease_id": "l", "task_id": "t", "status": "error",
        "observations": [{"name": "connect_ms", "value": 1.5, "unit": "ms"}, {"name": "connected", "value": false}],
        "error": "connection refused"
    }]}));
    assert_eq!(r.reports[0].status, ReportStatus::Error);
    assert_eq!(r.reports[0].observations[1].unit, None);
    let a: ReportResponse =
        round_trip(json!({"acknowledged": true, "accepted": ["l"], "refused": []}));
    assert!(a.acknowledged);
}

#[test]
fn observation_any_value_and_optional_unit() {
    let o: Observation =
        round_trip(json!({"name": "mx", "value": [{"preference": 10, "exchange": "mx.test."}]}));
    assert_eq!(
        o,
        Observation::new("mx", json!([{"preference": 10, "exchange": "mx.test."}]))
    );
    let o: Observation = round_trip(json!({"name": "rtt", "value": 3, "unit": "ms"}));
    assert_eq!(o, Observation::with_unit("rtt", 3, "ms"));
}

#[test]
fn heartbeat_and_register() {
    let h: HeartbeatRequest = round_trip(json!({"inflight": 1, "queued": 2, "leases": 3}));
    assert_eq!(h.leases, 3);
    let _: HeartbeatResponse = round_trip(json!({"session": 2}));
    let r: RegisterRequest = round_trip(
        json!({"version": "0.1.0", "kinds": ["dns", "http", "tcp"], "max_inflight": 64, "hostname": "probe-1"}),
    );
    assert_eq!(r.kinds.len(), 3);
    let _: RegisterResponse = round_trip(
        json!({"agent_id": "a1", "session": 1, "resumed": false, "heartbeat_ms": 5000, "lease_ms": 10000}),
    );
}

#[test]
fn tasks_api() {
    let c: CreateTask = round_trip(
        json!({"spec": {"kind": "tcp", "host": "127.0.0.1", "port": 1}, "every_secs": 30}),
    );
    assert_eq!(c.every_secs, Some(30));
    let _: CreateTaskResponse = round_trip(json!({"task_id": "t1"}));
    let v: TaskView = round_trip(json!({
        "task_id": "t1", "spec": {"kind": "tcp", "host": "127.0.0.1", "port": 1}, "state": "done",
        "claims": 1, "results": 1,
        "last": {"lease_id": "l", "agent_id": "a", "status": "ok", "observations": [], "reported_at_ms": 1}
    }));
    assert_eq!(v.state, TaskState::Done);
    let _: TaskResults = round_trip(json!({"results": []}));
    let _: ErrorBody = round_trip(json!({"code": "AUTH.FORBIDDEN", "message": "wrong token"}));
}
