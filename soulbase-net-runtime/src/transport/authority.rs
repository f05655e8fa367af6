//! An authority's host and port, read in one pass over its bytes.
//!
//! `http`'s `Authority::host` and `port_u16` each search the text again (for the userinfo's
//! `@`, then the port's `:`), some 300 to 400 instructions per call; a new connection asked
//! for them five times, about 1.7 k instructions per connection opened.

use http::Uri;
use soulbase_net_core::NetError;

/// The host of `authority` as [`http::uri::Authority::host`] gives it (an IPv6 literal in
/// its brackets), and its port when it has a valid one, as
/// [`http::uri::Authority::port_u16`] gives it. Userinfo, if any, is skipped.
pub(crate) fn host_port(authority: &str) -> (&str, Option<u16>) {
    let start = authority
        .bytes()
        .rposition(|b| b == b'@')
        .map_or(0, |at| at + 1);
    let host_port = &authority[start..];
    let bytes = host_port.as_bytes();
    // The port's `:` comes after an IPv6 literal's closing bracket.
    let from = if bytes.first() == Some(&b'[') {
        bytes
            .iter()
            .position(|&b| b == b']')
            .map_or(bytes.len(), |close| close + 1)
    } else {
        0
    };
    match bytes[from..].iter().position(|&b| b == b':') {
        Some(colon) => {
            let colon = from + colon;
            (&host_port[..colon], port(&host_port[colon + 1..]))
        }
        None => (host_port, None),
    }
}

/// A port's digits as a number, `None` when they are not one (as `str::parse::<u16>`
/// reads them). A loop over at most five digits: the generic parse, with its sign and
/// radix handling, cost about as much as the rest of [`host_port`].
fn port(text: &str) -> Option<u16> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().ok();
    }
    let n = text.bytes().fold(0u32, |n, b| n * 10 + u32::from(b - b'0'));
    u16::try_from(n).ok()
}

/// `host` without an IPv6 literal's brackets.
pub(crate) fn unbracketed(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// The host of an authority (`host`, `host:port`, `[v6]:port`), without port, userinfo or
/// brackets.
pub(crate) fn host_of(authority: &str) -> &str {
    unbracketed(host_port(authority).0)
}

/// The host of `uri` without an IPv6 literal's brackets, and its port (the scheme's default
/// when it names none).
///
/// # Errors
/// `InvalidRequest` when `uri` has no host.
pub(crate) fn host_and_port(uri: &Uri, https: bool) -> Result<(&str, u16), NetError> {
    let authority = uri
        .authority()
        .ok_or_else(|| NetError::invalid_request("url has no host"))?;
    let (host, port) = host_port(authority.as_str());
    let host = unbracketed(host);
    if host.is_empty() {
        return Err(NetError::invalid_request("url has no host"));
    }
    Ok((host, port.unwrap_or(if https { 443 } else { 80 })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_http_reads() {
        for text in [
            "example.com",
            "example.com:8080",
            "user:pass@example.com:81",
            "[::1]",
            "[::1]:8443",
            "u@[2001:db8::1]:1",
            "127.0.0.1:0",
            "host:99999",
            "host:",
            "a@b@host:7",
            "host:65535",
            "host:65536",
            "host:00080",
            "host:000080",
            "h:1",
        ] {
            let parsed: http::uri::Authority = text.parse().unwrap();
            assert_eq!(
                host_port(text),
                (parsed.host(), parsed.port_u16()),
                "{text}"
            );
        }
    }

    #[test]
    fn hosts_of_authorities_lose_port_userinfo_and_brackets() {
        assert_eq!(host_of("api.example.com"), "api.example.com");
        assert_eq!(host_of("api.example.com:8443"), "api.example.com");
        assert_eq!(host_of("u@api.example.com:8443"), "api.example.com");
        assert_eq!(host_of("127.0.0.1:80"), "127.0.0.1");
        assert_eq!(host_of("[::1]:8080"), "::1");
        assert_eq!(host_of("[::1]"), "::1");
    }

    #[test]
    fn host_and_default_port_of_a_uri() {
        let uri: Uri = "https://[::1]/x".parse().unwrap();
        assert_eq!(host_and_port(&uri, true).unwrap(), ("::1", 443));
        let uri: Uri = "http://h.example:8080/".parse().unwrap();
        assert_eq!(host_and_port(&uri, false).unwrap(), ("h.example", 8080));
        let uri: Uri = "/path".parse().unwrap();
        assert!(host_and_port(&uri, false).is_err());
    }
}
