//! HTTP/3 (`http.version` in the policy, the runtime's `http3` feature): what a build without
//! the feature says about a policy that asks for HTTP/3.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod policy;
