//! The demo's phases of one client against fault servers: retries, the breaker, the
//! concurrency limit, SSRF refusals, a first-byte timeout, the cache and the SLO controller.

use super::*;

/// (i) The SLO controller: a host whose calls start timing out (30 %) is slowed down — its
/// backoff and rate factors move within a window — and is back at its policy once healed.
pub(super) async fn phase_slo(
    dialer: &Arc<LoopbackDialer>,
    observer: Arc<dyn Observer>,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(i) slo";
    let started = Instant::now();
    let mut srv = server(20, |b| {
        b.route("/ok", Reply::ok("ok")).route("/storm", storm())
    })
    .await?;
    let mut p = demo_policy();
    // The breaker would open on the storm; this phase shows the controller alone.
    p.cbreaker.enabled = false;
    p.slo.recover_step = 0.5;
    let p = slo_policy(p, true)?;
    let client = Client::builder()
        .policy(p)
        .observer(observer)
        .dialer(dialer.clone())
        .build()
        .map_err(|e| format!("could not build the SLO client: {e}"))?;
    let factors = || {
        let mut out = (1.0, 1.0);
        client.gauge_source().read_gauges(&mut |r| {
            if let GaugeReading::SloFactors { backoff, rate, .. } = r {
                out = (backoff, rate);
            }
        });
        out
    };
    progress.update(NAME, "50 req/s, 30 % of them timing out …");
    load(
        &client,
        &srv.url("/storm"),
        Duration::from_millis(2500),
        || false,
    )
    .await;
    let storm = factors();
    progress.update(
        NAME,
        &format!("storm: backoff ×{}, rate ×{}; healed …", storm.0, storm.1),
    );
    let healed_at = Instant::now();
    let back = || factors() == (1.0, 1.0);
    load(&client, &srv.url("/ok"), Duration::from_secs(4), back).await;
    let back_after = healed_at.elapsed();
    let end = factors();
    srv.shutdown().await;
    let passed = storm == (4.0, 0.25) && end == (1.0, 1.0);
    let result = PhaseResult {
        name: NAME,
        expected: "storm: backoff ×4, rate ×0.25; healed: back to 1 within 3.2 s".to_owned(),
        measured: format!(
            "storm: backoff ×{}, rate ×{}; healed: backoff ×{}, rate ×{} after {:.1}s",
            storm.0,
            storm.1,
            end.0,
            end.1,
            back_after.as_secs_f64()
        ),
        passed: passed && back_after < Duration::from_millis(3200),
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

pub(super) fn describe(result: &Result<NetResponse, NetError>) -> String {
    match result {
        Ok(res) => format!("{} after {} attempt(s)", res.status.as_u16(), res.attempts),
        Err(e) => format!("{} ({})", e.kind().label(), e.code().as_str()),
    }
}

/// (a) `/flaky` answers 503 twice then 200; `/random` answers 503 on a seeded 20 % of hits.
pub(super) async fn phase_flaky(
    client: &Client,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(a) retries";
    let started = Instant::now();
    let srv = server(1, |b| {
        b.route("/flaky", Script::status(503).times(2).then(Reply::ok("hi")))
            .route(
                "/random",
                RandomFaults::seeded(42)
                    .fault(0.2, Reply::status(503))
                    .otherwise(Reply::ok("ok")),
            )
    })
    .await?;
    progress.update(NAME, "GET /flaky (503, 503, then 200) …");
    let first = client.send(NetRequest::get(srv.url("/flaky"))).await;
    let first_ok = matches!(&first, Ok(r) if r.status == 200 && r.attempts == 3);
    progress.update(NAME, &format!("GET /flaky: {}", describe(&first)));
    let (mut ok, mut retried, mut attempts) = (0u32, 0u32, 0u32);
    for i in 1..=RANDOM_REQUESTS {
        let res = client.send(NetRequest::get(srv.url("/random"))).await;
        if let Ok(r) = &res {
            attempts += r.attempts;
            if r.status == 200 {
                ok += 1;
            }
            if r.attempts > 1 {
                retried += 1;
            }
        }
        progress.update(
            NAME,
            &format!(
                "GET /random {i}/{RANDOM_REQUESTS}: {} — {ok} ok, {retried} needed a retry",
                describe(&res)
            ),
        );
    }
    let hits = srv.hits("/random");
    srv.join().await;
    let passed = first_ok && ok == RANDOM_REQUESTS && retried > 0 && u64::from(attempts) == hits;
    let result = PhaseResult {
        name: NAME,
        expected: "503,503,200 in 3 attempts; 20/20 ok through random 503s".to_owned(),
        measured: format!(
            "/flaky {}; /random {ok}/{RANDOM_REQUESTS} ok, {retried} retried, {attempts} attempts",
            describe(&first)
        ),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// (b) `/down` fails until healed: the breaker opens, calls fail fast, and after the cooldown
/// a HalfOpen probe against the healed upstream closes it again.
pub(super) async fn phase_breaker(
    client: &Client,
    observer: &DemoObserver,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(b) breaker";
    let started = Instant::now();
    let healed = Arc::new(AtomicBool::new(false));
    let srv = {
        let healed = healed.clone();
        server(2, move |b| {
            b.route(
                "/down",
                Script::respond_with(move |_| {
                    if healed.load(Ordering::SeqCst) {
                        Reply::ok("healed")
                    } else {
                        Reply::status(503)
                    }
                }),
            )
        })
        .await?
    };
    let url = srv.url("/down");
    // Failing: until the breaker refuses a call.
    let mut opened_after = None;
    for i in 1..=10u32 {
        let res = client.send(NetRequest::get(&url)).await;
        progress.update(
            NAME,
            &format!("failing upstream, call {i}: {}", describe(&res)),
        );
        if matches!(&res, Err(e) if e.kind() == ErrorKind::CircuitOpen) {
            opened_after = Some(i);
            break;
        }
    }
    // Open: calls fail fast without reaching the server.
    let hits_at_open = srv.hits("/down");
    let mut fast_failures = 0u32;
    let mut slowest = Duration::ZERO;
    for i in 1..=10u32 {
        let t = Instant::now();
        let res = client.send(NetRequest::get(&url)).await;
        slowest = slowest.max(t.elapsed());
        if matches!(&res, Err(e) if e.kind() == ErrorKind::CircuitOpen) {
            fast_failures += 1;
        }
        progress.update(NAME, &format!("open, call {i}: {}", describe(&res)));
    }
    let hits_while_open = srv.hits("/down") - hits_at_open;
    // The upstream heals; after the cooldown a probe goes through and closes the breaker.
    healed.store(true, Ordering::SeqCst);
    progress.update(NAME, "upstream healed; waiting out the cooldown …");
    tokio::time::sleep(BREAKER_COOLDOWN + Duration::from_millis(100)).await;
    let mut recovered = 0u32;
    for i in 1..=5u32 {
        let res = client.send(NetRequest::get(&url)).await;
        if matches!(&res, Ok(r) if r.status == 200) {
            recovered += 1;
        }
        progress.update(NAME, &format!("recovering, call {i}: {}", describe(&res)));
    }
    // The breaker is keyed by origin: scheme, host and port.
    let origin = srv.origin().to_owned();
    srv.join().await;
    let path = observer.path_of(&origin);
    let expected_path = [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
        BreakerState::Closed,
    ];
    let passed = opened_after.is_some()
        && fast_failures == 10
        && hits_while_open == 0
        && slowest < Duration::from_millis(250)
        && recovered == 5
        && path == expected_path;
    let path_text: Vec<&str> = path.iter().map(|s| s.as_str()).collect();
    let result = PhaseResult {
        name: NAME,
        expected: "opens, 10/10 fail fast (0 hits), closes via half_open".to_owned(),
        measured: format!(
            "CircuitOpen at call {}; {fast_failures}/10 fast (max {:.1} ms, {hits_while_open} hits); {recovered}/5 ok after heal; {}",
            opened_after.map_or("-".to_owned(), |n| n.to_string()),
            slowest.as_secs_f64() * 1e3,
            path_text.join(" -> ")
        ),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// (c) Six concurrent calls to a slow route with a per-host limit of two.
pub(super) async fn phase_limit(
    client: &Arc<Client>,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(c) rate limit";
    const CALLS: u32 = 6;
    let started = Instant::now();
    let mut srv = server(3, |b| {
        b.route("/slow", Reply::ok("done").delay(Duration::from_millis(500)))
    })
    .await?;
    progress.update(
        NAME,
        &format!("{CALLS} concurrent calls, per_host_concurrency = {HOST_CONCURRENCY} …"),
    );
    let mut tasks = Vec::new();
    for _ in 0..CALLS {
        let (client, url) = (client.clone(), srv.url("/slow"));
        tasks.push(tokio::spawn(async move {
            client.send(NetRequest::get(url)).await
        }));
    }
    let (mut ok, mut limited, mut other) = (0u32, 0u32, Vec::new());
    for task in tasks {
        match task.await {
            Ok(Ok(r)) if r.status == 200 => ok += 1,
            Ok(Err(e)) if e.kind() == ErrorKind::RateLimited => limited += 1,
            Ok(res) => other.push(describe(&res)),
            Err(e) => other.push(format!("task failed: {e}")),
        }
        progress.update(NAME, &format!("{ok} ok, {limited} rate limited"));
    }
    let hits = srv.hits("/slow");
    srv.shutdown().await;
    let passed = (1..=HOST_CONCURRENCY).contains(&ok)
        && ok + limited == CALLS
        && other.is_empty()
        && hits == u64::from(ok);
    let result = PhaseResult {
        name: NAME,
        expected: format!("<= {HOST_CONCURRENCY} ok, the rest RateLimited at once"),
        measured: format!(
            "{ok} ok, {limited} RateLimited (QUOTA.RATE_LIMITED), {hits} reached the server{}",
            if other.is_empty() {
                String::new()
            } else {
                format!("; unexpected: {}", other.join(", "))
            }
        ),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// (d) The cloud metadata address, directly and through a redirect: refused by the guard.
pub(super) async fn phase_ssrf(
    client: &Client,
    dialer: &LoopbackDialer,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(d) SSRF guard";
    const METADATA: &str = "http://169.254.169.254/latest/meta-data/";
    let started = Instant::now();
    let srv = server(4, |b| b.route("/go", Reply::redirect(302, METADATA))).await?;
    progress.update(NAME, &format!("GET {METADATA} …"));
    let direct = client.send(NetRequest::get(METADATA)).await;
    progress.update(NAME, &format!("direct: {}", describe(&direct)));
    let redirected = client.send(NetRequest::get(srv.url("/go"))).await;
    progress.update(NAME, &format!("via redirect: {}", describe(&redirected)));
    let refused = |r: &Result<NetResponse, NetError>| matches!(r, Err(e) if e.kind() == ErrorKind::Blocked && e.code() == ErrorCode::AuthForbidden);
    let hits = srv.hits("/go");
    srv.join().await;
    let off = dialer.off_loopback().len();
    let passed = refused(&direct) && refused(&redirected) && hits == 1 && off == 0;
    let result = PhaseResult {
        name: NAME,
        expected: "direct and redirect Blocked (AUTH.FORBIDDEN), 0 dials".to_owned(),
        measured: format!(
            "direct {}; redirect {}; {off} dials off loopback",
            describe(&direct),
            describe(&redirected)
        ),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// (e) The head comes after 5 s; the request allows 200 ms to the first byte.
pub(super) async fn phase_timeout(
    client: &Client,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(e) timeout";
    const TTFB: Duration = Duration::from_millis(200);
    let started = Instant::now();
    let mut srv = server(5, |b| {
        b.route("/late", Reply::ok("late").delay(Duration::from_secs(5)))
    })
    .await?;
    progress.update(
        NAME,
        "GET /late with ttfb = 200 ms (the head comes after 5 s) …",
    );
    let req = NetRequest::get(srv.url("/late")).timeout(TimeoutCfg::default().with_ttfb(TTFB));
    let t = Instant::now();
    let res = client.send(req).await;
    let took = t.elapsed();
    srv.shutdown().await;
    let attempts = res.as_ref().err().map_or(0, NetError::attempts);
    let passed = matches!(&res, Err(e) if e.kind() == ErrorKind::Timeout(Phase::Ttfb)
        && e.code() == ErrorCode::ProviderTimeout)
        && took < Duration::from_secs(3);
    let result = PhaseResult {
        name: NAME,
        expected: "Timeout(ttfb) -> PROVIDER.TIMEOUT, well before 5 s".to_owned(),
        measured: format!(
            "{} after {attempts} attempt(s) in {:.2}s",
            describe(&res),
            took.as_secs_f64()
        ),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}

/// Requests answered from the cache in the cached-GET phase.
const CACHED_GETS: u32 = 5;

/// (f) A cacheable GET: the first goes to the server, the next ones are answered by the
/// CacheHook without a request (no attempt), with the same body.
pub(super) async fn phase_cache(
    client: &Client,
    progress: Progress,
) -> Result<PhaseResult, String> {
    const NAME: &str = "(f) cache";
    let started = Instant::now();
    let srv = server(6, |b| {
        b.route(
            "/catalog",
            Reply::ok("catalog v1")
                .header("cache-control", "max-age=60")
                .header("etag", "\"v1\""),
        )
    })
    .await?;
    progress.update(NAME, "GET /catalog (max-age=60) …");
    let first = client.send(NetRequest::get(srv.url("/catalog"))).await;
    let first_body = match first {
        Ok(r) if r.status == 200 && r.attempts == 1 => r.text().await.ok(),
        _ => None,
    };
    let mut from_cache = 0u32;
    for i in 1..=CACHED_GETS {
        let res = client.send(NetRequest::get(srv.url("/catalog"))).await;
        if let Ok(r) = res {
            let cached = r.status == 200 && r.attempts == 0;
            if cached && r.text().await.ok() == first_body {
                from_cache += 1;
            }
        }
        progress.update(
            NAME,
            &format!("GET /catalog again {i}/{CACHED_GETS}: {from_cache} from the cache"),
        );
    }
    let hits = srv.hits("/catalog");
    srv.join().await;
    let passed = first_body.is_some() && from_cache == CACHED_GETS && hits == 1;
    let result = PhaseResult {
        name: NAME,
        expected: format!("1st GET from the server, the next {CACHED_GETS} from the cache"),
        measured: format!("{from_cache}/{CACHED_GETS} from the cache, {hits} server hit(s)"),
        passed,
        elapsed: started.elapsed(),
    };
    progress.finish(&result);
    Ok(result)
}
