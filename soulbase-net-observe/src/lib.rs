//! Observability for soulbase-net.
//!
//! This crate will hold an implementation of [`soulbase_net_core::Observer`] that turns the
//! runtime's [`soulbase_net_core::NetEvent`]s into the seed's metrics
//! (`net_requests_total`, `net_latency_ms_bucket`, `net_bytes`, `net_retry_total`,
//! `net_circuit_open_total`, `net_redirect_total`) in Prometheus text format, `tracing` spans per
//! request and per attempt with OpenTelemetry HTTP-client field names, and the SLIs of the
//! timeout / retry policy (retry rate, timeout rate, p50 / p99 latency, error ratio).
//!
//! It is built by the observability issue; until then it exports nothing.
