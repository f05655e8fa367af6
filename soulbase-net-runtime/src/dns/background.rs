//! Background work of the resolver (seed 004): prefetch at start, refresh of expired names in use,
//! and periodic persistence.
//!
//! Tasks hold only a `Weak` to the resolver between steps, so dropping the last resolver ends
//! them; the resolver also aborts them on drop. They are started only inside a Tokio runtime.

use std::sync::{Arc, Weak};
use std::time::Duration;

use soulbase_net_policy::DnsPolicy;
use tokio::runtime::Handle;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cache::{Caller, Source};
use super::order::{parse_host, Host};
use super::{persist, Inner};

/// How many background lookups run at once.
const PARALLEL_LOOKUPS: usize = 8;

/// Starts prefetch, refresh and persistence as the policy asks, if a runtime is present.
pub(super) fn start(inner: &Arc<Inner>, policy: &DnsPolicy) {
    let Ok(handle) = Handle::try_current() else {
        return;
    };
    let mut tasks = Vec::new();
    let prefetch: Vec<String> = policy
        .prefetch
        .iter()
        .filter_map(|h| match parse_host(h) {
            Ok(Host::Name(n)) if !inner.static_hosts.contains_key(&n) => Some(n),
            _ => None,
        })
        .collect();
    if !prefetch.is_empty() {
        let weak = Arc::downgrade(inner);
        tasks.push(handle.spawn(resolve_with_retries(weak, prefetch)));
    }
    if let Some(every) = policy.refresh_interval {
        tasks.push(handle.spawn(refresh_loop(Arc::downgrade(inner), every)));
    }
    if let (Some(_), Some(every)) = (&policy.persist_file, policy.persist_interval) {
        tasks.push(handle.spawn(persist_loop(Arc::downgrade(inner), every)));
    }
    inner
        .tasks
        .lock()
        .extend(tasks.iter().map(|t| t.abort_handle()));
}

/// Every `every`, drops entries past their stale window and looks up again the expired
/// ones that requests used since their last lookup.
async fn refresh_loop(weak: Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let names = {
            let Some(inner) = weak.upgrade() else { return };
            let now = Instant::now();
            inner.cache.purge(now);
            inner.cache.take_refreshable(now)
        };
        if !names.is_empty() {
            resolve_with_retries(weak.clone(), names).await;
        }
    }
}

/// Every `every`, writes the cache to the persistence file. A failed write is tried again at
/// the next tick; there is nobody to report it to.
async fn persist_loop(weak: Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let (path, entries) = {
            let Some(inner) = weak.upgrade() else { return };
            let Some(path) = inner.persist_file.clone() else {
                return;
            };
            if !inner.loaded.is_done() {
                // Not before the file is read: the write would replace its entries.
                continue;
            }
            (path, inner.cache.snapshot())
        };
        let _ = tokio::task::spawn_blocking(move || persist::save(&path, &entries)).await;
    }
}

/// Looks `names` up through the cache (sharing any lookup in flight), up to
/// `resolve_retries` attempts per name, waiting 50–100 % of `resolve_retry_delay` between
/// rounds. A stale answer counts as a failure here: the point is a fresh one.
pub(super) async fn resolve_with_retries(weak: Weak<Inner>, mut names: Vec<String>) {
    let mut attempt = 0;
    loop {
        let delay = {
            let Some(inner) = weak.upgrade() else { return };
            names = resolve_round(&inner, names).await;
            attempt += 1;
            if names.is_empty() || attempt >= inner.resolve_retries.max(1) {
                return;
            }
            jitter(inner.resolve_retry_delay)
        };
        tokio::time::sleep(delay).await;
    }
}

/// Looks `names` up, [`PARALLEL_LOOKUPS`] at a time, so one slow name does not hold up the
/// rest; returns the names that got no fresh answer.
async fn resolve_round(inner: &Arc<Inner>, names: Vec<String>) -> Vec<String> {
    let mut failed = Vec::new();
    let mut pending = names.into_iter();
    let mut set = JoinSet::new();
    loop {
        while set.len() < PARALLEL_LOOKUPS {
            let Some(name) = pending.next() else { break };
            let inner = inner.clone();
            set.spawn(async move {
                let fresh = matches!(
                    inner.lookup(&name, Caller::Background).await,
                    Ok((_, Source::Cache | Source::Lookup))
                );
                (name, fresh)
            });
        }
        match set.join_next().await {
            Some(Ok((name, false))) => failed.push(name),
            // A lookup task cannot panic or be cancelled but by the runtime shutting down:
            // its name is left to the next round or refresh.
            Some(Ok((_, true)) | Err(_)) => {}
            None => break,
        }
    }
    failed
}

/// A wait of 50–100 % of `delay`.
fn jitter(delay: Duration) -> Duration {
    delay.mul_f64(0.5 + fastrand::f64() * 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_half_and_whole() {
        let d = Duration::from_secs(1);
        for _ in 0..1000 {
            let j = jitter(d);
            assert!(j >= d / 2 && j <= d, "{j:?}");
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
