//! [`OutboxStore`]: where items wait, are claimed, acknowledged, rescheduled and dead-lettered.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Method};
use soulbase_net_core::NetError;

/// An item as stored.
#[derive(Clone, Debug)]
pub struct StoredItem {
    /// The store's id.
    pub id: i64,
    /// The caller's id, if any.
    pub dedup_id: Option<String>,
    /// The method.
    pub method: Method,
    /// The URL.
    pub url: String,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
    /// The tenant.
    pub tenant: Option<String>,
    /// The key sent as `Idempotency-Key` on every attempt.
    pub idempotency_key: String,
    /// When it is due.
    pub deliver_at: SystemTime,
    /// When it is given up, if ever.
    pub deadline: Option<SystemTime>,
    /// Attempts made.
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
}

/// What `enqueue` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// Stored under this id.
    New(i64),
    /// An item with the same caller id was already stored (under this id); nothing was added.
    Duplicate(i64),
}

/// An item that will not be delivered, and why.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// The item.
    pub item: StoredItem,
    /// Why: the last error's stable code, or the HTTP status, and a message.
    pub reason: String,
    /// The last status, if the upstream answered.
    pub status: Option<u16>,
    /// When it died.
    pub died_at: SystemTime,
}

/// Where items live. Every method is one short transaction; an error is a `NetError` with kind
/// `Io` saying what failed (a half-written item never exists).
#[async_trait::async_trait]
pub trait OutboxStore: Send + Sync + std::fmt::Debug {
    /// Stores `item` durably (returns after the commit).
    async fn enqueue(&self, item: StoredItem) -> Result<Enqueued, NetError>;
    /// Claims up to `limit` items due at `now` for `lease` (claimed items are not claimed again
    /// until the lease ends: a crashed worker's claims come back).
    async fn claim_due(
        &self,
        now: SystemTime,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<StoredItem>, NetError>;
    /// When the next unclaimed item is due, if any.
    async fn next_due(&self) -> Result<Option<SystemTime>, NetError>;
    /// Delivered: forget it.
    async fn ack(&self, id: i64) -> Result<(), NetError>;
    /// Failed, retried later: due at `at`, with `attempts` made and the lease released.
    async fn reschedule(&self, id: i64, at: SystemTime, attempts: u32) -> Result<(), NetError>;
    /// Given up: moved to the dead letters.
    async fn dead(
        &self,
        id: i64,
        attempts: u32,
        reason: &str,
        status: Option<u16>,
    ) -> Result<(), NetError>;
    /// The dead letters, oldest first.
    async fn dead_letters(&self) -> Result<Vec<DeadLetter>, NetError>;
    /// Puts a dead letter back in the queue, due now, with its attempts reset.
    async fn requeue(&self, id: i64) -> Result<bool, NetError>;
    /// Forgets every dead letter; returns how many.
    async fn purge_dead(&self) -> Result<u64, NetError>;
    /// Items waiting (claimed or not).
    async fn pending(&self) -> Result<u64, NetError>;
}
