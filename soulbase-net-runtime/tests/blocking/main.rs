//! Blocking file I/O stays off the async workers (issue 37, item 3): with a persistence or
//! policy file on a "disk" that never answers — a named pipe nobody opens at the other end, so
//! that opening it blocks until someone does — calls and attempts still complete at once, and
//! a client or resolver is dropped in a bounded time.
//!
//! Each scenario runs on a current-thread runtime on a thread of its own: a blocking call on
//! the async path would stop that one thread, which the test sees as a scenario that does not
//! end within `BOUND`, rather than as a hung test. At the end, every pipe is opened at the
//! other end, so no thread stays blocked on it.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    future::Future,
    io::Read,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::Duration,
};

use soulbase_net_core::NetRequest;
use soulbase_net_policy::{DnsPolicy, NetPolicy};
use soulbase_net_runtime::{Client, DnsResolver};
use soulbase_net_testkit::{FaultServer, MockDns, Reply};

/// What the tests allow for work that takes milliseconds.
const BOUND: Duration = Duration::from_secs(5);
/// What the tests allow for the clean-up (a pipe's writer queued behind another test's).
const CLEANUP: Duration = Duration::from_secs(30);

#[cfg(target_os = "linux")]
const O_NONBLOCK: i32 = 0o4000;
#[cfg(not(target_os = "linux"))]
const O_NONBLOCK: i32 = 0x0004;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "soulbase-blocking-{tag}-{}-{:x}",
        std::process::id(),
        NEXT_DIR.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&d).unwrap();
    d
}

/// Tells apart the directories of the tests of this process.
static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

/// Runs the future `scenario` makes on a current-thread runtime on a thread of its own, and
/// returns a receiver of its output.
fn on_one_thread<T, F, Fut>(scenario: F) -> mpsc::Receiver<T>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
{
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let out = rt.block_on(scenario());
        // Sent before the runtime shuts down: that waits for the blocking pool, which may
        // still be reading a pipe the test unblocks only once it has the output.
        let _ = tx.send(out);
        rt.shutdown_timeout(CLEANUP);
    });
    rx
}

/// Reads everything written into the pipe at `path`, once a writer opens it: the end that
/// unblocks a writer waiting to open it.
fn drain(path: &Path) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    let path = path.to_path_buf();
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Ok(mut f) = fs::File::open(&path) {
            let _ = f.read_to_end(&mut bytes);
        }
        let _ = tx.send(bytes);
    });
    rx
}

/// Unblocks whoever waits on either end of the pipe at `path` (a writer waiting for a reader,
/// or a reader waiting for a writer or for data): both ends opened without blocking, then
/// closed.
fn unblock(path: &Path) {
    let read = fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open(path);
    let write = fs::OpenOptions::new()
        .write(true)
        .custom_flags(O_NONBLOCK)
        .open(path);
    drop((read, write));
}

fn loopback_policy() -> NetPolicy {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    // Never the system resolver: no name is looked up here.
    p.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    p.dns.timeout = Duration::from_millis(500);
    p.dns.prefetch.clear();
    p.retry.backoff.base = Duration::from_millis(5);
    p.retry.backoff.cap = Duration::from_millis(50);
    p
}

#[test]
fn attempts_do_not_wait_for_a_stalled_write_of_the_frozen_endpoints() {
    let dir = temp_dir("frozen");
    let frozen = dir.join("dns.json.frozen");
    let (fifo, dns_file) = (frozen.clone(), dir.join("dns.json"));
    let done = on_one_thread(move || async move {
        let dead = soulbase_net_testkit::refused_addr().await.unwrap();
        let good = FaultServer::http1()
            .route("/v1/x", Reply::ok("alt"))
            .start()
            .await
            .unwrap();
        let mut p = loopback_policy();
        p.endpoints.urls = vec![good.origin().to_owned()];
        p.dns.persist_file = Some(dns_file);
        p.dns.persist_interval = None;
        let client = Client::builder().policy(p).build().unwrap();
        // After the build (which reads the file): from now on, saving the frozen set blocks
        // until someone opens the pipe, which nobody does before the call has ended.
        mkfifo(&fifo);
        let call = client.send(NetRequest::get(format!("http://{dead}/v1/x")));
        let res = tokio::time::timeout(BOUND, call).await;
        let attempts = res.map(|r| r.map(|r| r.attempts).map_err(|e| e.to_string()));
        let dropping = tokio::time::Instant::now();
        drop(client);
        let dropped_in = dropping.elapsed();
        good.join().await;
        (attempts, dropped_in, dead)
    });
    let outcome = done.recv_timeout(BOUND);
    // The frozen set was being written all along: reading the pipe lets the write end.
    let written = drain(&frozen).recv_timeout(CLEANUP);
    if written.is_err() {
        unblock(&frozen);
    }
    let _ = fs::remove_dir_all(&dir);
    let (attempts, dropped_in, dead) =
        outcome.expect("the call waited for the frozen endpoints file to be written");
    assert_eq!(
        attempts.expect("the call did not end in time"),
        Ok(2),
        "the refused origin, then the alternative"
    );
    assert!(
        dropped_in < BOUND,
        "dropping the client took {dropped_in:?}"
    );
    let written = String::from_utf8(written.expect("the frozen set was never written")).unwrap();
    assert!(
        written.contains(&format!("\"origin\":\"http://{dead}\"")),
        "{written}"
    );
}

#[test]
fn dropping_a_resolver_does_not_wait_for_a_stalled_disk_and_loses_nothing() {
    let dir = temp_dir("dns");
    let file = dir.join("dns.json");
    let fifo = file.clone();
    let done = on_one_thread(move || async move {
        let dns = MockDns::start().await.unwrap();
        dns.set_ips("kept.example.test", &["192.0.2.7".parse().unwrap()], 300);
        let mut p = DnsPolicy::default();
        p.nameservers = vec![dns.addr()];
        p.timeout = Duration::from_secs(2);
        p.refresh_interval = None;
        p.persist_interval = None;
        p.prefetch.clear();
        p.persist_file = Some(fifo.clone());
        let resolver = DnsResolver::new(&p).unwrap();
        // The file is read in the background: once it has been (there is none yet), the
        // last write blocks until someone opens the pipe, which nobody does before the drop
        // has returned.
        tokio::time::timeout(BOUND, resolver.loaded())
            .await
            .expect("a missing cache file was not loaded in time");
        resolver.resolve("kept.example.test").await.unwrap();
        mkfifo(&fifo);
        let dropping = tokio::time::Instant::now();
        drop(resolver);
        dropping.elapsed()
    });
    let outcome = done.recv_timeout(BOUND);
    let written = drain(&file).recv_timeout(CLEANUP);
    if written.is_err() {
        unblock(&file);
    }
    let _ = fs::remove_dir_all(&dir);
    let dropped_in = outcome.expect("dropping the resolver waited for the disk");
    assert!(
        dropped_in < BOUND,
        "dropping the resolver took {dropped_in:?}"
    );
    // Not lost: the last write went on once the "disk" answered.
    let written = String::from_utf8(written.expect("the cache was never written")).unwrap();
    assert!(written.contains("kept.example.test"), "{written}");
    assert!(written.contains("192.0.2.7"), "{written}");
}

#[test]
fn calls_do_not_wait_for_a_watched_policy_file_on_a_stalled_disk() {
    let dir = temp_dir("watch");
    let file = dir.join("policy.toml");
    fs::write(
        &file,
        "[default]\nsecurity.grants.cidrs = [\"127.0.0.0/8\"]\ndns.nameservers = [\"127.0.0.1:9\"]\n",
    )
    .unwrap();
    let fifo = dir.join("policy.fifo");
    mkfifo(&fifo);
    // Holds the pipe open for writing once the watcher opens it for reading, and writes
    // nothing: the watcher's read then waits until `release`.
    let (opened_tx, opened_rx) = tokio::sync::oneshot::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let holder = {
        let fifo = fifo.clone();
        thread::spawn(move || {
            // Blocks until a reader opens the pipe (under either of its names).
            if let Ok(pipe) = fs::OpenOptions::new().write(true).open(&fifo) {
                let _ = opened_tx.send(());
                let _ = released.recv_timeout(CLEANUP);
                drop(pipe);
            }
        })
    };
    let (path, swap_from) = (file.clone(), fifo.clone());
    let done = on_one_thread(move || async move {
        let srv = FaultServer::http1()
            .route("/ok", Reply::ok("ok"))
            .start()
            .await
            .unwrap();
        let client = Client::builder()
            .policy_file_watched(&path, Duration::from_millis(20))
            .build()
            .unwrap();
        let first = client.send(NetRequest::get(srv.url("/ok"))).await;
        assert_eq!(first.map(|r| r.status.as_u16()).unwrap(), 200);
        // The policy file becomes the pipe (a second name for it): the watcher sees a change
        // and reads it, and the read waits for data that never comes.
        fs::remove_file(&path).unwrap();
        fs::hard_link(&swap_from, &path).unwrap();
        tokio::time::timeout(BOUND, opened_rx)
            .await
            .expect("the watcher never read the file")
            .unwrap();
        let call = client.send(NetRequest::get(srv.url("/ok")));
        let second = tokio::time::timeout(BOUND, call)
            .await
            .map(|r| r.map(|r| r.status.as_u16()).map_err(|e| e.to_string()));
        let dropping = tokio::time::Instant::now();
        drop(client);
        let dropped_in = dropping.elapsed();
        srv.join().await;
        (second, dropped_in)
    });
    let outcome = done.recv_timeout(BOUND);
    // Lets the watcher's read end (at end of file), and anyone still opening the pipe.
    let _ = release.send(());
    unblock(&fifo);
    let _ = holder.join();
    let _ = fs::remove_dir_all(&dir);
    let (second, dropped_in) = outcome.expect("the call waited for the policy file to be read");
    assert_eq!(second.expect("the call did not end in time"), Ok(200));
    assert!(
        dropped_in < BOUND,
        "dropping the client took {dropped_in:?}"
    );
}

#[test]
fn calls_do_not_wait_for_the_dns_cache_file_to_be_read() {
    let dir = temp_dir("load");
    let fifo = dir.join("dns.json");
    // A cache file on a "disk" that never answers: opening it to read blocks until someone
    // opens the pipe to write, which nobody does before the scenario has ended.
    mkfifo(&fifo);
    let file = fifo.clone();
    let done = on_one_thread(move || async move {
        let srv = FaultServer::http1()
            .route("/ok", Reply::ok("ok"))
            .start()
            .await
            .unwrap();
        let mut p = loopback_policy();
        p.dns.persist_file = Some(file);
        p.dns.persist_interval = None;
        // The resolver (which loads the file) is created when the transport is first built:
        // here, or on the call.
        let client = Client::builder().policy(p).build().unwrap();
        let call = client.send(NetRequest::get(srv.url("/ok")));
        let status = tokio::time::timeout(BOUND, call)
            .await
            .map(|r| r.map(|r| r.status.as_u16()).map_err(|e| e.to_string()));
        let dropping = tokio::time::Instant::now();
        drop(client);
        let dropped_in = dropping.elapsed();
        srv.join().await;
        (status, dropped_in)
    });
    let outcome = done.recv_timeout(BOUND);
    // Opens the pipe to write and closes it: the blocked read ends (at end of file, which is
    // not a cache file, so it is ignored) and the runtime's blocking pool can shut down.
    unblock(&fifo);
    let _ = fs::remove_dir_all(&dir);
    let (status, dropped_in) = outcome.expect("the call waited for the dns cache file to be read");
    assert_eq!(status.expect("the call did not end in time"), Ok(200));
    assert!(
        dropped_in < BOUND,
        "dropping the client took {dropped_in:?}"
    );
}

#[test]
fn a_late_cache_file_never_replaces_answers_looked_up_while_it_loaded() {
    let dir = temp_dir("merge");
    let fifo = dir.join("dns.json");
    mkfifo(&fifo);
    let (file, pipe) = (fifo.clone(), fifo.clone());
    // Far in the future: both entries are fresh when they arrive.
    let saved = r#"{"version":1,"entries":[
        {"name":"fresh.example.test","addrs":["192.0.2.1"],"expires_unix_ms":4102444800000},
        {"name":"saved.example.test","addrs":["192.0.2.2"],"expires_unix_ms":4102444800000}]}"#;
    let done = on_one_thread(move || async move {
        let dns = MockDns::start().await.unwrap();
        dns.set_ips("fresh.example.test", &["192.0.2.9".parse().unwrap()], 300);
        let mut p = DnsPolicy::default();
        p.nameservers = vec![dns.addr()];
        p.timeout = Duration::from_secs(2);
        p.refresh_interval = None;
        p.persist_interval = None;
        p.prefetch.clear();
        p.persist_file = Some(file);
        let resolver = DnsResolver::new(&p).unwrap();
        // The file is still being read (nobody has written the pipe): looked up afresh.
        let before = tokio::time::timeout(BOUND, resolver.resolve("fresh.example.test"))
            .await
            .map(|r| {
                r.map(|r| (r.source, r.addrs.to_vec()))
                    .map_err(|e| e.to_string())
            });
        // Now the file arrives.
        let (written_tx, written_rx) = tokio::sync::oneshot::channel();
        thread::spawn(move || {
            let written = fs::OpenOptions::new()
                .write(true)
                .open(&pipe)
                .and_then(|mut f| std::io::Write::write_all(&mut f, saved.as_bytes()));
            let _ = written_tx.send(written.is_ok());
        });
        let wrote = tokio::time::timeout(BOUND, written_rx).await;
        let loaded = tokio::time::timeout(BOUND, resolver.loaded()).await.is_ok();
        let fresh = resolver.resolve("fresh.example.test").await;
        let saved = resolver.resolve("saved.example.test").await;
        let queries = dns.queries().len();
        drop(resolver);
        (
            before,
            wrote.map(|w| w.unwrap_or(false)),
            loaded,
            fresh
                .map(|r| (r.source, r.addrs.to_vec()))
                .map_err(|e| e.to_string()),
            saved
                .map(|r| (r.source, r.addrs.to_vec()))
                .map_err(|e| e.to_string()),
            queries,
        )
    });
    let outcome = done.recv_timeout(BOUND);
    unblock(&fifo);
    let _ = fs::remove_dir_all(&dir);
    let (before, wrote, loaded, fresh, saved, queries) =
        outcome.expect("the resolver waited for the dns cache file to be read");
    let looked_up = (
        soulbase_net_core::DnsSource::Lookup,
        vec!["192.0.2.9".parse().unwrap()],
    );
    assert_eq!(
        before.expect("the lookup did not end in time"),
        Ok(looked_up)
    );
    assert_eq!(
        wrote,
        Ok(true),
        "the cache file was not written to the pipe"
    );
    assert!(loaded, "the cache file was never loaded");
    // The answer looked up meanwhile is kept; the file's other entry is served from the cache.
    assert_eq!(
        fresh,
        Ok((
            soulbase_net_core::DnsSource::Cache,
            vec!["192.0.2.9".parse().unwrap()]
        ))
    );
    assert_eq!(
        saved,
        Ok((
            soulbase_net_core::DnsSource::Cache,
            vec!["192.0.2.2".parse().unwrap()]
        ))
    );
    assert_eq!(
        queries, 2,
        "one lookup (A and AAAA) of the fresh name, none of the saved one"
    );
}

/// Writes `text` into the pipe at `path` once `go` says so (opening it blocks until a reader
/// opens the other end).
fn feed(path: &Path, text: String) -> (mpsc::Sender<()>, thread::JoinHandle<()>) {
    let (go, wait) = mpsc::channel::<()>();
    let path = path.to_path_buf();
    let writer = thread::spawn(move || {
        if wait.recv_timeout(CLEANUP).is_ok() {
            if let Ok(mut pipe) = fs::OpenOptions::new().write(true).open(&path) {
                let _ = std::io::Write::write_all(&mut pipe, text.as_bytes());
            }
        }
    });
    (go, writer)
}

#[test]
fn build_async_reads_the_policy_file_off_the_async_worker() {
    let dir = temp_dir("build-policy");
    let fifo = dir.join("policy.toml");
    mkfifo(&fifo);
    // A document the build refuses, so that its error shows the file was read and used.
    let (go, writer) = feed(&fifo, "[default]\nretry.max_attempts = 0\n".to_owned());
    let path = fifo.clone();
    let done = on_one_thread(move || async move {
        let building = tokio::spawn(Client::builder().policy_file(&path).build_async());
        // The file has no data until `go`: a build that read it on this runtime's one thread
        // would hold the thread, and this timer would never fire.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let pending = !building.is_finished();
        let _ = go.send(());
        let built = tokio::time::timeout(BOUND, building)
            .await
            .expect("the build did not end once the file was written")
            .unwrap();
        (pending, built.map(|_| ()).map_err(|e| e.to_string()))
    });
    let outcome = done.recv_timeout(BOUND);
    unblock(&fifo);
    let _ = writer.join();
    let _ = fs::remove_dir_all(&dir);
    let (pending, built) = outcome.expect("the runtime's thread waited for the policy file");
    assert!(pending, "the build ended before its file was written");
    let err = built.expect_err("the document in the file is invalid");
    assert!(err.contains("default.retry.max_attempts"), "{err}");
}

#[test]
fn build_async_reads_the_frozen_endpoints_off_the_async_worker() {
    let dir = temp_dir("build-frozen");
    let dns_file = dir.join("dns.json");
    let frozen = dir.join("dns.json.frozen");
    mkfifo(&frozen);
    let thaws = std::time::SystemTime::now() + Duration::from_secs(600);
    let thaws_ms = thaws
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let (go, writer) = feed(
        &frozen,
        format!(
            r#"{{"version":1,"frozen":[{{"origin":"http://frozen.test:8080","thaws_unix_ms":{thaws_ms}}}]}}"#
        ),
    );
    let mut policy = loopback_policy();
    policy.dns.persist_file = Some(dns_file);
    let done = on_one_thread(move || async move {
        let building = tokio::spawn(Client::builder().policy(policy).build_async());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let pending = !building.is_finished();
        let _ = go.send(());
        let client = tokio::time::timeout(BOUND, building)
            .await
            .expect("the build did not end once the file was written")
            .unwrap()
            .unwrap();
        let frozen: Vec<String> = client
            .frozen_endpoints()
            .into_iter()
            .map(|(origin, _)| origin)
            .collect();
        (pending, frozen)
    });
    let outcome = done.recv_timeout(BOUND);
    unblock(&frozen);
    let _ = writer.join();
    let _ = fs::remove_dir_all(&dir);
    let (pending, frozen) = outcome.expect("the runtime's thread waited for the frozen file");
    assert!(pending, "the build ended before its file was written");
    assert_eq!(frozen, vec!["http://frozen.test:8080".to_owned()]);
}
