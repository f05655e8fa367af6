//! The idempotency interceptor's side of the dedup window a fleet shares: a call's claim on a
//! key, released if the call is dropped, and the errors of a refused or conflicting call. The
//! store itself is `soulbase_net_store::dedup`.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use soulbase_net_core::{ErrorKind, NetError};
pub use soulbase_net_store::dedup::RedisDedupStore;
pub(super) use soulbase_net_store::dedup::{Claim, StoredResponse};
use soulbase_net_store::lease::Heartbeat;

/// A call's part in the shared window, kept in its extensions.
#[derive(Debug)]
pub(super) struct SharedCall {
    pub(super) tenant: String,
    pub(super) key: String,
    /// Identifies this call's claim, so it never releases another's.
    pub(super) token: String,
    /// Whether this call claimed the key (and must finish it).
    pub(super) leader: AtomicBool,
    pub(super) store: Arc<RedisDedupStore>,
    /// The call's total timeout, when the request sets one: the claim is held no longer.
    pub(super) deadline: Option<Duration>,
    /// Extends the claim while the call runs (the lease discipline); dropped when it ends.
    pub(super) heartbeat: parking_lot::Mutex<Option<Heartbeat>>,
}

impl SharedCall {
    /// Takes the lead: `finish` is now this call's to do (once), and its claim is extended
    /// while the call runs.
    pub(super) fn lead(&self) {
        self.leader.store(true, Ordering::Release);
        let heartbeat = self
            .store
            .hold(&self.tenant, &self.key, &self.token, self.deadline);
        *self.heartbeat.lock() = Some(heartbeat);
    }

    /// Gives the lead up after finishing; the claim is no longer extended.
    pub(super) fn done(&self) -> bool {
        self.heartbeat.lock().take();
        self.leader.swap(false, Ordering::AcqRel)
    }
}

impl Drop for SharedCall {
    fn drop(&mut self) {
        // A leader that never finished (cancelled): release its claim in the background,
        // so duplicates elsewhere stop waiting; the marker's own expiry is the fallback.
        if self.done() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let (store, tenant, key, token) = (
                    self.store.clone(),
                    std::mem::take(&mut self.tenant),
                    std::mem::take(&mut self.key),
                    std::mem::take(&mut self.token),
                );
                rt.spawn(async move {
                    store
                        .finish(&tenant, &key, &token, None, Duration::ZERO)
                        .await;
                });
            }
        }
    }
}

/// The error of a call refused because the dedup store is down (`refuse_when_down`).
pub(super) fn store_down(key: &str) -> NetError {
    NetError::new(ErrorKind::Interceptor).with_message(format!(
        "the dedup store is unavailable; the call with Idempotency-Key {key} is refused rather than sent without dedup"
    ))
}

/// The error of a duplicate that waited `wait` for a call in flight elsewhere.
pub(super) fn conflict(key: &str, wait: Duration) -> NetError {
    NetError::new(ErrorKind::Interceptor).with_message(format!(
        "a call with Idempotency-Key {key} is in flight on another instance and did not finish within {wait:?}; not sent again"
    ))
}
