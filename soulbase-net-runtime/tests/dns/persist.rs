//! The cache file: a warm start makes no queries.

use std::time::Duration;

use soulbase_net_core::DnsSource;
use soulbase_net_testkit::MockDns;

use crate::{a_queries, ips, policy, resolver, temp_dir};

#[tokio::test]
async fn a_restarted_resolver_starts_warm_from_the_file() {
    let dns = MockDns::start().await.unwrap();
    let dir = temp_dir("warm");
    let file = dir.join("dns-cache.json");
    dns.set_ips("one.example.test", &ips(&["192.0.2.1"]), 300);
    dns.set_ips("two.example.test", &ips(&["192.0.2.2", "2001:db8::2"]), 300);
    let mut p = policy(&dns);
    p.persist_file = Some(file.clone());

    let first = resolver(&p);
    first.resolve("one.example.test").await.unwrap();
    first.resolve("two.example.test").await.unwrap();
    first.persist().await.unwrap();
    assert!(file.exists());
    drop(first);
    let queries = dns.queries().len();

    let second = resolver(&p);
    second.loaded().await;
    assert_eq!(second.cached_names(), 2);
    let one = second.resolve("one.example.test").await.unwrap();
    assert_eq!(
        (one.source, &*one.addrs),
        (DnsSource::Cache, ips(&["192.0.2.1"]).as_slice())
    );
    let two = second.resolve("two.example.test").await.unwrap();
    assert_eq!(two.source, DnsSource::Cache);
    assert_eq!(two.addrs.len(), 2);
    assert_eq!(dns.queries().len(), queries, "0 queries on a warm start");
    // The last handle's drop writes the file before it returns, even right after the load.
    std::fs::remove_file(&file).unwrap();
    drop(second);
    assert!(file.exists(), "dropping the last handle wrote the file");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn dropping_the_resolver_writes_the_file() {
    let dns = MockDns::start().await.unwrap();
    let dir = temp_dir("drop");
    let file = dir.join("dns-cache.json");
    dns.set_ips("drop.example.test", &ips(&["192.0.2.3"]), 300);
    let mut p = policy(&dns);
    p.persist_file = Some(file.clone());
    let r = resolver(&p);
    // A resolver dropped before its file is read leaves the file alone.
    r.loaded().await;
    r.resolve("drop.example.test").await.unwrap();
    let clone = r.clone();
    drop(r);
    assert!(!file.exists(), "a clone is still alive");
    drop(clone);
    assert!(file.exists());
    let warm = resolver(&p);
    warm.loaded().await;
    assert_eq!(
        warm.resolve("drop.example.test").await.unwrap().source,
        DnsSource::Cache
    );
    assert_eq!(a_queries(&dns, "drop.example.test"), 1);
    drop(warm);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn expired_entries_load_as_stale_and_bad_files_start_cold() {
    let dns = MockDns::start().await.unwrap();
    let dir = temp_dir("stale");
    let file = dir.join("dns-cache.json");
    let name = "old.example.test";
    dns.set_ips(name, &ips(&["192.0.2.4"]), 1);
    let mut p = policy(&dns);
    p.persist_file = Some(file.clone());
    let first = resolver(&p);
    first.loaded().await;
    first.resolve(name).await.unwrap();
    drop(first);
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // Expired in the file, the server now failing: served stale.
    dns.servfail(name);
    let second = resolver(&p);
    second.loaded().await;
    assert_eq!(second.cached_names(), 1);
    let res = second.resolve(name).await.unwrap();
    assert_eq!(
        (res.source, &*res.addrs),
        (DnsSource::Stale, ips(&["192.0.2.4"]).as_slice())
    );
    drop(second);

    // Without serve_stale, an expired entry is not loaded.
    let mut strict = p.clone();
    strict.serve_stale = false;
    let strict = resolver(&strict);
    strict.loaded().await;
    assert_eq!(strict.cached_names(), 0);
    drop(strict);

    // A corrupt file: the resolver starts cold and works.
    std::fs::write(&file, b"{ not json").unwrap();
    dns.set_ips(name, &ips(&["192.0.2.5"]), 60);
    let cold = resolver(&p);
    cold.loaded().await;
    assert_eq!(cold.cached_names(), 0);
    assert_eq!(cold.resolve(name).await.unwrap().source, DnsSource::Lookup);
    drop(cold);
    std::fs::remove_dir_all(&dir).unwrap();
}
