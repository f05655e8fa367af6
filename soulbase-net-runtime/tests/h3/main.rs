//! HTTP/3 (`http.version` in the policy, the runtime's `http3` feature) over loopback against
//! the testkit's FaultServer on QUIC: requests and streams, the address guard before any
//! packet, handshake and certificate failures, retries, Alt-Svc discovery and the race with
//! TCP; and what a build without the feature says about a policy that asks for HTTP/3.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod policy;
#[cfg(feature = "http3")]
mod quic;
#[cfg(feature = "http3")]
mod support;
