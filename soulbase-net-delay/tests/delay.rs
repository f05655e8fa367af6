//! The delay server over real TCP on loopback, with its SQLite store in a temporary file: the
//! protocol's every case, bad input of every kind, `allowed_hosts`, a restart, a route with
//! two consumers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::{json, Value};
use soulbase_net_delay::{Config, DelayServer};
use soulbase_net_store::delay::{DelayStore, DelayStoreOptions, SqliteDelayStore};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{
        tcp::{OwnedReadHalf, OwnedWriteHalf},
        TcpStream,
    },
};

/// A directory of its own under the system's temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "soulbase-delay-{name}-{}-{}",
            std::process::id(),
            fastrand_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn db(&self) -> PathBuf {
        self.0.join("delay.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fastrand_suffix() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// A server on a free loopback port, with short delays so that tests run fast.
fn config() -> Config {
    Config {
        bind_addr: "127.0.0.1:0".parse().unwrap(),
        retry_delay_ms: 100,
        ack_timeout_ms: 300,
        ..Config::default()
    }
}

async fn store(dir: &TempDir) -> Arc<SqliteDelayStore> {
    Arc::new(
        SqliteDelayStore::open(dir.db(), DelayStoreOptions::default())
            .await
            .unwrap(),
    )
}

async fn server(config: Config, store: Arc<SqliteDelayStore>) -> DelayServer {
    DelayServer::start(config, store).await.unwrap()
}

/// A client: lines out, lines in (each read bounded in time).
struct Client {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
    /// Deliveries read while waiting for an answer: a task due at once may be delivered
    /// before its schedule's `ack` arrives (the protocol promises no order between them).
    early: std::collections::VecDeque<Value>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Self {
        let (read, write) = TcpStream::connect(addr).await.unwrap().into_split();
        Self {
            lines: BufReader::new(read).lines(),
            write,
            early: std::collections::VecDeque::new(),
        }
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        self.write.write_all(bytes).await.unwrap();
    }

    async fn send(&mut self, v: Value) {
        let mut line = v.to_string();
        line.push('\n');
        self.send_raw(line.as_bytes()).await;
    }

    /// The next line, within 5 s; `None` when the server closed the connection.
    async fn recv(&mut self) -> Option<Value> {
        if let Some(v) = self.early.pop_front() {
            return Some(v);
        }
        self.read().await
    }

    /// The next line from the socket itself.
    async fn read(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(Duration::from_secs(5), self.lines.next_line())
            .await
            .expect("a line within 5 s")
            .ok()??;
        Some(serde_json::from_str(&line).unwrap())
    }

    /// The answer to the last line (anything but a delivery), keeping deliveries for later.
    async fn answer(&mut self) -> Option<Value> {
        loop {
            let v = self.read().await?;
            if v["kind"] == "delivery" {
                self.early.push_back(v);
            } else {
                return Some(v);
            }
        }
    }

    async fn register(&mut self, route: &str) {
        self.send(json!({"kind": "register", "route_key": route}))
            .await;
        assert_eq!(
            self.recv().await,
            Some(json!({"kind": "registered", "route_key": route}))
        );
    }

    async fn schedule(&mut self, id: &str, route: &str, fire_at: i64, payload: &str) -> Value {
        use base64::Engine as _;
        self.send(json!({
            "kind": "schedule", "id": id, "route_key": route, "fire_at": fire_at,
            "compression": "none",
            "payload_base64": base64::engine::general_purpose::STANDARD.encode(payload),
        }))
        .await;
        self.answer().await.expect("an answer")
    }
}

/// Waits (bounded) until the store holds `n` tasks.
async fn pending_becomes(store: &SqliteDelayStore, n: u64) {
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = store.pending().await.unwrap();
        if now == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{now} pending, expected {n}"
        );
        // The store has no event to await.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_acknowledged_when_stored_delivered_when_due_and_deleted_on_ack() {
    let dir = TempDir::new("basic");
    let store = store(&dir).await;
    let srv = server(config(), store.clone()).await;
    let mut c = Client::connect(srv.local_addr()).await;
    c.register("service-A").await;
    let fire_at = now_ms() + 300;
    let ack = c.schedule("t-1", "service-A", fire_at, "hello").await;
    assert_eq!(ack, json!({"kind": "ack", "id": "t-1", "fire_at": fire_at}));
    // Durable before the ack: the store has it.
    assert_eq!(
        store.get("t-1").await.unwrap().unwrap().route_key,
        "service-A"
    );
    let delivery = c.recv().await.unwrap();
    let received = now_ms();
    assert_eq!(
        delivery,
        json!({"kind": "delivery", "id": "t-1", "route_key": "service-A", "fire_at": fire_at,
               "payload_base64": "aGVsbG8=", "compression": "none"})
    );
    assert!(
        received >= fire_at,
        "delivered {} ms early",
        fire_at - received
    );
    c.send(json!({"kind": "ack", "id": "t-1"})).await;
    pending_becomes(&store, 0).await;
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_delivery_comes_again_with_the_same_id() {
    let dir = TempDir::new("redeliver");
    let store = store(&dir).await;
    let cfg = Config {
        http_addr: Some("127.0.0.1:0".parse().unwrap()),
        // Long enough that the second delivery's ack surely comes in time: one redelivery.
        ack_timeout_ms: 1000,
        ..config()
    };
    let srv = server(cfg, store.clone()).await;
    let web = srv.http_addr().unwrap();
    let mut c = Client::connect(srv.local_addr()).await;
    c.register("r").await;
    c.schedule("again", "r", now_ms(), "x").await;
    let first = c.recv().await.unwrap();
    // No ack: after the ack timeout (1 s) and the retry delay (100 ms), once more.
    let second = c.recv().await.unwrap();
    assert_eq!(first["id"], "again");
    assert_eq!(second["id"], "again");
    let task = store.get("again").await.unwrap().unwrap();
    assert!(task.attempts >= 1, "{task:?}");
    c.send(json!({"kind": "ack", "id": "again"})).await;
    pending_becomes(&store, 0).await;
    let (_, text) = http(web, "GET", "/metrics", "").await;
    for expected in [
        "delay_delivered_total 2\n",
        "delay_redelivered_total 1\n",
        "delay_acked_total 1\n",
        "delay_fire_lateness_ms_count 1\n",
        "delay_due_undelivered 0\n",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waits_for_its_route_across_a_restart() {
    let dir = TempDir::new("restart");
    let store_a = store(&dir).await;
    let srv = server(config(), store_a).await;
    let mut scheduler = Client::connect(srv.local_addr()).await;
    // Nobody serves the route yet: the task waits in the store.
    let ack = scheduler
        .schedule("kept", "later", now_ms(), "survives")
        .await;
    assert_eq!(ack["kind"], "ack");
    srv.shutdown().await;
    assert!(
        scheduler.recv().await.is_none(),
        "the server closed its connections"
    );

    // A new server on the same file; a client registers the route and gets the task.
    let store_b = store(&dir).await;
    let srv = server(config(), store_b.clone()).await;
    let mut worker = Client::connect(srv.local_addr()).await;
    worker.register("later").await;
    let delivery = worker.recv().await.unwrap();
    assert_eq!(
        (delivery["id"].as_str(), delivery["payload_base64"].as_str()),
        (Some("kept"), Some("c3Vydml2ZXM="))
    );
    worker.send(json!({"kind": "ack", "id": "kept"})).await;
    pending_becomes(&store_b, 0).await;
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lines_get_error_lines_and_the_connection_goes_on() {
    let dir = TempDir::new("bad");
    let store = store(&dir).await;
    let srv = server(config(), store.clone()).await;
    let mut c = Client::connect(srv.local_addr()).await;
    let code = "SCHEMA.VALIDATION_FAILED";
    c.send_raw(b"{not json\n").await;
    let e = c.recv().await.unwrap();
    assert_eq!(
        (e["kind"].as_str(), e["code"].as_str()),
        (Some("error"), Some(code))
    );
    c.send(json!({"kind": "teleport"})).await;
    assert!(c.recv().await.unwrap()["message"]
        .as_str()
        .unwrap()
        .contains("unknown kind"));
    c.send(json!({"kind": "schedule", "id": "b64", "fire_at": 1, "payload_base64": "%%%"}))
        .await;
    let e = c.recv().await.unwrap();
    assert_eq!(e["id"], "b64");
    assert!(e["message"].as_str().unwrap().contains("not base64"));
    c.send(json!({"kind": "schedule", "id": "late", "fire_at": "soon"}))
        .await;
    assert!(c.recv().await.unwrap()["message"]
        .as_str()
        .unwrap()
        .contains("fire_at"));
    // A line over 64 KiB is skipped whole, with an error line.
    let mut long = vec![b'x'; 70 * 1024];
    long.push(b'\n');
    c.send_raw(&long).await;
    assert!(c.recv().await.unwrap()["message"]
        .as_str()
        .unwrap()
        .contains("over 65536 bytes"));
    // None of it was stored, and the connection still works.
    assert_eq!(store.pending().await.unwrap(), 0);
    let ack = c.schedule("fine", "r", now_ms() + 60_000, "ok").await;
    assert_eq!(ack["kind"], "ack");
    assert_eq!(store.pending().await.unwrap(), 1);
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_id_or_a_route_the_server_makes_them_and_delivers_back_here() {
    let dir = TempDir::new("defaults");
    let store = store(&dir).await;
    let srv = server(config(), store.clone()).await;
    let mut c = Client::connect(srv.local_addr()).await;
    c.send(json!({"kind": "schedule", "fire_at": now_ms(), "payload_base64": ""}))
        .await;
    let ack = c.recv().await.unwrap();
    let id = ack["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 32, "a server-made id: {ack}");
    let task = store.get(&id).await.unwrap().unwrap();
    assert!(task.route_key.starts_with("conn-"), "{task:?}");
    // The connection's own route is registered for it only if it says so.
    c.register(&task.route_key.clone()).await;
    let delivery = c.recv().await.unwrap();
    assert_eq!(delivery["id"].as_str(), Some(id.as_str()));
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_outside_allowed_hosts_is_refused_at_accept() {
    let dir = TempDir::new("hosts");
    let store = store(&dir).await;
    let mut cfg = config();
    cfg.allowed_hosts = vec!["::1".parse().unwrap()];
    let srv = server(cfg, store.clone()).await;
    let mut c = Client::connect(srv.local_addr()).await;
    c.send_raw(b"{\"kind\":\"register\",\"route_key\":\"r\"}\n")
        .await;
    assert!(c.recv().await.is_none(), "closed without an answer");
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_payloads_are_delivered_as_sent_and_bombs_refused() {
    use base64::Engine as _;
    use std::io::Write as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let dir = TempDir::new("compress");
    let store = store(&dir).await;
    let srv = server(config(), store.clone()).await;
    let mut c = Client::connect(srv.local_addr()).await;
    c.register("z").await;
    let text = b"the same words again and again ".repeat(50);
    let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
    enc.write_all(&text).unwrap();
    let lz4 = enc.finish().unwrap();
    c.send(
        json!({"kind": "schedule", "id": "lz", "route_key": "z", "fire_at": now_ms(),
                  "compression": "lz4", "payload_base64": b64(&lz4)}),
    )
    .await;
    assert_eq!(c.answer().await.unwrap()["kind"], "ack");
    let d = c.recv().await.unwrap();
    assert_eq!(
        (d["compression"].as_str(), d["payload_base64"].as_str()),
        (Some("lz4"), Some(b64(&lz4).as_str())),
        "delivered as sent"
    );
    // Acknowledged, so that no redelivery comes between the next line and its answer.
    c.send(json!({"kind": "ack", "id": "lz"})).await;
    let zst = zstd::encode_all(&text[..], 3).unwrap();
    c.send(
        json!({"kind": "schedule", "id": "zs", "route_key": "z", "fire_at": now_ms(),
                  "compression": "zstd", "payload_base64": b64(&zst)}),
    )
    .await;
    assert_eq!(c.answer().await.unwrap()["kind"], "ack");
    let d = c.recv().await.unwrap();
    assert_eq!(
        (
            d["id"].as_str(),
            d["compression"].as_str(),
            d["payload_base64"].as_str()
        ),
        (Some("zs"), Some("zstd"), Some(b64(&zst).as_str())),
        "delivered as sent"
    );
    c.send(json!({"kind": "ack", "id": "zs"})).await;
    // 64 MiB of zeros in a few kilobytes of zstd: over the 1 MiB limit, refused, not stored.
    let bomb = zstd::encode_all(&vec![0u8; 64 << 20][..], 19).unwrap();
    c.send(
        json!({"kind": "schedule", "id": "bomb", "route_key": "z", "fire_at": now_ms(),
                  "compression": "zstd", "payload_base64": b64(&bomb)}),
    )
    .await;
    let e = c.recv().await.unwrap();
    assert_eq!(
        (e["kind"].as_str(), e["id"].as_str()),
        (Some("error"), Some("bomb"))
    );
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("more than the limit"),
        "{e}"
    );
    assert!(store.get("bomb").await.unwrap().is_none());
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_with_a_token_refuses_lines_without_it_and_closes() {
    let dir = TempDir::new("tokens");
    let store = store(&dir).await;
    let mut cfg = config();
    cfg.tokens.insert("payments".into(), "s3cret".into());
    let srv = server(cfg, store.clone()).await;
    // Registering without the token (or with another): an error line, then the close.
    for token in [None, Some("guess")] {
        let mut c = Client::connect(srv.local_addr()).await;
        c.send(json!({"kind": "register", "route_key": "payments", "token": token}))
            .await;
        let e = c.recv().await.unwrap();
        assert_eq!(
            (e["kind"].as_str(), e["code"].as_str()),
            (Some("error"), Some("AUTH.FORBIDDEN"))
        );
        assert!(c.recv().await.is_none(), "closed after the refusal");
    }
    // Scheduling for it without the token: refused, nothing stored.
    let mut c = Client::connect(srv.local_addr()).await;
    let e = c.schedule("p-1", "payments", now_ms(), "x").await;
    assert_eq!(
        (e["id"].as_str(), e["code"].as_str()),
        (Some("p-1"), Some("AUTH.FORBIDDEN"))
    );
    assert!(c.recv().await.is_none());
    assert_eq!(store.pending().await.unwrap(), 0);
    // With it: served; and a route without a token needs none.
    let mut c = Client::connect(srv.local_addr()).await;
    c.send(json!({"kind": "register", "route_key": "payments", "token": "s3cret"}))
        .await;
    assert_eq!(c.recv().await.unwrap()["kind"], "registered");
    c.send(
        json!({"kind": "schedule", "id": "p-2", "route_key": "payments", "token": "s3cret",
                  "fire_at": now_ms(), "payload_base64": ""}),
    )
    .await;
    assert_eq!(c.answer().await.unwrap()["kind"], "ack");
    assert_eq!(c.recv().await.unwrap()["id"], "p-2", "delivered");
    c.register("open").await;
    srv.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_with_two_connections_shares_its_tasks() {
    const TASKS: usize = 20;
    let dir = TempDir::new("shared");
    let store = store(&dir).await;
    let srv = server(config(), store.clone()).await;
    let (mut a, mut b) = (
        Client::connect(srv.local_addr()).await,
        Client::connect(srv.local_addr()).await,
    );
    a.register("pool").await;
    b.register("pool").await;
    let mut scheduler = Client::connect(srv.local_addr()).await;
    let due = now_ms() + 200;
    for i in 0..TASKS {
        scheduler
            .schedule(&format!("p-{i}"), "pool", due, "w")
            .await;
    }
    // Each consumer acknowledges what it gets, until all are acknowledged.
    let consume = |mut c: Client| async move {
        let mut got = Vec::new();
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout(Duration::from_millis(1500), c.lines.next_line()).await
        {
            let v: Value = serde_json::from_str(&line).unwrap();
            let id = v["id"].as_str().unwrap().to_owned();
            c.send(json!({"kind": "ack", "id": id})).await;
            got.push(id);
        }
        got
    };
    let (got_a, got_b) = tokio::join!(consume(a), consume(b));
    let mut all: Vec<String> = got_a.iter().chain(&got_b).cloned().collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), TASKS, "a: {got_a:?}, b: {got_b:?}");
    assert!(
        !got_a.is_empty() && !got_b.is_empty(),
        "both consumers served: {} / {}",
        got_a.len(),
        got_b.len()
    );
    pending_becomes(&store, 0).await;
    srv.shutdown().await;
}

/// Two servers on one PostgreSQL table: a task scheduled through either is delivered by the
/// one holding a connection for its route, and only by it.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_postgres_deliver_each_others_tasks() {
    use soulbase_net_store::delay::PostgresDelayStore;
    let Some(pg) = soulbase_net_testkit::PostgresServer::start_or_skip(
        "two_servers_on_one_postgres_deliver_each_others_tasks",
    ) else {
        return;
    };
    let url = pg.create_database("delay").unwrap();
    let open = || async {
        Arc::new(
            PostgresDelayStore::connect(&url, DelayStoreOptions::default())
                .await
                .unwrap(),
        )
    };
    let (store_a, store_b) = (open().await, open().await);
    let a = DelayServer::start(config(), store_a.clone()).await.unwrap();
    let b = DelayServer::start(config(), store_b).await.unwrap();
    let mut on_a = Client::connect(a.local_addr()).await;
    let mut on_b = Client::connect(b.local_addr()).await;
    on_a.register("served-by-a").await;
    on_b.register("served-by-b").await;
    // Each schedules for the other's route.
    let due = now_ms() + 100;
    assert_eq!(
        on_b.schedule("to-a", "served-by-a", due, "1").await["kind"],
        "ack"
    );
    assert_eq!(
        on_a.schedule("to-b", "served-by-b", due, "2").await["kind"],
        "ack"
    );
    let got_a = on_a.recv().await.unwrap();
    let got_b = on_b.recv().await.unwrap();
    assert_eq!(
        (got_a["id"].as_str(), got_b["id"].as_str()),
        (Some("to-a"), Some("to-b"))
    );
    on_a.send(json!({"kind": "ack", "id": "to-a"})).await;
    on_b.send(json!({"kind": "ack", "id": "to-b"})).await;
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while store_a.pending().await.unwrap() > 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "acknowledged tasks are deleted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// One HTTP/1.1 request on a fresh connection: the status and the body.
async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    http_with(addr, method, path, &[], body).await
}

/// One HTTP/1.1 request with `headers` on a fresh connection: the whole raw answer (empty
/// when the server closed the connection without one).
async fn http_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let extra: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: delay\r\nconnection: close\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    // A server that refuses the peer may close before the request is written: no answer.
    if s.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut raw))
        .await
        .expect("an answer or a close within 5 s");
    String::from_utf8(raw).unwrap()
}

/// One HTTP/1.1 request with `headers` on a fresh connection: the status and the body.
async fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let raw = http_raw(addr, method, path, headers, body).await;
    assert!(raw.len() > 12, "an HTTP answer: {raw:?}");
    let status = raw[9..12].parse().unwrap();
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_face_schedules_looks_up_cancels_and_reports_metrics() {
    let dir = TempDir::new("http");
    let store = store(&dir).await;
    let cfg = Config {
        http_addr: Some("127.0.0.1:0".parse().unwrap()),
        // A delivery waits for its ack while the gauges are read.
        ack_timeout_ms: 10_000,
        ..config()
    };
    let srv = server(cfg, store.clone()).await;
    let web = srv.http_addr().expect("an HTTP face");
    let mut worker = Client::connect(srv.local_addr()).await;
    worker.register("h").await;
    let (status, body) = http(web, "GET", "/health", "").await;
    assert_eq!(
        (status, body.contains("\"status\":\"ok\"")),
        (200, true),
        "{body}"
    );

    // Scheduled over HTTP, delivered over TCP.
    let line = json!({"kind": "schedule", "id": "web-1", "route_key": "h", "fire_at": now_ms(),
                      "payload_base64": "aGk="});
    let (status, body) = http(web, "POST", "/tasks", &line.to_string()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["kind"], "ack");
    let d = worker.recv().await.unwrap();
    assert_eq!(d["id"], "web-1");
    // Due and delivered, not acknowledged yet: due but undelivered.
    let (_, text) = http(web, "GET", "/metrics", "").await;
    for expected in ["delay_due_undelivered 1\n", "delay_in_flight 1\n"] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    // Due with no connection for its route anywhere: due but undelivered too.
    let orphan = json!({"kind": "schedule", "id": "web-0", "route_key": "nobody",
                        "fire_at": now_ms() - 1_000, "payload_base64": ""});
    assert_eq!(
        http(web, "POST", "/tasks", &orphan.to_string()).await.0,
        200
    );
    let (_, text) = http(web, "GET", "/metrics", "").await;
    assert!(
        text.contains("delay_due_undelivered 2\n"),
        "the delivered task and the one with no route's connection, in\n{text}"
    );
    assert_eq!(http(web, "DELETE", "/tasks/web-0", "").await.0, 200);
    worker.send(json!({"kind": "ack", "id": "web-1"})).await;
    pending_becomes(&store, 0).await;

    // Looked up and cancelled.
    let later = json!({"kind": "schedule", "id": "web-2", "route_key": "h",
                       "fire_at": now_ms() + 3_600_000, "payload_base64": ""});
    assert_eq!(http(web, "POST", "/tasks", &later.to_string()).await.0, 200);
    let (status, body) = http(web, "GET", "/tasks/web-2", "").await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["route_key"],
        "h"
    );
    assert_eq!(http(web, "DELETE", "/tasks/web-2", "").await.0, 200);
    assert_eq!(http(web, "GET", "/tasks/web-2", "").await.0, 404);
    assert_eq!(http(web, "DELETE", "/tasks/web-2", "").await.0, 404);

    // Refused: no route over HTTP, not a schedule, bad JSON.
    let no_route = json!({"kind": "schedule", "fire_at": 1, "payload_base64": ""});
    assert_eq!(
        http(web, "POST", "/tasks", &no_route.to_string()).await.0,
        400
    );
    assert_eq!(
        http(web, "POST", "/tasks", "{\"kind\":\"ack\",\"id\":\"x\"}")
            .await
            .0,
        400
    );
    assert_eq!(http(web, "POST", "/tasks", "{nope").await.0, 400);

    let (status, text) = http(web, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    for expected in [
        "delay_scheduled_total 3\n",
        "delay_delivered_total 1\n",
        "delay_acked_total 1\n",
        "delay_route_connections{route=\"h\"} 1\n",
        "delay_fire_lateness_ms_count 1\n",
        "delay_pending 0\n",
        // One acknowledged, the others cancelled: none.
        "delay_due_undelivered 0\n",
        "delay_in_flight 0\n",
        "delay_acks_ignored_total 0\n",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    srv.shutdown().await;
}

/// A server process killed (SIGKILL) with a task delivered but not acknowledged: another
/// server on the same PostgreSQL table delivers it once the dead one's lease runs out.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_s_task_is_delivered_by_another_on_the_same_postgres() {
    use soulbase_net_store::delay::PostgresDelayStore;
    let Some(pg) = soulbase_net_testkit::PostgresServer::start_or_skip(
        "a_killed_server_s_task_is_delivered_by_another_on_the_same_postgres",
    ) else {
        return;
    };
    let url = pg.create_database("killed").unwrap();
    let dir = TempDir::new("killed");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config_file = dir.0.join("config.json");
    std::fs::write(
        &config_file,
        json!({"bind_addr": format!("127.0.0.1:{port}"), "store": url, "ack_timeout_ms": 500,
               "retry_delay_ms": 100})
        .to_string(),
    )
    .unwrap();
    let mut a = std::process::Command::new(env!("CARGO_BIN_EXE_soulbase-net-delay"))
        .env("HYPER_DELAY_CONFIG", &config_file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(a.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(first.contains("listening on"), "{first:?}");
    let mut on_a = Client::connect(format!("127.0.0.1:{port}").parse().unwrap()).await;
    on_a.register("r").await;
    assert_eq!(
        on_a.schedule("orphan", "r", now_ms(), "x").await["kind"],
        "ack"
    );
    assert_eq!(
        on_a.recv().await.unwrap()["id"],
        "orphan",
        "delivered by A, not acked"
    );
    a.kill().unwrap(); // SIGKILL: A's claim stays in the table until its lease runs out
    a.wait().unwrap();
    let killed = tokio::time::Instant::now();
    let store = Arc::new(
        PostgresDelayStore::connect(&url, DelayStoreOptions::default())
            .await
            .unwrap(),
    );
    let b = DelayServer::start(config(), store.clone()).await.unwrap();
    let mut on_b = Client::connect(b.local_addr()).await;
    on_b.register("r").await;
    let d = on_b.recv().await.unwrap();
    assert_eq!(d["id"], "orphan", "delivered by B");
    let after = killed.elapsed();
    // A's lease: the claim-ahead horizon (500 ms) + its ack timeout (500 ms) + 2 s.
    assert!(after < Duration::from_secs(5), "{after:?}");
    on_b.send(json!({"kind": "ack", "id": "orphan"})).await;
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.pending().await.unwrap() > 0 {
        assert!(tokio::time::Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("a killed server's task delivered by another {after:?} after the kill");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_slows_no_other() {
    let dir = TempDir::new("slow");
    let store = store(&dir).await;
    let cfg = Config {
        connection_write_channel: 4,
        ..config()
    };
    let srv = server(cfg, store.clone()).await;
    // A client that registers and then reads nothing: its queue (and socket) fill up.
    let mut stuck = Client::connect(srv.local_addr()).await;
    stuck.register("stuck").await;
    let mut fast = Client::connect(srv.local_addr()).await;
    fast.register("fast").await;
    let mut scheduler = Client::connect(srv.local_addr()).await;
    let payload = "y".repeat(30_000);
    for i in 0..200 {
        scheduler
            .schedule(&format!("s-{i}"), "stuck", now_ms(), &payload)
            .await;
    }
    for i in 0..20 {
        scheduler
            .schedule(&format!("f-{i}"), "fast", now_ms(), "x")
            .await;
    }
    // The fast client gets all of its tasks, at once, whatever the stuck one does.
    let started = tokio::time::Instant::now();
    let mut got = 0;
    while got < 20 {
        let d = fast.recv().await.unwrap();
        fast.send(json!({"kind": "ack", "id": d["id"]})).await;
        got += 1;
    }
    // Were a delivery to wait for room in the stuck client's full queue, the fast client's
    // would wait behind ~200 of them that never get it (it reads nothing). 10 s leaves room
    // for a loaded machine: one running other builds beside the tests took 4.6 s.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The stuck client's tasks wait in the store (none lost), due again later.
    assert!(
        store.pending().await.unwrap() >= 190,
        "the stuck route's tasks are kept"
    );
    drop(stuck);
    srv.shutdown().await;
}

/// An outbox of its own next to the tasks, with a client allowed to reach loopback only.
async fn outbox(dir: &TempDir) -> Arc<soulbase_net_outbox::Outbox> {
    let mut policy = soulbase_net_policy::NetPolicy::default();
    policy.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    let client = soulbase_net_runtime::Client::builder()
        .policy(policy)
        .build()
        .unwrap();
    let outbox_store = soulbase_net_outbox::SqliteStore::open(dir.0.join("outbox.db"))
        .await
        .unwrap();
    Arc::new(
        soulbase_net_outbox::Outbox::builder()
            .store(Arc::new(outbox_store))
            .client(Arc::new(client))
            .poll(Duration::from_millis(20))
            .build()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_task_is_made_through_the_outbox_when_due() {
    use soulbase_net_testkit::{FaultServer, Reply};
    let upstream = FaultServer::http1()
        .route("/hook", Reply::ok("done"))
        .start()
        .await
        .unwrap();
    let dir = TempDir::new("http-task");
    let store = store(&dir).await;
    let outbox = outbox(&dir).await;
    let srv = DelayServer::start_with_http_tasks(config(), store.clone(), Some(outbox.clone()))
        .await
        .unwrap();
    let mut c = Client::connect(srv.local_addr()).await;
    let fire_at = now_ms() + 300;
    c.send(
        json!({"kind": "schedule", "id": "call-1", "fire_at": fire_at,
                  "payload_base64": "eyJvcmRlciI6N30=",
                  "target": {"method": "POST", "url": upstream.url("/hook"),
                             "headers": {"content-type": "application/json"}}}),
    )
    .await;
    assert_eq!(
        c.recv().await.unwrap(),
        json!({"kind": "ack", "id": "call-1", "fire_at": fire_at})
    );
    tokio::time::timeout(Duration::from_secs(5), upstream.wait_for_hits("/hook", 1))
        .await
        .expect("the call is made");
    let arrived = now_ms();
    assert!(arrived >= fire_at, "made {} ms early", fire_at - arrived);
    let req = &upstream.requests("/hook")[0];
    assert_eq!(req.body, b"{\"order\":7}".to_vec());
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert!(
        req.header("idempotency-key").is_some(),
        "one key on every attempt"
    );
    assert_eq!(
        store.pending().await.unwrap(),
        0,
        "not a delivery to a connection"
    );

    // Without an outbox, or with a compressed body: an error line.
    c.send(
        json!({"kind": "schedule", "id": "call-2", "fire_at": fire_at, "compression": "zstd",
                  "payload_base64": "", "target": {"url": upstream.url("/hook")}}),
    )
    .await;
    assert!(c.recv().await.unwrap()["message"]
        .as_str()
        .unwrap()
        .contains("compression must be"));
    let plain = server(config(), store.clone()).await;
    let mut p = Client::connect(plain.local_addr()).await;
    p.send(
        json!({"kind": "schedule", "id": "call-3", "fire_at": fire_at, "payload_base64": "",
                  "target": {"url": upstream.url("/hook")}}),
    )
    .await;
    assert!(p.recv().await.unwrap()["message"]
        .as_str()
        .unwrap()
        .contains("not enabled"));
    plain.shutdown().await;
    srv.shutdown().await;
    upstream.join().await;
}

/// One batch of writes, as group commit makes them: a task new in the batch, the same id again
/// in the batch, an id stored before; acknowledgements under the right claim, under a wrong
/// one, and by whoever holds the task (claim 0). Each answer says what happened to its line.
async fn a_batch_tells_new_from_duplicate_and_acks_only_under_its_claim(store: &dyn DelayStore) {
    let task = |id: &str| soulbase_net_store::delay::DelayTask {
        id: id.to_owned(),
        route_key: "batch".to_owned(),
        fire_at: now_ms() - 1,
        compression: "none".to_owned(),
        payload: bytes::Bytes::from_static(b"x"),
        attempts: 0,
        claim: 0,
        due_in: Duration::ZERO,
    };
    use soulbase_net_store::delay::Scheduled::{Duplicate, New};
    let (stored, _) = store.write(&[task("old")], &[]).await.unwrap();
    assert_eq!(stored, vec![New]);
    let (stored, deleted) = store
        .write(&[task("a"), task("old"), task("b"), task("a")], &[])
        .await
        .unwrap();
    assert_eq!(stored, vec![New, Duplicate, New, Duplicate]);
    assert!(deleted.is_empty());
    assert_eq!(store.pending().await.unwrap(), 3);

    let claimed = store
        .claim_due(
            &["batch".to_owned()],
            10,
            Duration::from_secs(30),
            Duration::ZERO,
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    let claim_of = |id: &str| claimed.iter().find(|t| t.id == id).unwrap().claim;
    let (stored, deleted) = store
        .write(
            &[],
            &[
                ("a".to_owned(), claim_of("a")),
                ("b".to_owned(), claim_of("b") ^ 1),
                ("old".to_owned(), 0),
                ("missing".to_owned(), 0),
            ],
        )
        .await
        .unwrap();
    assert!(stored.is_empty());
    assert_eq!(deleted, vec![true, false, true, false]);
    assert_eq!(store.pending().await.unwrap(), 1, "only `b` is left");
    assert_eq!(store.get("b").await.unwrap().unwrap().id, "b");
}

#[tokio::test]
async fn a_batch_of_writes_on_sqlite_answers_line_by_line() {
    let dir = TempDir::new("batch");
    a_batch_tells_new_from_duplicate_and_acks_only_under_its_claim(&*store(&dir).await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_batch_of_writes_on_postgres_answers_line_by_line() {
    use soulbase_net_store::delay::PostgresDelayStore;
    let Some(pg) = soulbase_net_testkit::PostgresServer::start_or_skip(
        "a_batch_of_writes_on_postgres_answers_line_by_line",
    ) else {
        return;
    };
    let url = pg.create_database("delay").unwrap();
    let store = PostgresDelayStore::connect(&url, DelayStoreOptions::default())
        .await
        .unwrap();
    a_batch_tells_new_from_duplicate_and_acks_only_under_its_claim(&store).await;
}

/// The HTTP face sees HTTP tasks as it sees connection tasks: one is looked up with its target
/// and cancelled before it is due, and is never made; the next one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_task_is_looked_up_and_cancelled_over_the_http_face() {
    use soulbase_net_testkit::{FaultServer, Reply};
    let upstream = FaultServer::http1()
        .route("/hook", Reply::ok("done"))
        .start()
        .await
        .unwrap();
    let dir = TempDir::new("http-task-cancel");
    let srv = DelayServer::start_with_http_tasks(
        Config {
            http_addr: Some("127.0.0.1:0".parse().unwrap()),
            ..config()
        },
        store(&dir).await,
        Some(outbox(&dir).await),
    )
    .await
    .unwrap();
    let face = srv.http_addr().unwrap();
    let mut c = Client::connect(srv.local_addr()).await;
    let first = now_ms() + 600;
    for (id, at, body) in [("cancelled", first, "b25l"), ("made", first + 200, "dHdv")] {
        c.send(
            json!({"kind": "schedule", "id": id, "fire_at": at, "payload_base64": body,
                      "target": {"method": "PUT", "url": upstream.url("/hook"),
                                 "headers": {"x-order": id}}}),
        )
        .await;
        assert_eq!(c.recv().await.unwrap()["kind"], "ack");
    }
    let (status, body) = http(face, "GET", "/tasks/cancelled", "").await;
    assert_eq!(status, 200, "{body}");
    let found: Value = serde_json::from_str(&body).unwrap();
    // The outbox keeps its due time on the store's clock (moved there as an offset from this
    // server's reading), so it reads back to within a millisecond of what was scheduled.
    let fire_at = found["fire_at"].as_i64().unwrap();
    assert!((fire_at - first).abs() <= 2, "{fire_at} for {first}");
    assert_eq!(
        (
            found["payload_base64"].as_str(),
            found["target"]["method"].as_str(),
            found["target"]["url"].as_str(),
            found["target"]["headers"]["x-order"].as_str(),
        ),
        (
            Some("b25l"),
            Some("PUT"),
            Some(upstream.url("/hook").as_str()),
            Some("cancelled")
        ),
        "{found}"
    );
    assert_eq!(http(face, "DELETE", "/tasks/cancelled", "").await.0, 200);
    assert_eq!(http(face, "GET", "/tasks/cancelled", "").await.0, 404);
    assert_eq!(http(face, "DELETE", "/tasks/cancelled", "").await.0, 404);

    tokio::time::timeout(Duration::from_secs(5), upstream.wait_for_hits("/hook", 1))
        .await
        .expect("the other call is made");
    let made = upstream.requests("/hook");
    assert_eq!(made.len(), 1, "the cancelled call is not made");
    assert_eq!(made[0].header("x-order"), Some("made"));
    assert_eq!(made[0].body, b"two".to_vec());
    srv.shutdown().await;
    upstream.join().await;
}

/// A second `schedule` of an id already stored changes nothing, and its `ack` says when the
/// task really fires: the stored `fire_at`, not the one the duplicate asked for — over TCP
/// and over HTTP alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_schedule_is_acknowledged_with_the_stored_fire_at() {
    let dir = TempDir::new("duplicate");
    let store = store(&dir).await;
    let srv = server(
        Config {
            http_addr: Some("127.0.0.1:0".parse().unwrap()),
            ..config()
        },
        store.clone(),
    )
    .await;
    let mut c = Client::connect(srv.local_addr()).await;
    let first = now_ms() + 3_600_000;
    let ack = c.schedule("dup", "later", first, "one").await;
    assert_eq!(ack, json!({"kind": "ack", "id": "dup", "fire_at": first}));
    let ack = c.schedule("dup", "later", first + 5_000, "two").await;
    assert_eq!(
        ack,
        json!({"kind": "ack", "id": "dup", "fire_at": first}),
        "the stored fire_at"
    );
    let kept = store.get("dup").await.unwrap().unwrap();
    assert_eq!((kept.fire_at, &kept.payload[..]), (first, &b"one"[..]));
    let line = json!({"kind": "schedule", "id": "dup", "route_key": "later",
                      "fire_at": first + 9_000, "payload_base64": ""});
    let (status, body) = http(
        srv.http_addr().unwrap(),
        "POST",
        "/tasks",
        &line.to_string(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"kind": "ack", "id": "dup", "fire_at": first})
    );
    assert_eq!(store.pending().await.unwrap(), 1);
    srv.shutdown().await;
}

/// An `ack` deletes a task only when it answers a delivery made on the same connection: a
/// connection without the route's token that acknowledges another route's task by its id —
/// delivered elsewhere and waiting for its ack, or not due yet — changes nothing, and the
/// task is delivered again to its own client, which acknowledges it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_counts_only_on_the_connection_the_delivery_was_made_on() {
    let dir = TempDir::new("foreign-ack");
    let store = store(&dir).await;
    let mut cfg = Config {
        http_addr: Some("127.0.0.1:0".parse().unwrap()),
        // Long enough that the redelivery's ack surely comes in time: one redelivery.
        ack_timeout_ms: 1000,
        ..config()
    };
    cfg.tokens.insert("payments".into(), "s3cret".into());
    let srv = server(cfg, store.clone()).await;
    let mut worker = Client::connect(srv.local_addr()).await;
    worker
        .send(json!({"kind": "register", "route_key": "payments", "token": "s3cret"}))
        .await;
    assert_eq!(worker.recv().await.unwrap()["kind"], "registered");
    for (id, at) in [("pay-now", now_ms()), ("pay-later", now_ms() + 3_600_000)] {
        worker
            .send(
                json!({"kind": "schedule", "id": id, "route_key": "payments",
                         "token": "s3cret", "fire_at": at, "payload_base64": ""}),
            )
            .await;
        assert_eq!(worker.answer().await.unwrap()["kind"], "ack");
    }
    let first = worker.recv().await.unwrap();
    assert_eq!(first["id"], "pay-now", "delivered, not acknowledged yet");

    // Another connection, with no token, acknowledges both by id; then schedules a task of
    // its own, whose ack comes once its batch is committed — after the acks it sent first.
    let mut intruder = Client::connect(srv.local_addr()).await;
    intruder.send(json!({"kind": "ack", "id": "pay-now"})).await;
    intruder
        .send(json!({"kind": "ack", "id": "pay-later"}))
        .await;
    let barrier = intruder
        .schedule("barrier", "open", now_ms() + 3_600_000, "")
        .await;
    assert_eq!(barrier["kind"], "ack");
    assert!(
        store.get("pay-now").await.unwrap().is_some(),
        "a foreign ack deletes nothing"
    );
    assert!(store.get("pay-later").await.unwrap().is_some());

    // The task was not taken from its client: without its ack, it comes again (same id).
    let again = worker.recv().await.unwrap();
    assert_eq!(again["id"], "pay-now");
    worker.send(json!({"kind": "ack", "id": "pay-now"})).await;
    pending_becomes(&store, 2).await;
    assert!(store.get("pay-now").await.unwrap().is_none());
    let (_, text) = http(srv.http_addr().unwrap(), "GET", "/metrics", "").await;
    for expected in [
        "delay_acks_ignored_total 2\n",
        "delay_acked_total 1\n",
        "delay_redelivered_total 1\n",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    srv.shutdown().await;
}

/// Over HTTP, a route named in `tokens` needs its token to schedule a task, see it or
/// cancel it: in `Authorization: Bearer`, or (POST) in the line's `token`. Without it, 403
/// and nothing stored, shown or cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_face_needs_a_route_s_token_to_schedule_see_or_cancel_its_tasks() {
    let dir = TempDir::new("http-tokens");
    let store = store(&dir).await;
    let mut cfg = Config {
        http_addr: Some("127.0.0.1:0".parse().unwrap()),
        ..config()
    };
    cfg.tokens.insert("payments".into(), "s3cret".into());
    let srv = server(cfg, store.clone()).await;
    let web = srv.http_addr().unwrap();
    let later = now_ms() + 3_600_000;
    let line = |id: &str, token: Option<&str>| {
        json!({"kind": "schedule", "id": id, "route_key": "payments", "fire_at": later,
               "payload_base64": "", "token": token})
        .to_string()
    };
    let right = [("authorization", "Bearer s3cret")];
    let wrong = [("authorization", "Bearer guess")];

    // Scheduling: no token, a wrong one → 403, not stored; in the line or the header → 200.
    let (status, body) = http(web, "POST", "/tasks", &line("p-0", None)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["code"],
        "AUTH.FORBIDDEN"
    );
    assert_eq!(
        http_with(web, "POST", "/tasks", &wrong, &line("p-0", None))
            .await
            .0,
        403
    );
    assert_eq!(
        http(web, "POST", "/tasks", &line("p-0", Some("guess")))
            .await
            .0,
        403
    );
    assert_eq!(store.pending().await.unwrap(), 0);
    assert_eq!(
        http(web, "POST", "/tasks", &line("p-1", Some("s3cret")))
            .await
            .0,
        200
    );
    assert_eq!(
        http_with(web, "POST", "/tasks", &right, &line("p-2", None))
            .await
            .0,
        200
    );
    assert_eq!(store.pending().await.unwrap(), 2);

    // Looking up and cancelling: without the token or with a wrong one, 403 and the task
    // stays; with it, shown and cancelled.
    for path in ["/tasks/p-1", "/tasks/p-2"] {
        assert_eq!(http(web, "GET", path, "").await.0, 403);
        assert_eq!(http_with(web, "GET", path, &wrong, "").await.0, 403);
        assert_eq!(http(web, "DELETE", path, "").await.0, 403);
        assert_eq!(http_with(web, "DELETE", path, &wrong, "").await.0, 403);
    }
    assert_eq!(store.pending().await.unwrap(), 2, "nothing cancelled");
    let (status, body) = http_with(web, "GET", "/tasks/p-1", &right, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["route_key"],
        "payments"
    );
    assert_eq!(
        http_with(web, "DELETE", "/tasks/p-1", &right, "").await.0,
        200
    );
    assert!(store.get("p-1").await.unwrap().is_none());
    assert!(store.get("p-2").await.unwrap().is_some());

    // A route without a token needs none; an unknown id is 404 either way.
    let open = json!({"kind": "schedule", "id": "o-1", "route_key": "open",
                      "fire_at": later, "payload_base64": ""});
    assert_eq!(http(web, "POST", "/tasks", &open.to_string()).await.0, 200);
    assert_eq!(http(web, "GET", "/tasks/o-1", "").await.0, 200);
    assert_eq!(http(web, "DELETE", "/tasks/o-1", "").await.0, 200);
    assert_eq!(http(web, "GET", "/tasks/nobody", "").await.0, 404);
    srv.shutdown().await;
}

/// The HTTP face applies `allowed_hosts` as the TCP port does: a peer outside is closed on
/// without an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_face_refuses_a_peer_outside_allowed_hosts() {
    let dir = TempDir::new("http-hosts");
    let store = store(&dir).await;
    let srv = server(
        Config {
            http_addr: Some("127.0.0.1:0".parse().unwrap()),
            allowed_hosts: vec!["::1".parse().unwrap()],
            ..config()
        },
        store.clone(),
    )
    .await;
    let web = srv.http_addr().unwrap();
    for (method, path, body) in [
        ("GET", "/health", String::new()),
        ("GET", "/metrics", String::new()),
        (
            "POST",
            "/tasks",
            json!({"kind": "schedule", "id": "x", "route_key": "r", "fire_at": now_ms(),
                   "payload_base64": ""})
            .to_string(),
        ),
    ] {
        let raw = http_raw(web, method, path, &[], &body).await;
        assert_eq!(raw, "", "{method} {path}: closed without an answer");
    }
    assert_eq!(store.pending().await.unwrap(), 0);
    srv.shutdown().await;
}
