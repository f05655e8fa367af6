//! The delay server of seed 003, on the workspace's durable store: services in any language
//! connect over TCP, schedule tasks for a time, and receive them back on a connection
//! registered for their route when they fire — persisted before the server acknowledges them,
//! recovered after a restart, delivered at least once (the same id every time) until a client
//! acknowledges.
//!
//! The protocol is JSON, one object per line ([`protocol`]): `register`, `schedule` and `ack`
//! from the client; `registered`, `ack`, `delivery` and `error` from the server. The tasks live
//! in `soulbase-net-store`'s delay store — SQLite embedded, PostgreSQL with the `postgres`
//! feature — under the same lease discipline and statements' clock as the outbox's items.
//!
//! ```no_run
//! # async fn run() -> Result<(), soulbase_net_core::NetError> {
//! use soulbase_net_delay::{Config, DelayServer};
//! use soulbase_net_store::delay::{open_delay_store, DelayStoreOptions};
//!
//! let config = Config::default(); // 127.0.0.1:7000, data/delay.db
//! let store = open_delay_store(&config.store_url(), DelayStoreOptions::default()).await?;
//! let server = DelayServer::start(config, store).await?;
//! println!("listening on {}", server.local_addr());
//! # server.shutdown().await; Ok(()) }
//! ```
//!
//! The binary (`cargo run -p soulbase-net-delay`) reads the seed's `config.json` (or the file
//! `HYPER_DELAY_CONFIG` names) and runs until interrupted.

pub mod compress;
mod config;
mod metrics;
pub mod protocol;
mod server;

pub use crate::config::{Config, HttpTasks, CONFIG_ENV};
pub use crate::server::DelayServer;
