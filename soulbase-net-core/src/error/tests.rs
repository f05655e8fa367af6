use std::{error::Error as _, io, mem::size_of};

use super::*;

fn assert_send_sync<T: Send + Sync + 'static>() {}

#[test]
fn net_error_is_one_pointer_wide_and_thread_safe() {
    assert_eq!(size_of::<NetError>(), size_of::<usize>());
    assert_eq!(size_of::<Option<NetError>>(), size_of::<usize>());
    assert_send_sync::<NetError>();
}

#[test]
fn display_never_repeats_the_source() {
    let source = io::Error::new(io::ErrorKind::ConnectionReset, "peer reset SECRET-DETAIL");
    let err = NetError::new(ErrorKind::Io)
        .with_source(source)
        .at(&http::Method::GET, "https://api.example.com/v1/x");
    let text = err.to_string();
    assert_eq!(
        text,
        "connection i/o failed (GET https://api.example.com/v1/x)"
    );
    assert!(!text.contains("SECRET-DETAIL"));
    let source = err.source().expect("source is kept");
    assert!(source.to_string().contains("SECRET-DETAIL"));
}

#[test]
fn display_says_what_and_where_and_how_many_attempts() {
    let err = NetError::invalid_request("header `x-a` contains CR or LF")
        .at(&http::Method::POST, "http://h.example/p")
        .with_attempts(3);
    assert_eq!(
        err.to_string(),
        "invalid request: header `x-a` contains CR or LF (POST http://h.example/p) after 3 attempts"
    );
    assert_eq!(err.message(), Some("header `x-a` contains CR or LF"));
    assert_eq!(err.context(), Some("POST http://h.example/p"));
}

#[test]
fn context_never_carries_userinfo_or_query() {
    let err = NetError::new(ErrorKind::Connect).at(
        &http::Method::GET,
        "https://user:pass@api.example.com/a/b?token=abc#frag",
    );
    let context = err.context().unwrap();
    assert_eq!(context, "GET https://***@api.example.com/a/b");
    assert!(!err.to_string().contains("pass"));
    assert!(!format!("{err:?}").contains("token"));
}

#[test]
fn chain_walks_every_cause_and_find_source_downcasts() {
    #[derive(Debug)]
    struct Outer(io::Error);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("outer")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    let err = NetError::new(ErrorKind::Connect).with_source(Outer(io::Error::new(
        io::ErrorKind::ConnectionRefused,
        "refused",
    )));
    assert_eq!(err.chain().count(), 2);
    let io = err.find_source::<io::Error>().expect("io error in chain");
    assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);
}

#[test]
fn public_code_hides_rate_limits_unless_qos_made_them_visible() {
    let err = NetError::new(ErrorKind::RateLimited);
    assert_eq!(err.code(), ErrorCode::QuotaRateLimited);
    assert_eq!(err.public_code(), ErrorCode::ProviderUnavailable);
    let err = err.with_quota_visible(true);
    assert_eq!(err.public_code(), ErrorCode::QuotaRateLimited);
    let timeout = NetError::timeout(Phase::Read).with_quota_visible(true);
    assert_eq!(timeout.public_code(), ErrorCode::ProviderUnavailable);
}

#[test]
fn status_errors_expose_their_status() {
    let err = NetError::status(http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        err.kind(),
        ErrorKind::Status(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(
        err.status_code(),
        Some(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(NetError::timeout(Phase::Total).status_code(), None);
    assert!(NetError::timeout(Phase::Total).is_timeout());
    assert_eq!(err.to_string(), "http status 503");
}

#[test]
fn labels_are_unique_per_kind() {
    let mut labels: Vec<&str> = ErrorKind::ALL_SIMPLE.iter().map(|k| k.label()).collect();
    labels.extend(Phase::ALL.iter().map(|p| ErrorKind::Timeout(*p).label()));
    labels.sort_unstable();
    let before = labels.len();
    labels.dedup();
    // Timeout(Total) appears in both lists.
    assert_eq!(labels.len(), before - 1);
}

#[test]
fn retry_after_is_carried() {
    let err = NetError::new(ErrorKind::CircuitOpen).with_retry_after(Duration::from_secs(7));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(NetError::new(ErrorKind::Dns).retry_after(), None);
}
