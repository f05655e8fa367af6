use http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use soulbase_net_core::ErrorKind;
use soulbase_net_policy::{RedirectPolicy, SecurityPolicy};
use url::Url;

use super::*;

const STATUSES: [u16; 5] = [301, 302, 303, 307, 308];

fn url(s: &str) -> Url {
    Url::parse(s).unwrap()
}

fn policies() -> (RedirectPolicy, SecurityPolicy) {
    let mut security = SecurityPolicy::default();
    security.strip_headers = vec!["X-Api-Key".to_owned()];
    (RedirectPolicy::default(), security)
}

/// Decides on one 3xx from `from` to `location` with a fresh state.
fn decide_one(
    redirect: &RedirectPolicy,
    status: u16,
    method: &Method,
    from: &str,
    location: &str,
    replayable: bool,
) -> Result<Action, NetError> {
    let from = url(from);
    let location = HeaderValue::from_str(location).unwrap();
    let resp = Redirect {
        status: StatusCode::from_u16(status).unwrap(),
        location: Some(&location),
        url: &from,
        method,
        body_replayable: replayable,
    };
    decide(redirect, &SecurityPolicy::default(), &resp, 0)
}

fn follow(action: Action) -> Follow {
    match action {
        Action::Follow(f) => f,
        Action::Return => panic!("expected a follow, got a return"),
    }
}

// === credentials across origins ===

/// The credential headers of the matrix: the three built-in ones and a declared one.
fn credential_headers() -> [HeaderName; 4] {
    [
        header::AUTHORIZATION,
        header::COOKIE,
        header::PROXY_AUTHORIZATION,
        HeaderName::from_static("x-api-key"),
    ]
}

/// The headers of the caller's first request.
fn first_request_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    for name in credential_headers() {
        headers.insert(name, HeaderValue::from_static("secret"));
    }
    headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
    headers
}

struct Scenario {
    name: &'static str,
    /// The first URL, then the Location of each hop.
    chain: &'static [&'static str],
    /// Whether the credentials may be sent on each hop (one per Location).
    sent: &'static [bool],
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "same origin",
        chain: &["https://a.example/1", "/2", "https://a.example:443/3"],
        sent: &[true, true],
    },
    Scenario {
        name: "other host",
        chain: &["https://a.example/", "https://b.example/"],
        sent: &[false],
    },
    Scenario {
        name: "other port",
        chain: &["https://a.example/", "https://a.example:8443/"],
        sent: &[false],
    },
    Scenario {
        name: "http to https",
        chain: &["http://a.example/", "https://a.example/"],
        sent: &[false],
    },
    Scenario {
        name: "subdomain",
        chain: &["https://example.com/", "https://api.example.com/"],
        sent: &[false],
    },
    Scenario {
        name: "parent domain",
        chain: &["https://api.example.com/", "https://example.com/"],
        sent: &[false],
    },
    Scenario {
        name: "same origin then another",
        chain: &["https://a.example/1", "/2", "https://b.example/"],
        sent: &[true, false],
    },
    Scenario {
        name: "A→B→B",
        chain: &["https://a.example/", "https://b.example/1", "/2"],
        sent: &[false, false],
    },
    Scenario {
        name: "A→B→A",
        chain: &[
            "https://a.example/",
            "https://b.example/",
            "https://a.example/back",
        ],
        sent: &[false, false],
    },
    Scenario {
        name: "A→B→A via scheme-relative",
        chain: &["https://a.example/", "//b.example/", "//a.example/back"],
        sent: &[false, false],
    },
];

#[derive(Debug, Default)]
struct Tally {
    hops: u32,
    leaks: u32,
    restorations: u32,
    kept: u32,
    wrongly_stripped: u32,
}

/// Follows `scenario` with `status`, building each hop's headers from the first request's
/// (the worst case for restoration), and counts what each hop would carry.
fn run_chain(scenario: &Scenario, status: u16, tally: &mut Tally) {
    let (redirect, security) = policies();
    let mut current = url(scenario.chain[0]);
    let mut method = Method::POST;
    let mut state = RedirectState::new();
    let mut stripped_before = [false; 4];
    for (hop, (location, &may_send)) in scenario.chain[1..].iter().zip(scenario.sent).enumerate() {
        let location = HeaderValue::from_static(location);
        let resp = Redirect {
            status: StatusCode::from_u16(status).unwrap(),
            location: Some(&location),
            url: &current,
            method: &method,
            body_replayable: true,
        };
        let f = follow(state.next(&redirect, &security, &resp).unwrap());
        let mut headers = first_request_headers();
        state.prepare_headers(&f, &mut headers, &security.strip_headers);
        assert_eq!(
            headers[header::ACCEPT],
            "*/*",
            "{} hop {hop}",
            scenario.name
        );
        tally.hops += 1;
        for (i, name) in credential_headers().iter().enumerate() {
            let present = headers.contains_key(name);
            match (present, may_send) {
                (true, false) => tally.leaks += 1,
                (true, true) => tally.kept += 1,
                (false, true) => tally.wrongly_stripped += 1,
                (false, false) => {}
            }
            if present && stripped_before[i] {
                tally.restorations += 1;
            }
            stripped_before[i] |= !present;
        }
        current = f.url;
        method = f.method;
    }
}

#[test]
fn credentials_never_leak_across_origins_and_are_never_restored() {
    let mut tally = Tally::default();
    for scenario in SCENARIOS {
        assert_eq!(
            scenario.chain.len(),
            scenario.sent.len() + 1,
            "{}",
            scenario.name
        );
        for status in STATUSES {
            run_chain(scenario, status, &mut tally);
        }
    }
    assert_eq!(tally.leaks, 0, "{tally:?}");
    assert_eq!(tally.restorations, 0, "{tally:?}");
    assert_eq!(tally.wrongly_stripped, 0, "{tally:?}");
    // 15 hops per status, 5 statuses; kept on the 3 same-origin hops × 4 headers × 5.
    assert_eq!(tally.hops, 15 * 5, "{tally:?}");
    assert_eq!(tally.kept, 3 * 4 * 5, "{tally:?}");
}

#[test]
fn https_to_http_is_refused_for_every_status_so_nothing_is_sent() {
    let (redirect, _) = policies();
    for status in STATUSES {
        for (from, to) in [
            ("https://a.example/", "http://a.example/"),
            ("https://a.example/", "http://b.example/"),
            ("https://a.example/", "http://a.example:443/"),
        ] {
            let err = decide_one(&redirect, status, &Method::GET, from, to, true).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Blocked, "{status} {to}");
        }
    }
}

#[test]
fn a_hop_back_after_a_crossing_stays_stripped_in_the_state() {
    let (redirect, security) = policies();
    let a = url("https://a.example/");
    let mut state = RedirectState::new();
    assert!(!state.crossed_origin());
    let to_b = HeaderValue::from_static("https://b.example/");
    let resp = Redirect {
        status: StatusCode::FOUND,
        location: Some(&to_b),
        url: &a,
        method: &Method::GET,
        body_replayable: true,
    };
    let f = follow(state.next(&redirect, &security, &resp).unwrap());
    assert!(f.cross_origin && state.crossed_origin());
    let b = f.url;
    let to_a = HeaderValue::from_static("https://a.example/other");
    let resp = Redirect {
        location: Some(&to_a),
        url: &b,
        ..resp
    };
    let back = follow(state.next(&redirect, &security, &resp).unwrap());
    assert!(back.cross_origin);
    assert!(state.crossed_origin());
    assert_eq!(state.hops(), 2);
}

#[test]
fn strip_sensitive_removes_credentials_and_declared_headers_only() {
    let mut headers = first_request_headers();
    headers.append(header::COOKIE, HeaderValue::from_static("second=cookie"));
    headers.insert("x-other", HeaderValue::from_static("kept"));
    strip_sensitive(
        &mut headers,
        &["X-API-KEY".to_owned(), "not a header name".to_owned()],
    );
    for name in credential_headers() {
        assert!(!headers.contains_key(&name), "{name}");
    }
    assert_eq!(headers.len(), 2);
    assert_eq!(headers["x-other"], "kept");
    assert_eq!(headers[header::ACCEPT], "*/*");
}

// === method and body ===

#[test]
fn methods_and_bodies_follow_rfc_9110() {
    use Method as M;
    let (redirect, _) = policies();
    #[rustfmt::skip]
    let table: &[(u16, Method, Method, bool)] = &[
        (301, M::GET, M::GET, true), (301, M::HEAD, M::HEAD, true),
        (301, M::POST, M::GET, false), (301, M::PUT, M::PUT, true),
        (301, M::DELETE, M::DELETE, true),
        (302, M::GET, M::GET, true), (302, M::HEAD, M::HEAD, true),
        (302, M::POST, M::GET, false), (302, M::PUT, M::PUT, true),
        (302, M::PATCH, M::PATCH, true),
        (303, M::GET, M::GET, false), (303, M::HEAD, M::HEAD, false),
        (303, M::POST, M::GET, false), (303, M::PUT, M::GET, false),
        (303, M::DELETE, M::GET, false),
        (307, M::GET, M::GET, true), (307, M::HEAD, M::HEAD, true),
        (307, M::POST, M::POST, true), (307, M::PUT, M::PUT, true),
        (308, M::POST, M::POST, true), (308, M::DELETE, M::DELETE, true),
        (308, M::PATCH, M::PATCH, true),
    ];
    for (status, method, want_method, want_body) in table {
        let f = follow(
            decide_one(
                &redirect,
                *status,
                method,
                "https://a.example/x",
                "/y",
                true,
            )
            .unwrap(),
        );
        assert_eq!(
            (&f.method, f.keep_body),
            (want_method, *want_body),
            "{status} {method}"
        );
        assert!(!f.cross_origin);
    }
}

#[test]
fn keep_method_on_303_keeps_method_and_body() {
    let (mut redirect, _) = policies();
    redirect.keep_method_on_303 = true;
    let f = follow(
        decide_one(
            &redirect,
            303,
            &Method::POST,
            "https://a.example/",
            "/y",
            true,
        )
        .unwrap(),
    );
    assert_eq!((f.method, f.keep_body), (Method::POST, true));
}

#[test]
fn a_body_that_cannot_be_replayed_returns_the_3xx_when_it_would_be_kept() {
    let (redirect, _) = policies();
    let from = "https://a.example/";
    for (status, method, returned) in [
        (307, Method::POST, true),
        (308, Method::PUT, true),
        (301, Method::PUT, true),
        (301, Method::POST, false),
        (302, Method::POST, false),
        (303, Method::POST, false),
    ] {
        let action = decide_one(&redirect, status, &method, from, "/y", false).unwrap();
        assert_eq!(action == Action::Return, returned, "{status} {method}");
    }
}

#[test]
fn body_headers_go_when_the_body_does() {
    let (redirect, security) = policies();
    let from = url("https://a.example/");
    let mut state = RedirectState::new();
    let to = HeaderValue::from_static("/next");
    let resp = Redirect {
        status: StatusCode::SEE_OTHER,
        location: Some(&to),
        url: &from,
        method: &Method::POST,
        body_replayable: true,
    };
    let f = follow(state.next(&redirect, &security, &resp).unwrap());
    let mut headers = first_request_headers();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("12"));
    state.prepare_headers(&f, &mut headers, &security.strip_headers);
    assert!(headers.get(header::CONTENT_TYPE).is_none());
    assert!(headers.get(header::CONTENT_LENGTH).is_none());
    // Same origin: the credentials stay.
    assert_eq!(headers[header::AUTHORIZATION], "secret");
}

// === what is returned to the caller ===

#[test]
fn some_3xx_responses_are_returned_to_the_caller() {
    let (redirect, _) = policies();
    let from = "https://a.example/";
    for status in [300, 304, 305, 306, 200, 404] {
        let action = decide_one(&redirect, status, &Method::GET, from, "/y", true).unwrap();
        assert_eq!(action, Action::Return, "{status}");
    }
    let mut off = redirect.clone();
    off.enabled = false;
    for status in STATUSES {
        let action = decide_one(&off, status, &Method::GET, from, "/y", true).unwrap();
        assert_eq!(action, Action::Return, "{status}");
    }
    let from = url(from);
    let invalid = [
        HeaderValue::from_bytes(b"/caf\xe9").unwrap(),
        HeaderValue::from_static("http://[::1"),
        HeaderValue::from_static("https://"),
    ];
    for location in invalid.iter().map(Some).chain([None]) {
        let resp = Redirect {
            status: StatusCode::FOUND,
            location,
            url: &from,
            method: &Method::GET,
            body_replayable: true,
        };
        let action = decide(&redirect, &SecurityPolicy::default(), &resp, 0).unwrap();
        assert_eq!(action, Action::Return, "{location:?}");
    }
}

// === resolution ===

#[test]
fn locations_resolve_against_the_current_url() {
    let (redirect, _) = policies();
    let cases = [
        ("https://h.example/a/b?q=1", "c", "https://h.example/a/c"),
        ("https://h.example/a/b?q=1", "/x", "https://h.example/x"),
        ("https://h.example/a/b/c", "../y", "https://h.example/a/y"),
        (
            "https://h.example/a/b?q=1",
            "?z=2",
            "https://h.example/a/b?z=2",
        ),
        (
            "https://h.example/a",
            "//o.example/p",
            "https://o.example/p",
        ),
        (
            "http://h.example/a",
            "//o.example:8080/p",
            "http://o.example:8080/p",
        ),
        (
            "http://h.example/a",
            "https://O.Example/Z",
            "https://o.example/Z",
        ),
        (
            "https://h.example/a",
            "https://h.example:443/b",
            "https://h.example/b",
        ),
        (
            "https://h.example/a",
            " /spaced ",
            "https://h.example/spaced",
        ),
    ];
    for (from, location, want) in cases {
        let f = follow(decide_one(&redirect, 302, &Method::GET, from, location, true).unwrap());
        assert_eq!(f.url.as_str(), want, "{from} + {location}");
    }
}

// === refusals ===

#[test]
fn unsafe_targets_are_blocked() {
    let (redirect, _) = policies();
    let from = "https://a.example/";
    for location in [
        "ftp://a.example/file",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "data:text/plain,hi",
        "gopher://a.example/",
        "https://user:pw@a.example/",
        "https://user@b.example/",
        "//user:pw@b.example/",
        "http://a.example/",
    ] {
        let err = decide_one(&redirect, 302, &Method::GET, from, location, true).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Blocked, "{location}");
        assert!(!err.to_string().contains("pw"), "{err}");
    }
}

#[test]
fn cross_origin_hops_are_blocked_when_the_policy_says_so() {
    let (mut redirect, _) = policies();
    redirect.allow_cross_origin = false;
    let from = "http://a.example/";
    for location in [
        "http://b.example/",
        "http://a.example:81/",
        "https://a.example/",
    ] {
        let err = decide_one(&redirect, 307, &Method::GET, from, location, true).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Blocked, "{location}");
    }
    let same = decide_one(
        &redirect,
        307,
        &Method::GET,
        from,
        "http://a.example:80/x",
        true,
    );
    assert!(!follow(same.unwrap()).cross_origin);
}

// === limits and loops ===

/// Follows `/0` → `/1` → … with `status` until an error or `steps` hops.
fn chain(
    redirect: &RedirectPolicy,
    security: &SecurityPolicy,
    steps: u32,
) -> Result<u32, NetError> {
    let mut current = url("https://a.example/0");
    let mut state = RedirectState::new();
    for i in 1..=steps {
        let location = HeaderValue::from_str(&format!("/{i}")).unwrap();
        let resp = Redirect {
            status: StatusCode::FOUND,
            location: Some(&location),
            url: &current,
            method: &Method::GET,
            body_replayable: true,
        };
        current = follow(state.next(redirect, security, &resp)?).url;
    }
    Ok(state.hops())
}

#[test]
fn the_smaller_of_the_two_limits_is_enforced() {
    let (mut redirect, mut security) = policies();
    for (max, max_redirects) in [(3, 5), (5, 2), (0, 5), (5, 0), (20, 20)] {
        redirect.max = max;
        security.max_redirects = max_redirects;
        let limit = u32::from(max.min(max_redirects));
        assert_eq!(chain(&redirect, &security, limit).unwrap(), limit);
        let err = chain(&redirect, &security, limit + 1).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::RedirectLimit,
            "{max} {max_redirects}"
        );
    }
}

/// A 302 answering `GET from`, pointing at `to`.
fn get<'a>(from: &'a Url, to: &'a HeaderValue) -> Redirect<'a> {
    Redirect {
        status: StatusCode::FOUND,
        location: Some(to),
        url: from,
        method: &Method::GET,
        body_replayable: true,
    }
}

#[test]
fn loops_are_detected_before_the_limit() {
    let (mut redirect, mut security) = policies();
    redirect.max = 20;
    security.max_redirects = 20;
    let a = url("https://a.example/a");
    let b = url("https://a.example/b");
    let mut state = RedirectState::new();
    let to_b = HeaderValue::from_static("/b");
    let to_a = HeaderValue::from_static("/a#frag");
    assert!(state.next(&redirect, &security, &get(&a, &to_b)).is_ok());
    let err = state
        .next(&redirect, &security, &get(&b, &to_a))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RedirectLimit);
    assert_eq!(err.message(), Some("redirect loop"));

    // A page redirecting to itself.
    let mut state = RedirectState::new();
    let to_self = HeaderValue::from_static("/a");
    let err = state
        .next(&redirect, &security, &get(&a, &to_self))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RedirectLimit);
}

#[test]
fn post_then_get_of_the_same_url_is_not_a_loop() {
    let (redirect, security) = policies();
    let a = url("https://a.example/form");
    let mut state = RedirectState::new();
    let to_self = HeaderValue::from_static("/form");
    let resp = Redirect {
        status: StatusCode::SEE_OTHER,
        location: Some(&to_self),
        url: &a,
        method: &Method::POST,
        body_replayable: true,
    };
    let f = follow(state.next(&redirect, &security, &resp).unwrap());
    assert_eq!(f.method, Method::GET);
    // But the GET redirecting to itself again is.
    let resp = Redirect {
        method: &Method::GET,
        ..resp
    };
    let err = state.next(&redirect, &security, &resp).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RedirectLimit);
}

#[test]
fn internal_targets_are_handed_to_the_client_for_the_guard() {
    // Addresses are the address guard's business: the module hands over the exact next URL,
    // and the client checks it (and dials through the guard) like the first one.
    let (redirect, _) = policies();
    for location in [
        "http://10.0.0.1/",
        "http://169.254.169.254/latest",
        "http://[::1]:8080/",
    ] {
        let f = follow(
            decide_one(
                &redirect,
                302,
                &Method::GET,
                "http://a.example/",
                location,
                true,
            )
            .unwrap(),
        );
        assert_eq!(f.url.as_str(), location);
        assert!(f.cross_origin);
    }
}
