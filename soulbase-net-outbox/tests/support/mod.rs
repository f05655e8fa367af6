//! What the outbox's test binaries share: a fresh database path, a loopback-only client, an
//! outbox running in the background, and a bounded wait.
#![allow(dead_code, reason = "each test binary uses part of it")]

use std::{path::PathBuf, sync::Arc, time::Duration};

use soulbase_net_outbox::Outbox;
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use tokio::time::Instant;

/// `outbox.db` in a fresh directory of its own for `name`.
pub(crate) fn db(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("soulbase-outbox-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("outbox.db")
}

/// A client that reaches loopback only and makes one attempt per delivery (the outbox
/// retries across time).
pub(crate) fn client() -> Arc<Client> {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    p.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    p.dns.prefetch.clear();
    p.retry.enabled = false;
    Arc::new(Client::builder().policy(p).build().unwrap())
}

/// An outbox on `store` with 16 workers, quick backoff (10–50 ms) and `poll`, delivering
/// through [`client`].
pub(crate) fn outbox(
    store: Arc<dyn soulbase_net_outbox::OutboxStore>,
    poll: Duration,
) -> Arc<Outbox> {
    Arc::new(
        Outbox::builder()
            .store(store)
            .client(client())
            .workers(16)
            .backoff(Duration::from_millis(10), Duration::from_millis(50))
            .poll(poll)
            .build()
            .unwrap(),
    )
}

/// Runs an outbox in the background until dropped.
pub(crate) struct Running(Arc<Outbox>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

/// Runs `outbox` in the background until the returned guard is dropped.
pub(crate) fn run(outbox: &Arc<Outbox>) -> Running {
    let o = outbox.clone();
    tokio::spawn(async move { o.run().await.unwrap() });
    Running(outbox.clone())
}

/// Waits (bounded, 20 s) until `f` holds; a store has no event to await across connections.
pub(crate) async fn until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !f().await {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether the SQLite file at `path` or its WAL holds `secret` anywhere in its bytes.
pub(crate) fn file_holds(path: &std::path::Path, secret: &[u8]) -> bool {
    [path.to_path_buf(), path.with_extension("db-wal")]
        .iter()
        .map(|file| std::fs::read(file).unwrap_or_default())
        .any(|bytes| bytes.windows(secret.len()).any(|w| w == secret))
}
