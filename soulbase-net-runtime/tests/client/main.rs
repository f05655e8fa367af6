//! Integration tests of the client over loopback against the testkit: requests and
//! responses, the address guard, phase timeouts, limits, the connection cap, interceptors
//! and events.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod basic;
mod cap;
mod guard;
mod limits;
mod support;
mod timeouts;
