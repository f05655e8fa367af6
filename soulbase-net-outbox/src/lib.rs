//! Durable delivery for soulbase-net: calls that must happen — a payment, an order, a webhook
//! — are persisted first and delivered by workers through any [`NetClient`], now or at a set
//! time, retried with backoff, acknowledged, or moved to a dead-letter table (persist first,
//! then schedule: the transactional-outbox pattern of River, Oban and Que).
//!
//! - [`OutboxItem`]: the request (method, URL, headers, body bytes, tenant) with `deliver_at`,
//!   a deadline, `max_attempts`, an `Idempotency-Key` drawn from the OS CSPRNG at enqueue and
//!   sent on every attempt, an optional caller-chosen id (enqueueing it twice stores one), and
//!   an optional ordering key ([`OutboxItem::ordering_key`]): the items of one key are
//!   delivered one at a time in enqueue order — a retried item holds its key, a dead-lettered
//!   one is skipped — while other keys go in parallel.
//! - [`OutboxStore`]: where items live; [`SqliteStore`] is the embedded default (a file, WAL
//!   mode, one writer); `PostgresStore` (cargo feature `postgres`) serves a fleet: several
//!   instances deliver from one table without double claims (`FOR UPDATE SKIP LOCKED` under a
//!   lease), are woken by `LISTEN`/`NOTIFY`, and a service can enqueue inside its own
//!   transaction (`enqueue_in`), so the call is recorded if and only if its change commits.
//!   [`open_store`] opens either from a URL; [`StoreOptions`] names the table, the retention
//!   of acknowledged items and the operation timeout; schemas are versioned and migrated.
//! - [`Outbox`]: `enqueue` returns once the item is durable; `run` delivers until
//!   [`Outbox::shutdown`], which lets deliveries in flight finish within a grace period and
//!   leaves the rest durable. It claims due items in batches, delivers with a window that
//!   adapts to the upstream (AIMD up to [`OutboxBuilder::workers`], 64 by default) and commits
//!   acknowledgements in batches (one commit for whatever was delivered meanwhile); every
//!   acknowledgement, reschedule and dead letter is fenced by the item's claim, so a holder
//!   whose lease ran out changes nothing.
//! - Secrets at rest: credential headers (`Authorization`, `Cookie`, API-key headers, any
//!   value marked sensitive) and the URL's query are sealed with a key the caller gives
//!   ([`StoreOptions::seal_key`], ChaCha20-Poly1305) and opened only when claimed; without a
//!   key an item carrying them is refused at enqueue. Nothing secret is written in clear, dead
//!   letters included. Better still: store the request without its credentials and let the
//!   client's interceptors add them at delivery.
//!
//! The items and the stores are `soulbase-net-store`'s `outbox` module, re-exported here: the
//! delay server and other systems of the workspace keep their durable state in the same
//! stores. This crate is the delivery.
//!
//! Delivery goes through the `NetClient` given, so the policy, the address guard, the breaker
//! and the interceptors apply to every attempt; the outbox adds its own retries across time
//! (and restarts) on top of the client's within one attempt.
//!
//! [`NetClient`]: soulbase_net_core::NetClient
//!
//! The guide to running a fleet — shared state on Redis, the outbox and the delay server on
//! PostgreSQL, leases — is the page [`guide`].

pub mod admin;
mod outbox;

pub use crate::outbox::{NoClient, NoStore, Outbox, OutboxBuilder};
pub use soulbase_net_store::outbox::{
    open_store, DeadLetter, Enqueued, OutboxItem, OutboxStore, SqliteStore, SqliteStoreBuilder,
    StoreOptions, StoredItem, SQLITE_SCHEMA_VERSION,
};
#[cfg(feature = "postgres")]
pub use soulbase_net_store::outbox::{
    PostgresStore, PostgresStoreBuilder, POSTGRES_SCHEMA_VERSION,
};

/// The guide to running a fleet (shared state, leases, the outbox's engines): also
/// `docs/fleet.md` in the repository, its Rust snippets doctests of this crate.
#[doc = include_str!("../../docs/fleet.md")]
pub mod guide {}
