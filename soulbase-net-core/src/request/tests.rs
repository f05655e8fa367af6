use bytes::Bytes;
use http_body_util::Full;
use proptest::prelude::*;

use super::*;
use crate::{ErrorCode, ErrorKind};

fn invalid(req: &NetRequest) -> String {
    let err = req.validate(1024).expect_err("request must be refused");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
    assert_eq!(err.attempts(), 0);
    err.to_string()
}

#[test]
fn relative_url_is_refused() {
    let msg = invalid(&NetRequest::get("/v1/users"));
    assert!(msg.contains("url is relative"), "{msg}");
}

#[test]
fn unparsable_url_is_refused() {
    let msg = invalid(&NetRequest::get("http://exa mple.com/"));
    assert!(msg.contains("url cannot be parsed"), "{msg}");
}

#[test]
fn non_http_schemes_are_refused() {
    for url in [
        "ftp://h.example/x",
        "file:///etc/passwd",
        "gopher://h.example/",
        "ws://h.example/",
    ] {
        let msg = invalid(&NetRequest::get(url));
        assert!(msg.contains("is not http or https"), "{url}: {msg}");
    }
}

#[test]
fn userinfo_is_refused_and_never_echoed() {
    for url in [
        "http://user:secret@h.example/",
        "https://user@h.example/",
        "http://:secret@h.example/",
    ] {
        let msg = invalid(&NetRequest::get(url));
        assert!(msg.contains("url has userinfo"), "{url}: {msg}");
        assert!(!msg.contains("secret"), "{msg}");
    }
}

#[test]
fn numeric_hosts_that_are_not_canonical_ipv4_are_refused() {
    for (url, means) in [
        ("http://2130706433/", "127.0.0.1"),
        ("http://0x7f.1/", "127.0.0.1"),
        ("http://127.1/", "127.0.0.1"),
        ("http://0177.0.0.1:8080/x", "127.0.0.1"),
        ("http://10.0.0.011/", "10.0.0.9"),
    ] {
        let msg = invalid(&NetRequest::get(url));
        assert!(msg.contains("not a canonical IPv4 address"), "{url}: {msg}");
        assert!(msg.contains(means), "{url}: {msg}");
    }
    // Canonical literals are valid requests (the address guard decides whether they may be
    // dialled).
    for url in [
        "http://127.0.0.1:8080/",
        "http://10.1.2.3/",
        "http://[::1]:80/",
        "https://api.example.com/",
    ] {
        NetRequest::get(url).validate(1024).expect(url);
    }
}

#[test]
fn numeric_hosts_hidden_from_a_second_parse_are_refused() {
    // The host the URL parser takes, not the text after some later `://`.
    for url in [
        "http:0x5db8d822/?://93.184.216.34",
        "http:0x5db8d822/#://93.184.216.34",
        "http:/0x5db8d822/?://93.184.216.34",
        "http:\\\\2130706433/",
        "  http://127.1/",
        "ht\ttp://0x7f.1/",
        "http://0x7f\t.1/",
        "HTTP:2130706433",
    ] {
        let msg = invalid(&NetRequest::get(url));
        assert!(msg.contains("not a canonical IPv4 address"), "{url}: {msg}");
    }
    NetRequest::get("http:93.184.216.34/?://0x5db8d822")
        .validate(1024)
        .expect("a canonical host with a query that looks like one");
}

#[test]
fn references_are_checked_against_their_own_authority() {
    let base = Url::parse("http://127.0.0.1:8080/a/b").unwrap();
    for bad in [
        "http://0x5db8d822/",
        "//2130706433/x",
        "\\\\127.1/",
        "https:0x7f.1/",
        "http:\\/0x7f.1/",
    ] {
        let err = check_url(Some(&base), bad).unwrap_err();
        assert!(
            err.to_string().contains("not a canonical IPv4 address"),
            "{bad}: {err}"
        );
    }
    for (good, expect) in [
        ("/c", "http://127.0.0.1:8080/c"),
        ("c?x=//0x7f.1", "http://127.0.0.1:8080/a/c?x=//0x7f.1"),
        ("http:/c", "http://127.0.0.1:8080/c"),
        ("http:c", "http://127.0.0.1:8080/a/c"),
        ("//127.0.0.2:9/", "http://127.0.0.2:9/"),
        ("https://api.example.com/", "https://api.example.com/"),
    ] {
        assert_eq!(
            check_url(Some(&base), good).unwrap().as_str(),
            expect,
            "{good}"
        );
    }
    assert!(check_url(Some(&base), "ftp://h/").is_err());
    assert!(check_url(Some(&base), "http://u:p@h/").is_err());
}

#[test]
fn header_with_cr_or_lf_is_refused_with_its_name() {
    let msg = invalid(&NetRequest::get("http://h.example/").header("x-evil", "a\r\nInjected: 1"));
    assert!(msg.contains("header `x-evil`"), "{msg}");
    let msg = invalid(&NetRequest::get("http://h.example/").header("x-nul", b"a\0b"));
    assert!(msg.contains("header `x-nul`"), "{msg}");
    let msg = invalid(&NetRequest::get("http://h.example/").header("bad name", "v"));
    assert!(msg.contains("header name `bad name`"), "{msg}");
}

#[test]
fn the_first_building_mistake_is_the_one_reported() {
    let req = NetRequest::get("http://h.example/")
        .header("x-a", "1\n")
        .header("x-b", "2\r");
    let msg = invalid(&req);
    assert!(msg.contains("x-a") && !msg.contains("x-b"), "{msg}");
}

#[test]
fn body_over_max_req_bytes_is_refused_with_both_sizes() {
    let req = NetRequest::post("http://h.example/").body(vec![0u8; 2000]);
    let msg = invalid(&req);
    assert!(
        msg.contains("2000 bytes") && msg.contains("1024 bytes"),
        "{msg}"
    );
    assert!(msg.contains("max_req_bytes"), "{msg}");
    let json = NetRequest::post("http://h.example/")
        .json(&serde_json::json!({"blob": "x".repeat(1100)}))
        .unwrap();
    invalid(&json);
    let stream = NetRequest::post("http://h.example/")
        .body(Body::stream(Full::new(Bytes::from(vec![1u8; 1025]))));
    invalid(&stream);
    // At the limit is fine.
    NetRequest::post("http://h.example/")
        .body(vec![0u8; 1024])
        .validate(1024)
        .unwrap();
}

#[test]
fn errors_say_where_without_secrets() {
    let err = NetRequest::get("https://h.example/p?token=abc")
        .header("x", "\r")
        .validate(1024)
        .unwrap_err();
    assert_eq!(err.context(), Some("GET https://h.example/p"));
    assert!(!err.to_string().contains("token"));
}

#[test]
fn query_pairs_are_appended_and_replace_same_names() {
    let url = NetRequest::get("https://h.example/s?a=1&b=2&a=3#top")
        .query("a", "x y")
        .query("c", "&=")
        .validate(1024)
        .unwrap();
    assert_eq!(url.as_str(), "https://h.example/s?b=2&a=x+y&c=%26%3D#top");
}

#[test]
fn retry_rules_follow_the_seed() {
    assert!(NetRequest::get("http://h/").is_retryable_method());
    assert!(NetRequest::head("http://h/").is_retryable_method());
    assert!(NetRequest::options("http://h/").is_retryable_method());
    assert!(!NetRequest::post("http://h/").is_retryable_method());
    assert!(!NetRequest::put("http://h/").is_retryable_method());
    assert!(!NetRequest::delete("http://h/").is_retryable_method());
    assert!(NetRequest::post("http://h/")
        .idempotent(true)
        .is_retryable_method());
    let streamed = NetRequest::put("http://h/")
        .idempotent(true)
        .body(Body::stream(Full::new(Bytes::from_static(b"x"))));
    assert!(streamed.is_retryable_method());
    assert!(!streamed.is_replayable(), "a stream body is never replayed");
    assert!(streamed.try_clone().is_none());
}

#[test]
fn try_clone_copies_everything_replayable() {
    #[derive(Clone, Debug, PartialEq)]
    struct Marker(u32);
    let mut req = NetRequest::patch("http://h.example/")
        .header("x-k", "v")
        .query("q", "1")
        .body("data")
        .idempotent(true)
        .tenant("t1")
        .policy_key("pk")
        .total_timeout(Duration::from_secs(3));
    req.extensions.insert(Marker(7));
    let copy = req.try_clone().unwrap();
    assert_eq!(copy.method, Method::PATCH);
    assert_eq!(copy.url, req.url);
    assert_eq!(copy.headers, req.headers);
    assert_eq!(copy.query, req.query);
    assert_eq!(
        copy.body.to_bytes().unwrap(),
        Some(Bytes::from_static(b"data"))
    );
    assert_eq!(copy.timeout.total, Some(Duration::from_secs(3)));
    assert!(copy.idempotent);
    assert_eq!(copy.tenant.as_deref(), Some("t1"));
    assert_eq!(copy.policy_key.as_deref(), Some("pk"));
    assert_eq!(copy.extensions.get::<Marker>(), Some(&Marker(7)));
}

#[test]
fn debug_hides_header_values_and_query() {
    let req = NetRequest::get("https://u:p@h.example/x?token=abc")
        .header("authorization", "Bearer s3cr3t");
    let text = format!("{req:?}");
    assert!(
        !text.contains("s3cr3t") && !text.contains("token=abc") && !text.contains("u:p"),
        "{text}"
    );
    assert!(text.contains("authorization"));
}

#[test]
fn json_builder_reports_unserialisable_values() {
    let mut map = std::collections::HashMap::new();
    map.insert((1, 2), "v");
    let err = NetRequest::post("http://h.example/")
        .json(&map)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any header value with CR or LF anywhere is refused, never sent.
    #[test]
    fn any_value_with_cr_or_lf_is_refused(prefix in "[ -~]{0,20}", suffix in "[ -~]{0,20}", cr in any::<bool>()) {
        let bad = format!("{prefix}{}{suffix}", if cr { '\r' } else { '\n' });
        let req = NetRequest::get("http://h.example/").header("x-h", bad);
        prop_assert!(req.validate(1024).is_err());
    }

    /// Printable header values are accepted as they are.
    #[test]
    fn printable_values_are_kept(value in "[!-~][ -~]{0,30}[!-~]") {
        let req = NetRequest::get("http://h.example/").header("x-h", value.as_str());
        prop_assert!(req.validate(1024).is_ok());
        prop_assert_eq!(req.headers.get("x-h").unwrap().as_bytes(), value.as_bytes());
    }

    /// Whatever a reference is made of, an accepted IPv4 host is the base's or is written
    /// canonically in the reference.
    #[test]
    fn accepted_ipv4_hosts_are_written_canonically(
        parts in proptest::collection::vec(
            prop_oneof![
                Just("http:"), Just("https:"), Just("/"), Just("\\"), Just("\t"), Just("?"),
                Just("#"), Just("://"), Just("0x7f.1"), Just("2130706433"), Just("127.1"),
                Just("10.0.0.1"), Just("@"), Just(":80"), Just("a"), Just(" "),
            ],
            1..8,
        ),
        with_base in any::<bool>(),
    ) {
        let reference: String = parts.concat();
        let base = Url::parse("http://127.0.0.1/x/").unwrap();
        let base = with_base.then_some(&base);
        if let Ok(url) = check_url(base, &reference) {
            if let Some(url::Host::Ipv4(ip)) = url.host() {
                let from_base = base.is_some_and(|b| b.host() == url.host());
                let written = reference.replace(['\t', '\n', '\r'], "").contains(&ip.to_string());
                prop_assert!(from_base || written, "{:?} -> {}", reference, url);
            }
        }
    }

    /// Dotted-decimal IPv4 literals are accepted exactly when they are canonical.
    #[test]
    fn ipv4_literals_are_canonical_or_refused(a in 0u32..300, b in 0u32..300, pad in any::<bool>()) {
        let text = if pad { format!("0{a}.0.0.{b}") } else { format!("{a}.0.0.{b}") };
        let req = NetRequest::get(format!("http://{text}/"));
        let ok = req.validate(1024).is_ok();
        let canonical = !pad && a < 256 && b < 256;
        prop_assert_eq!(ok, canonical, "{}", text);
    }
}

#[test]
fn remembered_urls_give_the_same_answers_as_parsing() {
    // More distinct URLs than are remembered, each validated twice, interleaved with ones
    // that must keep failing: a remembered parse never changes an answer.
    for round in 0..2 {
        for i in 0..(RECENT_URLS as u16 + 4) {
            let text = format!("http://127.0.0.1:{}/p?q={i}", 8000 + i);
            let url = NetRequest::get(text.as_str()).validate(u64::MAX).unwrap();
            assert_eq!(url.as_str(), text, "round {round}");
            assert_eq!(url.port(), Some(8000 + i));
            let bad = NetRequest::get("http://127.1/").validate(u64::MAX);
            assert!(
                bad.is_err(),
                "round {round}: a non-canonical host stays refused"
            );
        }
    }
    // A remembered URL still gets the request's own query merged in.
    let plain = NetRequest::get("http://127.0.0.1:8000/p?q=0")
        .validate(u64::MAX)
        .unwrap();
    let merged = NetRequest::get("http://127.0.0.1:8000/p?q=0")
        .query("q", "9")
        .validate(u64::MAX)
        .unwrap();
    assert_eq!(plain.query(), Some("q=0"));
    assert_eq!(merged.query(), Some("q=9"));
}
