//! The issue's end-to-end proof, in network namespaces: the control plane and three agents as
//! processes, targets the testkit provides (a FaultServer, a MockDns, an open and a closed TCP
//! port) and, for ping and trace, the namespace chain of `ns` (client — r1 — r2 — target,
//! forwarding in the routers), with a second address of the target that r2 blackholes.
//!
//! A process started with `ip netns exec` sees only that namespace's network, and the
//! testkit's servers listen where the test process is. So the test runs twice: outside, it
//! builds the chain and runs this same test binary (this test only) inside the client's
//! namespace with `ip netns exec`; inside, it starts the targets on the namespace's loopback,
//! the control plane binary (`control`), three agent binaries (`agent`, configured by a file
//! and the seed's variables), and drives them over the control plane's operator API. The
//! chain has no link to the host's network: nothing leaves the machine. Outside, a guard kills
//! what is left in the namespace (by id) and the chain's guard deletes the namespaces, even
//! when the scenario fails or hangs.
//!
//! Root and `ip` (iproute2) needed, as for `netns`; never skipped.
#![allow(
    clippy::print_stdout,
    reason = "the scenario's steps, outside `#[test]` functions, print what they measured"
)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use soulbase_net_core::NetRequest;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{refused_addr, FaultServer, Gate, MockDns, Reply};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::time::{timeout, Instant};

use super::ns::{ip_in, Chain, R1_NEAR, R2_NEAR, TARGET};
use super::{binary, eventually, loopback_client};
/// Set in the inner run: the scenario runs, rather than the chain being built.
const INSIDE: &str = "SOULBASE_FLEET_INSIDE";
/// This test's name, as the harness filters it.
const TEST: &str =
    "fleet::three_agents_in_namespaces_run_every_kind_survive_sigkill_and_revocation";
/// A second address of the target, which r2 blackholes: a ping of it is lost.
const LOST: &str = "10.9.3.3";
/// The control plane's lease (`--lease-secs 2`); the agents extend every third of it.
const LEASE: Duration = Duration::from_secs(2);
/// The control plane's operator token.
const ADMIN: &str = "fleet-admin-token";
/// The tasks the SIGKILLed agent holds.
const HELD: [&str; 3] = ["held-1", "held-2", "held-3"];

/// Every kind reports the right observation; an agent killed with SIGKILL has its leases
/// taken by another within the lease; a revoked lease is cancelled; no task is reported done
/// twice. Outside the namespace: builds the chain and runs itself in the client's namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_in_namespaces_run_every_kind_survive_sigkill_and_revocation() {
    if std::env::var_os(INSIDE).is_some() {
        return scenario().await;
    }
    let chain = Chain::build("fleet");
    let _reaper = Reaper(&chain.client);
    ip_in(&chain.target, &format!("addr add {LOST}/24 dev to-r2"));
    ip_in(&chain.r2, &format!("route add blackhole {LOST}/32"));
    let mut inner = Command::new("ip");
    inner
        .args(["netns", "exec", &chain.client])
        .arg(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(INSIDE, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = timeout(Duration::from_secs(120), inner.output())
        .await
        .expect("the scenario ends within 120 s")
        .expect("`ip netns exec` runs");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the scenario in {} failed ({}): its output is above",
        chain.client,
        out.status
    );
    // The ping's 3 echoes and the trace's last probe crossed both routers; r2 dropped the
    // lost ping's 3 (same target, blackholed address).
    assert_eq!(
        chain.echoes_at_target(),
        4,
        "echoes the target's kernel received"
    );
}

/// Kills whatever is left in namespace `.0` (the scenario's control plane and agents, were the
/// scenario itself killed), each by its id, before the chain is deleted.
struct Reaper<'a>(&'a str);

impl Drop for Reaper<'_> {
    fn drop(&mut self) {
        let Ok(out) = std::process::Command::new("ip")
            .args(["netns", "pids", self.0])
            .output()
        else {
            return;
        };
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", pid])
                .status();
        }
    }
}

/// A directory of the scenario's files, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The control plane binary and an operator's client of its API.
struct Control {
    _child: Child,
    url: String,
    http: Client,
}

impl Control {
    /// Starts the control plane on a SQLite file in `dir`, as "Running it" does. (In memory,
    /// its store was seen to lose every table — `no such table: tasks` — right after an agent
    /// was killed, about once in 30 runs under load: its pool's one connection was replaced by
    /// a new, empty in-memory database.)
    async fn start(dir: &TempDir) -> Control {
        let mut command = binary::control();
        command
            .arg("--lease-secs")
            .arg(LEASE.as_secs().to_string())
            .arg("--database")
            .arg(dir.0.join("control.db"))
            .env("AGENT_ADMIN_TOKEN", ADMIN);
        let (child, url) = binary::spawn_control(&mut command, true).await;
        Control {
            _child: child,
            url,
            http: loopback_client(),
        }
    }

    /// Sends `req` (with the admin token); its status and body.
    async fn call(&self, req: NetRequest) -> (u16, String) {
        let res = self
            .http
            .send(req.header("authorization", format!("Bearer {ADMIN}")))
            .await
            .unwrap();
        (res.status.as_u16(), res.text().await.unwrap())
    }

    /// `GET path` as JSON, expecting 200.
    async fn get(&self, path: &str) -> Value {
        let (status, body) = self
            .call(NetRequest::get(format!("{}{path}", self.url)))
            .await;
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Creates the one-off task `id` running `spec`.
    async fn create(&self, id: &str, spec: Value) {
        let req = NetRequest::post(format!("{}/v1/tasks", self.url))
            .json(&json!({"spec": spec, "id": id}))
            .unwrap();
        let (status, body) = self.call(req).await;
        assert_eq!(status, 201, "creating {id}: {body}");
    }

    async fn view(&self, id: &str) -> Value {
        self.get(&format!("/v1/tasks/{id}")).await
    }

    /// Every result stored for task `id`.
    async fn results(&self, id: &str) -> Vec<Value> {
        let v = self.get(&format!("/v1/tasks/{id}/results?limit=100")).await;
        v["results"].as_array().unwrap().clone()
    }

    /// Waits until task `id` is done; its only result.
    async fn done(&self, id: &str) -> Value {
        let view = eventually(
            &format!("task {id} done"),
            Duration::from_secs(20),
            || async {
                let v = self.view(id).await;
                (v["state"] == "done").then_some(v)
            },
        )
        .await;
        let results = self.results(id).await;
        assert_eq!(
            results.len(),
            1,
            "task {id} is reported done once: {results:?}"
        );
        assert_eq!(view["results"], 1, "{view}");
        results.into_iter().next().unwrap()
    }

    /// The value of the control plane's counter `name`.
    async fn metric(&self, name: &str) -> f64 {
        let (status, text) = self
            .call(NetRequest::get(format!("{}/metrics", self.url)))
            .await;
        assert_eq!(status, 200, "{text}");
        metric(&text, name)
    }
}

/// The value of sample `name` (without labels) in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no `{name}` in\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// An agent binary, configured by a file (quick heartbeats and claim back-off) and the seed's
/// variables, serving its metrics.
struct Agent {
    id: String,
    child: Child,
    metrics: String,
}

impl Agent {
    async fn start(id: &str, control: &Control, dns: &MockDns, dir: &TempDir) -> Agent {
        let file = dir.0.join(format!("{id}.toml"));
        std::fs::write(
            &file,
            format!(
                "control_plane = \"{}\"\nagent_id = \"{id}\"\ntoken = \"token-of-{id}\"\n\
                 heartbeat_every = \"200ms\"\nclaim_backoff_min = \"10ms\"\n\
                 claim_backoff_max = \"100ms\"\ncall_timeout = \"3s\"\n",
                control.url
            ),
        )
        .unwrap();
        let mut command = binary::command(&["agent"]);
        command
            .env("AGENT_CONFIG", &file)
            .env("AGENT_DNS_SERVERS", dns.addr().to_string())
            .env("AGENT_PROBE_GRANTS", "127.0.0.1/32")
            .env("AGENT_METRICS_LISTEN", "127.0.0.1:0");
        // Said once it has registered.
        let (child, metrics) =
            binary::spawn_until(&mut command, id, "agent metrics on ", true).await;
        Agent {
            id: id.to_owned(),
            child,
            metrics,
        }
    }

    /// The value of the agent's counter `name`.
    async fn metric(&self, control: &Control, name: &str) -> f64 {
        let res = control
            .http
            .send(NetRequest::get(self.metrics.clone()))
            .await
            .unwrap();
        metric(&res.text().await.unwrap(), name)
    }
}

/// The value of observation `name` of a stored result.
fn value<'a>(result: &'a Value, name: &str) -> &'a Value {
    &result["observations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == name)
        .unwrap_or_else(|| panic!("no observation `{name}` in {result}"))["value"]
}

fn http(url: String) -> Value {
    json!({"kind": "http", "url": url, "timeout_ms": 30_000})
}

/// The scenario, inside the client's namespace.
async fn scenario() {
    let started = Instant::now();
    let held = Gate::new();
    let revoked = Gate::new();
    let web = FaultServer::http1()
        .route("/ok", Reply::ok("hello"))
        .route("/teapot", Reply::status(418))
        .route("/held", Reply::ok("held").after(&held))
        .route("/revoked", Reply::ok("again").after(&revoked))
        .start()
        .await
        .unwrap();
    let port = web.addr().port();
    let dns = MockDns::start().await.unwrap();
    dns.set_ips("web.fleet.test", &["127.0.0.1".parse().unwrap()], 60);
    dns.set_ips("target.fleet.test", &[TARGET.parse().unwrap()], 60);
    let open = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open_port = open.local_addr().unwrap().port();
    let closed = refused_addr().await.unwrap();
    let dir = TempDir(std::env::temp_dir().join(format!("fleet-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();

    let control = Control::start(&dir).await;
    // Agent 1 alone first: it takes the three held tasks (their answers held back).
    let mut agent_1 = Agent::start("agent-1", &control, &dns, &dir).await;
    for id in HELD {
        control.create(id, http(web.url("/held"))).await;
    }
    timeout(Duration::from_secs(20), web.wait_for_hits("/held", 3))
        .await
        .expect("agent-1 runs the three held tasks");
    let held_since = Instant::now();
    for id in HELD {
        let v = control.view(id).await;
        assert_eq!(
            (&v["state"], &v["agent_id"]),
            (&json!("leased"), &json!("agent-1")),
            "{v}"
        );
    }
    let agent_2 = Agent::start("agent-2", &control, &dns, &dir).await;
    let agent_3 = Agent::start("agent-3", &control, &dns, &dir).await;

    every_kind(&control, &web, port, open_port, closed.port()).await;

    // Held past a whole lease: only agent-1's extensions keep its leases (an observation
    // window, not a wait for an event).
    let window = LEASE + Duration::from_millis(500);
    if let Some(left) = window.checked_sub(held_since.elapsed()) {
        tokio::time::sleep(left).await;
    }
    for id in HELD {
        let v = control.view(id).await;
        assert_eq!(
            (&v["state"], &v["agent_id"]),
            (&json!("leased"), &json!("agent-1")),
            "extended: {v}"
        );
        assert_eq!(v["claims"], 1, "{v}");
    }

    let agents = [&agent_1, &agent_2, &agent_3];
    revocation(&control, &web, &revoked, &agents).await;
    sigkill(&control, &mut agent_1, &held).await;

    // No task reported twice as done: one result each, and the control plane recorded one
    // report per task, refused none (the revoked lease's probe was never reported).
    let kinds = KINDS.map(|(id, _)| id);
    let all: Vec<&str> = kinds
        .iter()
        .chain(HELD.iter())
        .copied()
        .chain(["revoke-me"])
        .collect();
    for id in &all {
        let results = control.results(id).await;
        assert_eq!(results.len(), 1, "{id}: {results:?}");
        let v = control.view(id).await;
        assert_eq!(
            (&v["state"], &v["results"]),
            (&json!("done"), &json!(1)),
            "{v}"
        );
    }
    let reports = control.metric("agent_control_reports_total").await;
    let refused = control.metric("agent_control_refused_reports_total").await;
    let revocations = control.metric("agent_control_revoked_total").await;
    assert_eq!(reports, all.len() as f64, "one report recorded per task");
    assert_eq!(refused, 0.0, "no report of a lost lease");
    assert_eq!(revocations, 1.0);
    println!(
        "fleet: {} tasks each reported done once ({reports} reports recorded, {refused} refused) in {:.1?}",
        all.len(),
        started.elapsed()
    );
    drop((agent_2, agent_3, control));
}

/// The kinds' tasks: every one reports the right observation.
const KINDS: [(&str, &str); 10] = [
    ("http-ok", "http"),
    ("http-by-name", "http"),
    ("http-teapot", "http"),
    ("dns-a", "dns"),
    ("dns-nxdomain", "dns"),
    ("tcp-open", "tcp"),
    ("tcp-closed", "tcp"),
    ("ping", "ping"),
    ("ping-lost", "ping"),
    ("trace", "trace"),
];

async fn every_kind(control: &Control, web: &FaultServer, port: u16, open: u16, closed: u16) {
    let specs = [
        http(web.url("/ok")),
        http(format!("http://web.fleet.test:{port}/ok")),
        http(web.url("/teapot")),
        json!({"kind": "dns", "name": "target.fleet.test", "record_types": ["A"], "timeout_ms": 3000}),
        json!({"kind": "dns", "name": "missing.fleet.test", "record_types": ["A"], "timeout_ms": 3000}),
        json!({"kind": "tcp", "host": "127.0.0.1", "port": open, "timeout_ms": 2000}),
        json!({"kind": "tcp", "host": "127.0.0.1", "port": closed, "timeout_ms": 2000}),
        json!({"kind": "ping", "host": TARGET, "count": 3, "interval_ms": 100, "timeout_ms": 1000}),
        json!({"kind": "ping", "host": LOST, "count": 3, "interval_ms": 100, "timeout_ms": 300}),
        json!({"kind": "trace", "host": "target.fleet.test", "max_hops": 8, "timeout_ms": 1000}),
    ];
    for ((id, kind), spec) in KINDS.iter().zip(specs) {
        assert_eq!(spec["kind"], *kind);
        control.create(id, spec).await;
    }
    let mut by = Vec::new();
    let mut done = |r: Value, id: &str| {
        by.push(format!("{id}: {}", r["agent_id"].as_str().unwrap()));
        r
    };

    let r = done(control.done("http-ok").await, "http-ok");
    assert_eq!(
        (&r["status"], value(&r, "status")),
        (&json!("ok"), &json!(200)),
        "{r}"
    );
    assert_eq!(value(&r, "body_bytes"), 5, "{r}");
    let r = done(control.done("http-by-name").await, "http-by-name");
    assert_eq!(
        (&r["status"], value(&r, "status")),
        (&json!("ok"), &json!(200)),
        "{r}"
    );
    assert_eq!(web.hits("/ok"), 2, "the two probes of /ok, nothing more");
    let r = done(control.done("http-teapot").await, "http-teapot");
    assert_eq!(
        (&r["status"], value(&r, "status")),
        (&json!("error"), &json!(418)),
        "{r}"
    );

    let r = done(control.done("dns-a").await, "dns-a");
    assert_eq!(
        (&r["status"], value(&r, "a")),
        (&json!("ok"), &json!([TARGET])),
        "{r}"
    );
    let r = done(control.done("dns-nxdomain").await, "dns-nxdomain");
    assert_eq!(
        (&r["status"], value(&r, "rcode")),
        (&json!("error"), &json!("NXDOMAIN")),
        "{r}"
    );

    let r = done(control.done("tcp-open").await, "tcp-open");
    assert_eq!(
        (&r["status"], value(&r, "connected")),
        (&json!("ok"), &json!(true)),
        "{r}"
    );
    assert_eq!(
        value(&r, "address"),
        &json!(format!("127.0.0.1:{open}")),
        "{r}"
    );
    let r = done(control.done("tcp-closed").await, "tcp-closed");
    assert_eq!(
        (&r["status"], value(&r, "connected")),
        (&json!("error"), &json!(false)),
        "{r}"
    );
    assert_eq!(value(&r, "error_kind"), "refused", "{r}");

    // Across both routers to the target and back: every echo answered.
    let r = done(control.done("ping").await, "ping");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        (value(&r, "sent"), value(&r, "received")),
        (&json!(3), &json!(3)),
        "{r}"
    );
    assert_eq!(value(&r, "loss"), 0.0, "{r}");
    let rtts = value(&r, "rtts").as_array().unwrap();
    assert!(rtts.len() == 3 && rtts.iter().all(Value::is_number), "{r}");
    // r2 drops every echo for the blackholed address.
    let r = done(control.done("ping-lost").await, "ping-lost");
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(
        (value(&r, "sent"), value(&r, "received")),
        (&json!(3), &json!(0)),
        "{r}"
    );
    assert_eq!(value(&r, "loss"), 100.0, "{r}");
    assert_eq!(value(&r, "rtts"), &json!([null, null, null]), "{r}");
    assert_eq!(value(&r, "error_kind"), "timeout", "{r}");

    // The name resolved through MockDns, then each router named in order, then the target.
    let r = done(control.done("trace").await, "trace");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(value(&r, "address"), TARGET, "{r}");
    let hops: Vec<&Value> = value(&r, "hops")
        .as_array()
        .unwrap()
        .iter()
        .map(|h| &h["address"])
        .collect();
    assert_eq!(
        hops,
        [&json!(R1_NEAR), &json!(R2_NEAR), &json!(TARGET)],
        "{r}"
    );
    assert_eq!(
        (value(&r, "reached"), value(&r, "hop_count")),
        (&json!(true), &json!(3)),
        "{r}"
    );
    println!(
        "every kind reported the right observation ({})",
        by.join(", ")
    );
}

/// A lease revoked through the operator API: its holder cancels the probe at its next
/// extension and never reports it; the task is claimed again and reported once, under the
/// new lease.
async fn revocation(control: &Control, web: &FaultServer, gate: &Gate, agents: &[&Agent; 3]) {
    control.create("revoke-me", http(web.url("/revoked"))).await;
    timeout(Duration::from_secs(20), web.wait_for_hits("/revoked", 1))
        .await
        .expect("an agent runs the task");
    let v = control.view("revoke-me").await;
    let first = v["lease_id"].as_str().unwrap().to_owned();
    let holder = *agents
        .iter()
        .find(|a| v["agent_id"] == a.id.as_str())
        .unwrap_or_else(|| panic!("held by one of the agents: {v}"));
    let cancelled = holder.metric(control, "agent_cancelled_total").await;
    let lost = holder.metric(control, "agent_leases_lost_total").await;
    let req = NetRequest::post(format!("{}/v1/leases/{first}/revoke", control.url));
    let revoked_at = Instant::now();
    let (status, body) = control.call(req).await;
    assert_eq!((status, body.as_str()), (200, r#"{"revoked":true}"#));
    eventually(
        "the holder cancels the revoked lease's probe",
        Duration::from_secs(5),
        || async {
            (holder.metric(control, "agent_cancelled_total").await > cancelled).then_some(())
        },
    )
    .await;
    let cancelled_after = revoked_at.elapsed();
    assert_eq!(
        holder.metric(control, "agent_leases_lost_total").await,
        lost + 1.0
    );
    // Learnt at its next extension: within a third of a lease (plus a call's time).
    assert!(
        cancelled_after <= LEASE / 3 + Duration::from_millis(400),
        "cancelled {cancelled_after:?} after the revocation"
    );
    // Due again: claimed anew (by any agent), answered once the target lets it through.
    timeout(Duration::from_secs(20), web.wait_for_hits("/revoked", 2))
        .await
        .expect("the task is claimed again");
    gate.open();
    let r = control.done("revoke-me").await;
    assert_ne!(r["lease_id"], first.as_str(), "not the revoked lease: {r}");
    assert_eq!(
        (&r["status"], value(&r, "status")),
        (&json!("ok"), &json!(200)),
        "{r}"
    );
    assert_eq!(control.view("revoke-me").await["claims"], 2);
    println!(
        "revoked lease cancelled by {} {cancelled_after:?} after the revocation; \
         reported once by {} under a new lease",
        holder.id,
        r["agent_id"].as_str().unwrap()
    );
}

/// Agent 1, holding the three held tasks, is killed with SIGKILL: the other agents take each
/// lease when it runs out (within the lease after the kill) and report each task once.
async fn sigkill(control: &Control, agent_1: &mut Agent, gate: &Gate) {
    for id in HELD {
        assert_eq!(control.view(id).await["agent_id"], "agent-1");
    }
    agent_1.child.start_kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    let status = agent_1.child.wait().await.unwrap();
    assert!(!status.success(), "{status}");
    // From now on the held route answers at once (agent-1's connections died with it).
    gate.open();
    let deadline = killed + Duration::from_secs(10);
    let mut taken: [Option<Duration>; 3] = [None; 3];
    while taken.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "not taken over within 10 s: {taken:?}"
        );
        for (id, at) in HELD.iter().zip(taken.iter_mut()) {
            if at.is_none() {
                let v = control.view(id).await;
                let other = v["agent_id"].as_str().is_some_and(|a| a != "agent-1");
                if other || v["state"] == "done" {
                    *at = Some(killed.elapsed());
                }
            }
        }
        // The control plane's database holds this: no event to await.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let taken: Vec<Duration> = taken.into_iter().map(Option::unwrap).collect();
    for (id, after) in HELD.iter().zip(&taken) {
        // Not before the lease could run out (agent-1 extended it at most a third of a lease
        // before the kill), and within the lease plus a claim's back-off and a poll.
        assert!(
            *after >= LEASE / 2 && *after <= LEASE + Duration::from_millis(700),
            "{id} taken over {after:?} after the kill (lease {LEASE:?})"
        );
        let r = control.done(id).await;
        assert!(
            ["agent-2", "agent-3"].contains(&r["agent_id"].as_str().unwrap()),
            "{r}"
        );
        assert_eq!(
            (&r["status"], value(&r, "status")),
            (&json!("ok"), &json!(200)),
            "{r}"
        );
        assert_eq!(control.view(id).await["claims"], 2);
    }
    println!("a SIGKILLed agent's three leases taken over after {taken:?} (lease {LEASE:?})");
}
