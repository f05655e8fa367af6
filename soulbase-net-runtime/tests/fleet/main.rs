//! Limits shared by a fleet, on a real Redis (a throwaway `redis-server` on a free loopback
//! port): one quota for several clients, leases, and what each `on_store_error` mode does when
//! Redis is gone or slow; the same on a Redis Cluster and through Sentinel. Without
//! `redis-server` installed, each test prints a line and is skipped; CI installs it and sets
//! `SOULBASE_REQUIRE_REDIS`, so there they never skip.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster;
mod sentinel;

use std::{sync::Arc, time::Duration};

use parking_lot::Mutex;
use soulbase_net_core::{
    ErrorKind, LimitScope, NetError, NetEvent, NetRequest, NetResponse, Observer,
};
use soulbase_net_policy::{GlobalLimit, NetPolicy, OnStoreError};
use soulbase_net_runtime::testing::LoopbackDialer;
use soulbase_net_runtime::{
    fleet::{Counted, RateStore, RedisRateStore, RedisStore, TakeRequest},
    Client,
};
use soulbase_net_testkit::{FaultServer, RedisServer, Reply};
use tokio::time::Instant;

/// Keeps store errors and the scopes of refusals.
#[derive(Debug, Default)]
struct Seen {
    store_errors: Mutex<Vec<(bool, &'static str)>>,
    refusals: Mutex<Vec<LimitScope>>,
}

impl Observer for Seen {
    fn on_event(&self, ev: &NetEvent<'_>) {
        match ev {
            NetEvent::StoreError { timed_out, op, .. } => {
                self.store_errors.lock().push((*timed_out, op));
            }
            NetEvent::RateLimited { scope, .. } => self.refusals.lock().push(*scope),
            _ => {}
        }
    }
}

fn policy(global: GlobalLimit) -> NetPolicy {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    p.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    p.dns.prefetch.clear();
    p.retry.enabled = false;
    p.limits.global = Some(global);
    p
}

fn global(rps: u32, burst: u32) -> GlobalLimit {
    let mut g = GlobalLimit::default();
    g.rps = rps;
    g.burst = burst;
    // A loaded CI machine: the store gets room to answer (the slow-Redis test sets its own).
    g.store_timeout = Duration::from_millis(500);
    g
}

fn client(p: NetPolicy, store: Arc<dyn RateStore>, seen: Arc<Seen>) -> Client {
    Client::builder()
        .policy(p)
        .dialer(Arc::new(LoopbackDialer::default()))
        .rate_store(store)
        .observer(seen)
        .build()
        .unwrap()
}

async fn server() -> FaultServer {
    FaultServer::http1()
        .route("/q", Reply::ok("ok"))
        .start()
        .await
        .unwrap()
}

/// Sends `n` calls at once from `client`; returns the answers.
async fn burst_of(client: &Client, url: &str, n: usize) -> Vec<Result<NetResponse, NetError>> {
    let calls = (0..n).map(|_| client.send(NetRequest::get(url).tenant("t1")));
    futures_join_all(calls).await
}

async fn futures_join_all<F: std::future::Future>(fs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut out = Vec::new();
    let pinned: Vec<_> = fs.map(Box::pin).collect();
    for f in pinned {
        out.push(f.await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_share_one_quota_through_redis() {
    let Some(redis) = RedisServer::start_or_skip("two_clients_share_one_quota_through_redis")
    else {
        return;
    };
    let srv = server().await;
    let url = srv.url("/q");
    let seen = Arc::new(Seen::default());
    let g = global(5, 10);
    let a = client(
        policy(g.clone()),
        Arc::new(RedisRateStore::new(&redis.url()).unwrap()),
        seen.clone(),
    );
    let b = client(
        policy(g),
        Arc::new(RedisRateStore::new(&redis.url()).unwrap()),
        seen.clone(),
    );
    let started = Instant::now();
    let (ra, rb) = tokio::join!(burst_of(&a, &url, 15), burst_of(&b, &url, 15));
    let elapsed = started.elapsed();
    let ok = ra.iter().chain(&rb).filter(|r| r.is_ok()).count() as u64;
    let refused: Vec<&NetError> = ra
        .iter()
        .chain(&rb)
        .filter_map(|r| r.as_ref().err())
        .collect();
    // One bucket for both: the burst of 10, plus what the rate refilled while they ran.
    let refill = (elapsed.as_secs_f64() * 5.0).ceil() as u64;
    assert!(
        ok >= 10 && ok <= 10 + refill,
        "{ok} admitted in {elapsed:?}"
    );
    assert_eq!(srv.hits("/q"), ok, "only admitted calls reached the server");
    assert!(refused.iter().all(|e| e.kind() == ErrorKind::RateLimited));
    assert!(
        seen.store_errors.lock().is_empty(),
        "{:?}",
        seen.store_errors.lock()
    );
    assert!(seen
        .refusals
        .lock()
        .iter()
        .all(|s| *s == LimitScope::GlobalRate));
    // A refusal says when to come back.
    assert!(refused[0]
        .retry_after()
        .is_some_and(|d| d <= Duration::from_millis(200)));
    srv.join().await;
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_spare_redis_round_trips_and_keep_the_quota() {
    let Some(redis) =
        RedisServer::start_or_skip("leases_spare_redis_round_trips_and_keep_the_quota")
    else {
        return;
    };
    let srv = server().await;
    let url = srv.url("/q");
    let seen = Arc::new(Seen::default());
    let mut g = global(1000, 40);
    g.lease = 10;
    let store = Arc::new(Counted::new(RedisRateStore::new(&redis.url()).unwrap()));
    let c = client(policy(g), store.clone(), seen.clone());
    // One caller after another: 40 calls, the burst, in 4 leases of 10.
    for _ in 0..40 {
        c.send(NetRequest::get(url.as_str()).tenant("t1"))
            .await
            .unwrap();
    }
    let takes = store.calls();
    assert!(takes <= 5, "{takes} round trips for 40 calls");
    assert_eq!(srv.hits("/q"), 40);
    srv.join().await;
    drop(redis);
}

/// Runs `n` calls one after another with `client`; returns (admitted, refused, slowest).
async fn run_calls(client: &Client, url: &str, n: usize) -> (usize, usize, Duration) {
    let (mut ok, mut refused, mut slowest) = (0, 0, Duration::ZERO);
    for _ in 0..n {
        let t = Instant::now();
        let r = client
            .send(
                NetRequest::get(url)
                    .tenant("t1")
                    .total_timeout(Duration::from_secs(2)),
            )
            .await;
        slowest = slowest.max(t.elapsed());
        match r {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::RateLimited, "{e}");
                refused += 1;
            }
        }
    }
    (ok, refused, slowest)
}

/// One token of `key`'s bucket (1 000 per second).
fn take(key: &str) -> TakeRequest<'_> {
    TakeRequest {
        key,
        rps: 1000,
        burst: 1000,
        want: 1,
        at_least: 1,
        owed: 0,
    }
}

/// While Redis is down, every command fails instead of waiting for it to come back: the
/// first on the broken connection, the next ones on the reconnection it started (which gives
/// up after a few connects, and the next command starts another). Once Redis is back, the
/// commands go through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_commands_fail_rather_than_wait() {
    let Some(mut redis) =
        RedisServer::start_or_skip("while_redis_is_down_commands_fail_rather_than_wait")
    else {
        return;
    };
    let store = RedisRateStore::new(&redis.url()).unwrap();
    assert_eq!(store.take(take("k")).await.unwrap().granted, 1);
    redis.stop();
    for n in 1..=3 {
        let failed = tokio::time::timeout(Duration::from_secs(3), store.take(take("k")))
            .await
            .unwrap_or_else(|_| panic!("command {n} while Redis is down waited, not failed"));
        assert!(failed.is_err(), "command {n}: {failed:?}");
    }
    redis.restart().unwrap();
    takes_again(&store, "Redis").await;
}

/// Takes from `store` until it grants, within 5 s of `what` coming back; how long it took.
async fn takes_again(store: &RedisRateStore, what: &str) -> Duration {
    let back = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(2), store.take(take("k"))).await {
            Ok(Ok(taken)) => {
                assert_eq!(taken.granted, 1);
                return back.elapsed();
            }
            _ => assert!(
                back.elapsed() < Duration::from_secs(5),
                "{what} came back but the store did not"
            ),
        }
        // Nothing to await but the next try.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_redis_is_gone_each_mode_does_what_it_says_and_recovery_follows() {
    let Some(mut redis) = RedisServer::start_or_skip(
        "when_redis_is_gone_each_mode_does_what_it_says_and_recovery_follows",
    ) else {
        return;
    };
    let srv = server().await;
    let url = srv.url("/q");
    let mut table = Vec::new();
    for mode in [OnStoreError::Allow, OnStoreError::Deny, OnStoreError::Local] {
        redis.restart().unwrap();
        let seen = Arc::new(Seen::default());
        let mut g = global(1000, 1000);
        g.on_store_error = mode;
        g.expected_instances = 100; // allow's share: 10 rps, a burst of 10
        g.lease = 5; // local's credit: 5 calls
        g.store_timeout = Duration::from_millis(200);
        let c = client(
            policy(g),
            Arc::new(RedisRateStore::new(&redis.url()).unwrap()),
            seen.clone(),
        );
        // Up: through Redis.
        let (ok, _, _) = run_calls(&c, &url, 5).await;
        assert_eq!(ok, 5, "{mode:?}: Redis up");
        assert!(seen.store_errors.lock().is_empty());
        // Gone.
        redis.stop();
        let (ok, refused, slowest) = run_calls(&c, &url, 30).await;
        // Every call reports the store: asked and failed, or skipped after a failure moments
        // ago (one failure per back-off, not one timeout per call).
        let errors = seen.store_errors.lock().clone();
        assert_eq!(errors.len(), 30, "{mode:?}: {errors:?}");
        assert!(
            errors.iter().filter(|(_, op)| *op == "take").count() < 30,
            "{mode:?}"
        );
        assert!(
            slowest < Duration::from_secs(2) + Duration::from_millis(100),
            "{mode:?}: slowest {slowest:?}"
        );
        // The five calls while Redis was up took one lease (5 tokens): spent by then.
        match mode {
            // The share's burst of 10, and its refill (10 per second) while the calls ran.
            OnStoreError::Allow => assert!(
                (10..=16).contains(&ok) && ok + refused == 30,
                "{mode:?}: {ok}"
            ),
            OnStoreError::Deny => assert_eq!((ok, refused), (0, 30), "{mode:?}"),
            _ => assert_eq!((ok, refused), (5, 25), "{mode:?}"),
        }
        table.push(format!(
            "{mode:?}: down → {ok} admitted, {refused} refused, slowest {slowest:?}"
        ));
        // Back: within 2 s, calls go through Redis again.
        redis.restart().unwrap();
        let back = Instant::now();
        let recovered = loop {
            let before = seen.store_errors.lock().len();
            let r = c.send(NetRequest::get(url.as_str()).tenant("t1")).await;
            if r.is_ok() && seen.store_errors.lock().len() == before {
                break back.elapsed();
            }
            assert!(
                back.elapsed() < Duration::from_secs(5),
                "{mode:?}: no recovery"
            );
            // Redis reconnects in the background; nothing to await but the next try.
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            recovered < Duration::from_secs(2),
            "{mode:?}: recovered in {recovered:?}"
        );
        table.push(format!(
            "{mode:?}: back → through Redis again after {recovered:?}"
        ));
    }
    eprintln!("{}", table.join("\n"));
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_is_cut_at_the_store_timeout() {
    let Some(redis) = RedisServer::start_or_skip("a_slow_redis_is_cut_at_the_store_timeout") else {
        return;
    };
    let srv = server().await;
    let url = srv.url("/q");
    let seen = Arc::new(Seen::default());
    let mut g = global(1000, 1000);
    g.on_store_error = OnStoreError::Allow;
    g.store_timeout = Duration::from_millis(50);
    let metrics = Arc::new(soulbase_net_observe::Metrics::new());
    let c = Client::builder()
        .policy(policy(g))
        .dialer(Arc::new(LoopbackDialer::default()))
        .rate_store(Arc::new(RedisRateStore::new(&redis.url()).unwrap()))
        .observer(Arc::new(
            soulbase_net_observe::Fanout::new()
                .with(seen.clone())
                .with(metrics.clone()),
        ))
        .build()
        .unwrap();
    run_calls(&c, &url, 3).await;
    redis.pause().unwrap();
    let (ok, _, slowest) = run_calls(&c, &url, 5).await;
    redis.resume().unwrap();
    assert_eq!(ok, 5);
    assert!(
        slowest < Duration::from_millis(50 + 450),
        "slowest {slowest:?}"
    );
    // The first call waits out the store timeout; the next ones skip the store for a moment.
    let errors = seen.store_errors.lock().clone();
    assert_eq!(errors.len(), 5);
    assert_eq!(errors[0], (true, "take"));
    let takes = errors.iter().filter(|(_, op)| *op == "take").count();
    let skips = errors.iter().filter(|(_, op)| *op == "skip").count();
    assert_eq!(takes + skips, 5);
    let text = metrics.encode();
    for (op, n) in [("take", takes), ("skip", skips)] {
        let line = format!(r#"net_store_errors_total{{store="rate",op="{op}"}} {n}"#);
        assert!(n == 0 || text.contains(&line), "{line}\n{text}");
    }
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_section_connects_the_shared_limits() {
    let Some(redis) = RedisServer::start_or_skip("a_store_section_connects_the_shared_limits")
    else {
        return;
    };
    let srv = server().await;
    let url = srv.url("/q");
    // What a service does with its policy document's `[store]`.
    let doc = soulbase_net_policy::PolicyDocument::from_toml_str(&format!(
        "[store]\nredis = \"{}\"\n",
        redis.url()
    ))
    .unwrap();
    let store = doc.store().cloned().unwrap();
    let build = || {
        Client::builder()
            .policy(policy(global(5, 6)))
            .dialer(Arc::new(LoopbackDialer::default()))
            .store(store.clone())
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let started = Instant::now();
    let (ra, rb) = tokio::join!(burst_of(&a, &url, 10), burst_of(&b, &url, 10));
    let refill = (started.elapsed().as_secs_f64() * 5.0).ceil() as usize;
    let ok = ra.iter().chain(&rb).filter(|r| r.is_ok()).count();
    assert!(
        ok >= 6 && ok <= 6 + refill,
        "{ok} admitted: one quota for both"
    );
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_redis_is_verified() {
    let kit = soulbase_net_testkit::CertKit::new().unwrap();
    let leaf = kit.localhost().unwrap();
    let Some(redis) = RedisServer::start_tls_or_skip(
        "tls_to_redis_is_verified",
        leaf.chain_pem(),
        leaf.key_pem(),
    ) else {
        return;
    };
    let tls_url = redis.tls_url().unwrap();
    let srv = server().await;
    let url = srv.url("/q");
    // Trusting the test CA: through Redis over TLS (a burst of 2: the third call is refused).
    let seen = Arc::new(Seen::default());
    let store = RedisRateStore::with_root_pem(&tls_url, kit.root_pem().as_bytes()).unwrap();
    let mut g = global(1, 2);
    g.on_store_error = OnStoreError::Deny;
    let c = client(policy(g.clone()), Arc::new(store), seen.clone());
    let (ok, refused, _) = run_calls(&c, &url, 3).await;
    assert_eq!((ok, refused), (2, 1));
    assert!(
        seen.store_errors.lock().is_empty(),
        "{:?}",
        seen.store_errors.lock()
    );
    // Trusting only the system's roots: the handshake fails, the store is down, deny refuses.
    let seen = Arc::new(Seen::default());
    let untrusted = RedisRateStore::new(&tls_url).unwrap();
    let c = client(policy(g), Arc::new(untrusted), seen.clone());
    let (ok, _, _) = run_calls(&c, &url, 1).await;
    assert_eq!(ok, 0);
    assert_eq!(seen.store_errors.lock().len(), 1);
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_reaches_redis() {
    let Some(redis) = RedisServer::start_unix_or_skip("a_unix_socket_reaches_redis") else {
        return;
    };
    let srv = server().await;
    let url = srv.url("/q");
    let seen = Arc::new(Seen::default());
    let mut g = global(1, 2);
    g.on_store_error = OnStoreError::Deny;
    let store = RedisRateStore::new(&redis.unix_url().unwrap()).unwrap();
    let c = client(policy(g), Arc::new(store), seen.clone());
    let (ok, refused, _) = run_calls(&c, &url, 3).await;
    assert_eq!((ok, refused), (2, 1), "{:?}", seen.store_errors.lock());
    assert!(seen.store_errors.lock().is_empty());
    srv.join().await;
}
