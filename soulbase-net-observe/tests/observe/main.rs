//! Observe: metrics exposition, SLIs and tracing spans, driven by scripted `NetEvent`s.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod capture;
mod events;
mod metrics;
#[cfg(feature = "otel")]
mod otel;
mod seed_series;
mod slis;
mod spans;
