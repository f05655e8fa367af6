//! Mapping TLS failures to [`ErrorKind`]s: [`classify_error`].

use std::error::Error as StdError;
use std::io;

use rustls::AlertDescription;
use soulbase_net_core::ErrorKind;

/// How deep [`classify_error`] walks a chain of causes before giving up (a guard against
/// cyclic or absurdly long chains).
const MAX_DEPTH: usize = 32;

/// Classifies a failure by the [`rustls::Error`] somewhere in its chain of causes.
///
/// rustls errors rarely arrive bare: tokio-rustls wraps them in an `io::Error`
/// (`InvalidData`), hyper and hyper-util wrap that again. This walks `source()` from `err`
/// down, looking inside each `io::Error` (whose `source()` skips the error it wraps), and
/// classifies the first `rustls::Error` found:
///
/// - [`ErrorKind::TlsVerify`] (`AUTH.FORBIDDEN`): the server's certificate or its pin was
///   rejected (`InvalidCertificate`, `NoCertificatesPresented`, `InvalidCertRevocationList`),
///   or the server rejected ours — an alert received saying our certificate is missing or
///   unacceptable (`certificate_required`, `bad_certificate`, `unsupported_certificate`,
///   `certificate_revoked`, `certificate_expired`, `certificate_unknown`, `unknown_ca`,
///   `access_denied`);
/// - [`ErrorKind::Tls`] (`PROVIDER.UNAVAILABLE`): any other handshake or protocol failure
///   (no common version, cipher suite or application protocol, a peer misbehaving, other
///   alerts);
/// - `None`: no `rustls::Error` in the chain (not a TLS failure, or one this function cannot
///   see).
///
/// One exception to "a `rustls::Error` in the chain": on HTTP/2 the h2 crate flattens I/O
/// errors to their text, so an alert received after the handshake (how a TLS 1.3 server
/// refuses our client certificate) is recognised from an `InvalidData` `io::Error` whose text
/// is exactly what rustls prints for that alert.
///
/// # Examples
/// ```
/// use std::io;
/// use rustls::{CertificateError, Error};
/// use soulbase_net_core::ErrorKind;
/// use soulbase_net_runtime::tls::classify_error;
///
/// let err = io::Error::new(
///     io::ErrorKind::InvalidData,
///     Error::InvalidCertificate(CertificateError::UnknownIssuer),
/// );
/// assert_eq!(classify_error(&err), Some(ErrorKind::TlsVerify));
/// assert_eq!(classify_error(&io::Error::other("refused")), None);
/// ```
pub fn classify_error(err: &(dyn StdError + 'static)) -> Option<ErrorKind> {
    if let Some(found) = find_rustls_error(err) {
        return Some(classify_rustls(found));
    }
    find_alert_text(err).map(|alert| classify_rustls(&rustls::Error::AlertReceived(alert)))
}

/// The first `rustls::Error` in the chain of `err`, `err` included.
fn find_rustls_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(err);
    for _ in 0..MAX_DEPTH {
        let current = next?;
        if let Some(found) = current.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        // `io::Error::source()` returns the *source of* the wrapped error, skipping the
        // wrapped error itself: step into it instead.
        next = match current.downcast_ref::<io::Error>() {
            Some(io_err) => match io_err.get_ref() {
                Some(inner) => Some(inner as &(dyn StdError + 'static)),
                None => current.source(),
            },
            None => current.source(),
        };
    }
    None
}

/// The alert of a rustls "received fatal alert" error that reached us as text only.
///
/// The h2 crate keeps only the kind and the *text* of the `io::Error`s it sees, so an alert
/// received after the handshake on an HTTP/2 connection (a TLS 1.3 server refusing our client
/// certificate) arrives as `io::Error(InvalidData, "received fatal alert: …")` with no
/// `rustls::Error` left. The text is compared with what rustls itself prints for each alert,
/// not with a copy of its format.
fn find_alert_text(err: &(dyn StdError + 'static)) -> Option<AlertDescription> {
    let mut next = Some(err);
    for _ in 0..MAX_DEPTH {
        let current = next?;
        if let Some(io_err) = current.downcast_ref::<io::Error>() {
            if io_err.kind() == io::ErrorKind::InvalidData {
                if let Some(inner) = io_err.get_ref() {
                    if let Some(alert) = alert_named_by(&inner.to_string()) {
                        return Some(alert);
                    }
                }
            }
            next = match io_err.get_ref() {
                Some(inner) => Some(inner as &(dyn StdError + 'static)),
                None => current.source(),
            };
        } else {
            next = current.source();
        }
    }
    None
}

/// The alert whose rustls `AlertReceived` error prints exactly `text`.
fn alert_named_by(text: &str) -> Option<AlertDescription> {
    // Only on the error path, and only for `InvalidData` errors carrying a message: cheap
    // enough to rebuild the text of all 256 alert codes rather than parse rustls' format.
    (0..=u8::MAX)
        .map(AlertDescription::from)
        .find(|alert| rustls::Error::AlertReceived(*alert).to_string() == text)
}

/// The kind of a TLS failure known only by its alert code (QUIC carries TLS alerts as
/// transport error codes, without the rustls error): a certificate rejected, either way, is
/// `TlsVerify`; any other alert is `Tls`.
#[cfg(feature = "http3")]
pub(crate) fn alert_kind(alert: u8) -> ErrorKind {
    classify_rustls(&rustls::Error::AlertReceived(AlertDescription::from(alert)))
}

fn classify_rustls(err: &rustls::Error) -> ErrorKind {
    use rustls::Error as E;
    match err {
        E::InvalidCertificate(_) | E::NoCertificatesPresented | E::InvalidCertRevocationList(_) => {
            ErrorKind::TlsVerify
        }
        E::AlertReceived(alert) if rejects_our_certificate(*alert) => ErrorKind::TlsVerify,
        _ => ErrorKind::Tls,
    }
}

/// Alerts by which a server says it refuses the client certificate we sent (or did not send).
fn rejects_our_certificate(alert: AlertDescription) -> bool {
    matches!(
        alert,
        AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied
    )
}

#[cfg(test)]
mod tests {
    use std::fmt;
    use std::sync::Arc;

    use rustls::{CertificateError, Error, OtherError, PeerIncompatible, PeerMisbehaved};
    use soulbase_net_core::NetError;

    use super::*;

    /// A wrapper error exposing its cause through `source()`, like hyper's.
    #[derive(Debug)]
    struct Wrapper(Box<dyn StdError + Send + Sync>);

    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapped")
        }
    }

    impl StdError for Wrapper {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.0)
        }
    }

    fn io_wrapped(e: Error) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn bare_and_wrapped_errors_are_found() {
        let e = Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert_eq!(classify_error(&e), Some(ErrorKind::TlsVerify));
        assert_eq!(
            classify_error(&io_wrapped(e.clone())),
            Some(ErrorKind::TlsVerify)
        );
        // hyper-util's legacy client → hyper → io::Error → rustls::Error.
        let deep = Wrapper(Box::new(Wrapper(Box::new(io_wrapped(e.clone())))));
        assert_eq!(classify_error(&deep), Some(ErrorKind::TlsVerify));
        // io::Error inside io::Error.
        let double = io::Error::other(io_wrapped(e.clone()));
        assert_eq!(classify_error(&double), Some(ErrorKind::TlsVerify));
        // Inside a NetError.
        let net = NetError::new(ErrorKind::Connect).with_source(io_wrapped(e));
        assert_eq!(classify_error(&net), Some(ErrorKind::TlsVerify));
    }

    #[test]
    fn verification_failures_are_tls_verify() {
        let pin = OtherError(Arc::new(io::Error::other("pin")));
        for e in [
            Error::InvalidCertificate(CertificateError::ExpiredContext {
                time: rustls::pki_types::UnixTime::since_unix_epoch(
                    std::time::Duration::from_secs(2),
                ),
                not_after: rustls::pki_types::UnixTime::since_unix_epoch(
                    std::time::Duration::from_secs(1),
                ),
            }),
            Error::InvalidCertificate(CertificateError::NotValidForName),
            Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure),
            Error::InvalidCertificate(CertificateError::Other(pin)),
            Error::NoCertificatesPresented,
        ] {
            assert_eq!(
                classify_error(&io_wrapped(e.clone())),
                Some(ErrorKind::TlsVerify),
                "{e:?}"
            );
        }
    }

    #[test]
    fn client_certificate_rejections_are_tls_verify() {
        for alert in [
            AlertDescription::CertificateRequired,
            AlertDescription::BadCertificate,
            AlertDescription::UnknownCA,
            AlertDescription::AccessDenied,
            AlertDescription::CertificateUnknown,
            AlertDescription::CertificateExpired,
        ] {
            let e = io_wrapped(Error::AlertReceived(alert));
            assert_eq!(classify_error(&e), Some(ErrorKind::TlsVerify), "{alert:?}");
        }
    }

    #[test]
    fn protocol_failures_are_tls() {
        for e in [
            Error::PeerIncompatible(PeerIncompatible::Tls13RequiredForQuic),
            Error::NoApplicationProtocol,
            Error::AlertReceived(AlertDescription::ProtocolVersion),
            Error::AlertReceived(AlertDescription::HandshakeFailure),
            Error::AlertReceived(AlertDescription::DecodeError),
            Error::PeerMisbehaved(PeerMisbehaved::MissingKeyShare),
            Error::General("boom".into()),
        ] {
            assert_eq!(
                classify_error(&io_wrapped(e.clone())),
                Some(ErrorKind::Tls),
                "{e:?}"
            );
        }
    }

    #[test]
    fn alerts_flattened_to_text_by_h2_are_recognised() {
        // What h2 hands hyper: the kind and the text of the io::Error, nothing else.
        let flat = |alert| {
            let original = io_wrapped(Error::AlertReceived(alert));
            io::Error::new(original.kind(), original.to_string())
        };
        let e = Wrapper(Box::new(flat(AlertDescription::CertificateRequired)));
        assert_eq!(classify_error(&e), Some(ErrorKind::TlsVerify));
        let e = flat(AlertDescription::ProtocolVersion);
        assert_eq!(classify_error(&e), Some(ErrorKind::Tls));
        // Other text, or the right text under another io kind, is not a TLS error.
        let e = io::Error::new(io::ErrorKind::InvalidData, "received fatal alert: nonsense");
        assert_eq!(classify_error(&e), None);
        let e =
            io::Error::other(Error::AlertReceived(AlertDescription::BadCertificate).to_string());
        assert_eq!(classify_error(&e), None);
    }

    #[test]
    fn no_rustls_error_is_none() {
        assert_eq!(classify_error(&io::Error::other("refused")), None);
        assert_eq!(
            classify_error(&io::Error::from(io::ErrorKind::ConnectionReset)),
            None
        );
        assert_eq!(
            classify_error(&Wrapper(Box::new(io::Error::other("x")))),
            None
        );
    }
}
