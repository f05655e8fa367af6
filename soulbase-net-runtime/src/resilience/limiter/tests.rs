use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use soulbase_net_core::{ErrorKind, LimitScope, Outcome, Phase};
use soulbase_net_policy::{AimdScope, LimitsPolicy};
use tokio::time::Instant;

use super::*;

const MS: Duration = Duration::from_millis(1);

fn policy(per_host: u32) -> LimitsPolicy {
    let mut p = LimitsPolicy::default();
    p.per_host_concurrency = per_host;
    p
}

#[tokio::test(start_paused = true)]
async fn permits_never_exceed_the_cap_under_1000_tasks() {
    let limiter = Arc::new(Limiter::new(100));
    let mut p = policy(8);
    p.max_wait = Duration::from_secs(60);
    let p = Arc::new(p);
    let current = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..1_000)
        .map(|_| {
            let (limiter, p, current, peak) =
                (limiter.clone(), p.clone(), current.clone(), peak.clone());
            tokio::spawn(async move {
                let _permit = limiter.acquire("h", None, &p).await.unwrap();
                let now = current.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(MS).await;
                current.fetch_sub(1, Ordering::SeqCst);
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(peak.load(Ordering::SeqCst), 8);
    let g = limiter.gauges("h").unwrap();
    assert_eq!((g.in_flight, g.queued), (0, 0));
}

#[tokio::test]
async fn over_the_host_cap_fails_at_once() {
    let limiter = Limiter::new(100);
    let p = policy(2);
    let a = limiter.acquire("h", None, &p).await.unwrap();
    let _b = limiter.acquire("h", None, &p).await.unwrap();
    let err = limiter.acquire("h", None, &p).await.unwrap_err();
    assert_eq!(err, LimitScope::HostConcurrency);
    assert!(limiter.acquire("other", None, &p).await.is_ok());
    assert_eq!(limiter.gauges("h").unwrap().in_flight, 2);
    drop(a);
    assert!(limiter.acquire("h", None, &p).await.is_ok());
}

#[tokio::test]
async fn tenant_cap_spans_hosts() {
    let limiter = Limiter::new(100);
    let mut p = policy(10);
    p.per_tenant_concurrency = 2;
    let _a = limiter.acquire("h1", Some("t"), &p).await.unwrap();
    let _b = limiter.acquire("h2", Some("t"), &p).await.unwrap();
    let err = limiter.acquire("h3", Some("t"), &p).await.unwrap_err();
    assert_eq!(err, LimitScope::TenantConcurrency);
    // The refused call gave back its host slot.
    assert_eq!(limiter.gauges("h3").unwrap().in_flight, 0);
    let _c = limiter.acquire("h3", Some("u"), &p).await.unwrap();
    assert_eq!(limiter.gauges("h3").unwrap().in_flight, 1);
}

#[tokio::test(start_paused = true)]
async fn bounded_wait_queues_then_gives_up() {
    let limiter = Arc::new(Limiter::new(100));
    let mut p = policy(1);
    p.max_wait = 100 * MS;
    let held = limiter.acquire("h", None, &p).await.unwrap();
    let start = Instant::now();
    let waiter = {
        let (limiter, p) = (limiter.clone(), p.clone());
        tokio::spawn(async move { limiter.acquire("h", None, &p).await.map(drop) })
    };
    tokio::time::sleep(10 * MS).await;
    assert_eq!(limiter.gauges("h").unwrap().queued, 1);
    assert_eq!(waiter.await.unwrap(), Err(LimitScope::HostConcurrency));
    assert_eq!(start.elapsed(), 100 * MS);
    assert_eq!(limiter.gauges("h").unwrap().queued, 0);
    // A slot freed within the wait is taken.
    let waiter = {
        let (limiter, p) = (limiter.clone(), p.clone());
        tokio::spawn(async move { limiter.acquire("h", None, &p).await.map(drop) })
    };
    tokio::time::sleep(50 * MS).await;
    drop(held);
    assert_eq!(waiter.await.unwrap(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn permits_return_on_cancellation() {
    let limiter = Arc::new(Limiter::new(100));
    let mut p = policy(1);
    p.max_wait = Duration::from_secs(3600);
    let holder = {
        let (limiter, p) = (limiter.clone(), p.clone());
        tokio::spawn(async move {
            let _permit = limiter.acquire("h", None, &p).await.unwrap();
            std::future::pending::<()>().await;
        })
    };
    let waiter = {
        let (limiter, p) = (limiter.clone(), p.clone());
        tokio::spawn(async move { limiter.acquire("h", None, &p).await.map(drop) })
    };
    tokio::time::sleep(MS).await;
    let g = limiter.gauges("h").unwrap();
    assert_eq!((g.in_flight, g.queued), (1, 1));
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    holder.abort();
    assert!(holder.await.unwrap_err().is_cancelled());
    let g = limiter.gauges("h").unwrap();
    assert_eq!((g.in_flight, g.queued), (0, 0));
    assert!(limiter.acquire("h", None, &p).await.is_ok());
}

#[tokio::test]
async fn permits_return_on_panic() {
    let limiter = Arc::new(Limiter::new(100));
    let mut p = policy(1);
    p.per_tenant_concurrency = 1;
    p.aimd.enabled = true;
    p.aimd.initial = 1;
    let task = {
        let (limiter, p) = (limiter.clone(), p.clone());
        tokio::spawn(async move {
            let _permit = limiter.acquire("h", Some("t"), &p).await.unwrap();
            panic!("the request handler panicked");
        })
    };
    assert!(task.await.unwrap_err().is_panic());
    assert_eq!(limiter.gauges("h").unwrap().in_flight, 0);
    assert!(limiter.acquire("h", Some("t"), &p).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn host_rate_with_burst_and_bounded_wait() {
    let limiter = Limiter::new(100);
    let mut p = policy(100);
    p.per_host_rate_rps = Some(10);
    p.rate_burst = Some(2);
    assert!(limiter.acquire("h", None, &p).await.is_ok());
    assert!(limiter.acquire("h", None, &p).await.is_ok());
    assert_eq!(
        limiter.acquire("h", None, &p).await.unwrap_err(),
        LimitScope::HostRate
    );
    p.max_wait = 150 * MS;
    let start = Instant::now();
    assert!(limiter.acquire("h", None, &p).await.is_ok());
    assert_eq!(start.elapsed(), 100 * MS, "waited for the next slot");
    // The next slot is 100ms later still: too far for a 50ms wait.
    p.max_wait = 50 * MS;
    assert_eq!(
        limiter.acquire("h", None, &p).await.unwrap_err(),
        LimitScope::HostRate
    );
}

/// Calls `limiter` admits to `h` under `p`, trying every millisecond for `ms` ms (the clock
/// paused and advanced by the test).
async fn admitted_over(limiter: &Limiter, p: &LimitsPolicy, ms: u32) -> usize {
    let mut n = 0;
    for _ in 0..ms {
        if let Some(Ok(_)) = limiter.acquire_now("h", None, p, Instant::now()) {
            n += 1;
        }
        tokio::time::advance(MS).await;
    }
    n
}

#[tokio::test(start_paused = true)]
async fn a_scaled_host_rate_keeps_the_bucket_state() {
    // 100 a second, bursts of one second's worth; run at its rate until the bucket is empty.
    let mut p = policy(1_000);
    p.per_host_rate_rps = Some(100);
    let run_in = || async {
        let limiter = Limiter::new(100);
        assert_eq!(admitted_over(&limiter, &p, 2_000).await, 100 + 199);
        limiter
    };
    // Unchanged, the next second admits the rate.
    let same = run_in().await;
    assert_eq!(admitted_over(&same, &p, 1_000).await, 100);
    // Scaled to a quarter (as the SLO controller does: the burst follows the rate), it admits
    // a quarter: a rebuilt bucket would have let 25 through at once on top.
    let scaled = run_in().await;
    let mut quarter = p.clone();
    quarter.per_host_rate_rps = Some(25);
    let n = admitted_over(&scaled, &quarter, 1_000).await;
    assert!((24..=26).contains(&n), "{n} in the second after the change");
    // Back to the full rate: the bucket is still empty, and fills at the new rate.
    assert_eq!(admitted_over(&scaled, &p, 1_000).await, 100);
}

#[tokio::test]
async fn aimd_window_refuses_then_halves_and_grows_back() {
    let limiter = Limiter::new(100);
    let mut p = policy(100);
    p.aimd.enabled = true;
    p.aimd.initial = 4;
    let permits: Vec<_> = futures_take(&limiter, &p, 4).await;
    assert_eq!(
        limiter.acquire("h", None, &p).await.unwrap_err(),
        LimitScope::Adaptive
    );
    permits[0].record(Outcome::Error(ErrorKind::Timeout(Phase::Ttfb)));
    assert_eq!(limiter.gauges("h").unwrap().window, Some(2));
    drop(permits);
    let permits: Vec<_> = futures_take(&limiter, &p, 2).await;
    assert!(limiter.acquire("h", None, &p).await.is_err());
    for _ in 0..2 {
        permits[0].record(Outcome::Response(http::StatusCode::OK));
    }
    assert_eq!(limiter.gauges("h").unwrap().window, Some(4));
}

#[tokio::test]
async fn global_aimd_is_shared_by_hosts() {
    let limiter = Limiter::new(100);
    let mut p = policy(100);
    p.aimd.enabled = true;
    p.aimd.scope = AimdScope::Global;
    p.aimd.initial = 2;
    let _a = limiter.acquire("h1", None, &p).await.unwrap();
    let _b = limiter.acquire("h2", None, &p).await.unwrap();
    assert_eq!(
        limiter.acquire("h3", None, &p).await.unwrap_err(),
        LimitScope::Adaptive
    );
    assert_eq!(limiter.global_window(), Some(2));
    assert_eq!(limiter.gauges("h1").unwrap().window, None);
}

#[tokio::test]
async fn host_map_is_bounded() {
    let limiter = Limiter::new(1_000);
    let p = policy(4);
    for i in 0..100_000u32 {
        let permit = limiter
            .acquire(&format!("h{i}"), Some(&format!("t{i}")), &p)
            .await;
        drop(permit.unwrap());
        assert!(limiter.hosts_len() <= 1_000);
    }
    assert!(limiter.tenants.lock().map.len() <= 1_000);
}

async fn futures_take(limiter: &Limiter, p: &LimitsPolicy, n: usize) -> Vec<LimitPermit> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(limiter.acquire("h", None, p).await.unwrap());
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_never_exceed_the_cap_across_threads() {
    let limiter = Arc::new(Limiter::new(100));
    let mut p = policy(4);
    p.per_tenant_concurrency = 3;
    p.max_wait = Duration::from_secs(60);
    let p = Arc::new(p);
    let current = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..1_000)
        .map(|_| {
            let (limiter, p, current, peak) =
                (limiter.clone(), p.clone(), current.clone(), peak.clone());
            tokio::spawn(async move {
                let _permit = limiter.acquire("h", Some("t"), &p).await.unwrap();
                let now = current.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                current.fetch_sub(1, Ordering::SeqCst);
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        peak.load(Ordering::SeqCst) <= 3,
        "the tenant cap of 3 holds"
    );
    assert_eq!(limiter.gauges("h").unwrap().in_flight, 0);
}

#[test]
fn acquire_now_answers_without_waiting_or_defers_to_acquire() {
    let limiter = Limiter::new(100);
    // No waiting allowed: a permit while there is room, then the scope that refused.
    let mut p = policy(1);
    p.per_tenant_concurrency = 1;
    let held = limiter
        .acquire_now("h", Some("t"), &p, Instant::now())
        .unwrap()
        .unwrap();
    assert_eq!(
        limiter
            .acquire_now("h", None, &p, Instant::now())
            .unwrap()
            .unwrap_err(),
        LimitScope::HostConcurrency
    );
    assert_eq!(
        limiter
            .acquire_now("h2", Some("t"), &p, Instant::now())
            .unwrap()
            .unwrap_err(),
        LimitScope::TenantConcurrency
    );
    // A refused call gave back what it had taken: `h2` has all its room.
    assert_eq!(limiter.gauges("h2").unwrap().in_flight, 0);
    // Waiting allowed: a call that would wait is left to `acquire`.
    p.max_wait = Duration::from_millis(10);
    assert!(limiter.acquire_now("h", None, &p, Instant::now()).is_none());
    drop(held);
    assert!(limiter
        .acquire_now("h", Some("t"), &p, Instant::now())
        .unwrap()
        .is_ok());
    // A rate with waiting allowed always goes through `acquire`; without, it answers.
    p.per_host_concurrency = 4;
    p.per_host_rate_rps = Some(1);
    p.rate_burst = Some(1);
    assert!(limiter.acquire_now("r", None, &p, Instant::now()).is_none());
    p.max_wait = Duration::ZERO;
    let first = limiter.acquire_now("r", None, &p, Instant::now()).unwrap();
    assert!(first.is_ok());
    assert_eq!(
        limiter
            .acquire_now("r", None, &p, Instant::now())
            .unwrap()
            .unwrap_err(),
        LimitScope::HostRate
    );
}
