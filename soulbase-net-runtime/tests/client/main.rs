//! Integration tests of the client over loopback against the testkit: requests and
//! responses, the address guard, phase timeouts, limits, the connection cap, interceptors
//! and events.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod basic;
mod body;
mod cap;
mod dns;
mod guard;
mod limits;
mod proxy;
mod redirects;
mod support;
mod timeouts;
