//! TLS policy: protocol floor, certificate verification, SPKI pins, mTLS and extra roots.

use std::fmt;

use base64::Engine as _;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::validate::Checker;

/// TLS for outbound connections.
///
/// Certificates are always verified against the web PKI roots (plus `extra_roots_pem`); pins
/// are checked in addition to, never instead of, that verification.
///
/// Default: TLS 1.2 or 1.3, verification on, no pins, no client certificate, HTTP/2 offered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TlsPolicy {
    /// Lowest protocol version accepted; below 1.2 is refused. Default is `"1.2"`.
    pub min_tls: TlsVersion,
    /// Highest protocol version offered; must not be below `min_tls`. `"1.2"` also refuses
    /// HTTP/3 (QUIC is TLS 1.3 only). Default is `"1.3"`.
    pub max_tls: TlsVersion,
    /// Verify the server's certificate chain and name. Must stay on. Default is `true`.
    pub verify_cert: bool,
    /// Accepted SHA-256 digests of the leaf's SubjectPublicKeyInfo, base64 (standard alphabet,
    /// optionally prefixed `sha256/`). Default is `None` (no pinning).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinset_sha256: Option<Vec<String>>,
    /// Client certificate for mutual TLS. Default is `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtls: Option<MtlsCfg>,
    /// Extra trusted root certificates, PEM. Default is empty.
    pub extra_roots_pem: Vec<String>,
    /// Offer HTTP/2 through ALPN. Default is `true`.
    pub http2: bool,
}

/// A TLS protocol version. Written `"1.2"` or `"1.3"`; anything older is rejected.
/// Default is `Tls12`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum TlsVersion {
    /// TLS 1.2. The default.
    #[default]
    Tls12,
    /// TLS 1.3.
    Tls13,
}

/// A client certificate and key for mutual TLS, both PEM.
///
/// `Debug` never prints the key. Default is empty strings (which validation rejects).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct MtlsCfg {
    /// The client certificate chain, PEM, leaf first. Default is empty.
    pub client_cert_pem: String,
    /// The client private key, PEM (PKCS#8, PKCS#1 or SEC1). Default is empty.
    pub client_key_pem: String,
}

// === impl TlsPolicy ===

impl Default for TlsPolicy {
    fn default() -> Self {
        Self {
            min_tls: TlsVersion::Tls12,
            max_tls: TlsVersion::Tls13,
            verify_cert: true,
            pinset_sha256: None,
            mtls: None,
            extra_roots_pem: Vec::new(),
            http2: true,
        }
    }
}

impl TlsPolicy {
    /// The decoded SPKI pins (32-byte SHA-256 digests); entries that are not valid pins are
    /// skipped (a validated policy has none).
    pub fn pins(&self) -> Vec<[u8; 32]> {
        self.pinset_sha256
            .iter()
            .flatten()
            .filter_map(|p| decode_pin(p))
            .collect()
    }

    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        c.when(self.max_tls < self.min_tls, "max_tls", || {
            format!(
                "{} is below min_tls {}: no version would be left to offer",
                self.max_tls, self.min_tls
            )
        });
        c.when(!self.verify_cert, "verify_cert", || {
            "certificate verification cannot be turned off; add the server's CA to extra_roots_pem instead"
                .to_owned()
        });
        if let Some(pins) = &self.pinset_sha256 {
            c.when(pins.is_empty(), "pinset_sha256", || {
                "an empty pin set would refuse every server; leave it out to turn pinning off"
                    .to_owned()
            });
            for (i, pin) in pins.iter().enumerate() {
                c.when(
                    decode_pin(pin).is_none(),
                    &format!("pinset_sha256[{i}]"),
                    || format!("`{pin}` is not the base64 of a 32-byte SHA-256 digest"),
                );
            }
        }
        if let Some(m) = &self.mtls {
            let mut c = c.nested("mtls");
            c.when(!is_pem(&m.client_cert_pem, "CERTIFICATE"), "client_cert_pem", || {
                "does not look like PEM (no -----BEGIN CERTIFICATE----- … -----END CERTIFICATE----- block)"
                    .to_owned()
            });
            c.when(
                !is_pem(&m.client_key_pem, "PRIVATE KEY"),
                "client_key_pem",
                || {
                    "does not look like a PEM private key (no -----BEGIN … PRIVATE KEY----- block)"
                        .to_owned()
                },
            );
        }
        for (i, pem) in self.extra_roots_pem.iter().enumerate() {
            c.when(
                !is_pem(pem, "CERTIFICATE"),
                &format!("extra_roots_pem[{i}]"),
                || "does not look like PEM (no -----BEGIN CERTIFICATE----- block)".to_owned(),
            );
        }
    }
}

/// Decodes a pin: standard base64 (optionally prefixed `sha256/`) of exactly 32 bytes.
fn decode_pin(pin: &str) -> Option<[u8; 32]> {
    let b64 = pin.strip_prefix("sha256/").unwrap_or(pin);
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    bytes.try_into().ok()
}

/// A PEM block whose label ends with `label` (so `PRIVATE KEY` accepts `RSA PRIVATE KEY`).
fn is_pem(text: &str, label: &str) -> bool {
    let Some(begin) = text.find("-----BEGIN ") else {
        return false;
    };
    let rest = &text[begin + "-----BEGIN ".len()..];
    let Some(end_of_label) = rest.find("-----") else {
        return false;
    };
    let found = &rest[..end_of_label];
    found.ends_with(label) && rest.contains(&format!("-----END {found}-----"))
}

// === impl MtlsCfg ===

impl fmt::Debug for MtlsCfg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MtlsCfg")
            .field(
                "client_cert_pem",
                &format_args!("<{} bytes>", self.client_cert_pem.len()),
            )
            .field("client_key_pem", &format_args!("<redacted>"))
            .finish()
    }
}

// === impl TlsVersion ===

impl TlsVersion {
    /// `"1.2"` or `"1.3"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tls12 => "1.2",
            Self::Tls13 => "1.3",
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let t = t
            .trim_start_matches("tls")
            .trim_start_matches('v')
            .replace('_', ".");
        match t.as_str() {
            "1.2" | "12" => Ok(Self::Tls12),
            "1.3" | "13" => Ok(Self::Tls13),
            "1.0" | "1" | "10" | "1.1" | "11" => Err(format!(
                "TLS {s} is not allowed: the minimum is TLS 1.2 (use \"1.2\" or \"1.3\")"
            )),
            _ if s.to_ascii_lowercase().starts_with("ssl") => Err(format!(
                "{s} is not allowed: the minimum is TLS 1.2 (use \"1.2\" or \"1.3\")"
            )),
            _ => Err(format!("unknown TLS version `{s}`: use \"1.2\" or \"1.3\"")),
        }
    }
}

impl fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for TlsVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TlsVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TlsVersionVisitor)
    }
}

struct TlsVersionVisitor;

impl Visitor<'_> for TlsVersionVisitor {
    type Value = TlsVersion;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a TLS version, \"1.2\" or \"1.3\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<TlsVersion, E> {
        TlsVersion::parse(v).map_err(E::custom)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<TlsVersion, E> {
        // `min_tls = 1.2` in TOML is a float; compare in tenths to avoid float equality.
        let tenths = (v * 10.0).round();
        if (v * 10.0 - tenths).abs() > 1e-9 || !(0.0..=100.0).contains(&tenths) {
            return Err(E::custom(format!(
                "unknown TLS version `{v}`: use \"1.2\" or \"1.3\""
            )));
        }
        TlsVersion::parse(&format!("{:.1}", tenths / 10.0)).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_in_common_spellings() {
        for (s, v) in [
            ("1.2", TlsVersion::Tls12),
            ("TLSv1.3", TlsVersion::Tls13),
            ("tls1_2", TlsVersion::Tls12),
        ] {
            assert_eq!(TlsVersion::parse(s).unwrap(), v, "{s}");
        }
        for s in ["1.1", "1.0", "SSLv3", "2.0", ""] {
            assert!(TlsVersion::parse(s).is_err(), "{s}");
        }
        let v: TlsVersion = serde_json::from_str("1.3").unwrap();
        assert_eq!(v, TlsVersion::Tls13);
        let e = serde_json::from_str::<TlsVersion>("1.1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("minimum is TLS 1.2"), "{e}");
    }

    #[test]
    fn pins_decode_32_bytes_only() {
        let good = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        assert_eq!(decode_pin(&good), Some([7u8; 32]));
        assert_eq!(decode_pin(&format!("sha256/{good}")), Some([7u8; 32]));
        let short = base64::engine::general_purpose::STANDARD.encode([7u8; 20]);
        assert_eq!(decode_pin(&short), None);
        assert_eq!(decode_pin("not base64!"), None);
    }

    #[test]
    fn pem_shape() {
        assert!(is_pem(
            "-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n",
            "CERTIFICATE"
        ));
        assert!(is_pem(
            "-----BEGIN RSA PRIVATE KEY-----\nx\n-----END RSA PRIVATE KEY-----",
            "PRIVATE KEY"
        ));
        assert!(!is_pem("MIIB...", "CERTIFICATE"));
        assert!(!is_pem("-----BEGIN CERTIFICATE-----\nx", "CERTIFICATE"));
        assert!(!is_pem(
            "-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----",
            "PRIVATE KEY"
        ));
    }

    #[test]
    fn mtls_debug_redacts_the_key() {
        let m = MtlsCfg {
            client_cert_pem: "CERT".into(),
            client_key_pem: "SECRET-KEY-MATERIAL".into(),
        };
        let s = format!("{m:?}");
        assert!(!s.contains("SECRET"), "{s}");
        assert!(s.contains("redacted"), "{s}");
    }
}
