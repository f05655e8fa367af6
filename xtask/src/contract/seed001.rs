//! The assertions of seed 001 (`07-EFT.WP.Core.Threads`): the S75 equations of §IV and the
//! templates of §XI (`timeout_upper_bound`, `retry_success_prob`, `idempotency`,
//! `dedup_window`, `semantics`), each a row with what the seed predicts and what was measured.
//! S75-4's segments are the client's own measurement (`Elapsed`), judged against the
//! caller's clock.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::Mutex;
use soulbase_net_core::{NetClient, NetRequest};
use soulbase_net_interceptors::{IdempotencyKey, RedisDedupStore};
use soulbase_net_runtime::{fleet::RedisStore, testing::LoopbackDialer, Client};
use soulbase_net_testkit::{FaultServer, RedisServer, Reply, Script};

use super::{base_policy, client, start, Jitter};
use crate::table::{row, Row};

/// Every row of seed 001 §IV and §XI.
pub(super) async fn rows() -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    rows.push(timeout_upper_bound().await?);
    rows.extend(retry_success_prob().await?);
    rows.extend(idempotency().await?);
    rows.extend(dedup_window().await?);
    rows.extend(composed_deadlines().await?);
    rows.push(segmented_budget().await?);
    rows.push(semantics().await?);
    rows.extend(declared_semantics().await?);
    rows.push(exactly_once().await?);
    Ok(rows)
}

/// S75-1: W_retry ≤ timeout·(retries+1) + J_total, for every request of a run.
async fn timeout_upper_bound() -> Result<Row, String> {
    let srv = start(
        FaultServer::http1().route(
            "/jitter",
            Script::random(
                soulbase_net_testkit::RandomFaults::seeded(11)
                    .fault(0.4, Reply::ok("late").delay(Duration::from_millis(400)))
                    .fault(0.2, Reply::status(503))
                    .otherwise(Reply::ok("ok")),
            ),
        ),
    )
    .await?;
    let mut p = base_policy()?;
    p.timeout.connect = Duration::from_millis(100);
    p.timeout.ttfb = Duration::from_millis(100);
    p.timeout.read = Duration::from_millis(100);
    p.timeout.write = Duration::from_millis(100);
    p.timeout.attempt = Duration::from_millis(150);
    p.timeout.dynamic.max = Duration::from_millis(150);
    p.retry.backoff.base = Duration::from_millis(5);
    p.retry.backoff.cap = Duration::from_millis(40);
    p.retry.budget.enabled = false;
    let attempt = p.timeout.attempt;
    let jitter = Arc::new(Jitter::default());
    let c = Client::builder()
        .policy(p)
        .dialer(Arc::new(LoopbackDialer::default()))
        .observer(jitter.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let n = 100;
    // The machine's own lateness, measured alongside: on a loaded machine every timer fires
    // late, the client's too, so each of a call's timers (an attempt's limit, a backoff) may
    // add the worst lateness seen while it ran; the bound is the client's, not the machine's.
    let canary = crate::chaos::tally::Lateness::start();
    let mut calls = Vec::with_capacity(n);
    for _ in 0..n {
        jitter.delays.lock().clear();
        let t = tokio::time::Instant::now();
        let r = c.send(NetRequest::get(srv.url("/jitter"))).await;
        let end = tokio::time::Instant::now();
        let attempts = match &r {
            Ok(res) => res.attempts,
            Err(e) => e.attempts(),
        };
        let j_total: Duration = jitter.delays.lock().values().sum();
        calls.push((t, end, attempts, j_total));
    }
    let lateness = canary.stop();
    let mut worst_slack = Duration::MAX;
    let mut violations = 0;
    for (t, end, attempts, j_total) in calls {
        let w = end.saturating_duration_since(t);
        let late = lateness.during(t, end) * (2 * attempts);
        let bound = attempt * attempts + j_total + Duration::from_millis(50) + late;
        if w > bound {
            violations += 1;
        }
        worst_slack = worst_slack.min(bound.saturating_sub(w));
    }
    Ok(row(
        "seed001.timeout_upper_bound",
        format!(
            "W_retry <= timeout*(retries+1) + J_total (+50ms, + the timers' measured lateness) for {n}/{n}"
        ),
        format!(
            "{}/{n} within, least slack {}ms, timers at most {}ms late",
            n - violations,
            worst_slack.as_millis(),
            lateness.worst().as_millis()
        ),
        violations == 0,
    ))
}

/// The z of a two-sided bound that all nine `retry_success_prob` cells meet together with
/// probability 0.999 on a correct client (Bonferroni: Φ⁻¹(1 − 0.001 / (2 · 9)) = 3.865).
const RETRY_PROB_Z: f64 = 3.865;

/// S75-2: p_ok = 1 − p_drop^(retries+1), over 2 000 requests per cell.
///
/// Each request carries a stream header of its own, so the server's draws for its attempts
/// are the request's own (the outcome does not depend on how the 32 callers interleave: the
/// run is deterministic). Each cell is checked against the nominal drop rate and against the
/// per-attempt drop rate the server actually realised, both within a family-wise bound for
/// the nine cells ([`RETRY_PROB_Z`]).
async fn retry_success_prob() -> Result<Vec<Row>, String> {
    const STREAM: &str = "x-draw-stream";
    let mut builder = FaultServer::http1();
    let cells: Vec<(f64, u32)> = [0.1, 0.3, 0.5]
        .iter()
        .flat_map(|p| [0u32, 1, 2].map(|r| (*p, r)))
        .collect();
    for (i, (p, r)) in cells.iter().enumerate() {
        builder = builder.route(
            format!("/drop/{p}/{r}"),
            soulbase_net_testkit::RandomFaults::seeded(1000 + i as u64)
                .per_request(STREAM)
                .fault(*p, Reply::reset())
                .otherwise(Reply::ok("ok")),
        );
    }
    let srv = start(builder).await?;
    let mut rows = Vec::new();
    let n: u32 = 2000;
    for (p, r) in cells {
        let mut pol = base_policy()?;
        pol.retry.max_attempts = r + 1;
        pol.retry.backoff.base = Duration::from_millis(1);
        pol.retry.backoff.cap = Duration::from_millis(1);
        pol.retry.backoff.factor = 1.0;
        pol.retry.budget.enabled = false;
        let c = Arc::new(client(pol)?);
        let path = format!("/drop/{p}/{r}");
        let url = srv.url(&path);
        let mut tasks = tokio::task::JoinSet::new();
        // Rounded up, so that no cell runs fewer than `n` requests.
        let per_task = n.div_ceil(32);
        for task in 0..32u32 {
            let (c, url) = (c.clone(), url.clone());
            tasks.spawn(async move {
                let mut ok = 0u32;
                for i in 0..per_task {
                    let req = NetRequest::get(url.as_str()).header(STREAM, format!("{task}-{i}"));
                    if matches!(c.send(req).await, Ok(res) if res.status == 200) {
                        ok += 1;
                    }
                }
                ok
            });
        }
        let mut ok = 0u32;
        while let Some(done) = tasks.join_next().await {
            ok += done.map_err(|e| e.to_string())?;
        }
        let total = per_task * 32;
        let attempts = srv.hits(&path);
        let measured = f64::from(ok) / f64::from(total);
        // Every attempt but the successful ones was a drop.
        let realised = attempts.saturating_sub(u64::from(ok)) as f64 / attempts.max(1) as f64;
        let band = |q: f64| {
            let expected = 1.0 - q.powi(r as i32 + 1);
            let half = RETRY_PROB_Z * (expected * (1.0 - expected) / f64::from(total)).sqrt();
            (expected, half, (measured - expected).abs() <= half + 1e-9)
        };
        let (nominal, nominal_half, nominal_ok) = band(p);
        let (real, real_half, real_ok) = band(realised);
        rows.push(row(
            &format!("seed001.retry_success_prob p={p} r={r}"),
            format!(
                "{nominal:.4} ± {nominal_half:.4}; at realised p={realised:.4}: {real:.4} ± {real_half:.4}"
            ),
            format!("{measured:.4} over {total} ({attempts} attempts)"),
            nominal_ok && real_ok,
        ));
        // S75-3 on the same draws: the attempts a request used, against the geometric sum.
        let used = attempts as f64 / f64::from(total);
        let (nominal, nominal_half, nominal_ok) = attempts_band(p, r, total, used);
        let (real, real_half, real_ok) = attempts_band(realised, r, total, used);
        rows.push(row(
            &format!("seed001.expected_attempts p={p} r={r}"),
            format!(
                "{nominal:.4} ± {nominal_half:.4}; at realised p={realised:.4}: {real:.4} ± {real_half:.4}"
            ),
            format!("{used:.4} attempts per request over {total}"),
            nominal_ok && real_ok,
        ));
    }
    Ok(rows)
}

/// S75-3: `E[attempts_used] = Σ_{k=1}^{r+1} p^(k−1)`, the mean of a geometric number of
/// attempts cut at r + 1, and the bound the mean of `total` requests meets at [`RETRY_PROB_Z`]
/// (its variance from `E[A²] = Σ_{k=1}^{r+1} (2k − 1)·p^(k−1)`). Returns the expectation, the
/// half-width, and whether `used` is within.
fn attempts_band(p: f64, r: u32, total: u32, used: f64) -> (f64, f64, bool) {
    let (mut mean, mut square) = (0.0, 0.0);
    for k in 1..=r + 1 {
        let reached = p.powi(k as i32 - 1);
        mean += reached;
        square += f64::from(2 * k - 1) * reached;
    }
    let variance = (square - mean * mean).max(0.0);
    let half = RETRY_PROB_Z * (variance / f64::from(total)).sqrt();
    (mean, half, (used - mean).abs() <= half + 1e-9)
}

/// One Idempotency-Key across retries and across hedged copies.
async fn idempotency() -> Result<Vec<Row>, String> {
    let srv = start(
        FaultServer::http1()
            .route("/retry", Script::status(503).times(2).then(Reply::ok("ok")))
            .route(
                "/hedge",
                Script::reply(Reply::ok("slow").delay(Duration::from_millis(800)))
                    .times(1)
                    .then(Reply::ok("fast")),
            ),
    )
    .await?;
    let mut rows = Vec::new();
    let c = client(base_policy()?)?;
    let _ = c
        .send(
            NetRequest::post(srv.url("/retry"))
                .body("x")
                .idempotent(true),
        )
        .await;
    let keys: Vec<Option<String>> = srv
        .requests("/retry")
        .iter()
        .map(|q| q.header("idempotency-key").map(str::to_owned))
        .collect();
    let stable = keys.len() == 3 && keys[0].is_some() && keys.iter().all(|k| k == &keys[0]);
    rows.push(row(
        "seed001.idempotency retries",
        "3 attempts, 1 key",
        format!("{} attempts, {} distinct keys", keys.len(), distinct(&keys)),
        stable,
    ));

    let mut p = base_policy()?;
    p.hedge.enabled = true;
    p.hedge.delay = Duration::from_millis(50);
    let c = client(p)?;
    let _ = c
        .send(
            NetRequest::post(srv.url("/hedge"))
                .body("x")
                .idempotent(true),
        )
        .await;
    let keys: Vec<Option<String>> = srv
        .requests("/hedge")
        .iter()
        .map(|q| q.header("idempotency-key").map(str::to_owned))
        .collect();
    let stable = keys.len() == 2 && keys[0].is_some() && keys.iter().all(|k| k == &keys[0]);
    rows.push(row(
        "seed001.idempotency hedges",
        "2 copies, 1 key",
        format!("{} copies, {} distinct keys", keys.len(), distinct(&keys)),
        stable,
    ));
    Ok(rows)
}

fn distinct(keys: &[Option<String>]) -> usize {
    let mut k: Vec<_> = keys.iter().collect();
    k.sort();
    k.dedup();
    k.len()
}

/// At-least-once paths never duplicate a side effect: non-idempotent calls reach the server
/// once each; idempotent ones may be retried, but each key gets at most one success.
async fn semantics() -> Result<Row, String> {
    let applied: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let seen = applied.clone();
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let hits = counter.clone();
    let srv = start(
        FaultServer::http1()
            .route("/plain", Script::p_drop(77, 0.3, Reply::ok("ok")))
            .route(
                "/keyed",
                Script::respond_with(move |req| {
                    let n = hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    // Every third attempt fails after the server saw it (a 503).
                    if n.is_multiple_of(3) {
                        return Reply::status(503);
                    }
                    if let Some(key) = req.header("idempotency-key") {
                        *seen.lock().entry(key.to_owned()).or_default() += 1;
                    }
                    Reply::ok("applied")
                }),
            ),
    )
    .await?;
    let c = client(base_policy()?)?;
    let n = 200;
    for _ in 0..n {
        let _ = c
            .send(NetRequest::post(srv.url("/plain")).body("charge"))
            .await;
    }
    let plain_hits = srv.hits("/plain");
    for _ in 0..n {
        let _ = c
            .send(
                NetRequest::post(srv.url("/keyed"))
                    .body("charge")
                    .idempotent(true),
            )
            .await;
    }
    let applied = applied.lock();
    let max_per_key = applied.values().copied().max().unwrap_or(0);
    let ok = plain_hits == n && max_per_key <= 1 && applied.len() == n as usize;
    Ok(row(
        "seed001.semantics",
        format!("{n} plain POSTs = {n} hits; each key applied once"),
        format!(
            "{plain_hits} hits; {} keys, max {max_per_key} per key",
            applied.len()
        ),
        ok,
    ))
}

/// Δt_dedup of the `dedup_window` rows: long enough that a scheduler hiccup on a loaded
/// machine is small beside [`EDGE`].
const WINDOW: Duration = Duration::from_millis(1000);

/// ε: how far inside and outside the window the duplicates are sent.
const EDGE: Duration = Duration::from_millis(200);

/// Keys per case and store.
const EDGE_KEYS: usize = 4;

/// `{"type":"dedup_window","span_reorder_le":Δt_dedup}` (§XI), built at the window's edge:
/// a duplicate reordered by Δt − ε is dropped (answered from the window, not sent) and one
/// reordered by Δt + ε is accepted (sent), none missed and none wrongly killed — on the
/// client's own dedup store and on the fleet's (Redis).
///
/// The window of an entry starts when its first call finishes, before `send` returns; the
/// delay is measured from that return, so a measured Δt − ε is at most the real one (a drop
/// stays a drop) and a measured Δt + ε at least the real one. A case whose measured delay
/// missed its side of the window (a stalled scheduler) is counted apart, not judged.
async fn dedup_window() -> Result<Vec<Row>, String> {
    let srv = start(FaultServer::http1().route("/apply", Reply::ok("applied"))).await?;
    let mut rows = Vec::new();
    let local = IdempotencyKey::random().dedup_window(WINDOW);
    rows.push(window_edge("local", local, &srv).await?);
    let redis = match RedisServer::try_start() {
        Ok(Some(redis)) => redis,
        Ok(None) => {
            rows.push(row(
                "seed001.dedup_window redis",
                "the edge cases on Redis",
                "redis-server is not installed: run the servers step (cargo xtask ci installs it)",
                false,
            ));
            return Ok(rows);
        }
        Err(e) => return Err(format!("redis-server did not start: {e}")),
    };
    let store = RedisDedupStore::new(&redis.url()).map_err(|e| e.to_string())?;
    let shared = IdempotencyKey::random()
        .dedup_window(WINDOW)
        .shared_dedup(store);
    rows.push(window_edge("redis", shared, &srv).await?);
    Ok(rows)
}

/// The edge cases of [`dedup_window`] through a client with `keys`, the store named `name`.
async fn window_edge(name: &str, keys: IdempotencyKey, srv: &FaultServer) -> Result<Row, String> {
    let c = Client::builder()
        .policy(base_policy()?)
        .dialer(Arc::new(LoopbackDialer::default()))
        .interceptor(keys)
        .build()
        .map_err(|e| e.to_string())?;
    let sent = |key: &str| {
        srv.requests("/apply")
            .iter()
            .filter(|r| r.header("idempotency-key") == Some(key))
            .count()
    };
    let (mut dropped, mut accepted, mut missed, mut killed, mut off_edge) = (0, 0, 0, 0, 0);
    let mut delays = Vec::new();
    for i in 0..EDGE_KEYS * 2 {
        let inside = i % 2 == 0;
        let key = format!("{name}-edge-{i}");
        let call = || {
            NetRequest::post(srv.url("/apply"))
                .body("x")
                .idempotency_key(key.as_str())
        };
        c.send(call()).await.map_err(|e| e.to_string())?;
        let first_done = Instant::now();
        let reorder = if inside { WINDOW - EDGE } else { WINDOW + EDGE };
        tokio::time::sleep(reorder).await;
        let delay = first_done.elapsed();
        c.send(call()).await.map_err(|e| e.to_string())?;
        delays.push(delay);
        let copies = sent(&key);
        match (inside, delay < WINDOW, copies) {
            // A stalled scheduler pushed an inside case past the window: not judged.
            (true, false, _) => off_edge += 1,
            (true, true, 1) => dropped += 1,
            // A duplicate inside the window reached the server.
            (true, true, _) => missed += 1,
            (false, _, 2) => accepted += 1,
            // A call after the window was taken for a duplicate.
            (false, _, _) => killed += 1,
        }
    }
    let worst = delays.iter().max().copied().unwrap_or_default();
    Ok(row(
        &format!("seed001.dedup_window {name}"),
        format!(
            "Δt_dedup {}ms: {EDGE_KEYS} duplicates at Δt−{}ms dropped, {EDGE_KEYS} at Δt+{}ms accepted",
            WINDOW.as_millis(),
            EDGE.as_millis(),
            EDGE.as_millis()
        ),
        format!(
            "{dropped} dropped, {accepted} accepted, {missed} missed, {killed} wrongly killed, \
             {off_edge} off the edge (latest delay {}ms)",
            worst.as_millis()
        ),
        dropped + off_edge == EDGE_KEYS
            && off_edge <= 1
            && accepted == EDGE_KEYS
            && missed == 0
            && killed == 0,
    ))
}

/// The semantics matrix of §VIII, a row per declared `sem`: under `at_most_once` no request
/// reaches the server twice, whatever fails (a 5xx after the work, an answer later than the
/// first-byte timeout); under `at_least_once` every keyed call ends applied, each key once at
/// a server that drops repeated keys, and an unkeyed POST is refused before it is sent.
async fn declared_semantics() -> Result<Vec<Row>, String> {
    use soulbase_net_policy::Semantics;

    let applied: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let seen = applied.clone();
    let attempts = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = attempts.clone();
    let srv = start(
        FaultServer::http1()
            .route(
                "/once",
                Script::random(
                    soulbase_net_testkit::RandomFaults::seeded(31)
                        .fault(0.3, Reply::status(503))
                        .fault(0.2, Reply::ok("late").delay(Duration::from_millis(300)))
                        .otherwise(Reply::ok("ok")),
                ),
            )
            .route(
                "/apply",
                Script::respond_with(move |req| {
                    let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(key) = req.header("idempotency-key") else {
                        return Reply::status(400);
                    };
                    // The server applies a key once and answers its repeats from memory; one
                    // attempt in three fails after the work was done.
                    *seen.lock().entry(key.to_owned()).or_default() += 1;
                    if n.is_multiple_of(3) {
                        Reply::status(503)
                    } else {
                        Reply::ok("applied")
                    }
                }),
            ),
    )
    .await?;
    let n = 100u32;
    let mut rows = Vec::new();

    let mut p = base_policy()?;
    p.delivery.sem = Some(Semantics::AtMostOnce);
    p.retry.max_attempts = 2;
    p.timeout.ttfb = Duration::from_millis(150);
    let c = client(p)?;
    let mut failed = 0;
    for _ in 0..n {
        if !matches!(c.send(NetRequest::get(srv.url("/once"))).await, Ok(r) if r.status == 200) {
            failed += 1;
        }
    }
    let hits = srv.hits("/once");
    rows.push(row(
        "seed001.semantics at_most_once",
        format!("{n} calls, {n} requests at the server (none sent twice)"),
        format!("{n} calls, {hits} requests, {failed} failed and returned as they were"),
        hits == u64::from(n) && failed > 0,
    ));

    let mut p = base_policy()?;
    p.delivery.sem = Some(Semantics::AtLeastOnce);
    p.delivery.dedup_window = Some(Duration::from_secs(600));
    p.retry.budget.enabled = false;
    let c = client(p)?;
    let refused = c
        .send(NetRequest::post(srv.url("/apply")).body("charge"))
        .await
        .is_err_and(|e| e.kind() == soulbase_net_core::ErrorKind::InvalidRequest);
    let before = srv.hits("/apply");
    let mut delivered = 0;
    for i in 0..n {
        let req = NetRequest::post(srv.url("/apply"))
            .header("idempotency-key", format!("charge-{i}"))
            .body("charge");
        if matches!(c.send(req).await, Ok(r) if r.status == 200) {
            delivered += 1;
        }
    }
    let sent = srv.hits("/apply") - before;
    let applied = applied.lock();
    let repeats: u32 = applied.values().map(|k| k - 1).sum();
    rows.push(row(
        "seed001.semantics at_least_once",
        format!("unkeyed POST refused unsent; {n} keyed calls delivered, each key applied once"),
        format!(
            "refused: {refused}; {delivered} delivered in {sent} requests, {} keys, {repeats} \
             repeats dropped by key",
            applied.len()
        ),
        refused
            && before == 0
            && delivered == n
            && applied.len() == n as usize
            && sent > u64::from(n),
    ));
    Ok(rows)
}

/// S75-5: composed deadlines. Three calls under policies with different worst cases
/// `W_retry_i` (`NetPolicy::worst_case_latency`: attempts × the attempt timeout + the longest
/// backoff), to an upstream that never answers in time, so that each call uses its whole
/// budget: made in parallel they end by `parallel_deadline` = max_i W_retry_i, one after the
/// other by `serial_deadline` = Σ_i W_retry_i — and not much sooner (the bound is the one the
/// calls need, not a loose one).
async fn composed_deadlines() -> Result<Vec<Row>, String> {
    use soulbase_net_core::{parallel_deadline, serial_deadline};

    let srv = start(
        FaultServer::http1().route("/never", Reply::ok("late").delay(Duration::from_secs(5))),
    )
    .await?;
    let mut branches = Vec::new();
    for (i, attempts) in [(0u32, 2u32), (1, 3), (2, 1)] {
        let mut p = base_policy()?;
        let attempt = Duration::from_millis(120 + 60 * u64::from(i));
        p.timeout.connect = attempt;
        p.timeout.ttfb = attempt;
        p.timeout.read = attempt;
        p.timeout.write = attempt;
        p.timeout.attempt = attempt;
        p.retry.max_attempts = attempts;
        p.retry.backoff.base = Duration::from_millis(10);
        p.retry.backoff.cap = Duration::from_millis(20);
        p.retry.budget.enabled = false;
        let worst = p.worst_case_latency();
        branches.push((client(p)?, worst));
    }
    let worst: Vec<Duration> = branches.iter().map(|(_, w)| *w).collect();
    let (fan_out, chain) = (
        parallel_deadline(worst.clone()),
        serial_deadline(worst.clone()),
    );
    let url = srv.url("/never");
    // Every timer of these calls may fire as late as the machine makes any (see
    // `timeout_upper_bound`): measured alongside and allowed for per timer.
    let canary = crate::chaos::tally::Lateness::start();
    let parallel_from = tokio::time::Instant::now();
    let began = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for (c, _) in &branches {
        let (c, url) = (c.clone(), url.clone());
        calls.spawn(async move { c.send(NetRequest::get(url.as_str())).await });
    }
    let mut parallel = Vec::new();
    while let Some(done) = calls.join_next().await {
        parallel.push(done.map_err(|e| e.to_string())?);
    }
    let parallel_took = began.elapsed();
    let serial_from = tokio::time::Instant::now();
    let began = Instant::now();
    let mut serial = Vec::new();
    for (c, _) in &branches {
        serial.push(c.send(NetRequest::get(url.as_str())).await);
    }
    let serial_took = began.elapsed();
    let lateness = canary.stop();
    let now = tokio::time::Instant::now();
    // An attempt's limit and a backoff per attempt, for the longest branch (in parallel) or
    // every branch (in a chain).
    let timers = |n: u32| 2 * n;
    let late_parallel = lateness.during(parallel_from, serial_from) * timers(3);
    let late_serial = lateness.during(serial_from, now) * timers(2 + 3 + 1);
    let all_timed_out = parallel
        .iter()
        .chain(&serial)
        .all(|r| r.as_ref().is_err_and(|e| e.kind().is_timeout()));
    // Scheduling and connecting on a loaded machine; the calls' own work is the bound.
    let slack = Duration::from_millis(150);
    let judge = |took: Duration, bound: Duration, late: Duration| {
        took <= bound + slack + late && took + slack >= bound.mul_f64(0.8)
    };
    let ms = |d: Duration| d.as_millis();
    Ok(vec![
        row(
            "seed001.composed_deadline parallel",
            format!(
                "3 calls (W_retry {}/{}/{}ms) end by max_i = {}ms (+{}ms, + timers' lateness)",
                ms(worst[0]),
                ms(worst[1]),
                ms(worst[2]),
                ms(fan_out),
                ms(slack)
            ),
            format!(
                "ended in {}ms, every call timed out: {all_timed_out}",
                ms(parallel_took)
            ),
            all_timed_out && judge(parallel_took, fan_out, late_parallel),
        ),
        row(
            "seed001.composed_deadline serial",
            format!(
                "the same 3 calls in a chain end by Σ_i = {}ms (+{}ms, + timers' lateness)",
                ms(chain),
                ms(slack)
            ),
            format!("ended in {}ms", ms(serial_took)),
            all_timed_out && judge(serial_took, chain, late_serial),
        ),
    ])
}

/// The loopback dialer after a fixed delay: a network whose connections take time to open.
#[derive(Debug)]
struct SlowDial(Duration);

impl soulbase_net_runtime::Dialer for SlowDial {
    fn dial(&self, addr: std::net::SocketAddr) -> soulbase_net_runtime::DialFuture {
        let (delay, dial) = (self.0, LoopbackDialer::default().dial(addr));
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            dial.await
        })
    }
}

/// An interceptor that spends `before` and `after` in its hooks: the calls' `w(proc)`.
struct Busy(Duration, Duration);

#[async_trait::async_trait]
impl soulbase_net_core::Interceptor for Busy {
    async fn before(&self, _req: &mut NetRequest) -> Result<(), soulbase_net_core::NetError> {
        tokio::time::sleep(self.0).await;
        Ok(())
    }

    async fn after(
        &self,
        _req: &NetRequest,
        _res: &mut soulbase_net_core::NetResponse,
    ) -> Result<(), soulbase_net_core::NetError> {
        tokio::time::sleep(self.1).await;
        Ok(())
    }
}

/// S75-4: `budget_total = W_q_in + w(proc) + W_q_out + W_net ≤ timeout`, per call. 96 calls,
/// 24 at a time under a host limit of 4 (queue in), through 3 + 2 ms of interceptors
/// (processing), on connections that take 30 ms to open (queue out) to a server that answers
/// in 0–20 ms (network). Every call's segments, as the client measured them, must fit in what
/// its caller saw, which must fit its timeout; and the segments must account for the call
/// (each exercised, and together at least 90 % of the callers' time).
async fn segmented_budget() -> Result<Row, String> {
    let srv = start(
        FaultServer::http1().route(
            "/seg",
            Script::random(
                soulbase_net_testkit::RandomFaults::seeded(75)
                    .fault(0.5, Reply::ok("a").delay(Duration::from_millis(20)))
                    .fault(0.25, Reply::ok("b").delay(Duration::from_millis(10)))
                    .otherwise(Reply::ok("c")),
            ),
        ),
    )
    .await?;
    let mut p = base_policy()?;
    p.limits.per_host_concurrency = 4;
    p.limits.max_wait = Duration::from_secs(5);
    p.retry.max_attempts = 1;
    let timeout = Duration::from_secs(3);
    let c = Client::builder()
        .policy(p)
        .dialer(Arc::new(SlowDial(Duration::from_millis(30))))
        .interceptor(Busy(Duration::from_millis(3), Duration::from_millis(2)))
        .build()
        .map_err(|e| e.to_string())?;
    let (n, at_once) = (96, 24);
    let url = srv.url("/seg");
    let mut seen = Vec::new();
    for _ in 0..n / at_once {
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..at_once {
            let (c, url) = (c.clone(), url.clone());
            calls.spawn(async move {
                let began = Instant::now();
                let res = c.send(NetRequest::get(url).total_timeout(timeout)).await;
                res.map(|res| (res.elapsed, began.elapsed()))
            });
        }
        while let Some(done) = calls.join_next().await {
            seen.push(
                done.map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?,
            );
        }
    }
    let closed = seen
        .iter()
        .filter(|(e, took)| e.segments() <= *took && *took <= timeout)
        .count();
    let sum = |f: fn(&soulbase_net_core::Elapsed) -> Duration| -> Duration {
        seen.iter().map(|(e, _)| f(e)).sum()
    };
    let (q_in, proc, q_out, net) = (
        sum(|e| e.queue_in()),
        sum(|e| e.processing()),
        sum(|e| e.queue_out()),
        sum(|e| e.network()),
    );
    let callers: Duration = seen.iter().map(|(_, took)| *took).sum();
    let covered = (q_in + proc + q_out + net).as_secs_f64() / callers.as_secs_f64().max(1e-9);
    let mean = |d: Duration| d.as_secs_f64() * 1e3 / f64::from(n);
    let exercised = [q_in, proc, q_out, net].iter().all(|d| !d.is_zero());
    Ok(row(
        "seed001.segmented_budget",
        format!(
            "W_q_in + w(proc) + W_q_out + W_net <= W <= timeout ({}s) for {n}/{n}, segments >= 90% of W",
            timeout.as_secs()
        ),
        format!(
            "{closed}/{n}; mean ms q_in {:.1} proc {:.1} q_out {:.1} net {:.1}, {:.1}% of W",
            mean(q_in),
            mean(proc),
            mean(q_out),
            mean(net),
            covered * 100.0
        ),
        closed == seen.len() && seen.len() == n as usize && exercised && covered >= 0.9,
    ))
}

/// How long the upstream of [`exactly_once`] holds each answer: two arrivals of one key
/// within it were in flight together.
const EO_HOLD: Duration = Duration::from_millis(30);

/// §VII's `exactly_once*` = atomic ∧ dedup(Δt_dedup) ∧ ordered_ack, through the outbox on
/// SQLite: 3 keys × 10 items enqueued in the caller's committed transactions, and 5 more in one
/// rolled back; the delivering outbox is stopped dead twice mid-delivery (its task aborted:
/// its claims held and its calls in flight cut off), and a fresh outbox takes over the file
/// each time. The receiver applies an effect once per `Idempotency-Key`.
async fn exactly_once() -> Result<Row, String> {
    use soulbase_net_outbox::{Outbox, OutboxItem, OutboxStore, SqliteStore};

    type Seen = Arc<Mutex<Vec<(String, String, Instant)>>>;
    let seen: Seen = Arc::default();
    let noted = seen.clone();
    let srv = start(FaultServer::http1().route(
        "/eo",
        Script::respond_with(move |req| {
            let key = req.header("idempotency-key").unwrap_or_default().to_owned();
            noted.lock().push((req.text(), key, Instant::now()));
            Reply::ok("applied").delay(EO_HOLD)
        }),
    ))
    .await?;
    let dir = crate::outbox_kit::TempDir::new("contract-eo")?;
    let store = Arc::new(
        SqliteStore::open(std::path::Path::new(&dir.file("eo.db")))
            .await
            .map_err(|e| e.to_string())?,
    );
    let (keys, per_key) = (["a", "b", "c"], 10usize);
    let url = srv.url("/eo");
    let item =
        |key: &str, seq: usize| OutboxItem::post(&url, format!("{key}:{seq}")).ordering_key(key);
    for seq in 0..per_key {
        let mut tx = store.pool().begin().await.map_err(|e| e.to_string())?;
        for key in keys {
            store
                .enqueue_in(&mut tx, item(key, seq))
                .await
                .map_err(|e| e.to_string())?;
        }
        tx.commit().await.map_err(|e| e.to_string())?;
    }
    let mut tx = store.pool().begin().await.map_err(|e| e.to_string())?;
    for seq in 0..5 {
        store
            .enqueue_in(&mut tx, item("rolled-back", seq))
            .await
            .map_err(|e| e.to_string())?;
    }
    tx.rollback().await.map_err(|e| e.to_string())?;
    let store: Arc<dyn OutboxStore> = store;
    let outbox = |store: Arc<dyn OutboxStore>| -> Result<Arc<Outbox>, String> {
        Ok(Arc::new(
            Outbox::builder()
                .store(store)
                .client(Arc::new(client(base_policy()?)?))
                .workers(8)
                .lease(Duration::from_millis(400))
                .poll(Duration::from_millis(20))
                .build()
                .map_err(|e| e.to_string())?,
        ))
    };
    let total = keys.len() * per_key;
    let mut kills = 0;
    for stop_at in [7, 18] {
        let o = outbox(store.clone())?;
        let running = tokio::spawn(async move { o.run().await });
        let reached = tokio::time::timeout(Duration::from_secs(20), async {
            while seen.lock().len() < stop_at {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        running.abort();
        let _ = running.await;
        if reached.is_ok() {
            kills += 1;
        }
    }
    let last = outbox(store.clone())?;
    let runner = last.clone();
    let running = tokio::spawn(async move { runner.run().await });
    let drained = crate::outbox_kit::drained(&*store, Duration::from_secs(30)).await;
    last.shutdown();
    let _ = running.await;
    let seen = seen.lock().clone();
    // Effects: one per key (Δt_dedup covers the run); each item's copies share one key.
    let mut effects: HashMap<String, String> = HashMap::new();
    let mut two_keys = 0;
    for (body, key, _) in &seen {
        if let Some(first) = effects.insert(key.clone(), body.clone()) {
            two_keys += usize::from(&first != body);
        }
    }
    let mut bodies: Vec<&String> = effects.values().collect();
    bodies.sort();
    bodies.dedup();
    let applied_once = effects.len() == total && bodies.len() == total && two_keys == 0;
    let rolled_back_sent = seen
        .iter()
        .filter(|(b, _, _)| b.starts_with("rolled-back"))
        .count();
    // Order: per key, first arrivals in enqueue order, later copies only of the latest.
    let mut in_order = true;
    let mut most_at_once = 0;
    for key in keys {
        let arrivals: Vec<(usize, Instant)> = seen
            .iter()
            .filter_map(|(b, _, at)| {
                let (k, seq) = b.split_once(':')?;
                (k == key).then(|| Some((seq.parse().ok()?, *at)))?
            })
            .collect();
        in_order &= arrivals.windows(2).all(|w| w[0].0 <= w[1].0);
        let mut firsts: Vec<usize> = arrivals.iter().map(|a| a.0).collect();
        firsts.dedup();
        in_order &= firsts == (0..per_key).collect::<Vec<_>>();
        for (_, t) in &arrivals {
            let overlapping = arrivals
                .iter()
                .filter(|(_, u)| *u <= *t && *t < *u + EO_HOLD)
                .count();
            most_at_once = most_at_once.max(overlapping);
        }
    }
    Ok(row(
        "seed001.semantics exactly_once*",
        format!(
            "{total} items over 3 keys, outbox stopped dead twice: each effect once, keys in order one at a time, 0 of 5 rolled back sent"
        ),
        format!(
            "{} effects for {total} items ({} on the wire), in order: {in_order}, most of a key at once {most_at_once}, rolled back sent {rolled_back_sent}, stopped {kills}/2",
            effects.len(),
            seen.len()
        ),
        drained.is_ok()
            && applied_once
            && in_order
            && most_at_once == 1
            && rolled_back_sent == 0
            && kills == 2,
    ))
}
