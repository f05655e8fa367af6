//! The `Cache-Control` directives the cache acts on.

use soulbase_net_core::http::{header, HeaderMap};

/// `no-store`, `no-cache`, `private`, `max-age`, `s-maxage`, `must-revalidate` (and
/// `proxy-revalidate`, its shared-cache twin) and `stale-while-revalidate` of every
/// `Cache-Control` header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Directives {
    /// `no-store`.
    pub no_store: bool,
    /// `no-cache`.
    pub no_cache: bool,
    /// `private`.
    pub private: bool,
    /// `must-revalidate` or `proxy-revalidate`.
    pub must_revalidate: bool,
    /// `max-age`, in seconds (the smallest when repeated; 0 when malformed).
    pub max_age: Option<u64>,
    /// `s-maxage`, in seconds (as `max_age`).
    pub s_maxage: Option<u64>,
    /// `stale-while-revalidate`, in seconds.
    pub stale_while_revalidate: Option<u64>,
}

impl Directives {
    /// The directives of every `Cache-Control` field line of `headers`; unknown ones are
    /// ignored.
    pub fn parse(headers: &HeaderMap) -> Self {
        let mut d = Directives::default();
        for value in headers.get_all(header::CACHE_CONTROL) {
            let Ok(value) = value.to_str() else { continue };
            for item in value.split(',') {
                let (name, arg) = match item.split_once('=') {
                    Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                    None => (item.trim(), None),
                };
                match name.to_ascii_lowercase().as_str() {
                    "no-store" => d.no_store = true,
                    "no-cache" => d.no_cache = true,
                    "private" => d.private = true,
                    "must-revalidate" | "proxy-revalidate" => d.must_revalidate = true,
                    "max-age" => d.max_age = Some(seconds(arg, d.max_age)),
                    "s-maxage" => d.s_maxage = Some(seconds(arg, d.s_maxage)),
                    "stale-while-revalidate" => {
                        d.stale_while_revalidate = arg.and_then(|a| a.parse::<u64>().ok());
                    }
                    _ => {}
                }
            }
        }
        d
    }
}

/// A delta-seconds argument, the smaller when repeated; a malformed one makes the response
/// stale (RFC 9111 §4.2.1).
fn seconds(arg: Option<&str>, before: Option<u64>) -> u64 {
    let secs = arg.and_then(|a| a.parse::<u64>().ok()).unwrap_or(0);
    before.map_or(secs, |b| b.min(secs))
}

#[cfg(test)]
mod tests {
    use soulbase_net_core::http::HeaderValue;

    use super::*;

    fn parse(values: &[&'static str]) -> Directives {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::CACHE_CONTROL, HeaderValue::from_static(v));
        }
        Directives::parse(&h)
    }

    #[test]
    fn directives() {
        assert_eq!(parse(&[]), Directives::default());
        let d = parse(&["public, Max-Age=\"60\"", "no-cache"]);
        assert_eq!(
            (d.max_age, d.no_cache, d.no_store, d.private),
            (Some(60), true, false, false)
        );
        let d = parse(&["no-store, private, max-age=x"]);
        assert_eq!((d.max_age, d.no_store, d.private), (Some(0), true, true));
        assert_eq!(parse(&["max-age=60, max-age=5"]).max_age, Some(5));
        assert_eq!(
            parse(&["max-age=0, stale-while-revalidate=30"]).stale_while_revalidate,
            Some(30)
        );
        let d = parse(&["s-maxage=30, Must-Revalidate", "s-maxage=10"]);
        assert_eq!(
            (d.s_maxage, d.max_age, d.must_revalidate),
            (Some(10), None, true)
        );
        assert!(parse(&["proxy-revalidate"]).must_revalidate);
    }
}
