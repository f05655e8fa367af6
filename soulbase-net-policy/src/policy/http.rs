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
/// Default: `auto`, 0-RTT off (and, when on, only for the safe methods).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HttpPolicy {
    /// How the HTTP version is chosen. Default is [`HttpVersionPolicy::Auto`].
    pub version: HttpVersionPolicy,
    /// A new HTTP/3 connection opened for a request whose method is in `zero_rtt_methods`,
    /// to a server whose session can be resumed, sends that request as QUIC 0-RTT early data.
    /// Requests with other methods never go early (early data can be replayed): on such a
    /// connection they wait for the handshake. Default is `false`.
    pub zero_rtt: bool,
    /// The methods whose requests may go as 0-RTT early data when `zero_rtt` is on. Default
    /// is the safe methods, `["GET", "HEAD", "OPTIONS", "TRACE"]` (RFC 8470 §4.1: a server
    /// may act on early data before it can tell a replay); `"PUT"` and `"DELETE"` (idempotent
    /// but not safe: a replay repeats their effect) go early only when listed here. Only those
    /// six methods, in capitals, may be listed.
    pub zero_rtt_methods: Vec<String>,
}

/// The methods that may be listed in `zero_rtt_methods`: the idempotent ones (RFC 9110
/// §9.2.2), since early data can be replayed.
const IDEMPOTENT_METHODS: [&str; 6] = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"];

/// The default of `zero_rtt_methods`: the safe methods (RFC 9110 §9.2.1).
const SAFE_METHODS: [&str; 4] = ["GET", "HEAD", "OPTIONS", "TRACE"];

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

impl Default for HttpPolicy {
    fn default() -> Self {
        HttpPolicy {
            version: HttpVersionPolicy::default(),
            zero_rtt: false,
            zero_rtt_methods: SAFE_METHODS.iter().map(|m| (*m).to_owned()).collect(),
        }
    }
}

impl HttpPolicy {
    /// Whether a request with `method` may be sent as 0-RTT early data: `zero_rtt` is on and
    /// `method` is in `zero_rtt_methods`. Every other request waits for the handshake.
    ///
    /// # Examples
    /// ```
    /// use http::Method;
    /// use soulbase_net_policy::HttpPolicy;
    ///
    /// let mut http = HttpPolicy::default();
    /// assert!(!http.zero_rtt_allows(&Method::GET)); // 0-RTT is off by default
    /// http.zero_rtt = true;
    /// assert!(http.zero_rtt_allows(&Method::GET));
    /// assert!(!http.zero_rtt_allows(&Method::PUT)); // only when listed
    /// assert!(!http.zero_rtt_allows(&Method::POST)); // never
    /// ```
    pub fn zero_rtt_allows(&self, method: &http::Method) -> bool {
        self.zero_rtt
            && self
                .zero_rtt_methods
                .iter()
                .any(|m| m.as_str() == method.as_str())
    }

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
        for (i, method) in self.zero_rtt_methods.iter().enumerate() {
            c.when(
                !IDEMPOTENT_METHODS.contains(&method.as_str()),
                &format!("zero_rtt_methods[{i}]"),
                || {
                    format!(
                        "`{method}` cannot go as 0-RTT early data, which can be replayed: only the idempotent methods {} may be listed, in capitals",
                        IDEMPOTENT_METHODS.join(", ")
                    )
                },
            );
        }
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

    fn with_methods(zero_rtt: bool, methods: &[&str]) -> HttpPolicy {
        HttpPolicy {
            zero_rtt,
            zero_rtt_methods: methods.iter().map(|m| (*m).to_owned()).collect(),
            ..HttpPolicy::default()
        }
    }

    #[test]
    fn only_safe_methods_go_early_by_default() {
        use http::Method;
        let mut http = HttpPolicy::default();
        assert_eq!(http.zero_rtt_methods, ["GET", "HEAD", "OPTIONS", "TRACE"]);
        let all = [
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::TRACE,
            Method::PUT,
            Method::DELETE,
            Method::POST,
            Method::PATCH,
            Method::CONNECT,
        ];
        // Off: nothing goes early.
        for m in &all {
            assert!(!http.zero_rtt_allows(m), "{m}");
        }
        http.zero_rtt = true;
        for m in &all {
            let safe = matches!(m.as_str(), "GET" | "HEAD" | "OPTIONS" | "TRACE");
            assert_eq!(http.zero_rtt_allows(m), safe, "{m}");
        }
    }

    #[test]
    fn put_and_delete_go_early_only_when_listed() {
        use http::Method;
        let opted = with_methods(true, &["GET", "PUT", "DELETE"]);
        assert!(opted.zero_rtt_allows(&Method::PUT));
        assert!(opted.zero_rtt_allows(&Method::DELETE));
        assert!(opted.zero_rtt_allows(&Method::GET));
        // The list replaces the default: what it leaves out waits.
        assert!(!opted.zero_rtt_allows(&Method::HEAD));
        assert!(!opted.zero_rtt_allows(&Method::POST));
        // Listed, but 0-RTT off.
        assert!(!with_methods(false, &["PUT"]).zero_rtt_allows(&Method::PUT));
        // An empty list: nothing goes early.
        assert!(!with_methods(true, &[]).zero_rtt_allows(&Method::GET));
    }

    #[test]
    fn zero_rtt_methods_are_the_idempotent_ones_in_capitals() {
        let check = |http: &HttpPolicy| {
            let mut problems = Vec::new();
            http.check(
                &TlsPolicy::default(),
                &mut Checker::new("http", &mut problems),
            );
            problems
        };
        let all = with_methods(true, &["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]);
        assert!(check(&all).is_empty());
        assert!(check(&HttpPolicy::default()).is_empty());
        let bad = with_methods(true, &["GET", "POST", "put", "PATCH"]);
        let problems = check(&bad);
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "http.zero_rtt_methods[1]",
                "http.zero_rtt_methods[2]",
                "http.zero_rtt_methods[3]"
            ]
        );
        assert!(problems[0].reason.contains("`POST`"), "{}", problems[0]);
        assert!(problems[0].reason.contains("replayed"), "{}", problems[0]);
    }

    #[test]
    fn zero_rtt_methods_default_when_absent() {
        let http: HttpPolicy = serde_json::from_str(r#"{"zero_rtt": true}"#).unwrap();
        assert_eq!(
            http,
            with_methods(true, &["GET", "HEAD", "OPTIONS", "TRACE"])
        );
        let http: HttpPolicy =
            serde_json::from_str(r#"{"zero_rtt": true, "zero_rtt_methods": ["GET", "PUT"]}"#)
                .unwrap();
        assert_eq!(http.zero_rtt_methods, ["GET", "PUT"]);
    }
}
