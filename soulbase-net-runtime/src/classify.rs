//! Turning what hyper, hyper-util, rustls and the OS report into [`NetError`]s.
//!
//! Why a walk over `source()`: rustls errors reach us as `io::Error(InvalidData)` wrapping a
//! `rustls::Error`, wrapped again by hyper (DEPS.md trap 11); and a request body's own
//! `NetError` (a stream over its size limit, a write timeout) comes back inside hyper's.

use std::{error::Error as StdError, io};

use soulbase_net_core::{ErrorKind, NetError};

/// The error of a failed TLS handshake with `host`.
pub(crate) fn tls_handshake_error(e: io::Error, host: &str) -> NetError {
    let kind = tls_kind(&e).unwrap_or(ErrorKind::Tls);
    NetError::new(kind)
        .with_message(format!("tls handshake with {host} failed"))
        .with_source(e)
}

/// The kind of a TLS failure somewhere in the chain (see [`crate::tls::classify_error`]).
fn tls_kind(err: &(dyn StdError + 'static)) -> Option<ErrorKind> {
    crate::tls::classify_error(err)
}

/// The error of a request (or a connection handshake) that hyper gave up on.
pub(crate) fn send_error(e: hyper::Error) -> NetError {
    let found = chain(&e)
        .find_map(|s| s.downcast_ref::<NetError>())
        .map(|net| {
            (
                net.kind(),
                net.message().map(str::to_owned),
                net.retry_after(),
            )
        });
    if let Some((kind, message, retry_after)) = found {
        let mut copy = NetError::new(kind);
        if let Some(m) = message {
            copy = copy.with_message(m);
        }
        if let Some(r) = retry_after {
            copy = copy.with_retry_after(r);
        }
        return copy.with_source(e);
    }
    if let Some(kind) = tls_kind(&e) {
        return NetError::new(kind)
            .with_message("tls failure on the connection")
            .with_source(e);
    }
    if let Some(why) = h2_not_processed(&e) {
        return not_processed(why).with_source(e);
    }
    let (kind, message) = if e.is_parse_too_large() {
        (
            ErrorKind::TooLarge,
            "the response head is over the header limits",
        )
    } else if e.is_incomplete_message() {
        (
            ErrorKind::Io,
            "connection closed before the response was complete",
        )
    } else if e.is_parse() || e.is_parse_status() {
        (ErrorKind::Io, "the response could not be parsed")
    } else if e.is_canceled() {
        (ErrorKind::Io, "the request was canceled by the connection")
    } else {
        (ErrorKind::Io, "the connection failed")
    };
    NetError::new(kind).with_message(message).with_source(e)
}

/// Why the HTTP/2 server provably did not process the request whose stream failed with
/// `e`, if it did not (RFC 9113 §8.7):
///
/// - a GOAWAY the server sent: h2 fails with it only the streams above the frame's last
///   stream id and the streams opened after it arrived (a stream at or below the last id
///   goes on, and fails with an I/O error if the connection is then lost);
/// - `REFUSED_STREAM`, which a server sends only for a stream it did not process.
pub(crate) fn h2_not_processed(e: &(dyn StdError + 'static)) -> Option<&'static str> {
    let h2 = remote_h2(e)?;
    if h2.is_go_away() {
        Some("the server is closing the connection (GOAWAY) and did not take the request")
    } else if h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM) {
        Some("the server refused the stream (REFUSED_STREAM)")
    } else {
        None
    }
}

/// The HTTP/2 error somewhere in `e`'s chain, when the server sent it (a GOAWAY or a
/// RST_STREAM frame), not when h2 made it.
pub(crate) fn remote_h2<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a h2::Error> {
    chain(e)
        .find_map(|s| s.downcast_ref::<h2::Error>())
        .filter(|h2| h2.is_remote())
}

/// Whether `e` is the connection going away under the request (reset, broken pipe, closed),
/// as opposed to an error about the request or a TLS alert (which says why the peer refused).
pub(crate) fn connection_io(e: &(dyn StdError + 'static)) -> bool {
    use std::io::ErrorKind as K;
    chain(e).any(|s| {
        let io = (s.downcast_ref::<h2::Error>())
            .and_then(h2::Error::get_io)
            .or_else(|| s.downcast_ref::<std::io::Error>());
        io.is_some_and(|io| {
            matches!(
                io.kind(),
                K::BrokenPipe | K::ConnectionReset | K::ConnectionAborted | K::UnexpectedEof
            )
        })
    })
}

/// A [`ErrorKind::NotProcessed`] error saying why.
pub(crate) fn not_processed(why: &'static str) -> NetError {
    NetError::new(ErrorKind::NotProcessed).with_message(why)
}

/// The `Io` error of a request that a GOAWAY raced and that may have been processed (a
/// request complete in its head and not idempotent, see the pool's `going_away`): the caller
/// gets `Io` and the retry rules for its method, but its source is a [`ServerGoingAway`], by
/// which [`is_server_going_away`] knows that only a connection's routine end failed it.
pub(crate) fn raced_by_goaway(e: hyper::Error) -> NetError {
    NetError::new(ErrorKind::Io)
        .with_message(
            "the server is closing the connection (GOAWAY); the request may have been processed",
        )
        .with_source(ServerGoingAway(e))
}

/// Whether `e` failed only because the server was closing the connection (a
/// [`ServerGoingAway`] in its chain). Such an error is ambiguous for the caller, but says
/// nothing of the upstream's health: the breaker and the SLO controller do not count it.
pub(crate) fn is_server_going_away(e: &NetError) -> bool {
    e.find_source::<ServerGoingAway>().is_some()
}

/// The source of an error [`raced_by_goaway`] made: the server's GOAWAY, as hyper reported
/// it. A type of its own so that what counts failures can tell it from every other `Io`.
#[derive(Debug)]
pub(crate) struct ServerGoingAway(hyper::Error);

impl std::fmt::Display for ServerGoingAway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the server sent GOAWAY as the request was handed over")
    }
}

impl StdError for ServerGoingAway {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

fn chain<'a>(
    err: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    let mut next = Some(err);
    std::iter::from_fn(move || {
        let current = next?;
        next = current.source();
        Some(current)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_errors_inside_io_errors_are_found() {
        let verify = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::Expired),
        );
        assert_eq!(tls_kind(&verify), Some(ErrorKind::TlsVerify));
        let refused = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        assert_eq!(tls_kind(&refused), Some(ErrorKind::TlsVerify));
        let protocol = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::ProtocolVersion),
        );
        assert_eq!(tls_kind(&protocol), Some(ErrorKind::Tls));
        let plain = io::Error::new(io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(tls_kind(&plain), None);
        let err = tls_handshake_error(verify, "h.example");
        assert_eq!(err.kind(), ErrorKind::TlsVerify);
        assert_eq!(
            err.to_string(),
            "tls verification failed: tls handshake with h.example failed"
        );
    }
}
