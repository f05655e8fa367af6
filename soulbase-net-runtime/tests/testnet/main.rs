//! `testing::TestNet`: a production host name pointed at a wiremock `MockServer` on
//! loopback, with the production policy document's allow-list and host overrides in force,
//! loopback granted for the mapping only, and every other name refused before real DNS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod patch;
mod refusals;
mod upstream;

use std::{net::SocketAddr, sync::Arc};

use soulbase_net_interceptors::SandboxGuard;
use soulbase_net_policy::{PolicyDocument, SecurityPolicy};
use soulbase_net_runtime::{testing::TestNet, Client};
use wiremock::MockServer;

/// The shop's production policy: only its API may be called, and the API gets five attempts
/// (the built-in default is three) and a production grant of its own network.
const PRODUCTION: &str = r#"
    [default]
    timeout = { connect = "1s", ttfb = "1s", read = "1s", write = "1s", attempt = "1500ms", total = "10s" }
    security.allow_hosts = ["api.shop.example"]
    security.grants.cidrs = ["10.20.0.0/16"]

    [overrides."api.shop.example"]
    retry.max_attempts = 5
"#;

/// What the tests lay over production: short waits between retries.
const FAST_BACKOFF: &str = r#"
    [default]
    retry.backoff = { base = "1ms", cap = "5ms" }
"#;

/// The production document with the test's own line.
fn production() -> PolicyDocument {
    PolicyDocument::from_toml_str(PRODUCTION)
        .unwrap()
        .merged_with_toml(FAST_BACKOFF)
        .unwrap()
}

/// The sandbox interceptor the service installs in production: its allow-list names the
/// shop's API only.
fn sandbox() -> SandboxGuard {
    let mut security = SecurityPolicy::default();
    security.allow_hosts = Some(vec!["api.shop.example".to_owned()]);
    SandboxGuard::new(&security).unwrap()
}

/// A client of `doc` through `net`, with the production sandbox interceptor.
fn client(net: &TestNet, doc: &PolicyDocument) -> Arc<Client> {
    Arc::new(
        net.client_builder(doc)
            .unwrap()
            .interceptor(sandbox())
            .build()
            .unwrap(),
    )
}

/// How many requests the mock received.
async fn received(mock: &MockServer) -> usize {
    mock.received_requests().await.unwrap_or_default().len()
}

/// `net` mapping the shop's API (plain HTTP) to `mock`.
fn shop_net(mock: &MockServer) -> TestNet {
    TestNet::new().map("http://api.shop.example", *mock.address())
}

/// The addresses of `net`'s dials that went somewhere.
fn dialled_to(net: &TestNet) -> Vec<Option<SocketAddr>> {
    net.dials().iter().map(|d| d.to).collect()
}
