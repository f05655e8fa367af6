//! Shared limits on the master a sentinel names (a real `redis-server` and sentinel on
//! loopback): found by name, looked up again after the master came back, and a name the
//! sentinel does not know is a clear store error.

use std::{sync::Arc, time::Duration};

use soulbase_net_policy::{OnStoreError, RedisSentinel, RedisTarget, StoreConfig};
use soulbase_net_runtime::{
    fleet::{RateStore, RedisRateStore, RedisStore, TakeRequest},
    Client,
};
use soulbase_net_testkit::RedisSentinel as Sentinel;
use tokio::time::Instant;

use super::{global, policy, run_calls, server, take, takes_again, Seen};
use soulbase_net_runtime::testing::LoopbackDialer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_store_finds_its_master_through_sentinel() {
    let Some(mut sentinel) =
        Sentinel::start_or_skip("the_rate_store_finds_its_master_through_sentinel")
    else {
        return;
    };
    let srv = server().await;
    let url = srv.url("/q");
    let target = RedisSentinel::new(Sentinel::MASTER_NAME, [sentinel.url()]);
    // Two instances share one quota on the master (a burst of 3), through the `[store]`
    // section.
    let store = StoreConfig::redis_sentinel(target.clone()).unwrap();
    let seen = Arc::new(Seen::default());
    let mut g = global(1, 3);
    g.on_store_error = OnStoreError::Deny;
    let build = || {
        Client::builder()
            .policy(policy(g.clone()))
            .dialer(Arc::new(LoopbackDialer::default()))
            .store(store.clone())
            .observer(seen.clone())
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let (ok_a, _, _) = run_calls(&a, &url, 3).await;
    let (ok_b, _, _) = run_calls(&b, &url, 3).await;
    assert_eq!(ok_a + ok_b, 3, "one quota for both");
    assert!(
        seen.store_errors.lock().is_empty(),
        "{:?}",
        seen.store_errors.lock()
    );

    // The master goes away and comes back (same address, no failover): errors meanwhile,
    // then the store looks the master up again and answers.
    let store = RedisRateStore::from_target(&RedisTarget::Sentinel(target)).unwrap();
    assert_eq!(store.take(take("k")).await.unwrap().granted, 1);
    sentinel.master_mut().stop();
    let err = tokio::time::timeout(Duration::from_secs(3), store.take(take("k")))
        .await
        .expect("a failure, not a hang")
        .unwrap_err();
    assert!(
        err.to_string().contains("sentinel master mymaster"),
        "{err}"
    );
    sentinel.master_mut().restart().unwrap();
    let back = takes_again(&store, "the master").await;
    eprintln!("through the sentinel again {back:?} after the master came back");
    srv.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_rate_store_writes_to_the_promoted_replica() {
    let Some(mut sentinel) = Sentinel::start_with_replica_or_skip(
        "after_a_failover_the_rate_store_writes_to_the_promoted_replica",
    ) else {
        return;
    };
    let target = RedisSentinel::new(Sentinel::MASTER_NAME, [sentinel.url()]);
    let store = RedisRateStore::from_target(&RedisTarget::Sentinel(target)).unwrap();
    // A bucket of 1 000 at 1 token a second, emptied on the first master.
    let bucket = |key| TakeRequest {
        key,
        rps: 1,
        burst: 1000,
        want: 1000,
        at_least: 1,
        owed: 0,
    };
    assert_eq!(store.take(bucket("f")).await.unwrap().granted, 1000);
    // The master dies; the operator's failover promotes the replica.
    sentinel.master_mut().stop();
    let failed_at = Instant::now();
    tokio::task::block_in_place(|| sentinel.failover()).unwrap();
    let promoted = failed_at.elapsed();
    // The store asks the sentinel again and writes where it now points.
    let back = Instant::now();
    let granted = loop {
        match tokio::time::timeout(Duration::from_secs(2), store.take(bucket("f"))).await {
            Ok(Ok(taken)) => break taken.granted,
            _ => assert!(
                back.elapsed() < Duration::from_secs(10),
                "the replica was promoted but the store did not follow"
            ),
        }
        // Nothing to await but the next try.
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "failover: replica promoted {promoted:?} after the master died; the store wrote to it \
         {:?} later",
        back.elapsed()
    );
    // The replica had the bucket (replicated before the failover): only what refilled since
    // (a token a second) is granted, not a fresh bucket's 1 000.
    let waited = failed_at.elapsed().as_secs() + 2;
    assert!(
        u64::from(granted) <= waited,
        "{granted} granted after {waited} s: the bucket's state was lost"
    );
    // And the replica is the master now: it takes writes, and holds the bucket.
    let replica = sentinel.replica().expect("started with a replica");
    let direct = RedisRateStore::new(&replica.url()).unwrap();
    let taken = direct.take(bucket("f")).await.unwrap();
    assert!(u64::from(taken.granted) <= waited, "{taken:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_name_the_sentinel_does_not_know_is_a_clear_store_error() {
    let Some(sentinel) =
        Sentinel::start_or_skip("a_master_name_the_sentinel_does_not_know_is_a_clear_store_error")
    else {
        return;
    };
    let target = RedisTarget::Sentinel(RedisSentinel::new("no-such-master", [sentinel.url()]));
    let store = RedisRateStore::from_target(&target).unwrap();
    let started = Instant::now();
    let err = store.take(take("k")).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("sentinel master no-such-master via redis://127.0.0.1:")
            && text.contains("MasterNameNotFoundBySentinel"),
        "{text}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Asked again at once: the same error, without a second lookup (the lookup backs off).
    let again = store.take(take("k")).await.unwrap_err();
    assert_eq!(again.to_string(), text);

    // Through a client: the store is down, `deny` refuses, the failure is reported.
    let srv = server().await;
    let seen = Arc::new(Seen::default());
    let mut g = global(10, 10);
    g.on_store_error = OnStoreError::Deny;
    let c = Client::builder()
        .policy(policy(g))
        .dialer(Arc::new(LoopbackDialer::default()))
        .store(
            StoreConfig::redis_sentinel(RedisSentinel::new("no-such-master", [sentinel.url()]))
                .unwrap(),
        )
        .observer(seen.clone())
        .build()
        .unwrap();
    let (ok, refused, _) = run_calls(&c, &srv.url("/q"), 1).await;
    assert_eq!((ok, refused), (0, 1));
    assert_eq!(seen.store_errors.lock().as_slice(), [(false, "take")]);
    srv.join().await;
}
