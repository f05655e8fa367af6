//! TLS over real loopback handshakes against the testkit: trust roots and ALPN, the broken
//! certificates, SPKI pins, protocol versions, mTLS and configuration errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod broken;
mod config;
mod handshake;
mod mtls;
mod pins;
mod support;
mod versions;
