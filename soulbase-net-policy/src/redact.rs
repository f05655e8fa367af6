//! Credentials in what a policy shows: its `Debug`, `Snapshot::explain`, its problems.
//!
//! A policy holds a few credentials, all where a person writes them into a policy file:
//!
//! | path (relative to a policy) | what it holds                 | shown as                          |
//! | --------------------------- | ----------------------------- | --------------------------------- |
//! | `proxy.http_proxy`          | a URL, maybe `user:password@` | `http://user:***@host:port/`      |
//! | `proxy.https_proxy`         | a URL, maybe `user:password@` | `https://user:***@host:port/`     |
//! | `endpoints.urls[i]`         | URLs, maybe `user:password@`  | `https://user:***@host:port/`     |
//! | `tls.mtls.client_key_pem`   | the mTLS private key          | `<redacted>`                      |
//!
//! A URL's query and fragment, which may carry tokens, are masked too (`?***`, `#***`).
//! (The `[store]` section's URLs and passwords are shown by scheme, host and port only; see
//! `store/check.rs`.) A policy holds no header values, bearer tokens or signing keys:
//! `security.strip_headers` and `cross_origin_strip_headers` are header names, and the interceptors keep their own secrets.
//!
//! Only showing changes: the fields keep their values, for the client to use, and a document
//! serialises (`to_toml_string`, `to_value`) exactly as written.
//!
//! Why by path rather than a wrapper type around each secret: the fields are plain `String`s
//! of a public, serialisable API, and a document's sections are value trees that never become
//! typed fields until they are merged; one table of paths serves the typed `Debug`s, the value
//! trees and the error messages alike.

use std::borrow::Cow;

use serde_json::Value;

/// What replaces a secret shown whole (the mTLS key), as `MtlsCfg`'s `Debug` writes it.
pub(crate) const REDACTED: &str = "<redacted>";

/// What replaces the password of a URL.
const MASK: &str = "***";

/// How a credential-bearing field is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A URL, or a list of them: the password of its user info masked.
    Url,
    /// A secret as a whole.
    Whole,
}

/// Every credential-bearing field of a policy, by path (see the module's table).
const SECRETS: [(&[&str], Kind); 4] = [
    (&["proxy", "http_proxy"], Kind::Url),
    (&["proxy", "https_proxy"], Kind::Url),
    (&["endpoints", "urls"], Kind::Url),
    (&["tls", "mtls", "client_key_pem"], Kind::Whole),
];

/// `url` with the password of its user info, its query and its fragment masked:
/// `http://user:***@proxy.internal:3128/`, `https://eu.api.example.com/?***`; as written when
/// it has none of them.
///
/// The user name stays: it says who the proxy or server sees, and is not a secret. (Compare
/// `soulbase_net_core::redact_url`, for request URLs in errors and logs, which drops the whole
/// user info, query and fragment.)
///
/// A URL that does not parse (or has no host, like `user:pw@proxy:3128`, which parses with the
/// scheme `user`) is masked in its text: everything between the first `:` of the user info and
/// its last `@`, and everything from the first `?` or `#` after it.
pub(crate) fn url(url: &str) -> Cow<'_, str> {
    if let Ok(mut parsed) = url::Url::parse(url) {
        if parsed.has_host() {
            if parsed.password().is_none()
                && parsed.query().is_none()
                && parsed.fragment().is_none()
            {
                return Cow::Borrowed(url);
            }
            let password = match parsed.password() {
                Some(_) => parsed.set_password(Some(MASK)),
                None => Ok(()),
            };
            if password.is_ok() {
                if parsed.query().is_some() {
                    parsed.set_query(Some(MASK));
                }
                if parsed.fragment().is_some() {
                    parsed.set_fragment(Some(MASK));
                }
                return Cow::Owned(parsed.into());
            }
        }
    }
    url_text(url)
}

/// [`url`] on text that is not a URL with a host: the user info is what precedes the last `@`
/// after the scheme, its password what follows its first `:`; the query or fragment starts at
/// the first `?` or `#` after the user info.
fn url_text(text: &str) -> Cow<'_, str> {
    let start = text.find("://").map_or(0, |i| i + 3);
    let rest = &text[start..];
    let (userinfo, host) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let password = userinfo.and_then(|u| u.find(':'));
    let tail = host.find(['?', '#']);
    if password.is_none() && tail.is_none() {
        return Cow::Borrowed(text);
    }
    let mut out = text[..start].to_owned();
    if let Some(u) = userinfo {
        match password {
            Some(colon) => out.push_str(&format!("{}:{MASK}@", &u[..colon])),
            None => out.push_str(&format!("{u}@")),
        }
    }
    match tail {
        Some(i) => {
            out.push_str(&host[..i]);
            out.push_str(&host[i..=i]);
            out.push_str(MASK);
        }
        None => out.push_str(host),
    }
    Cow::Owned(out)
}

/// A partial or whole policy's value tree (a document's section, a serialised `NetPolicy`)
/// with every credential-bearing field masked.
///
/// A field's value is masked by its kind; a table above it that is not a table (a string
/// where `proxy` or `tls.mtls` should be, in a document not yet validated) is masked whole.
pub(crate) fn section(tree: &Value) -> Value {
    let mut out = tree.clone();
    for (path, kind) in SECRETS {
        mask_at(&mut out, path, kind);
    }
    out
}

/// The value of the leaf at `path` (keys of a policy's value tree) as it may be shown.
pub(crate) fn leaf(path: &[&str], value: &Value) -> Value {
    let mut out = value.clone();
    for (secret, kind) in SECRETS {
        if path.starts_with(secret) {
            mask(&mut out, kind);
        } else if secret.starts_with(path) {
            // A leaf above a secret (an empty table, a non-table): whatever it holds.
            mask(&mut out, Kind::Whole);
        }
    }
    out
}

/// Whether a problem at the field `keys` (a policy's keys, outermost first) concerns a
/// credential-bearing field: the field itself, inside it, or a table that holds one.
pub(crate) fn concerns_secret(keys: &[&str]) -> bool {
    SECRETS
        .iter()
        .any(|(secret, _)| secret.starts_with(keys) || keys.starts_with(secret))
}

/// `message` with every double-quoted text masked: what serde writes about a value it got
/// (`invalid type: string "http://u:pw@h", expected struct ProxyPolicy`), for a problem that
/// [`concerns_secret`].
pub(crate) fn quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '"' {
            continue;
        }
        // Skip the quoted text, written as Rust's `{:?}` writes it (`\"` and `\\` escaped).
        let mut closed = false;
        while let Some(q) = chars.next() {
            match q {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    closed = true;
                    break;
                }
                _ => {}
            }
        }
        out.push_str(REDACTED);
        if closed {
            out.push('"');
        }
    }
    out
}

/// Masks the field at `path` of `tree`, if the tree reaches it.
fn mask_at(tree: &mut Value, path: &[&str], kind: Kind) {
    let Some((first, rest)) = path.split_first() else {
        mask(tree, kind);
        return;
    };
    match tree {
        Value::Object(map) => {
            if let Some(next) = map.get_mut(*first) {
                mask_at(next, rest, kind);
            }
        }
        other => mask(other, Kind::Whole),
    }
}

/// Masks `value` as `kind` shows it: each string of it, at any depth.
fn mask(value: &mut Value, kind: Kind) {
    match value {
        Value::String(s) => {
            let shown = match kind {
                Kind::Url => url(s).into_owned(),
                Kind::Whole => REDACTED.to_owned(),
            };
            *s = shown;
        }
        Value::Array(items) => items.iter_mut().for_each(|v| mask(v, kind)),
        Value::Object(map) => map.values_mut().for_each(|v| mask(v, Kind::Whole)),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// The `Debug` of a list of URLs, each [`url`]-masked.
pub(crate) fn urls(urls: &[String]) -> Vec<Cow<'_, str>> {
    urls.iter().map(|u| url(u)).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_url_loses_its_password_and_keeps_the_rest() {
        let cases = [
            (
                "http://alice:pw@proxy.internal:3128",
                "http://alice:***@proxy.internal:3128/",
            ),
            ("https://:pw@proxy.internal", "https://:***@proxy.internal/"),
            ("http://proxy.internal:3128", "http://proxy.internal:3128"),
            ("http://alice@proxy.internal", "http://alice@proxy.internal"),
            // Not URLs with a host: masked in the text.
            ("alice:pw@proxy:3128", "alice:***@proxy:3128"),
            ("http://alice:pw@", "http://alice:***@"),
            ("http://alice:pw@pro xy:1", "http://alice:***@pro xy:1"),
            ("http://alice:p/w:x@proxy", "http://alice:***@proxy"),
            (
                "http://alice:p@w@proxy:99999",
                "http://alice:***@proxy:99999",
            ),
            (
                "socks5://alice:pw@proxy:1080",
                "socks5://alice:***@proxy:1080",
            ),
            ("not a url", "not a url"),
        ];
        for (raw, shown) in cases {
            assert_eq!(url(raw), shown, "{raw}");
        }
    }

    #[test]
    fn sections_are_masked_by_path_and_nothing_else_changes() {
        let tree = json!({
            "proxy": {"http_proxy": "http://u:pw@p:1", "no_proxy": ["u:pw@x"]},
            "endpoints": {"urls": ["https://u:pw@e", 7]},
            "tls": {"mtls": {"client_cert_pem": "CERT", "client_key_pem": "KEY"}},
            "retry": {"max_attempts": 2},
        });
        assert_eq!(
            section(&tree),
            json!({
                "proxy": {"http_proxy": "http://u:***@p:1/", "no_proxy": ["u:pw@x"]},
                "endpoints": {"urls": ["https://u:***@e/", 7]},
                "tls": {"mtls": {"client_cert_pem": "CERT", "client_key_pem": REDACTED}},
                "retry": {"max_attempts": 2},
            })
        );
        // What stands where a table should is masked whole; null switches a section off.
        assert_eq!(
            section(
                &json!({"proxy": "http://u:pw@p", "tls": {"mtls": ["KEY"]}, "endpoints": null})
            ),
            json!({"proxy": REDACTED, "tls": {"mtls": [REDACTED]}, "endpoints": null})
        );
        assert_eq!(section(&json!("KEY")), json!(REDACTED));
    }

    #[test]
    fn leaves_are_masked_by_path() {
        assert_eq!(
            leaf(&["proxy", "https_proxy"], &json!("http://u:pw@p")),
            json!("http://u:***@p/")
        );
        assert_eq!(
            leaf(&["tls", "mtls", "client_key_pem"], &json!("KEY")),
            json!(REDACTED)
        );
        assert_eq!(leaf(&["tls", "mtls"], &json!({})), json!({}));
        assert_eq!(
            leaf(&["dns", "prefetch"], &json!(["u:pw@x"])),
            json!(["u:pw@x"])
        );
    }

    #[test]
    fn quoted_text_is_masked_in_messages() {
        assert_eq!(
            quoted(r#"invalid type: string "http://u:p\"w@h", expected struct ProxyPolicy"#),
            r#"invalid type: string "<redacted>", expected struct ProxyPolicy"#
        );
        assert_eq!(quoted("unknown field `x`"), "unknown field `x`");
        assert_eq!(quoted(r#"cut "short"#), r#"cut "<redacted>"#);
        assert!(concerns_secret(&["proxy"]));
        assert!(concerns_secret(&[]));
        assert!(concerns_secret(&["endpoints", "urls"]));
        assert!(!concerns_secret(&["retry", "max_attempts"]));
        assert!(!concerns_secret(&["proxy", "no_proxy"]));
    }
}
