//! Reloading a policy file when it changes (`ClientBuilder::policy_file_watched`).
//!
//! Why polling: a file's modification time and length, read every few seconds, work the same
//! on every platform, inside containers and on mounted config maps (where inotify misses the
//! symlink swap Kubernetes does), for the price of one `stat` per interval. The resolver
//! validates a changed file whole: an invalid one is refused and the policy in force stays.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Weak},
    time::{Duration, SystemTime},
};

use soulbase_net_core::NetError;
use soulbase_net_policy::SnapshotResolver;

/// What is compared between two looks at the file.
type Stamp = (Option<SystemTime>, u64);

/// Reads `path` into a resolver and starts a task that reloads it when the file's
/// modification time or length changes, every `every`; the task ends with the resolver.
///
/// # Errors
/// The problems of the file, or `InvalidRequest` outside a Tokio runtime.
pub(super) fn watched(path: &Path, every: Duration) -> Result<Arc<SnapshotResolver>, NetError> {
    runtime()?;
    let (resolver, loaded) = load(path.to_path_buf(), every)?;
    start(&resolver, loaded)?;
    Ok(resolver)
}

/// The current Tokio runtime, which the watch runs on.
fn runtime() -> Result<tokio::runtime::Handle, NetError> {
    tokio::runtime::Handle::try_current().map_err(|e| {
        NetError::invalid_request("policy_file_watched needs a Tokio runtime to watch the file")
            .with_source(e)
    })
}

/// A watched policy file as first read: what [`start`] needs to watch it. Made by [`load`].
pub(super) struct Loaded {
    path: PathBuf,
    every: Duration,
    /// The file's stamp before it was read.
    before: Stamp,
}

/// Reads the watched file at `path` the first time. Blocking.
///
/// # Errors
/// As [`SnapshotResolver::from_path`]; `InvalidRequest` when `every` is zero.
pub(super) fn load(
    path: PathBuf,
    every: Duration,
) -> Result<(Arc<SnapshotResolver>, Loaded), NetError> {
    if every.is_zero() {
        return Err(NetError::invalid_request(
            "policy_file_watched needs an interval above zero",
        ));
    }
    let before = stamp(&path);
    let resolver = Arc::new(SnapshotResolver::from_path(&path)?);
    Ok((
        resolver,
        Loaded {
            path,
            every,
            before,
        },
    ))
}

/// Starts watching the file [`load`] read into `resolver`, on the current Tokio runtime.
///
/// # Errors
/// `InvalidRequest` outside a Tokio runtime.
pub(super) fn start(resolver: &Arc<SnapshotResolver>, loaded: Loaded) -> Result<(), NetError> {
    runtime()?.spawn(watch(
        Arc::downgrade(resolver),
        loaded.path,
        loaded.every,
        loaded.before,
    ));
    Ok(())
}

async fn watch(resolver: Weak<SnapshotResolver>, path: PathBuf, every: Duration, mut seen: Stamp) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is now: the file was just read
    loop {
        ticks.tick().await;
        let Some(resolver) = resolver.upgrade() else {
            return; // the client is gone
        };
        // The `stat` and the read are blocking file I/O: made on the blocking pool, so a slow
        // filesystem (a stalled network mount, a FIFO) holds up this task only, never the
        // async worker the client's calls run on. One look at a time: the next waits for it.
        let look = tokio::task::spawn_blocking({
            let path = path.clone();
            move || look(&resolver, &path, seen)
        });
        match look.await {
            Ok(now) => seen = now,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "policy file watch stopped");
                return;
            }
        }
    }
}

/// Reloads `path` into `resolver` if its stamp differs from `seen`. Blocking. Returns the
/// stamp now seen: remembered even when the file is refused, so a bad file is reported once,
/// not every interval; the next write is looked at again.
fn look(resolver: &SnapshotResolver, path: &Path, seen: Stamp) -> Stamp {
    let now = stamp(path);
    if now == seen {
        return now;
    }
    match resolver.reload_from_file(path) {
        Ok(version) => tracing::info!(path = %path.display(), version, "policy reloaded"),
        Err(e) => tracing::warn!(
            path = %path.display(),
            problems = %e,
            "policy file refused; the policy in force stays"
        ),
    }
    now
}

/// The file's modification time and length; `(None, 0)` when it cannot be read.
fn stamp(path: &Path) -> Stamp {
    match std::fs::metadata(path) {
        Ok(m) => (m.modified().ok(), m.len()),
        Err(_) => (None, 0),
    }
}
