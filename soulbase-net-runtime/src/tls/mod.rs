//! TLS for outbound connections: the rustls client configuration a [`TlsPolicy`] asks for
//! ([`client_config`]), SPKI pinning ([`PinnedVerifier`]) and the classification of TLS
//! failures into error kinds ([`classify_error`]).
//!
//! Always rustls with the ring provider; certificate verification is always on (there is no
//! switch to turn it off — a pin or an extra root is the way to trust a private server).

mod classify;
mod pin;

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::version::{TLS12, TLS13};
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};
use soulbase_net_core::{ErrorKind, NetError};
use soulbase_net_policy::{TlsPolicy, TlsVersion};

#[cfg(feature = "http3")]
pub(crate) use self::classify::alert_kind;
pub use self::classify::classify_error;
pub use self::pin::{spki_sha256, PinMismatch, PinnedVerifier};

/// The ALPN protocol id of HTTP/2.
const ALPN_H2: &[u8] = b"h2";
/// The ALPN protocol id of HTTP/1.1.
const ALPN_HTTP11: &[u8] = b"http/1.1";

/// Builds the rustls client configuration that `policy` asks for.
///
/// - Crypto: rustls' ring provider (never the process default).
/// - Versions: from `min_tls` to `max_tls`: by default TLS 1.3 and 1.2; `min_tls = "1.3"`
///   offers TLS 1.3 only, `max_tls = "1.2"` TLS 1.2 only.
/// - Trust: the webpki-roots (Mozilla) roots, plus every certificate in
///   `policy.extra_roots_pem`, plus `extra_roots` (e.g. given to the client builder).
///   Chain and name are always verified.
/// - Pins: when `policy.pinset_sha256` is set, a [`PinnedVerifier`] additionally requires the
///   leaf's SPKI SHA-256 to be one of the pins (backup pins allowed; a pin never rescues an
///   invalid chain).
/// - mTLS: when `policy.mtls` is set, its PEM chain (leaf first) and private key (PKCS#8,
///   PKCS#1 or SEC1) are presented to servers that ask for a client certificate.
/// - ALPN: `h2` then `http/1.1` when `policy.http2`, else `http/1.1` only.
///
/// The policy is checked again here (it may not have gone through validation):
///
/// # Errors
/// [`ErrorKind::InvalidRequest`] (`SCHEMA.VALIDATION_FAILED`) naming the policy field when
/// the configuration is unusable: `verify_cert` off, an empty or undecodable pin, PEM that
/// holds no certificate or no private key, a root certificate that cannot be used, or a
/// client certificate and key that do not belong together. [`ErrorKind::Tls`] if rustls
/// refuses the combination of versions and provider (not expected).
///
/// # Examples
/// ```
/// use soulbase_net_policy::TlsPolicy;
///
/// let config = soulbase_net_runtime::tls::client_config(&TlsPolicy::default(), &[])?;
/// assert_eq!(config.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
/// # Ok::<(), soulbase_net_core::NetError>(())
/// ```
pub fn client_config(
    policy: &TlsPolicy,
    extra_roots: &[CertificateDer<'static>],
) -> Result<Arc<ClientConfig>, NetError> {
    if !policy.verify_cert {
        return Err(NetError::invalid_request(
            "tls.verify_cert cannot be turned off; add the server's CA to tls.extra_roots_pem instead",
        ));
    }
    let provider: Arc<CryptoProvider> = Arc::new(rustls::crypto::ring::default_provider());
    let roots = Arc::new(root_store(policy, extra_roots)?);
    let versions = protocol_versions(policy)?;
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| {
            NetError::new(ErrorKind::Tls)
                .with_message("the crypto provider does not support the requested tls versions")
                .with_source(e)
        })?;

    let builder = match decode_pins(policy)? {
        None => builder.with_root_certificates(roots),
        Some(pins) => {
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| {
                    NetError::new(ErrorKind::Tls)
                        .with_message("the certificate verifier could not be built")
                        .with_source(e)
                })?;
            pin::install(builder, Arc::new(PinnedVerifier::new(webpki, pins)))
        }
    };

    let mut config = match &policy.mtls {
        None => builder.with_no_client_auth(),
        Some(mtls) => {
            let chain = parse_certs(&mtls.client_cert_pem, "tls.mtls.client_cert_pem")?;
            // No source attached: a PEM parse error may quote bytes of the key.
            let key =
                PrivateKeyDer::from_pem_slice(mtls.client_key_pem.as_bytes()).map_err(|_| {
                    NetError::invalid_request(
                        "tls.mtls.client_key_pem is not a PEM private key (PKCS#8, PKCS#1 or SEC1)",
                    )
                })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                NetError::invalid_request(
                    "tls.mtls.client_cert_pem and tls.mtls.client_key_pem cannot be used together (unsupported key or key not matching the certificate)",
                )
                .with_source(e)
            })?
        }
    };

    config.alpn_protocols = if policy.http2 {
        vec![ALPN_H2.to_vec(), ALPN_HTTP11.to_vec()]
    } else {
        vec![ALPN_HTTP11.to_vec()]
    };
    Ok(Arc::new(config))
}

/// The rustls client configuration for TLS to an `https://` proxy under `policy`: the same
/// versions and trust roots as [`client_config`], but no pins and no client certificate
/// (those belong to the target, whose own TLS runs inside the tunnel) and ALPN `http/1.1`
/// (a proxy is spoken to in HTTP/1.1).
///
/// # Errors
/// As [`client_config`].
pub(crate) fn proxy_client_config(
    policy: &TlsPolicy,
    extra_roots: &[CertificateDer<'static>],
) -> Result<Arc<ClientConfig>, NetError> {
    let mut for_proxy = policy.clone();
    for_proxy.pinset_sha256 = None;
    for_proxy.mtls = None;
    for_proxy.http2 = false;
    client_config(&for_proxy, extra_roots)
}

/// The versions offered: from `min_tls` to `max_tls`, newest first.
fn protocol_versions(
    policy: &TlsPolicy,
) -> Result<&'static [&'static SupportedProtocolVersion], NetError> {
    const BOTH: &[&SupportedProtocolVersion] = &[&TLS13, &TLS12];
    const ONLY_13: &[&SupportedProtocolVersion] = &[&TLS13];
    const ONLY_12: &[&SupportedProtocolVersion] = &[&TLS12];
    match (policy.min_tls, policy.max_tls) {
        (TlsVersion::Tls12, TlsVersion::Tls13) => Ok(BOTH),
        (TlsVersion::Tls13, TlsVersion::Tls13) => Ok(ONLY_13),
        (TlsVersion::Tls12, TlsVersion::Tls12) => Ok(ONLY_12),
        (min, max) => Err(NetError::invalid_request(format!(
            "tls.min_tls {min} and tls.max_tls {max} leave no version this runtime supports"
        ))),
    }
}

/// The webpki roots, the policy's extra PEM roots and the caller's extra DER roots.
fn root_store(
    policy: &TlsPolicy,
    extra_roots: &[CertificateDer<'static>],
) -> Result<RootCertStore, NetError> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for (i, pem) in policy.extra_roots_pem.iter().enumerate() {
        let field = format!("tls.extra_roots_pem[{i}]");
        for cert in parse_certs(pem, &field)? {
            roots.add(cert).map_err(|e| {
                NetError::invalid_request(format!(
                    "{field} holds a certificate that cannot be used as a trust anchor"
                ))
                .with_source(e)
            })?;
        }
    }
    for (i, cert) in extra_roots.iter().enumerate() {
        roots.add(cert.clone()).map_err(|e| {
            NetError::invalid_request(format!(
                "extra root certificate #{i} cannot be used as a trust anchor"
            ))
            .with_source(e)
        })?;
    }
    Ok(roots)
}

/// Every certificate of a PEM text; at least one.
fn parse_certs(pem: &str, field: &str) -> Result<Vec<CertificateDer<'static>>, NetError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            NetError::invalid_request(format!("{field} is not valid PEM")).with_source(e)
        })?;
    if certs.is_empty() {
        return Err(NetError::invalid_request(format!(
            "{field} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )));
    }
    Ok(certs)
}

/// The pins of the policy, `None` when pinning is off; an invalid or empty pin set is an error
/// (it is never silently dropped, which would turn pinning off).
fn decode_pins(policy: &TlsPolicy) -> Result<Option<Vec<[u8; 32]>>, NetError> {
    let Some(list) = &policy.pinset_sha256 else {
        return Ok(None);
    };
    if list.is_empty() {
        return Err(NetError::invalid_request(
            "tls.pinset_sha256 is empty and would refuse every server; leave it out to turn pinning off",
        ));
    }
    let mut pins = Vec::with_capacity(list.len());
    for (i, pin) in list.iter().enumerate() {
        // Decode one entry at a time, with the policy's own decoder, to name the bad one.
        let mut one = TlsPolicy::default();
        one.pinset_sha256 = Some(vec![pin.clone()]);
        match one.pins().first() {
            Some(digest) => pins.push(*digest),
            None => {
                return Err(NetError::invalid_request(format!(
                    "tls.pinset_sha256[{i}] is not the base64 of a 32-byte sha-256 digest"
                )))
            }
        }
    }
    Ok(Some(pins))
}
