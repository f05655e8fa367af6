//! The scenarios that are not a race: a failing upstream with the breaker and the retry
//! budget off and on, and the fleet row (a shared limit on Redis beside the full policy).
#![allow(
    clippy::print_stdout,
    reason = "a command a person runs: progress goes to stdout"
)]

use std::{sync::Arc, time::Duration};

use http::StatusCode;
use soulbase_net_core::{ErrorKind, NetRequest};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;

use super::{
    clients::{full_policy, minimal_policy, BenchClient, Kind},
    measure::{load, Run},
    scenario::Scenario,
    server::{Listener, ServerProcess},
};

/// Requests the breaker and budget scenarios send to the failing upstream, per setting.
pub(crate) const FAILING_REQUESTS: u64 = 500;

/// Attempts reaching a failing upstream, with a setting off and on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OffOn {
    pub(crate) off: u64,
    pub(crate) on: u64,
}

impl OffOn {
    /// How much fewer with the setting on: 0.99 is 99 % fewer.
    pub(crate) fn reduction(self) -> f64 {
        if self.off == 0 {
            return 0.0;
        }
        1.0 - self.on as f64 / self.off as f64
    }

    /// Attempts per request: 3.0 means every retry went out.
    pub(crate) fn amplification(attempts: u64) -> f64 {
        attempts as f64 / FAILING_REQUESTS as f64
    }
}

/// [`FAILING_REQUESTS`] GETs (no retries) to `/fail`, which always answers 503, breaker off
/// and on (5 consecutive failures open it for a minute).
pub(crate) async fn breaker(server: &mut ServerProcess) -> Result<OffOn, String> {
    let mut hits = [0u64; 2];
    for (i, on) in [false, true].into_iter().enumerate() {
        let mut p = minimal_policy(1);
        p.cbreaker.enabled = on;
        p.cbreaker.consecutive_failures = 5;
        p.cbreaker.cooldown = Duration::from_secs(60);
        hits[i] = hits_on_failing(server, p, on).await?;
    }
    Ok(OffOn {
        off: hits[0],
        on: hits[1],
    })
}

/// [`FAILING_REQUESTS`] GETs to `/fail` with 3 attempts each and a 1 ms backoff, without and
/// with the retry budget (its defaults: 20 % of requests plus 10 retries a second over 10 s),
/// breaker off.
pub(crate) async fn budget(server: &mut ServerProcess) -> Result<OffOn, String> {
    let mut hits = [0u64; 2];
    for (i, on) in [false, true].into_iter().enumerate() {
        let mut p = minimal_policy(1);
        p.retry.enabled = true;
        p.retry.max_attempts = 3;
        p.retry.backoff.base = Duration::from_millis(1);
        p.retry.backoff.cap = Duration::from_millis(1);
        p.retry.budget.enabled = on;
        hits[i] = hits_on_failing(server, p, false).await?;
    }
    Ok(OffOn {
        off: hits[0],
        on: hits[1],
    })
}

/// Sends [`FAILING_REQUESTS`] GETs to `/fail` through a client of `policy`; returns how many
/// reached the server. Every call must end in the 503, or in `CircuitOpen` when `breaker`.
async fn hits_on_failing(
    server: &mut ServerProcess,
    policy: NetPolicy,
    breaker: bool,
) -> Result<u64, String> {
    let client = Client::builder()
        .policy(policy)
        .build()
        .map_err(|e| format!("bench: soulbase-net client: {e}"))?;
    let url = format!("http://127.0.0.1:{}/fail", server.port(Listener::H1));
    let before = server.stats().await?.fail_hits;
    for _ in 0..FAILING_REQUESTS {
        match client.send(NetRequest::get(url.as_str())).await {
            Ok(res) if res.status == StatusCode::SERVICE_UNAVAILABLE => {}
            Err(e) if breaker && e.kind() == ErrorKind::CircuitOpen => {}
            Ok(res) => return Err(format!("bench: /fail answered {}", res.status)),
            Err(e) => return Err(format!("bench: failing-upstream scenario: {e}")),
        }
    }
    Ok(server.stats().await?.fail_hits - before)
}

/// The lease of the fleet scenario's shared limit: one Redis call per this many requests.
pub(crate) const FLEET_LEASE: u32 = 50;

/// The full policy with a shared limit on Redis beside the full policy alone.
#[derive(Clone, Debug)]
pub(crate) struct Fleet {
    pub(crate) local: Vec<Run>,
    pub(crate) shared: Vec<Run>,
    /// Redis round trips per successful request of the shared runs.
    pub(crate) redis_calls_per_request: f64,
}

/// The full policy with `limits.global` on a throwaway Redis (a rate far above the offered
/// load, leases of [`FLEET_LEASE`]) against the full policy alone, over HTTP/1.1 with the
/// first scenario's callers, taking turns for up to 5 rounds; `None` (with a line) when
/// `redis-server` is not installed.
pub(crate) async fn fleet(
    server: &mut ServerProcess,
    scenario: &Scenario,
    rounds: usize,
    secs: f64,
) -> Result<Option<Fleet>, String> {
    let redis = match soulbase_net_testkit::RedisServer::try_start() {
        Ok(Some(redis)) => redis,
        Ok(None) => {
            println!("  fleet: skipped, redis-server is not installed");
            return Ok(None);
        }
        Err(e) => return Err(format!("bench: redis-server did not start: {e}")),
    };
    println!("  fleet: full policy + a shared limit on Redis (lease {FLEET_LEASE}) vs full policy");
    let (mut local, mut shared) = (Vec::new(), Vec::new());
    let (mut calls, mut requests) = (0u64, 0u64);
    let callers = scenario.callers;
    for _ in 0..rounds.min(5) {
        let before = server.stats().await?;
        let client = BenchClient::build(Kind::SoulbaseFull, scenario, scenario.targets(server)?);
        let run = load(client.await?, callers, secs, (server, Listener::H1, before)).await?;
        local.push(run);
        let store = Arc::new(soulbase_net_runtime::fleet::Counted::new(
            <soulbase_net_runtime::fleet::RedisRateStore as soulbase_net_runtime::fleet::RedisStore>::new(&redis.url())
                .map_err(|e| e.to_string())?,
        ));
        let mut policy = full_policy(callers);
        let mut global = soulbase_net_policy::GlobalLimit::default();
        global.rps = 10_000_000;
        global.burst = 10_000_000;
        global.lease = FLEET_LEASE;
        global.store_timeout = Duration::from_millis(100);
        policy.limits.global = Some(global);
        let client = Client::builder()
            .policy(policy)
            .pool_max_idle_per_host(callers)
            .interceptor(soulbase_net_interceptors::TraceUa::new())
            .observer(Arc::new(soulbase_net_observe::Metrics::new()))
            .rate_store(store.clone())
            .build()
            .map_err(|e| format!("bench: soulbase-net client: {e}"))?;
        let client = BenchClient::soulbase(client, scenario.targets(server)?);
        let before = server.stats().await?;
        let run = load(client, callers, secs, (server, Listener::H1, before)).await?;
        calls += store.calls();
        requests += run.ok;
        shared.push(run);
    }
    drop(redis);
    Ok(Some(Fleet {
        local,
        shared,
        redis_calls_per_request: if requests == 0 {
            0.0
        } else {
            calls as f64 / requests as f64
        },
    }))
}
