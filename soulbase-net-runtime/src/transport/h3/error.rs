//! QUIC and HTTP/3 failures as [`NetError`]s, with the same kinds and codes as TCP's: a
//! handshake that times out is `Timeout(Connect)`, a refused certificate `TlsVerify`
//! (`AUTH.FORBIDDEN`), a connection that cannot be opened `Connect`, one lost after it was
//! opened `Io` (retried for idempotent requests), a response head over
//! `max_response_head_bytes` `TooLarge` (see [`head_too_big`]), and a stream the server
//! refused before processing it (`H3_REQUEST_REJECTED`, a request sent after GOAWAY, or one
//! still unanswered when the server closed the connection gracefully with `H3_NO_ERROR`)
//! `NotProcessed`, which the retry loop sends again whatever the method (the rule HTTP/2's
//! GOAWAY and `REFUSED_STREAM` follow too, see [`crate::classify::not_processed`]).

use h3::error::{Code, ConnectionError, StreamError};
use soulbase_net_core::{BoxError, ErrorKind, NetError, Phase};

/// A QUIC transport error code in the crypto range: `0x100 + alert`.
const CRYPTO_ERROR: std::ops::RangeInclusive<u64> = 0x100..=0x1ff;

/// A connection to `host` that could not be started (a bad server name, no usable endpoint).
pub(super) fn connect_error(e: quinn::ConnectError, host: &str) -> NetError {
    let kind = match e {
        quinn::ConnectError::InvalidServerName(_) => ErrorKind::InvalidRequest,
        _ => ErrorKind::Connect,
    };
    NetError::new(kind)
        .with_message(format!("no quic connection to {host} could be started"))
        .with_source(e)
}

/// A QUIC handshake with `host` that failed.
pub(super) fn handshake_error(e: quinn::ConnectionError, host: &str) -> NetError {
    let kind = match &e {
        quinn::ConnectionError::TimedOut => ErrorKind::Timeout(Phase::Connect),
        quinn::ConnectionError::TransportError(t) => local_crypto_kind(u64::from(t.code)),
        quinn::ConnectionError::ConnectionClosed(c) => crypto_kind(u64::from(c.error_code)),
        _ => ErrorKind::Connect,
    };
    NetError::new(kind)
        .with_message(format!("quic handshake with {host} failed"))
        .with_source(e)
}

/// The kind of a QUIC close with transport error `code`: a TLS alert is classified as on
/// TCP, anything else is a failure to connect.
fn crypto_kind(code: u64) -> ErrorKind {
    if CRYPTO_ERROR.contains(&code) {
        // In range, so the low byte is the alert.
        crate::tls::alert_kind((code & 0xff) as u8)
    } else {
        ErrorKind::Connect
    }
}

/// The kind of a QUIC close this client made with transport error `code`: as
/// [`crypto_kind`], and `decrypt_error` too is `TlsVerify`, the alert rustls sends when the
/// server's certificate chain or handshake signature does not verify (`BadSignature`).
fn local_crypto_kind(code: u64) -> ErrorKind {
    if code == DECRYPT_ERROR {
        ErrorKind::TlsVerify
    } else {
        crypto_kind(code)
    }
}

/// `0x100 + 51`: the TLS alert `decrypt_error` as a QUIC transport error code.
const DECRYPT_ERROR: u64 = 0x133;

/// An HTTP/3 connection that failed or closed.
pub(super) fn connection_error(e: ConnectionError) -> NetError {
    let message = match &e {
        ConnectionError::Timeout { .. } => "the http/3 connection timed out",
        _ => "the http/3 connection failed",
    };
    NetError::new(ErrorKind::Io)
        .with_message(message)
        .with_source(e)
}

/// A request stream that failed.
pub(super) fn stream_error(e: StreamError) -> NetError {
    match e {
        StreamError::RemoteTerminate { code, .. } if code == Code::H3_REQUEST_REJECTED => {
            not_processed("the server rejected the request stream (H3_REQUEST_REJECTED)")
        }
        StreamError::RemoteClosing { .. } => {
            not_processed("the server is closing the connection (GOAWAY)")
        }
        // A server closes gracefully (H3_NO_ERROR) only after answering what it took: a
        // request still without its answer was not processed.
        StreamError::ConnectionError { 0: c, .. } if c.is_h3_no_error() => {
            not_processed("the server closed the connection gracefully before answering")
        }
        StreamError::ConnectionError { 0: c, .. } => connection_error(c),
        StreamError::HeaderTooBig { .. } => NetError::new(ErrorKind::TooLarge)
            .with_message("the request head is over the server's header limit")
            .with_source(e),
        _ => NetError::new(ErrorKind::Io)
            .with_message("the http/3 stream failed")
            .with_source(e),
    }
}

/// The error of a request body: the body's own [`NetError`] (over its size limit, a write
/// timeout) as it is, anything else as `Io`.
pub(super) fn body_error(e: BoxError) -> NetError {
    match e.downcast::<NetError>() {
        Ok(net) => *net,
        Err(other) => NetError::new(ErrorKind::Io)
            .with_message("the request body failed")
            .with_source(other),
    }
}

/// A request the server did not process: safe to send again whatever its method (RFC 9114
/// §4.1.1, `H3_REQUEST_REJECTED`; §5.2, requests past GOAWAY).
fn not_processed(why: &'static str) -> NetError {
    crate::classify::not_processed(why)
}

/// A response head over the client's limit, as `TooLarge`; `None` for any other failure of
/// a stream whose head was awaited ([`Live::head_failed`](super::conn::Live::head_failed)).
///
/// The client announces `max_response_head_bytes` as `SETTINGS_MAX_FIELD_SECTION_SIZE`, so
/// this is a server that sent a head it had been told is too large (h3 then refuses to decode
/// it and stops the stream with `H3_REQUEST_CANCELLED`; the connection stays usable). A
/// server that honours the setting sends no such head: what it does instead (reset the
/// stream, end it without a head, answer 5xx) is its own choice, and reaches the client as
/// that failure, which says nothing about the limit.
pub(super) fn head_too_big(e: &StreamError) -> Option<NetError> {
    match e {
        StreamError::HeaderTooBig {
            actual_size,
            max_size,
            ..
        } => Some(NetError::new(ErrorKind::TooLarge).with_message(format!(
            "the response head is over the header limits ({actual_size} bytes, \
             max_response_head_bytes is {max_size})"
        ))),
        _ => None,
    }
}

/// Whether a failed request stream says its connection takes no new request: the
/// connection failed, or the peer is going away (GOAWAY).
pub(super) fn retires_connection(e: &StreamError) -> bool {
    matches!(
        e,
        StreamError::RemoteClosing { .. } | StreamError::ConnectionError { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_alerts_are_tls_verify_other_codes_connect() {
        // 0x100 + 48 (unknown_ca), + 42 (bad_certificate): the verifier refused the chain.
        assert_eq!(crypto_kind(0x130), ErrorKind::TlsVerify);
        assert_eq!(crypto_kind(0x12a), ErrorKind::TlsVerify);
        // 0x100 + 40 (handshake_failure): TLS, not verification.
        assert_eq!(crypto_kind(0x128), ErrorKind::Tls);
        // PROTOCOL_VIOLATION.
        assert_eq!(crypto_kind(0x0a), ErrorKind::Connect);
        // decrypt_error: ours when the server's signature does not verify.
        assert_eq!(local_crypto_kind(DECRYPT_ERROR), ErrorKind::TlsVerify);
        assert_eq!(crypto_kind(DECRYPT_ERROR), ErrorKind::Tls);
    }
}
