//! How a call names and shows its URL: the host label policies, keys and events use, and
//! the URL as events show it (no userinfo, query or fragment).

use url::Url;

use soulbase_net_core::redact_url;

/// The host of a URL as policies and keys name it: without an IPv6 literal's brackets.
pub(crate) fn host_of(url: &Url) -> &str {
    url.as_str().get(host_span(url)).unwrap_or_default()
}

/// Where the host is in `url`'s text: as the URL parser wrote it, without an IPv6 literal's
/// brackets. A call finds it once, so that its host label, read by every event and limiter,
/// is a slice rather than a search.
pub(crate) fn host_span(url: &Url) -> std::ops::Range<usize> {
    let (start, end) = (
        url[..url::Position::BeforeHost].len(),
        url[..url::Position::AfterHost].len(),
    );
    match url.as_str().get(start..end) {
        Some(host) if host.starts_with('[') && host.ends_with(']') => start + 1..end - 1,
        _ => start..end,
    }
}

/// The URL as events show it: without userinfo, query or fragment. `validate` refuses
/// userinfo, so this is the parsed URL up to its path, cut without searching again.
pub(crate) fn shown_url(url: &Url) -> String {
    if url.username().is_empty() && url.password().is_none() {
        url[..url::Position::AfterPath].to_owned()
    } else {
        redact_url(url.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_drop_query_and_fragment() {
        let url = Url::parse("https://api.example:8443/a/b?token=1#f").unwrap();
        assert_eq!(shown_url(&url), "https://api.example:8443/a/b");
    }

    #[test]
    fn the_host_is_named_as_policies_name_it() {
        for (raw, host) in [
            ("https://API.Example.com/a", "api.example.com"),
            ("http://api.example.com:8080/a?q=1", "api.example.com"),
            ("http://127.0.0.1:9/", "127.0.0.1"),
            ("http://[::1]:8080/x", "::1"),
            ("https://[2001:DB8::1]/", "2001:db8::1"),
            ("https://bücher.example/", "xn--bcher-kva.example"),
            ("http://a.b/", "a.b"),
        ] {
            let url = Url::parse(raw).unwrap();
            assert_eq!(host_of(&url), host, "{raw}");
            assert_eq!(&url.as_str()[host_span(&url)], host, "{raw}");
        }
    }
}
