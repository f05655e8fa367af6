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
//!
//! # Delivery, acknowledgement and redelivery
//!
//! - A `schedule` is answered `{"kind":"ack","id":…,"fire_at":…}` only once the task is
//!   committed to the store (schedules and acks from every connection are committed together
//!   in batches: group commit). A `schedule` of an id already stored changes nothing; its
//!   `ack` carries the stored task's `fire_at` (when it really fires), not the duplicate's.
//! - When due, a task is delivered to one connection registered for its route (a route with
//!   several connections shares its tasks, turn by turn). It is deleted when that connection
//!   sends `{"kind":"ack","id":…}` — and only that connection: an ack counts only for a
//!   delivery made on the same connection and still waiting for its ack. An ack of anything
//!   else (another connection's delivery, another route's task by its id, a delivery whose
//!   ack timeout has passed, a task not delivered) changes nothing and is not answered; it is
//!   counted in `delay_acks_ignored_total`. So a connection cannot delete the tasks of a
//!   route whose token it does not hold.
//! - A delivery is made again after `retry_delay_ms`, with the same id, when its route has no
//!   connection, the connection's write queue is full (`connection_write_channel`: a slow
//!   client's deliveries wait in the store, other clients are not slowed), the connection
//!   closes before the ack, or no ack comes within `ack_timeout_ms` — until a client
//!   acknowledges it: at least once. An ack is never answered, so a client cannot know it was
//!   committed: a task whose ack was not committed when the server died (still on its way,
//!   or received and waiting for its batch: milliseconds) is delivered again after the
//!   restart, with the same id; a task whose ack was committed never is.
//! - A server that stops gives the tasks it was delivering back to the store, due at once; a
//!   server that dies (SIGKILL) leaves them leased until the lease ends (500 ms ahead +
//!   `ack_timeout_ms` + 2 s), then any server of the store delivers them.
//!
//! # Access: `allowed_hosts` and tokens
//!
//! A peer outside `allowed_hosts` (loopback only by default) is closed on at accept, on the
//! TCP port and on the HTTP face alike. A route named in `tokens` needs its token: over TCP
//! in the `token` field of `register` and `schedule` (without it, an `AUTH.FORBIDDEN` error
//! line and the connection closes); over HTTP as below. A route not named needs none.
//!
//! # The HTTP face
//!
//! With `http_addr` set (the same `allowed_hosts` apply):
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /health` | 200 `{"status":"ok","pending":N}`; 503 when the store does not answer |
//! | `GET /metrics` | 200, the Prometheus text exposition (below) |
//! | `POST /tasks`, a `schedule` line as the body (`route_key` required) | 200 the `ack` once stored (a duplicate's with the stored `fire_at`); 400 a bad line (the `error` line as the body); 403 without the route's token; 413 a body over 64 KiB; 503 not stored |
//! | `GET /tasks/{id}` | 200 the task (`id`, `route_key`, `fire_at`, `attempts`, `compression`, `payload_base64`; an HTTP task with its `target`); 403 without its route's token; 404 none; 503 |
//! | `DELETE /tasks/{id}` | 200 `{"id":…,"deleted":true}` (cancelled, whoever holds it); 403 without its route's token; 404 none; 503 |
//!
//! The token of a route named in `tokens` goes in the header `Authorization: Bearer <token>`
//! on all three task requests, or, on `POST`, in the line's `token` field as over TCP. A 403
//! tells that a task of that id exists on a protected route, nothing more; a 404 that none
//! does. An HTTP task (a `schedule` with a `target`, waiting in the outbox) has no route and
//! needs no token. Error bodies are the protocol's error line (`{"kind":"error","code":…,…}`).
//!
//! # Metrics
//!
//! `GET /metrics` on the HTTP face. Counters since the server started: `delay_scheduled_total`
//! (tasks stored), `delay_duplicates_total` (schedules of an id already stored),
//! `delay_refused_total` (TCP lines refused with an error line, a missing or wrong token
//! included), `delay_delivered_total` (deliveries written to a connection),
//! `delay_acked_total` (deliveries acknowledged), `delay_redelivered_total` (deliveries due
//! again: no connection, a full queue, a closed connection, no ack in time),
//! `delay_acks_ignored_total` (acks of no delivery waiting on their connection). Gauges read at scrape time: `delay_pending` (tasks in the store, every
//! server's), `delay_in_flight` (deliveries waiting for their ack), `delay_due_undelivered`
//! (tasks in the store, every server's, whose `fire_at` has passed on the store's clock and
//! that no client has acknowledged: delivered and waiting for their ack, waiting for a retry,
//! or waiting for a connection of their route),
//! `delay_ready` (tasks claimed ahead, waiting in memory to fire),
//! `delay_route_connections{route}`. A histogram: `delay_fire_lateness_ms` (first delivery's
//! write − `fire_at`). When the store does not answer, `delay_due_undelivered` falls back to
//! what this server holds.
//!
//! # Where the seed disagrees with itself
//!
//! Seed 003's examples and prose disagree with its protocol section in places; the protocol
//! section rules:
//!
//! - **`fire_at` is a number.** The protocol's delivery sample writes `"fire_at":"..."` (a
//!   string); its schedule sample, the Go client (`int64`) and the Java client (`long`) use a
//!   number. The server writes a number wherever it writes `fire_at` and reads a number (or,
//!   leniently, a string of digits) in a `schedule`.
//! - **Deleted on the client's ack, not on the write.** Step 4 of the seed's "how it runs"
//!   (时间轮运行逻辑) deletes the record once the delivery is written (投递成功 → 删除); the
//!   protocol section deletes it when the client's `ack` arrives. Deleting on the write would
//!   lose a task whose client dies before handling it; the server deletes on the ack.
//! - **The Java client cannot work as written.** It waits for `"kind":"ready"` where the
//!   protocol sends `"delivery"`, and its Jackson classes (`GenericMessage` with `kind` only,
//!   `ReadyMessage` without `compression`) fail on unknown fields with a default
//!   `ObjectMapper`, so it would drop every line even if the kind matched. The server sends
//!   the protocol's `delivery`; a Java client needs `"delivery"` and
//!   `@JsonIgnoreProperties(ignoreUnknown = true)` (or `FAIL_ON_UNKNOWN_PROPERTIES` off). The
//!   Go client follows the protocol and works unchanged (tested).
//! - **`data_dir` defaults to `data`**, not the seed's `data/db` (a sled directory): the store
//!   is one SQLite file, `data/delay.db`.
//! - **`ready_channel_capacity` is the claim batch**: the seed's is the capacity of its wheel's
//!   in-memory ready queue; here it bounds how many due tasks one claim takes from the store
//!   and holds in memory ahead of their time (default 2048 either way).

pub mod compress;
mod config;
mod metrics;
pub mod protocol;
mod server;

pub use crate::config::{Config, HttpTasks, CONFIG_ENV};
pub use crate::server::DelayServer;
