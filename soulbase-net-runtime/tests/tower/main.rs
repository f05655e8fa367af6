//! The tower face of the client: tower-http layers in front of it, `poll_ready` under the
//! in-flight cap, a tonic gRPC client whose channel is the client, the bodies it keeps to send
//! again, h2c per host, and the breaker's unit — all over loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod breaker;
mod grpc;
mod h2c;
mod layers;
mod ready;
mod replay;
mod stack;

/// The code `tonic-prost-build` 0.14 generated from `echo.proto` (with
/// `build_transport(false)`), checked in so that building the tests needs no `protoc`.
#[path = "echo.v1.rs"]
#[allow(unreachable_pub, clippy::all, clippy::pedantic)]
mod echo;

use std::time::Duration;

use soulbase_net_policy::NetPolicy;

/// The runtime's test dialer: nothing off loopback.
use soulbase_net_runtime::testing::LoopbackDialer;

/// The default policy with loopback granted, quick retries, and no name server off the
/// machine.
fn loopback_policy() -> NetPolicy {
    let mut p = NetPolicy::default();
    p.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    p.retry.backoff.base = Duration::from_millis(1);
    p.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    p
}

/// Runs `f` within 20 seconds; fails the test when it takes longer.
async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("the test exceeded its time bound")
}
