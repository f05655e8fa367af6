//! Integration tests of the client over loopback against the testkit: requests and
//! responses, the address guard, phase timeouts, limits, the connection cap, interceptors
//! and events, and TLS (broken certificates, trust, pins, mTLS, protocol floor).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod basic;
mod body;
mod cap;
mod dns;
mod guard;
mod keep_alive;
mod lifecycle;
mod limits;
mod metrics;
mod pool;
mod proxy;
mod redirects;
mod resilience;
mod semantics;
mod slo;
mod support;
mod timeouts;
mod tls;
