//! `cargo xtask fleet-client`: one instance of a fleet sharing a quota on Redis — the process
//! that the multi-process quota test (`xtask/tests/fleet.rs`) and the demo start several of.
//!
//! It sends calls to `--url` as fast as eight callers can for `--secs` seconds under a
//! `limits.global` of `--rps` per second (burst `--burst`, lease `--lease`, store timeout
//! `--store-timeout` ms, `--on-store-error` mode, `--instances` for the share) for tenant
//! `fleet`, kept in the Redis at `--redis`, and prints one line:
//! `admitted=<n> refused=<n> errors=<n> store_calls=<n> store_errors=<n>`.
//!
//! With `--post-key K` it sends one idempotent POST with `Idempotency-Key: K` instead, through
//! the dedup window shared in the same Redis, and prints `status=<n> body=<text>`.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use soulbase_net_core::{ErrorKind, NetEvent, NetRequest, Observer};
use soulbase_net_policy::{GlobalLimit, NetPolicy, OnStoreError};
use soulbase_net_runtime::{
    fleet::{Counted, RedisRateStore, RedisStore},
    Client,
};

use soulbase_net_runtime::testing::LoopbackDialer;
use tokio::time::Instant;

/// What one fleet instance is to do.
#[derive(Debug)]
struct Options {
    redis: String,
    url: String,
    rps: u32,
    burst: u32,
    lease: u32,
    secs: f64,
    store_timeout: Duration,
    on_store_error: OnStoreError,
    instances: u32,
    post_key: Option<String>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        redis: String::new(),
        url: String::new(),
        rps: 200,
        burst: 10,
        lease: 1,
        secs: 10.0,
        store_timeout: Duration::from_millis(50),
        on_store_error: OnStoreError::Local,
        instances: 1,
        post_key: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--redis" => o.redis = value()?,
            "--url" => o.url = value()?,
            "--rps" => o.rps = value()?.parse().map_err(|e| format!("--rps: {e}"))?,
            "--burst" => o.burst = value()?.parse().map_err(|e| format!("--burst: {e}"))?,
            "--lease" => o.lease = value()?.parse().map_err(|e| format!("--lease: {e}"))?,
            "--secs" => o.secs = value()?.parse().map_err(|e| format!("--secs: {e}"))?,
            "--store-timeout" => {
                let ms = value()?
                    .parse()
                    .map_err(|e| format!("--store-timeout: {e}"))?;
                o.store_timeout = Duration::from_millis(ms);
            }
            "--on-store-error" => {
                o.on_store_error = match value()?.as_str() {
                    "allow" => OnStoreError::Allow,
                    "deny" => OnStoreError::Deny,
                    "local" => OnStoreError::Local,
                    other => return Err(format!("--on-store-error: unknown mode `{other}`")),
                }
            }
            "--instances" => {
                o.instances = value()?.parse().map_err(|e| format!("--instances: {e}"))?;
            }
            "--post-key" => o.post_key = Some(value()?),
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    if o.redis.is_empty() || o.url.is_empty() {
        return Err("fleet-client needs --redis URL and --url TARGET".to_owned());
    }
    Ok(o)
}

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let line = match o.post_key.clone() {
        Some(key) => rt.block_on(post_once(o, key))?,
        None => rt.block_on(instance(o))?,
    };
    #[allow(
        clippy::print_stdout,
        reason = "the report is the command's output, read by the process that started it"
    )]
    {
        println!("{line}");
    }
    Ok(())
}

async fn instance(o: Options) -> Result<String, String> {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().map_err(|e| format!("{e}"))?];
    p.dns.nameservers = vec!["127.0.0.1:9".parse().map_err(|e| format!("{e}"))?];
    p.dns.prefetch.clear();
    p.retry.enabled = false;
    let mut g = GlobalLimit::default();
    g.rps = o.rps;
    g.burst = o.burst;
    g.lease = o.lease;
    g.store_timeout = o.store_timeout;
    g.on_store_error = o.on_store_error;
    g.expected_instances = o.instances;
    p.limits.global = Some(g);
    let store = Arc::new(Counted::new(
        RedisRateStore::new(&o.redis).map_err(|e| e.to_string())?,
    ));
    let store_errors = Arc::new(StoreErrors::default());
    let client = Client::builder()
        .policy(p)
        .dialer(Arc::new(LoopbackDialer::default()))
        .rate_store(store.clone())
        .observer(store_errors.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let until = Instant::now() + Duration::from_secs_f64(o.secs);
    let (admitted, refused, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (client, url) = (client.clone(), o.url.clone());
        let (admitted, refused, errors) = (admitted.clone(), refused.clone(), errors.clone());
        callers.spawn(async move {
            while Instant::now() < until {
                match client
                    .send(NetRequest::get(url.as_str()).tenant("fleet"))
                    .await
                {
                    Ok(res) => {
                        let _ = res.bytes().await;
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) if e.kind() == ErrorKind::RateLimited => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        // Back off as the refusal says (bounded), as a caller would.
                        let wait = e
                            .retry_after()
                            .unwrap_or(Duration::from_millis(1))
                            .clamp(Duration::from_millis(1), Duration::from_millis(20));
                        tokio::time::sleep(wait).await;
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    while callers.join_next().await.is_some() {}
    Ok(format!(
        "admitted={} refused={} errors={} store_calls={} store_errors={}",
        admitted.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        store.calls(),
        store_errors.0.load(Ordering::Relaxed)
    ))
}

/// Counts the rate store's failures and timeouts (`StoreError` events of the rate store).
#[derive(Debug, Default)]
struct StoreErrors(AtomicU64);

impl Observer for StoreErrors {
    fn on_event(&self, ev: &NetEvent<'_>) {
        if let NetEvent::StoreError { store: "rate", .. } = ev {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One idempotent POST under the dedup window shared in Redis; its answer as one line.
async fn post_once(o: Options, key: String) -> Result<String, String> {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().map_err(|e| format!("{e}"))?];
    p.dns.nameservers = vec!["127.0.0.1:9".parse().map_err(|e| format!("{e}"))?];
    p.dns.prefetch.clear();
    let store = soulbase_net_interceptors::RedisDedupStore::new(&o.redis)
        .map_err(|e| e.to_string())?
        .timeout(Duration::from_millis(500));
    let keys = soulbase_net_interceptors::IdempotencyKey::random()
        .dedup_window(Duration::from_secs(60))
        .shared_dedup(store);
    let client = Client::builder()
        .policy(p)
        .dialer(Arc::new(LoopbackDialer::default()))
        .interceptor(keys)
        .build()
        .map_err(|e| e.to_string())?;
    let req = NetRequest::post(o.url.as_str())
        .body("amount=10")
        .idempotent(true)
        .header("idempotency-key", key.as_str());
    let res = client.send(req).await.map_err(|e| e.to_string())?;
    let status = res.status.as_u16();
    let body = res.text().await.map_err(|e| e.to_string())?;
    Ok(format!("status={status} body={body}"))
}
