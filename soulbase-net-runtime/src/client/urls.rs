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
/// is a slice rather than a search. Found from the slice `host_str` returns, where it is in
/// the text: indexing the URL by `url::Position` walks its components instead.
pub(crate) fn host_span(url: &Url) -> std::ops::Range<usize> {
    let found = url
        .host_str()
        .and_then(|host| Some((offset_in(url.as_str(), host)?, host)));
    let Some((start, host)) = found else {
        // No host (or, were `url` ever to hand out a copy, by position).
        let (start, end) = (
            url[..url::Position::BeforeHost].len(),
            url[..url::Position::AfterHost].len(),
        );
        return start..end;
    };
    let end = start + host.len();
    if host.starts_with('[') && host.ends_with(']') {
        start + 1..end - 1
    } else {
        start..end
    }
}

/// Where the URL is cut for events when it has no userinfo (see [`shown_url`]): its length
/// up to the end of the path, before a query or a fragment; `None` when it has userinfo
/// (the only place a URL holds credentials: the `user:password@` just before the host).
pub(crate) fn shown_prefix(url: &Url) -> Option<usize> {
    let text = url.as_str();
    let credentials = match url.host_str().and_then(|host| offset_in(text, host)) {
        // Userinfo, when there is one, ends in the `@` right before the host.
        Some(at) => {
            at.checked_sub(1)
                .and_then(|before| text.as_bytes().get(before))
                == Some(&b'@')
        }
        None => !url.username().is_empty() || url.password().is_some(),
    };
    if credentials {
        return None;
    }
    // `query` and `fragment` are slices just after their `?` and `#`.
    match url.query().or_else(|| url.fragment()) {
        None => Some(text.len()),
        Some(rest) => match offset_in(text, rest) {
            Some(at) => Some(at.saturating_sub(1)),
            None => Some(url[..url::Position::AfterPath].len()),
        },
    }
}

/// Where `part` starts in `text`, when it is a slice of it (`url`'s accessors hand out
/// slices of its text).
fn offset_in(text: &str, part: &str) -> Option<usize> {
    let at = part.as_ptr().addr().checked_sub(text.as_ptr().addr())?;
    (at + part.len() <= text.len()).then_some(at)
}

/// The URL as events show it: without userinfo, query or fragment. `validate` refuses
/// userinfo, so this is the parsed URL up to its path, cut without searching again.
pub(crate) fn shown_url(url: &Url) -> String {
    match shown_prefix(url) {
        Some(len) => url
            .as_str()
            .get(..len)
            .map_or_else(|| redact_url(url.as_str()), str::to_owned),
        None => redact_url(url.as_str()),
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
    fn the_shown_prefix_is_the_url_up_to_its_path_unless_it_has_userinfo() {
        for raw in [
            "https://api.example:8443/a/b?token=1#f",
            "https://api.example/a?",
            "https://api.example/a#",
            "https://api.example/a#frag?not-a-query",
            "https://api.example/?q",
            "http://[::1]:8080/x?y",
            "https://bücher.example/ä?ö#ü",
            "http://user@h.example/p?q",
            "http://:pw@h.example/p",
            "http://user:pw@[::1]/p#f",
            "http://h.example/@/p",
            "http://h.example/p?a@b",
            "unix:/run/socket",
            "data:text/plain,x?y#z",
        ] {
            let url = Url::parse(raw).unwrap();
            let credentials = !url.username().is_empty() || url.password().is_some();
            let expected = (!credentials).then(|| url[..url::Position::AfterPath].len());
            assert_eq!(shown_prefix(&url), expected, "{raw}");
            if credentials {
                assert!(!shown_url(&url).contains("pw"), "{raw}");
            }
        }
    }

    #[test]
    fn an_offset_is_found_only_for_a_slice_of_the_text() {
        let text = "http://h.example/a?b";
        assert_eq!(offset_in(text, &text[7..16]), Some(7));
        assert_eq!(offset_in(text, &text[20..]), Some(20));
        let copy = text[7..16].to_owned();
        assert_eq!(offset_in(text, &copy), None);
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
            ("http://user:pw@a.b:81/", "a.b"),
            ("http://u@[::1]/", "::1"),
            ("unix:/run/socket", ""),
        ] {
            let url = Url::parse(raw).unwrap();
            assert_eq!(host_of(&url), host, "{raw}");
            assert_eq!(&url.as_str()[host_span(&url)], host, "{raw}");
        }
    }
}
