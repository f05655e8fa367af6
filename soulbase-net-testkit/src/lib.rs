//! The soulbase-net test kit: the other side of the wire.
//!
//! This crate will hold what this workspace's tests, and other services' contract tests, run
//! their HTTP clients against, all on loopback: a fault-injecting `FaultServer` (HTTP/1.1 and
//! HTTP/2, plain or TLS, scripted delays, resets, stalls, huge bodies, redirects, sequences and
//! seeded random faults, with hit counters and captured requests), a `CertKit` of good and broken
//! certificates, a `MockDns` server and a `ConnectProxy` with faults. It depends on
//! `soulbase-net-core` only, never on the runtime.
//!
//! It is built by the testkit issue; until then it exports nothing.
