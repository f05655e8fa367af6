//! Loading the persisted cache off the async path: the file is read on a blocking thread
//! (Tokio's blocking pool) and its entries merged into the cache when they arrive, so a slow
//! or stalled filesystem never holds up the async worker that builds a resolver — which may
//! be a request's, when a transport is first built on a call.
//!
//! Why the merge never overwrites: the cache starts empty, so an answer already in it when
//! the file arrives was looked up while the file loaded, and is fresher than the file's.

use std::sync::Arc;
use std::time::SystemTime;

use soulbase_net_core::NetError;
use tokio::sync::watch;
use tokio::time::Instant;

use super::cache::Saved;
use super::order::{parse_host, Host};
use super::{persist, Inner};

/// Whether the persisted cache has been loaded (or there was nothing to load). Cloned by the
/// loading thread, so that it can mark the load done after letting go of the resolver.
#[derive(Debug, Clone)]
pub(super) struct LoadState(Arc<watch::Sender<bool>>);

// === impl LoadState ===

impl LoadState {
    /// A load not yet done.
    pub(super) fn pending() -> Self {
        LoadState(Arc::new(watch::Sender::new(false)))
    }

    /// Whether the load is done (succeeded or failed).
    pub(super) fn is_done(&self) -> bool {
        *self.0.borrow()
    }

    fn finish(&self) {
        self.0.send_replace(true);
    }

    /// Waits until the load is done.
    pub(super) async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives as long as `self`, so this only ends when the load does.
        let _ = rx.wait_for(|done| *done).await;
    }
}

/// Starts loading the persistence file into `inner`'s cache: on the blocking pool inside a
/// Tokio runtime, else here and now (a thread without a runtime is not an async worker).
pub(super) fn start(inner: &Arc<Inner>) {
    let Some(path) = inner.persist_file.clone() else {
        inner.loaded.finish();
        return;
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            let weak = Arc::downgrade(inner);
            // Not aborted with the resolver's tasks: a blocking read cannot be interrupted,
            // and once the resolver is gone its result is simply dropped.
            drop(handle.spawn_blocking(move || {
                let saved = persist::load(&path);
                let Some(inner) = weak.upgrade() else { return };
                restore(&inner, saved);
                let state = inner.loaded.clone();
                // Let go of the resolver before saying the load is done: a caller that
                // awaited `loaded()` and then dropped the last handle must see the resolver
                // dropped (and its file written) on its own thread, not later on this one.
                drop(inner);
                state.finish();
            }));
        }
        Err(_) => {
            restore(inner, persist::load(&path));
            inner.loaded.finish();
        }
    }
}

/// Merges what was read into the cache. An unreadable file is ignored: it is only a cache,
/// and the next write replaces it.
fn restore(inner: &Inner, saved: Result<Vec<Saved>, NetError>) {
    match saved {
        Ok(saved) => {
            let (now, wall) = (Instant::now(), SystemTime::now());
            for mut entry in saved {
                if let Ok(Host::Name(name)) = parse_host(&entry.name) {
                    entry.name = name;
                    inner.cache.restore(&entry, now, wall);
                }
            }
        }
        Err(e) => tracing::debug!(error = %e, "the dns cache file was not loaded"),
    }
}
