//! Each interceptor through a real client against the testkit's servers over loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Feature sets that leave some interceptors out use only part of the helpers.
#[allow(dead_code)]
mod support;

#[cfg(feature = "bearer")]
mod bearer;
#[cfg(feature = "cache")]
mod cache;
#[cfg(feature = "redis")]
mod fleet;
#[cfg(feature = "idempotency")]
mod idempotency;
#[cfg(feature = "crypto")]
mod jws;
#[cfg(feature = "idempotency")]
mod observe;
#[cfg(feature = "qos")]
mod qos;
#[cfg(feature = "sandbox")]
mod sandbox;
#[cfg(feature = "trace")]
mod spans;
#[cfg(feature = "trace")]
mod trace;
