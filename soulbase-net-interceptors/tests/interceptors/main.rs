//! Each interceptor through a real client against the testkit's servers over loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

#[cfg(feature = "bearer")]
mod bearer;
#[cfg(feature = "cache")]
mod cache;
#[cfg(feature = "idempotency")]
mod idempotency;
#[cfg(feature = "crypto")]
mod jws;
#[cfg(feature = "qos")]
mod qos;
#[cfg(feature = "sandbox")]
mod sandbox;
#[cfg(feature = "trace")]
mod trace;
