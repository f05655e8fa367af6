//! The client's own cap on calls in flight, all hosts and tenants together
//! ([`ClientBuilder::max_in_flight`](super::ClientBuilder::max_in_flight)): the one limit
//! that does not depend on the request, so the tower face's `poll_ready` can reserve under
//! it (`service.rs`), and every call, through either face, holds a slot of it.

use std::sync::Arc;

use soulbase_net_core::{LimitScope, NetError};
use soulbase_net_policy::LimitsPolicy;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::{
    send::{Call, NoSlot},
    Inner,
};

/// The cap's slots, for `Some(max)`; `max` must be at least 1.
///
/// # Errors
/// `InvalidRequest` for a cap of 0 (no call could ever be made).
pub(super) fn cap(max: Option<usize>) -> Result<Option<Arc<Semaphore>>, NetError> {
    match max {
        None => Ok(None),
        Some(0) => Err(NetError::invalid_request(
            "max_in_flight is 0: no call could ever be made (leave it unset for no cap)",
        )),
        Some(n) => Ok(Some(Arc::new(Semaphore::new(
            n.min(Semaphore::MAX_PERMITS),
        )))),
    }
}

impl Inner {
    /// A slot under the in-flight cap for one call: the one `poll_ready` reserved, when
    /// there is one; else one free now, or within `limits.max_wait` when the policy allows a
    /// wait (never past the call's deadline); a wait counts in the call's `queue_in`. `None` when the client has no cap.
    pub(super) async fn in_flight_slot(
        &self,
        reserved: Option<OwnedSemaphorePermit>,
        limits: &LimitsPolicy,
        call: &Call<'_>,
    ) -> Result<Option<OwnedSemaphorePermit>, NoSlot> {
        let deadline = call.deadline;
        let Some(cap) = &self.in_flight else {
            return Ok(None);
        };
        if reserved.is_some() {
            return Ok(reserved);
        }
        if let Ok(permit) = cap.clone().try_acquire_owned() {
            return Ok(Some(permit));
        }
        let refused = NoSlot::Limited(LimitScope::ClientConcurrency);
        if limits.max_wait.is_zero() {
            return Err(refused);
        }
        let from = Instant::now();
        let until = from + limits.max_wait;
        // Boxed: waiting is rare, and its future would enlarge every call's.
        let wait = Box::pin(tokio::time::timeout_at(
            until.min(deadline),
            cap.clone().acquire_owned(),
        ));
        let waited = wait.await;
        call.segments.queued_since(from);
        match waited {
            Ok(Ok(permit)) => Ok(Some(permit)),
            Err(_) if until >= deadline => Err(NoSlot::Deadline),
            // Timed out at `max_wait`, or (never) a closed semaphore.
            _ => Err(refused),
        }
    }
}
