//! Integration tests of soulbase-net-policy: defaults, documents, validation, resolution and
//! hot reload.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod defaults;
mod document;
mod example;
mod explain;
mod hot_reload;
mod merge_prop;
mod patch;
mod reference;
mod resolution;
mod roundtrip;
mod secrets;
mod validation;
