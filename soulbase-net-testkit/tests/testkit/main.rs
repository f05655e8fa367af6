//! Integration tests of the test kit, driving every part with plain hyper-util, tokio-rustls
//! and hickory clients over loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod capacity;
mod dns;
mod faults;
mod forward;
mod http2;
mod lifecycle;
mod mock;
mod postgres;
mod proxy;
mod redis;
mod support;
mod testnet;
mod tls;
