//! Each interceptor through a real client against the testkit's servers over loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

#[cfg(feature = "idempotency")]
mod idempotency;
#[cfg(feature = "trace")]
mod trace;
