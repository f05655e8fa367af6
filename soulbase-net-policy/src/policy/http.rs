//! HTTP version policy: HTTP/2 or HTTP/1.1 over TCP by default, HTTP/3 over QUIC when the
//! origin advertises it (`auto`) or when a host's policy asks for it (`h3`, `h3-or-tcp`).
//!
//! Why a per-host choice and not a client switch: HTTP/3 is worth it for some origins (lossy
//! paths, many concurrent streams) and a risk for others (UDP blocked by a middlebox); the
//! policy document already layers per host and per tenant, so the choice layers the same way.

use serde::{Deserialize, Serialize};

use crate::policy::tls::{TlsPolicy, TlsVersion};
use crate::validate::Checker;

/// Which HTTP versions a call may use, and how HTTP/3 is found.
///
/// HTTP/3 needs the runtime's `http3` feature; a policy asking for `h3` or `h3-or-tcp` from a
/// runtime built without it fails at client build (for the default policy) or at request time
/// (for a host's override) with `SCHEMA.VALIDATION_FAILED`. `auto` without the feature is
/// plain TCP and never an error.
///
/// Default: `auto`, 0-RTT off.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HttpPolicy {
    /// How the HTTP version is chosen. Default is [`HttpVersionPolicy::Auto`].
    pub version: HttpVersionPolicy,
    /// A new HTTP/3 connection opened for a request with an idempotent method (GET, HEAD,
    /// OPTIONS, TRACE, PUT, DELETE) to a server whose session can be resumed sends that
    /// request as QUIC 0-RTT early data. Requests with other methods never go early (early
    /// data can be replayed): on such a connection they wait for the handshake. Default is
    /// `false`.
    pub zero_rtt: bool,
}

/// How the HTTP version of a call is chosen.
///
/// Written `"auto"`, `"h3"` or `"h3-or-tcp"`. Default is `Auto`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum HttpVersionPolicy {
    /// HTTP/2 or HTTP/1.1 over TCP (by ALPN); HTTP/3 only after the origin advertised it with
    /// `Alt-Svc: h3=":port"`, for the advertisement's `ma`, and dropped when it fails. The
    /// default.
    #[default]
    Auto,
    /// Prior knowledge: HTTP/3 only, never TCP.
    H3,
    /// Race a QUIC handshake with a TCP connect (Happy Eyeballs style), use the first to
    /// complete, and remember which one won for the origin.
    H3OrTcp,
}

// === impl HttpPolicy ===

impl HttpPolicy {
    /// Whether this policy may use HTTP/3 before the origin advertised it.
    pub fn wants_h3(&self) -> bool {
        matches!(
            self.version,
            HttpVersionPolicy::H3 | HttpVersionPolicy::H3OrTcp
        )
    }

    /// The rules between this section and `tls`: QUIC is TLS 1.3 only, so a policy that caps
    /// TLS at 1.2 cannot ask for HTTP/3.
    pub(crate) fn check(&self, tls: &TlsPolicy, c: &mut Checker<'_>) {
        c.when(
            self.wants_h3() && tls.max_tls < TlsVersion::Tls13,
            "version",
            || {
                format!(
                    "`{}` needs HTTP/3 over QUIC, which is TLS 1.3 only, but tls.max_tls is {}; use \"auto\" or raise tls.max_tls to \"1.3\"",
                    self.version.as_str(),
                    tls.max_tls
                )
            },
        );
    }
}

// === impl HttpVersionPolicy ===

impl HttpVersionPolicy {
    /// `"auto"`, `"h3"` or `"h3-or-tcp"`, as written in a document.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::H3 => "h3",
            Self::H3OrTcp => "h3-or-tcp",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_written_in_kebab_case() {
        for v in [
            HttpVersionPolicy::Auto,
            HttpVersionPolicy::H3,
            HttpVersionPolicy::H3OrTcp,
        ] {
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("\"{}\"", v.as_str()));
            assert_eq!(serde_json::from_str::<HttpVersionPolicy>(&json).unwrap(), v);
        }
        assert!(serde_json::from_str::<HttpVersionPolicy>("\"h2\"").is_err());
    }
}
