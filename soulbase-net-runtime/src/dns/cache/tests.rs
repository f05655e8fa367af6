use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

use super::*;

fn cfg() -> CacheCfg {
    CacheCfg {
        min_ttl: Duration::from_secs(1),
        max_ttl: Duration::from_secs(60),
        stale_for: Duration::from_secs(30),
        max_entries: 3,
    }
}

fn answer(last: u8, ttl: u64) -> Answer {
    Answer {
        addrs: vec![IpAddr::from([10, 0, 0, last])].into(),
        ttl: Duration::from_secs(ttl),
    }
}

fn wall() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

#[tokio::test(start_paused = true)]
async fn concurrent_misses_share_one_lookup() {
    let cache = Arc::new(DnsCache::<String>::new(cfg()));
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (cache, calls, gate) = (cache.clone(), calls.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            cache
                .resolve("api.example.com", Caller::Request, || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    gate.notified().await;
                    Ok(answer(1, 30))
                })
                .await
        }));
    }
    // Let every task reach the flight, then release the one lookup.
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    gate.notify_one();
    for t in tasks {
        let (addrs, _) = t.await.unwrap().unwrap();
        assert_eq!(&*addrs, &[IpAddr::from([10, 0, 0, 1])]);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(cache.inflight.lock().is_empty());
    let (_, source) = cache
        .resolve("api.example.com", Caller::Request, || async {
            Err("no".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(source, Source::Cache);
}

#[tokio::test(start_paused = true)]
async fn ttls_are_clamped_and_stale_answers_serve_failures() {
    let cache = DnsCache::<String>::new(cfg());
    // TTL 0 is raised to min_ttl (1s).
    cache
        .resolve("a", Caller::Request, || async { Ok(answer(1, 0)) })
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(900)).await;
    assert!(cache.get_fresh("a", Instant::now()).is_some());
    tokio::time::advance(Duration::from_millis(200)).await;
    assert!(cache.get_fresh("a", Instant::now()).is_none());
    assert_eq!(cache.take_refreshable(Instant::now()), ["a"]);
    assert!(
        cache.take_refreshable(Instant::now()).is_empty(),
        "picked once"
    );
    // Expired, lookup fails: served stale within stale_for.
    let (addrs, source) = cache
        .resolve("a", Caller::Request, || async {
            Err("servfail".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(
        (source, addrs[0]),
        (Source::Stale, IpAddr::from([10, 0, 0, 1]))
    );
    tokio::time::advance(Duration::from_secs(31)).await;
    let err = cache
        .resolve("a", Caller::Request, || async {
            Err("servfail".to_owned())
        })
        .await
        .unwrap_err();
    assert_eq!(err, "servfail");
    cache.purge(Instant::now());
    assert_eq!(cache.len(), 0);
    // A huge TTL is cut to max_ttl (60s).
    cache
        .resolve("b", Caller::Request, || async { Ok(answer(2, 86_400)) })
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(cache.get_fresh("b", Instant::now()).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_leader_hands_the_lookup_to_a_waiter() {
    let cache = Arc::new(DnsCache::<String>::new(cfg()));
    let leader = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .resolve(
                    "c",
                    Caller::Request,
                    std::future::pending::<Result<Answer, String>>,
                )
                .await
        })
    };
    tokio::task::yield_now().await;
    let waiter = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .resolve("c", Caller::Request, || async { Ok(answer(3, 10)) })
                .await
        })
    };
    tokio::task::yield_now().await;
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());
    let (addrs, source) = waiter.await.unwrap().unwrap();
    assert_eq!(
        (source, addrs[0]),
        (Source::Lookup, IpAddr::from([10, 0, 0, 3]))
    );
    assert!(cache.inflight.lock().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_flight_is_removed() {
    let cache = Arc::new(DnsCache::<String>::new(cfg()));
    let leader = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .resolve(
                    "d",
                    Caller::Request,
                    std::future::pending::<Result<Answer, String>>,
                )
                .await
        })
    };
    tokio::task::yield_now().await;
    assert_eq!(cache.inflight.lock().len(), 1);
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());
    assert!(cache.inflight.lock().is_empty());
    let (_, source) = cache
        .resolve("d", Caller::Request, || async { Ok(answer(4, 10)) })
        .await
        .unwrap();
    assert_eq!(source, Source::Lookup);
}

#[tokio::test(start_paused = true)]
async fn the_cache_is_bounded() {
    let cache = DnsCache::<String>::new(cfg());
    for (i, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        cache.insert(
            name,
            &answer(i as u8, 10 + i as u64),
            Instant::now(),
            wall(),
        );
    }
    assert_eq!(cache.len(), 3);
    // The entries closest to expiry went first.
    assert!(cache.get_fresh("a", Instant::now()).is_none());
    assert!(cache.get_fresh("e", Instant::now()).is_some());
}

#[tokio::test(start_paused = true)]
async fn entries_carry_a_wall_clock_expiry_and_restore_from_it() {
    let cache = DnsCache::<String>::new(cfg());
    cache.insert("a", &answer(1, 20), Instant::now(), wall());
    let saved = cache.snapshot();
    assert_eq!(saved.len(), 1);
    assert_eq!(saved[0].expires, wall() + Duration::from_secs(20));

    let now = Instant::now();
    let fresh = DnsCache::<String>::new(cfg());
    // 5s later by the wall clock: 15s left.
    assert!(fresh.restore(&saved[0], now, wall() + Duration::from_secs(5)));
    assert!(fresh
        .get_fresh("a", now + Duration::from_secs(14))
        .is_some());
    assert!(fresh
        .get_fresh("a", now + Duration::from_secs(15))
        .is_none());

    // 40s later: expired 20s ago, within stale_for (30s): kept as stale.
    let stale = DnsCache::<String>::new(cfg());
    assert!(stale.restore(&saved[0], now, wall() + Duration::from_secs(40)));
    assert!(stale.get_fresh("a", now).is_none());
    assert!(stale.get_stale("a", now).is_some());
    assert!(stale
        .get_stale("a", now + Duration::from_secs(10))
        .is_none());

    // 60s later: past the stale window: dropped.
    let gone = DnsCache::<String>::new(cfg());
    assert!(!gone.restore(&saved[0], now, wall() + Duration::from_secs(60)));
    assert_eq!(gone.len(), 0);

    // A file written with a longer cache_ttl is cut to this max_ttl (60s).
    let long = Saved {
        expires: wall() + Duration::from_secs(86_400),
        ..saved[0].clone()
    };
    let cut = DnsCache::<String>::new(cfg());
    assert!(cut.restore(&long, now, wall()));
    assert!(cut.get_fresh("a", now + Duration::from_secs(61)).is_none());
    assert_eq!(cut.snapshot()[0].expires, wall() + Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn only_names_in_use_are_refreshed() {
    let cache = DnsCache::<String>::new(cfg());
    let ok = |last| move || async move { Ok(answer(last, 10)) };
    cache
        .resolve("asked", Caller::Request, ok(1))
        .await
        .unwrap();
    cache
        .resolve("prefetched", Caller::Background, ok(2))
        .await
        .unwrap();
    cache
        .resolve("hit", Caller::Background, ok(3))
        .await
        .unwrap();
    cache.resolve("hit", Caller::Request, ok(3)).await.unwrap();
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(cache.take_refreshable(Instant::now()), ["asked", "hit"]);
    // Refreshed in the background and not asked for since: not picked again.
    cache
        .resolve("asked", Caller::Background, ok(1))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(11)).await;
    assert!(cache.take_refreshable(Instant::now()).is_empty());
}
