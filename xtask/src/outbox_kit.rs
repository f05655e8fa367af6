//! What runs of the outbox share — the demo's outbox phase, the crash loop of `cargo xtask
//! chaos` and `tests/outbox_crash.rs` (which includes this file by path: an integration test
//! cannot import from a binary crate): a throwaway directory for the database, an outbox
//! filled with numbered items, the receiver's count of what it applied, and a bounded wait
//! for the outbox to drain.

use std::{collections::HashMap, path::PathBuf, sync::Arc, time::Duration};

use soulbase_net_outbox::{open_store, Outbox, OutboxItem, OutboxStore, StoreOptions};
use soulbase_net_testkit::CapturedRequest;
use tokio::time::Instant;

/// A fresh directory under the system's temp dir, removed (with the database in it) on drop.
#[derive(Debug)]
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// `<tmp>/soulbase-<name>-<pid>`, emptied first (a run killed earlier may have left one).
    pub(crate) fn new(name: &str) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("soulbase-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Self(dir))
    }

    /// The path of `file` in the directory, as the text `SqliteStore::open` and
    /// `xtask outbox-worker --db` take.
    pub(crate) fn file(&self, file: &str) -> String {
        self.0.join(file).display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Enqueues `items` POSTs to `url` — bodies `item 0`, `item 1`, … — into the outbox at `db`
/// (a SQLite path or a `postgres://` URL) and delivers none of them (worker processes do).
/// Returns the store, to watch it drain.
pub(crate) async fn fill(
    db: &str,
    url: &str,
    items: usize,
) -> Result<Arc<dyn OutboxStore>, String> {
    let store = open_store(db, StoreOptions::default())
        .await
        .map_err(|e| format!("opening the outbox: {e}"))?;
    // Never run: an outbox needs a client, and this one only enqueues.
    let client = soulbase_net_runtime::Client::builder()
        .build()
        .map_err(|e| e.to_string())?;
    let filler = Outbox::builder()
        .store(store.clone())
        .client(Arc::new(client))
        .build()
        .map_err(|e| e.to_string())?;
    for i in 0..items {
        filler
            .enqueue(OutboxItem::post(url, format!("item {i}")))
            .await
            .map_err(|e| format!("enqueueing item {i}: {e}"))?;
    }
    Ok(store)
}

/// Waits until nothing is pending in `store`, looking every 20 ms (a store that another
/// process writes has no event to await here).
///
/// # Errors
/// When `within` passes first, saying how many items were still pending; or the store fails.
pub(crate) async fn drained(store: &dyn OutboxStore, within: Duration) -> Result<(), String> {
    let until = Instant::now() + within;
    loop {
        let pending = store.pending().await.map_err(|e| e.to_string())?;
        if pending == 0 {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(format!(
                "{pending} item(s) still pending after {:.1}s",
                within.as_secs_f64()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What a receiver that deduplicates by `Idempotency-Key` applied, from the requests a
/// `FaultServer` recorded. Each item's body is distinct (see [`fill`]), so items are counted
/// by body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Applied {
    /// Requests that arrived, copies included.
    pub(crate) on_wire: usize,
    /// Effects applied: one per distinct key, plus every request without a key (which the
    /// receiver cannot recognise as a copy).
    pub(crate) effects: usize,
    /// Distinct items (bodies) among the requests.
    pub(crate) items: usize,
    /// Keys that came with two different bodies: two items under one key, one of them
    /// silently dropped by a receiver that dedups.
    pub(crate) shared_keys: usize,
}

impl Applied {
    /// Counts `requests` as the receiver applies them.
    pub(crate) fn of(requests: &[CapturedRequest]) -> Self {
        let mut by_key: HashMap<&str, (String, bool)> = HashMap::new();
        let mut bodies = std::collections::HashSet::new();
        let mut unkeyed = 0;
        for r in requests {
            bodies.insert(r.text());
            let Some(key) = r.header("idempotency-key") else {
                unkeyed += 1;
                continue;
            };
            let entry = by_key.entry(key).or_insert_with(|| (r.text(), false));
            if entry.0 != r.text() {
                entry.1 = true;
            }
        }
        Self {
            on_wire: requests.len(),
            effects: by_key.len() + unkeyed,
            items: bodies.len(),
            shared_keys: by_key.values().filter(|(_, shared)| *shared).count(),
        }
    }

    /// Copies that arrived and were recognised as such (not applied again).
    pub(crate) fn duplicates_on_wire(&self) -> usize {
        self.on_wire - self.effects
    }

    /// Effects applied more than once per item (an item under two keys, or sent twice without
    /// one): what an exactly-once receiver must never see.
    pub(crate) fn duplicated_effects(&self) -> usize {
        self.effects.saturating_sub(self.items)
    }
}
