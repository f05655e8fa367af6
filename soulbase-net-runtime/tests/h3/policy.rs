//! The policy's `http.version` against the runtime's features.

use soulbase_net_core::{ErrorCode, ErrorKind};
use soulbase_net_policy::{HttpVersionPolicy, NetPolicy};
use soulbase_net_runtime::prelude::*;

#[test]
fn asking_for_http3_needs_the_feature() {
    for version in [HttpVersionPolicy::H3, HttpVersionPolicy::H3OrTcp] {
        let mut policy = NetPolicy::default();
        policy.http.version = version;
        let built = Client::builder().policy(policy).build();
        if cfg!(feature = "http3") {
            assert!(built.is_ok(), "{version:?}: {:?}", built.err());
        } else {
            let err = built.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest);
            assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
            assert!(
                err.message()
                    .unwrap_or_default()
                    .contains("`http3` feature"),
                "{err:?}"
            );
        }
    }
    // `auto` is plain TCP without the feature: never an error.
    assert!(Client::builder()
        .policy(NetPolicy::default())
        .build()
        .is_ok());
}

/// Without the feature only (a default `cargo test`; CI's `--all-features` run has the
/// HTTP/3 tests instead).
#[cfg(not(feature = "http3"))]
#[tokio::test]
async fn a_host_asking_for_http3_fails_its_requests_without_the_feature() {
    let doc = soulbase_net_policy::PolicyDocument::from_toml_str(
        "[overrides.\"h3.invalid\"]\nhttp.version = \"h3\"\n",
    )
    .unwrap();
    let client = Client::builder().policy_document(doc).build().unwrap();
    let err = client
        .send(NetRequest::get("https://h3.invalid/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err:?}");
    assert!(
        err.message()
            .unwrap_or_default()
            .contains("`http3` feature"),
        "{err:?}"
    );
    assert_eq!(client.connections_opened(), 0);
}
