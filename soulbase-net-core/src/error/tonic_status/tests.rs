use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};
use tonic::{metadata::MetadataMap, Code, Status};

use super::*;
use crate::ErrorCode;

/// `status` as it arrives on the other side of the wire: written into headers (trailers)
/// the way tonic sends it, and read back; its source, an in-process pointer, does not travel.
fn across_the_wire(status: &Status) -> Status {
    let mut headers = HeaderMap::new();
    status.add_header(&mut headers).unwrap();
    Status::from_header_map(&headers).unwrap()
}

/// Every kind: each payload-free kind, a timeout of every phase, and every status from 100
/// to 599.
fn every_kind() -> Vec<ErrorKind> {
    ErrorKind::ALL_SIMPLE
        .into_iter()
        .chain(Phase::ALL.map(ErrorKind::Timeout))
        .chain((100..600).map(|n| ErrorKind::Status(StatusCode::from_u16(n).unwrap())))
        .collect()
}

#[test]
fn every_kind_round_trips_across_the_wire() {
    for kind in every_kind() {
        let sent = Status::from(
            NetError::new(kind)
                .with_message("what went wrong")
                .with_attempts(2),
        );
        assert_eq!(sent.code(), Code::from(kind.grpc_code()), "{kind:?}");
        assert_eq!(
            sent.metadata().get(ERROR_CODE_HEADER).unwrap(),
            kind.code().as_str(),
            "{kind:?}"
        );
        let received = across_the_wire(&sent);
        assert!(received.source().is_none(), "the wire carries no source");
        let back = NetError::from_status(&received);
        assert_eq!(back.kind(), kind);
        assert_eq!(back.code(), kind.code(), "{kind:?}");
        assert_eq!(back.http_status(), kind.http_status(), "{kind:?}");
        assert_eq!(back.grpc_code(), kind.grpc_code(), "{kind:?}");
        // The other side's attempts are not this side's.
        assert_eq!(back.attempts(), 0, "{kind:?}");
    }
}

#[test]
fn in_process_the_error_itself_comes_back() {
    let err = NetError::new(ErrorKind::CircuitOpen)
        .with_message("host h.example")
        .at(&Method::POST, "https://h.example/p?q=1")
        .with_attempts(3)
        .with_retry_after(Duration::from_secs(2))
        .with_quota_visible(true);
    let status = Status::from(err);
    let back = NetError::from_status(&status);
    assert_eq!(back.kind(), ErrorKind::CircuitOpen);
    assert_eq!(back.attempts(), 3);
    assert_eq!(back.message(), Some("host h.example"));
    assert_eq!(back.context(), Some("POST https://h.example/p"));
    assert_eq!(back.retry_after(), Some(Duration::from_secs(2)));
}

#[test]
fn a_status_tonic_made_from_a_channel_error_gives_the_net_error_back() {
    // What tonic does with the error of a channel (the client as tonic's transport): a
    // `Code::Unknown` status with the error as its source.
    let refused = NetError::new(ErrorKind::Blocked).with_message("loopback is not granted");
    let status = Status::from_error(Box::new(refused));
    assert_eq!(status.code(), Code::Unknown);
    let back = NetError::from_status(&status);
    assert_eq!(back.kind(), ErrorKind::Blocked);
    assert_eq!(back.code(), ErrorCode::AuthForbidden);
    assert_eq!(back.grpc_code(), GrpcCode::PermissionDenied);
    assert_eq!(back.message(), Some("loopback is not granted"));
}

#[test]
fn retry_after_travels_as_grpc_pushback() {
    let err = NetError::new(ErrorKind::RateLimited).with_retry_after(Duration::from_millis(1500));
    let sent = Status::from(err);
    assert_eq!(sent.metadata().get(PUSHBACK).unwrap(), "1500");
    let back = NetError::from_status(&across_the_wire(&sent));
    assert_eq!(back.kind(), ErrorKind::RateLimited);
    assert_eq!(back.retry_after(), Some(Duration::from_millis(1500)));

    let none = Status::from(NetError::new(ErrorKind::Io));
    assert!(none.metadata().get(PUSHBACK).is_none());
    assert_eq!(
        NetError::from_status(&across_the_wire(&none)).retry_after(),
        None
    );
}

#[test]
fn the_message_says_the_code_and_what_but_never_where() {
    let err = NetError::new(ErrorKind::Io)
        .with_message("reset by peer")
        .at(
            &Method::GET,
            "https://billing.internal/v1/charge?token=s3cret",
        )
        .with_attempts(2);
    let status = Status::from(err);
    assert_eq!(
        status.message(),
        "PROVIDER.UNAVAILABLE: connection i/o failed: reset by peer"
    );
    let received = across_the_wire(&status);
    assert!(!received.message().contains("billing.internal"));
    let back = NetError::from_status(&received);
    assert_eq!(back.message(), Some("grpc status UNAVAILABLE"));
    // The remote's message is kept as the source, out of `Display`.
    assert_eq!(
        back.to_string(),
        "connection i/o failed: grpc status UNAVAILABLE"
    );
    let source = back.source().unwrap().to_string();
    assert_eq!(
        source,
        "grpc status UNAVAILABLE: PROVIDER.UNAVAILABLE: connection i/o failed: reset by peer"
    );
}

#[test]
fn without_metadata_each_code_has_its_closest_kind() {
    let st = |n| ErrorKind::Status(StatusCode::from_u16(n).unwrap());
    let table = [
        (Code::Ok, ErrorKind::Io),
        (Code::Cancelled, ErrorKind::Cancelled),
        (Code::Unknown, st(500)),
        (Code::InvalidArgument, st(400)),
        (Code::DeadlineExceeded, ErrorKind::Timeout(Phase::Total)),
        (Code::NotFound, st(404)),
        (Code::AlreadyExists, st(409)),
        (Code::PermissionDenied, st(403)),
        (Code::ResourceExhausted, st(429)),
        (Code::FailedPrecondition, st(400)),
        (Code::Aborted, st(409)),
        (Code::OutOfRange, st(400)),
        (Code::Unimplemented, st(501)),
        (Code::Internal, st(500)),
        (Code::Unavailable, st(503)),
        (Code::DataLoss, st(500)),
        (Code::Unauthenticated, st(401)),
    ];
    assert_eq!(table.len(), GrpcCode::ALL.len());
    for (code, kind) in table {
        let status = across_the_wire(&Status::new(code, "from elsewhere"));
        let err = NetError::from_status(&status);
        assert_eq!(err.kind(), kind, "{code:?}");
        assert_eq!(err.attempts(), 0);
    }
    // The codes a service passes on unchanged when it answers with the restored error.
    for code in [
        Code::Cancelled,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::ResourceExhausted,
        Code::Aborted,
        Code::Unavailable,
    ] {
        let err = NetError::from_status(&Status::new(code, ""));
        assert_eq!(Code::from(err.grpc_code()), code, "{code:?}");
    }
}

#[test]
fn a_kind_entry_that_names_no_kind_falls_back_to_the_code() {
    for token in ["no_such_kind", "status_", "status_abc", "status_42", ""] {
        let mut metadata = MetadataMap::new();
        metadata.insert(ERROR_KIND_HEADER, token.parse().unwrap());
        metadata.insert(ERROR_CODE_HEADER, "PROVIDER.TIMEOUT".parse().unwrap());
        let status = Status::with_metadata(Code::Unavailable, "x", metadata);
        assert_eq!(
            NetError::from_status(&status).kind(),
            ErrorKind::Status(StatusCode::SERVICE_UNAVAILABLE),
            "{token:?}"
        );
    }
}

#[test]
fn kind_tokens_are_labels_or_exact_statuses() {
    for kind in every_kind() {
        let token = kind_token(kind);
        assert_eq!(kind_from_token(&token), Some(kind), "{token}");
    }
    assert_eq!(kind_token(ErrorKind::Timeout(Phase::Read)), "timeout_read");
    assert_eq!(
        kind_token(ErrorKind::Status(StatusCode::BAD_GATEWAY)),
        "status_502"
    );
    // A label that does not name one status (`status_5xx`) is not a kind token.
    assert_eq!(kind_from_token("status_5xx"), None);
}

#[test]
fn grpc_codes_convert_to_and_from_tonic() {
    for code in GrpcCode::ALL {
        let tonic_code = Code::from(code);
        assert_eq!(tonic_code as i32, code as i32);
        assert_eq!(GrpcCode::from(tonic_code), code);
        assert!(!tonic_code.description().is_empty());
    }
}
