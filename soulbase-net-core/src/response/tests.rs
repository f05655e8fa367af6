use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::HeaderValue;
use http_body_util::BodyExt;

use super::*;
use crate::ErrorCode;

fn resp(status: u16) -> NetResponse {
    NetResponse::from_bytes(StatusCode::from_u16(status).unwrap(), "{}")
}

#[test]
fn error_for_status_follows_the_documented_table() {
    let rows: &[(u16, Option<ErrorCode>)] = &[
        (200, None),
        (204, None),
        (301, None),
        (304, None),
        (400, Some(ErrorCode::SchemaValidationFailed)),
        (401, Some(ErrorCode::AuthForbidden)),
        (403, Some(ErrorCode::AuthForbidden)),
        (404, Some(ErrorCode::SchemaValidationFailed)),
        (408, Some(ErrorCode::ProviderTimeout)),
        (409, Some(ErrorCode::SchemaValidationFailed)),
        (429, Some(ErrorCode::QuotaRateLimited)),
        (500, Some(ErrorCode::ProviderUnavailable)),
        (502, Some(ErrorCode::ProviderUnavailable)),
        (503, Some(ErrorCode::ProviderUnavailable)),
        (504, Some(ErrorCode::ProviderUnavailable)),
    ];
    for &(status, code) in rows {
        let got = resp(status).error_for_status();
        match code {
            None => assert_eq!(got.unwrap().status.as_u16(), status),
            Some(code) => {
                let err = got.unwrap_err();
                assert_eq!(
                    err.kind(),
                    ErrorKind::Status(http::StatusCode::from_u16(status).unwrap()),
                    "{status}"
                );
                assert_eq!(err.code(), code, "{status}");
                assert_eq!(
                    resp(status).error_for_status_ref().unwrap_err().code(),
                    code
                );
            }
        }
    }
}

#[test]
fn status_errors_carry_attempts_url_and_retry_after() {
    let mut r = resp(503).with_header(http::header::RETRY_AFTER, HeaderValue::from_static("7"));
    r.attempts = 3;
    r.url = "https://h.example/x".to_owned();
    let err = r.error_for_status().unwrap_err();
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(
        err.to_string(),
        "http status 503 (https://h.example/x) after 3 attempts"
    );
}

#[test]
fn retry_after_parses_seconds_and_dates() {
    let now = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let r = resp(429).with_header(http::header::RETRY_AFTER, HeaderValue::from_static("  30 "));
    assert_eq!(r.retry_after(now), Some(Duration::from_secs(30)));
    let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
    let r = resp(429).with_header(
        http::header::RETRY_AFTER,
        HeaderValue::from_str(&later).unwrap(),
    );
    assert_eq!(r.retry_after(now), Some(Duration::from_secs(90)));
    let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
    let r = resp(429).with_header(
        http::header::RETRY_AFTER,
        HeaderValue::from_str(&past).unwrap(),
    );
    assert_eq!(r.retry_after(now), Some(Duration::ZERO));
    for bad in ["-1", "1.5", "", "tomorrow"] {
        let r = resp(429).with_header(
            http::header::RETRY_AFTER,
            HeaderValue::from_str(bad).unwrap(),
        );
        assert_eq!(r.retry_after(now), None, "{bad:?}");
    }
    assert_eq!(resp(429).retry_after(SystemTime::now()), None);
}

#[tokio::test]
async fn json_decodes_or_reports_decode() {
    let v: serde_json::Value = NetResponse::from_bytes(StatusCode::OK, r#"{"a":[1,2]}"#)
        .json()
        .await
        .unwrap();
    assert_eq!(v["a"][1], 2);
    let mut bad = NetResponse::from_bytes(StatusCode::OK, "<html>");
    bad.url = "https://h.example/j".to_owned();
    let err = bad.json::<serde_json::Value>().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Decode);
    assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
    assert_eq!(err.context(), Some("https://h.example/j"));
    assert!(std::error::Error::source(&err).is_some());
}

#[tokio::test]
async fn streamed_bodies_are_collected_and_their_errors_surface() {
    let chunks = vec![
        Ok(http_body::Frame::data(Bytes::from_static(b"hel"))),
        Ok(http_body::Frame::data(Bytes::from_static(b"lo"))),
    ];
    let body = Chunks(chunks.into()).boxed_unsync();
    let mut r = NetResponse::from_bytes(StatusCode::OK, "");
    r.body = RespBody::Stream(body);
    assert_eq!(r.text().await.unwrap(), "hello");

    let chunks = vec![
        Ok(http_body::Frame::data(Bytes::from_static(b"abc"))),
        Err(NetError::new(ErrorKind::TooLarge)),
    ];
    let mut r = NetResponse::from_bytes(StatusCode::OK, "");
    r.body = RespBody::Stream(Chunks(chunks.into()).boxed_unsync());
    assert_eq!(r.bytes().await.unwrap_err().kind(), ErrorKind::TooLarge);
}

#[tokio::test]
async fn a_body_of_one_frame_is_that_frame_and_more_frames_are_joined_in_order() {
    let stream = |frames: Vec<http_body::Frame<Bytes>>| {
        let mut r = NetResponse::from_bytes(StatusCode::OK, "");
        r.body = RespBody::Stream(Chunks(frames.into_iter().map(Ok).collect()).boxed_unsync());
        r
    };
    let one = Bytes::from_static(b"the one frame");
    let got = stream(vec![http_body::Frame::data(one.clone())])
        .bytes()
        .await
        .unwrap();
    assert_eq!(got, one);
    // The same memory: a single frame is handed over, not copied.
    assert_eq!(got.as_ptr(), one.as_ptr());

    let mut trailers = HeaderMap::new();
    trailers.insert("x-sum", HeaderValue::from_static("1"));
    let frames = vec![
        http_body::Frame::data(Bytes::new()),
        http_body::Frame::data(Bytes::from_static(b"a")),
        http_body::Frame::data(Bytes::new()),
        http_body::Frame::data(Bytes::from_static(b"bc")),
        http_body::Frame::data(Bytes::from_static(b"def")),
        http_body::Frame::trailers(trailers),
    ];
    assert_eq!(stream(frames).bytes().await.unwrap(), "abcdef");
    assert!(stream(Vec::new()).bytes().await.unwrap().is_empty());
    let only_empty = vec![http_body::Frame::data(Bytes::new())];
    assert!(stream(only_empty).bytes().await.unwrap().is_empty());
}

#[test]
fn content_type_follows_the_header() {
    let r = resp(200).with_header(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    assert_eq!(format!("{:?}", r.body), "Bytes(2 bytes)");
}

/// A body yielding the given frames, one per poll.
struct Chunks(std::collections::VecDeque<Result<http_body::Frame<Bytes>, NetError>>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = NetError;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, NetError>>> {
        std::task::Poll::Ready(self.0.pop_front())
    }
}
