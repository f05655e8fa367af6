//! The demo's phases of shared and durable state: two instances sharing a quota on Redis,
//! the outbox on SQLite, and the delay server (seed 003).

use super::*;

/// (j) The delay server (seed 003): a client schedules a task over TCP, gets its `ack` once
/// it is stored, receives it when due on the connection registered for its route, and
/// acknowledges it; the store then holds nothing.
pub(super) async fn phase_delay(progress: Progress) -> Result<PhaseResult, String> {
    use soulbase_net_delay::{Config, DelayServer};
    use soulbase_net_store::delay::{DelayStore, DelayStoreOptions, SqliteDelayStore};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    const NAME: &str = "(j) delay server";
    const FIRE_IN_MS: i64 = 300;
    let started = Instant::now();
    let dir = TempDir::new("demo-delay")?;
    let store = Arc::new(
        SqliteDelayStore::open(dir.file("delay.db"), DelayStoreOptions::default())
            .await
            .map_err(|e| e.to_string())?,
    );
    let config = Config {
        bind_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..Config::default()
    };
    let server = DelayServer::start(config, store.clone())
        .await
        .map_err(|e| e.to_string())?;
    let run = async {
        let stream = tokio::net::TcpStream::connect(server.local_addr())
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        let (read, mut write) = stream.into_split();
        let mut lines = tokio::io::BufReader::new(read).lines();
        let now_ms = || {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        };
        let fire_at = now_ms() + FIRE_IN_MS;
        let lines_out = format!(
            "{{\"kind\":\"register\",\"route_key\":\"demo\"}}\n\
             {{\"kind\":\"schedule\",\"id\":\"demo-1\",\"route_key\":\"demo\",\"fire_at\":{fire_at},\"compression\":\"none\",\"payload_base64\":\"aGVsbG8=\"}}\n"
        );
        let sent = Instant::now();
        write
            .write_all(lines_out.as_bytes())
            .await
            .map_err(|e| format!("writing: {e}"))?;
        let registered = next_json(&mut lines).await?;
        let ack = next_json(&mut lines).await?;
        let acked_in = sent.elapsed();
        let stored = store
            .get("demo-1")
            .await
            .map_err(|e| e.to_string())?
            .is_some();
        let delivery = next_json(&mut lines).await?;
        let late = now_ms() - fire_at;
        write
            .write_all(b"{\"kind\":\"ack\",\"id\":\"demo-1\"}\n")
            .await
            .map_err(|e| format!("writing: {e}"))?;
        let until = Instant::now() + Duration::from_secs(5);
        let mut pending = store.pending().await.map_err(|e| e.to_string())?;
        while pending > 0 && Instant::now() < until {
            // The store has no event to await.
            tokio::time::sleep(Duration::from_millis(10)).await;
            pending = store.pending().await.map_err(|e| e.to_string())?;
        }
        let ok = registered["kind"] == "registered"
            && ack["kind"] == "ack"
            && ack["fire_at"] == fire_at
            && stored
            && delivery["kind"] == "delivery"
            && delivery["id"] == "demo-1"
            && delivery["payload_base64"] == "aGVsbG8="
            && late >= 0
            && pending == 0;
        Ok::<_, String>((
            format!(
                "ack after {acked_in:.1?} (stored: {stored}); delivered {late} ms after fire_at; {pending} left after the client's ack"
            ),
            ok,
        ))
    };
    progress.update(NAME, "scheduling over TCP");
    let outcome = run.await;
    server.shutdown().await;
    let (measured, passed) = match outcome {
        Ok(m) => m,
        Err(e) => (e, false),
    };
    let result = PhaseResult {
        name: NAME,
        expected: "ack once stored; delivered when due (not early); deleted on the client's ack"
            .to_owned(),
        measured,
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// The next line from the delay server, as JSON, within 5 s.
pub(super) async fn next_json(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>>,
) -> Result<serde_json::Value, String> {
    match tokio::time::timeout(Duration::from_secs(5), lines.next_line()).await {
        Ok(Ok(Some(line))) => {
            serde_json::from_str::<serde_json::Value>(&line).map_err(|e| format!("not JSON: {e}"))
        }
        _ => Err("no line from the server within 5 s".to_owned()),
    }
}

/// (g) Two instances (two clients, each with its own connection) share one tenant quota on
/// Redis: 20 calls each at once against a fleet-wide rps of 10 with a burst of 10.
pub(super) async fn phase_fleet(
    dialer: &Arc<LoopbackDialer>,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(g) fleet quota";
    const EACH: usize = 20;
    let started = Instant::now();
    let redis = match soulbase_net_testkit::RedisServer::try_start() {
        Ok(Some(redis)) => redis,
        Ok(None) => {
            let result = PhaseResult {
                name: NAME,
                expected: "two instances share one quota on Redis".to_owned(),
                measured: "skipped: redis-server is not installed (cargo xtask ci installs it)"
                    .to_owned(),
                passed: true,
                elapsed: started.elapsed(),
            };
            progress.finish(&result);
            return Ok(result);
        }
        Err(e) => return Err(format!("redis-server did not start: {e}")),
    };
    let srv = server(7, |b| b.route("/quota", Reply::ok("ok"))).await?;
    let instance = || -> Result<Client, String> {
        let mut p = demo_policy();
        p.retry.enabled = false;
        let mut g = soulbase_net_policy::GlobalLimit::default();
        g.rps = 10;
        g.burst = 10;
        g.store_timeout = Duration::from_millis(500);
        p.limits.global = Some(g);
        let store = <soulbase_net_runtime::fleet::RedisRateStore as soulbase_net_runtime::fleet::RedisStore>::new(&redis.url())
            .map_err(|e| e.to_string())?;
        Client::builder()
            .policy(p)
            .dialer(dialer.clone())
            .rate_store(Arc::new(store))
            .build()
            .map_err(|e| format!("could not build a fleet client: {e}"))
    };
    let (a, b) = (instance()?, instance()?);
    progress.update(
        NAME,
        &format!("2 instances × {EACH} calls, quota 10 rps + 10 burst …"),
    );
    let calls = |c: Client| {
        let url = srv.url("/quota");
        async move {
            let mut ok = 0usize;
            for _ in 0..EACH {
                if c.send(NetRequest::get(url.as_str()).tenant("shop"))
                    .await
                    .is_ok()
                {
                    ok += 1;
                }
            }
            ok
        }
    };
    let (ok_a, ok_b) = tokio::join!(calls(a), calls(b));
    let elapsed = started.elapsed();
    let hits = srv.hits("/quota");
    srv.join().await;
    drop(redis);
    // The burst, plus what 10 rps refilled while they ran.
    let ceiling = 10 + (elapsed.as_secs_f64() * 10.0).ceil() as usize;
    let admitted = ok_a + ok_b;
    let passed = admitted >= 10 && admitted <= ceiling && hits == admitted as u64;
    let result = PhaseResult {
        name: NAME,
        expected: format!(
            "≤ {ceiling} of {} admitted in all (not {EACH} each)",
            2 * EACH
        ),
        measured: format!("{ok_a} + {ok_b} admitted, {hits} server hits"),
        passed,
        elapsed,
    };
    progress.finish(&result);
    Ok(result)
}

/// When the outbox phase's delayed item is due, after it is enqueued.
const OUTBOX_DELAY: Duration = Duration::from_millis(300);

/// (h) An outbox on SQLite (a temp file, removed after): a POST whose upstream answers 503
/// twice, then 200, is delivered on the third try, the three attempts carrying one
/// `Idempotency-Key`; an item due 300 ms later arrives not before its time.
pub(super) async fn phase_outbox(
    dialer: &Arc<LoopbackDialer>,
    observe: Arc<dyn Observer>,
    counted: &DemoObserver,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(h) outbox";
    let started = Instant::now();
    // The receiver notes when the delayed item arrives, on the wall clock its due time is on.
    let arrived: Arc<Mutex<Option<SystemTime>>> = Arc::default();
    let srv = {
        let arrived = arrived.clone();
        server(8, move |b| {
            b.route("/hook", Script::status(503).times(2).then(Reply::ok("ok")))
                .route(
                    "/later",
                    Script::respond_with(move |_| {
                        arrived.lock().get_or_insert_with(SystemTime::now);
                        Reply::ok("ok")
                    }),
                )
        })
        .await?
    };
    let dir = TempDir::new("demo-outbox")?;
    let outbox = Arc::new(demo_outbox(&dir.file("outbox.db"), dialer, observe).await?);
    let running = {
        let o = outbox.clone();
        tokio::spawn(async move { o.run().await })
    };
    let due = SystemTime::now() + OUTBOX_DELAY;
    let delivered = deliver_both(&outbox, &srv, due, progress).await;
    outbox.shutdown();
    let ran = match running.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("the outbox stopped: {e}")),
        Err(e) => Err(format!("the outbox's task: {e}")),
    };
    let arrival = *arrived.lock();
    let seen = OutboxSeen {
        hook: Applied::of(&srv.requests("/hook")),
        key: srv
            .requests("/hook")
            .first()
            .and_then(|r| r.header("idempotency-key"))
            .map(|k| k.chars().take(8).collect())
            .unwrap_or_default(),
        later_hits: srv.hits("/later"),
        // How far past its due time the delayed item arrived; negative: early.
        lateness_ms: arrival.map(|at| match at.duration_since(due) {
            Ok(late) => late.as_secs_f64() * 1e3,
            Err(early) => -early.duration().as_secs_f64() * 1e3,
        }),
        dead: outbox
            .store()
            .dead_letters()
            .await
            .map_or(usize::MAX, |d| d.len()),
        counts: counted.counts(),
        failure: delivered.and(ran).err(),
    };
    srv.join().await;
    let result = PhaseResult {
        name: NAME,
        expected: "delivered on the 3rd try, 1 key on 3 attempts; delayed item not early"
            .to_owned(),
        measured: seen.measured(),
        passed: seen.passed(),
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// The outbox phase's outbox: its client has the demo's policy (loopback granted, nothing
/// else) without retries of its own — the outbox retries across time —, and short backoff
/// (50 ms up to 200 ms) so the phase takes well under a second.
pub(super) async fn demo_outbox(
    db: &str,
    dialer: &Arc<LoopbackDialer>,
    observe: Arc<dyn Observer>,
) -> Result<Outbox, String> {
    let mut policy = demo_policy();
    policy.retry.enabled = false;
    let client = Client::builder()
        .policy(policy)
        .observer(observe.clone())
        .dialer(dialer.clone())
        .build()
        .map_err(|e| format!("could not build the outbox's client: {e}"))?;
    let store = SqliteStore::open(db)
        .await
        .map_err(|e| format!("could not open the outbox's SQLite file: {e}"))?;
    Outbox::builder()
        .store(Arc::new(store))
        .client(Arc::new(client))
        .workers(4)
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .poll(Duration::from_millis(50))
        .observer(observe)
        .build()
        .map_err(|e| format!("could not build the outbox: {e}"))
}

/// Enqueues the phase's two items and waits (each step within 5 s) for the three attempts at
/// `/hook`, the one at `/later`, and both acknowledged.
pub(super) async fn deliver_both(
    outbox: &Outbox,
    srv: &FaultServer,
    due: SystemTime,
    progress: Progress,
) -> Result<(), String> {
    const NAME: &str = "(h) outbox";
    const WITHIN: Duration = Duration::from_secs(5);
    progress.update(
        NAME,
        "enqueue POST /hook (503, 503, then 200) and POST /later (due in 300 ms) …",
    );
    for item in [
        OutboxItem::post(srv.url("/hook"), "order=42"),
        OutboxItem::post(srv.url("/later"), "reminder").deliver_at(due),
    ] {
        outbox.enqueue(item).await.map_err(|e| e.to_string())?;
    }
    for n in 1..=3 {
        tokio::time::timeout(WITHIN, srv.wait_for_hits("/hook", n))
            .await
            .map_err(|_| format!("POST /hook: attempt {n} did not come within 5 s"))?;
        progress.update(NAME, &format!("POST /hook: attempt {n} arrived …"));
    }
    tokio::time::timeout(WITHIN, srv.wait_for_hits("/later", 1))
        .await
        .map_err(|_| "POST /later did not come within 5 s".to_owned())?;
    progress.update(NAME, "POST /later arrived; waiting for the acks …");
    outbox_kit::drained(&**outbox.store(), WITHIN).await
}

/// What the outbox phase saw.
#[derive(Debug)]
struct OutboxSeen {
    /// What `/hook`'s receiver applied (dedup by key).
    hook: Applied,
    /// The start of the key `/hook` saw first.
    key: String,
    later_hits: u64,
    /// The delayed item's arrival against its due time, in ms (negative: early).
    lateness_ms: Option<f64>,
    dead: usize,
    counts: Counts,
    /// A wait that timed out, or the outbox failing.
    failure: Option<String>,
}

impl OutboxSeen {
    fn passed(&self) -> bool {
        // Three attempts, every one with the same key, one item.
        let one_key_three_tries = self.hook
            == Applied {
                on_wire: 3,
                effects: 1,
                items: 1,
                shared_keys: 0,
            };
        let c = &self.counts;
        self.failure.is_none()
            && one_key_three_tries
            && self.later_hits == 1
            && self.lateness_ms.is_some_and(|ms| ms >= 0.0)
            && self.dead == 0
            && (c.outbox_delivered, c.outbox_retried, c.outbox_dead) == (2, 2, 0)
    }

    fn measured(&self) -> String {
        let later = match self.lateness_ms {
            Some(ms) if ms >= 0.0 => format!("{ms:.1} ms after its time"),
            Some(ms) => format!("{:.1} ms EARLY", -ms),
            None => "never arrived".to_owned(),
        };
        format!(
            "/hook delivered on try {}, {} key on its attempts ({}…); /later {later}; {} delivered, {} retried, {} dead{}",
            self.hook.on_wire,
            self.hook.effects,
            self.key,
            self.counts.outbox_delivered,
            self.counts.outbox_retried,
            self.dead,
            self.failure
                .as_ref()
                .map_or(String::new(), |f| format!("; {f}"))
        )
    }
}
