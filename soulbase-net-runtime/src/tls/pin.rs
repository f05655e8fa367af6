//! SPKI pinning of the server's leaf certificate: [`PinnedVerifier`].
//!
//! This is the only file of the workspace allowed to use rustls' `dangerous()` API (a tidy
//! rule checks it): installing a custom certificate verifier is that API's business. The
//! verifier installed here never weakens verification — it runs the full WebPKI check first
//! and only then adds the pin check.

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WantsClientCert, WebPkiServerVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, ConfigBuilder, DigitallySignedStruct, DistinguishedName, Error,
    OtherError, SignatureScheme, WantsVerifier,
};

/// A server certificate verifier that accepts a server only if its chain passes full WebPKI
/// verification **and** the SHA-256 digest of its leaf certificate's SubjectPublicKeyInfo is
/// one of the pinned digests.
///
/// - A pin never rescues a bad chain: an expired, untrusted or wrongly named certificate is
///   refused with the WebPKI error even when its key is pinned.
/// - Only the leaf is pinned. Matching any certificate of the presented chain would be
///   bypassable, since CA certificates are public.
/// - Several pins may be given (backup pins, for key rotation); any one of them matches.
///   An empty pin set refuses every server.
/// - A mismatch fails the handshake with
///   `rustls::Error::InvalidCertificate(CertificateError::Other(..))` carrying a
///   [`PinMismatch`].
///
/// The digest is the one of HPKP and `curl --pinnedpubkey sha256//…`:
/// `openssl x509 -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256`.
pub struct PinnedVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    pins: Vec<[u8; 32]>,
}

impl fmt::Debug for PinnedVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedVerifier")
            .field("pins", &self.pins.len())
            .finish_non_exhaustive()
    }
}

impl PinnedVerifier {
    /// A verifier running `webpki` first, then requiring the leaf's SPKI SHA-256 digest to be
    /// one of `pins`.
    pub fn new(
        webpki: Arc<WebPkiServerVerifier>,
        pins: impl IntoIterator<Item = [u8; 32]>,
    ) -> Self {
        Self {
            webpki,
            pins: pins.into_iter().collect(),
        }
    }

    /// The accepted digests.
    pub fn pins(&self) -> &[[u8; 32]] {
        &self.pins
    }
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        // The chain first: a pin adds a condition, it never replaces one.
        let verified = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        let presented = spki_sha256(end_entity)
            .ok_or(Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if self.pins.contains(&presented) {
            Ok(verified)
        } else {
            Err(Error::InvalidCertificate(CertificateError::Other(
                OtherError(Arc::new(PinMismatch {
                    presented,
                    pins: self.pins.len(),
                })),
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }

    fn root_hint_subjects(&self) -> Option<&[DistinguishedName]> {
        self.webpki.root_hint_subjects()
    }
}

/// The server's leaf key matched none of the pinned SPKI digests (the chain itself was valid).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinMismatch {
    presented: [u8; 32],
    pins: usize,
}

impl PinMismatch {
    /// The SHA-256 digest of the SubjectPublicKeyInfo the server presented.
    pub fn presented(&self) -> [u8; 32] {
        self.presented
    }
}

impl fmt::Display for PinMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the server's public key (spki sha256 ")?;
        for b in &self.presented[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(
            f,
            "…) matches none of the {} pinned spki sha256 digests",
            self.pins
        )
    }
}

impl std::error::Error for PinMismatch {}

/// SHA-256 of a certificate's DER SubjectPublicKeyInfo, outer SEQUENCE included (the HPKP /
/// `curl --pinnedpubkey` digest). `None` if the certificate cannot be parsed.
pub fn spki_sha256(cert: &CertificateDer<'_>) -> Option<[u8; 32]> {
    let ee = webpki::EndEntityCert::try_from(cert).ok()?;
    // rustls-webpki 0.103 re-wraps the SPKI contents in their SEQUENCE here, so the bytes are
    // the complete DER SubjectPublicKeyInfo (checked against the certificate in the tests).
    let spki = ee.subject_public_key_info();
    let digest = ring::digest::digest(&ring::digest::SHA256, spki.as_ref());
    digest.as_ref().try_into().ok()
}

/// Installs `verifier` on a client config builder (the one use of `dangerous()`).
pub(super) fn install(
    builder: ConfigBuilder<ClientConfig, WantsVerifier>,
    verifier: Arc<PinnedVerifier>,
) -> ConfigBuilder<ClientConfig, WantsClientCert> {
    builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
}

#[cfg(test)]
mod tests {
    use super::*;

    use soulbase_net_testkit::CertKit;

    /// The SPKI bytes hashed are the certificate's own DER SubjectPublicKeyInfo, outer
    /// SEQUENCE included, and the digest equals the testkit's.
    #[test]
    fn spki_is_the_full_der_sequence() {
        let kit = CertKit::new().unwrap();
        for leaf in [kit.localhost().unwrap(), kit.self_signed().unwrap()] {
            let der = leaf.cert_der();
            let ee = webpki::EndEntityCert::try_from(der).unwrap();
            let spki = ee.subject_public_key_info();
            let spki: &[u8] = spki.as_ref();
            // SEQUENCE tag, and a length that covers exactly the rest of the bytes.
            assert_eq!(spki[0], 0x30);
            let (len, header) = match spki[1] {
                n if n < 0x80 => (usize::from(n), 2),
                0x81 => (usize::from(spki[2]), 3),
                0x82 => ((usize::from(spki[2]) << 8) | usize::from(spki[3]), 4),
                other => panic!("unexpected DER length byte {other:#x}"),
            };
            assert_eq!(header + len, spki.len());
            // The same bytes appear verbatim inside the certificate.
            assert!(der.as_ref().windows(spki.len()).any(|w| w == spki));
            assert_eq!(spki_sha256(der), Some(leaf.spki_sha256_bytes()));
        }
    }

    #[test]
    fn garbage_is_not_a_certificate() {
        assert_eq!(
            spki_sha256(&CertificateDer::from(vec![0x30, 0x03, 1, 2, 3])),
            None
        );
    }

    #[test]
    fn mismatch_message_is_clear() {
        let m = PinMismatch {
            presented: [0xab; 32],
            pins: 2,
        };
        let text = m.to_string();
        assert!(text.contains("abababab"), "{text}");
        assert!(text.contains("none of the 2 pinned"), "{text}");
        assert_eq!(m.presented(), [0xab; 32]);
    }
}
