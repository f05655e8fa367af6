//! Sealing what must not rest in clear: credential headers and the URL's query are encrypted
//! with a key the caller gives (ChaCha20-Poly1305, ring) before an item is written, and opened
//! when it is claimed for delivery. Without a key, an item carrying a credential header or a
//! credential-looking query parameter is refused at enqueue: nothing secret is ever written in
//! clear — to the file, its WAL, the table or the dead letters.
//!
//! The usual way needs no key at all: store the request without its credentials and let the
//! client's interceptors (a bearer token, a signature) add them at delivery.

use base64::Engine as _;
use http::{HeaderMap, HeaderName, HeaderValue};
use ring::{
    aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN},
    rand::{SecureRandom, SystemRandom},
};
use soulbase_net_core::NetError;

/// The prefix of a sealed value (a header's value, or the whole query).
const SEALED: &str = "sealed.v1.";

/// Headers whose values are credentials: sealed with a key, refused without one. A value the
/// caller marked sensitive (`HeaderValue::set_sensitive`) counts too.
pub(crate) const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "x-auth-token",
    "x-amz-security-token",
];

/// Query parameters that look like credentials: with no key, a URL carrying one is refused.
const CREDENTIAL_PARAMS: &[&str] = &[
    "access_token",
    "api_key",
    "apikey",
    "auth",
    "code",
    "key",
    "password",
    "passwd",
    "secret",
    "session",
    "sig",
    "signature",
    "token",
    "x-amz-signature",
    "x-amz-credential",
];

/// The key that seals an item's secrets (see the module docs).
pub(crate) struct Seal {
    key: LessSafeKey,
    rng: SystemRandom,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("Seal(ChaCha20-Poly1305)")
    }
}

impl Seal {
    /// A seal with a 32-byte key.
    pub(crate) fn new(key: &[u8]) -> Result<Self, NetError> {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, key).map_err(|_| {
            NetError::invalid_request(format!(
                "an outbox seal key has 32 bytes, not {}",
                key.len()
            ))
        })?;
        Ok(Self {
            key: LessSafeKey::new(unbound),
            rng: SystemRandom::new(),
        })
    }

    /// `clear` sealed, bound to `what` (the header's name, or `query`).
    fn seal(&self, what: &str, clear: &[u8]) -> Result<String, NetError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .map_err(|_| NetError::invalid_request("the OS random source failed"))?;
        let mut data = clear.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(what.as_bytes()),
                &mut data,
            )
            .map_err(|_| NetError::invalid_request("sealing an outbox item failed"))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        Ok(format!(
            "{SEALED}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(out)
        ))
    }

    /// What [`seal`](Self::seal) sealed for `what`; `None` when `sealed` is not a sealed value
    /// of this key (another key, or changed).
    fn open(&self, what: &str, sealed: &str) -> Option<Vec<u8>> {
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(sealed.strip_prefix(SEALED)?)
            .ok()?;
        if raw.len() < NONCE_LEN + CHACHA20_POLY1305.tag_len() {
            return None;
        }
        let (nonce, data) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut data = data.to_vec();
        let clear = self
            .key
            .open_in_place(nonce, Aad::from(what.as_bytes()), &mut data)
            .ok()?;
        Some(clear.to_vec())
    }
}

/// Whether `name` (with `value`) is a credential header.
fn is_credential(name: &HeaderName, value: &HeaderValue) -> bool {
    value.is_sensitive() || CREDENTIAL_HEADERS.contains(&name.as_str())
}

/// The headers and URL of an item as they are to be stored: credentials sealed with `seal`,
/// or refused without one.
pub(crate) fn for_storage(
    seal: Option<&Seal>,
    headers: &HeaderMap,
    url: &str,
) -> Result<(HeaderMap, String), NetError> {
    let mut stored = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !is_credential(name, value) {
            stored.append(name.clone(), value.clone());
            continue;
        }
        let Some(seal) = seal else {
            return Err(NetError::invalid_request(format!(
                "header `{name}` would be stored in clear: give the store a seal key \
                 (StoreOptions::seal_key), or let an interceptor add it at delivery"
            )));
        };
        let sealed = seal.seal(name.as_str(), value.as_bytes())?;
        // Base64url after an ASCII prefix: always a valid header value.
        let sealed = HeaderValue::from_str(&sealed)
            .map_err(|_| NetError::invalid_request("a sealed header is not a header value"))?;
        stored.append(name.clone(), sealed);
    }
    let url = match url.split_once('?') {
        None => url.to_owned(),
        Some((base, query)) => {
            let (query, fragment) = match query.split_once('#') {
                Some((q, f)) => (q, Some(f)),
                None => (query, None),
            };
            let query = match seal {
                Some(seal) => seal.seal("query", query.as_bytes())?,
                None => {
                    if let Some(param) = credential_param(query) {
                        return Err(NetError::invalid_request(format!(
                            "query parameter `{param}` would be stored in clear: give the \
                             store a seal key (StoreOptions::seal_key), or let an \
                             interceptor add it at delivery"
                        )));
                    }
                    query.to_owned()
                }
            };
            match fragment {
                Some(f) => format!("{base}?{query}#{f}"),
                None => format!("{base}?{query}"),
            }
        }
    };
    Ok((stored, url))
}

/// The first parameter of `query` whose name looks like a credential.
fn credential_param(query: &str) -> Option<&str> {
    query
        .split('&')
        .filter_map(|pair| pair.split('=').next())
        .find(|name| {
            let lower = name.to_ascii_lowercase();
            CREDENTIAL_PARAMS.contains(&lower.as_str())
        })
}

/// The headers and URL of a stored item in clear, for its delivery; `Err` names what could
/// not be opened (sealed with another key, changed, or sealed while the store has no key).
pub(crate) fn opened(
    seal: Option<&Seal>,
    headers: &mut HeaderMap,
    url: &mut String,
) -> Result<(), String> {
    let sealed_headers = headers
        .iter()
        .any(|(_, v)| v.as_bytes().starts_with(SEALED.as_bytes()));
    let sealed_query = url
        .split_once('?')
        .is_some_and(|(_, q)| q.starts_with(SEALED));
    if !sealed_headers && !sealed_query {
        return Ok(());
    }
    let Some(seal) = seal else {
        return Err("the item has sealed parts and the store has no seal key".to_owned());
    };
    if sealed_headers {
        let mut clear = HeaderMap::with_capacity(headers.len());
        for (name, value) in headers.iter() {
            let Some(text) = value.to_str().ok().filter(|t| t.starts_with(SEALED)) else {
                clear.append(name.clone(), value.clone());
                continue;
            };
            let value = seal
                .open(name.as_str(), text)
                .and_then(|v| HeaderValue::from_bytes(&v).ok())
                .ok_or_else(|| {
                    format!("header `{name}` could not be opened (another seal key?)")
                })?;
            let mut value = value;
            value.set_sensitive(true);
            clear.append(name.clone(), value);
        }
        *headers = clear;
    }
    if sealed_query {
        let (base, rest) = url.split_once('?').unwrap_or((url.as_str(), ""));
        let (query, fragment) = match rest.split_once('#') {
            Some((q, f)) => (q, Some(f)),
            None => (rest, None),
        };
        let query = seal
            .open("query", query)
            .and_then(|q| String::from_utf8(q).ok())
            .ok_or_else(|| "the URL's query could not be opened (another seal key?)".to_owned())?;
        *url = match fragment {
            Some(f) => format!("{base}?{query}#{f}"),
            None => format!("{base}?{query}"),
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn credentials_are_sealed_and_opened_and_nothing_else_changes() {
        let seal = Seal::new(&[7; 32]).unwrap();
        let h = headers(&[
            ("authorization", "Bearer s3cr3t"),
            ("content-type", "application/json"),
            ("cookie", "sid=abc"),
        ]);
        let url = "https://api.example/pay?access_token=t0k3n&x=1#frag";
        let (mut stored, mut stored_url) = for_storage(Some(&seal), &h, url).unwrap();
        let text = format!("{stored:?} {stored_url}");
        for secret in ["s3cr3t", "sid=abc", "t0k3n"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(stored["content-type"], "application/json");
        assert!(stored_url.starts_with("https://api.example/pay?sealed.v1."));
        assert!(stored_url.ends_with("#frag"));
        opened(Some(&seal), &mut stored, &mut stored_url).unwrap();
        assert_eq!(stored, h);
        assert!(stored["authorization"].is_sensitive());
        assert_eq!(stored_url, url);
    }

    #[test]
    fn without_a_key_credentials_are_refused_and_plain_items_pass() {
        let err = for_storage(
            None,
            &headers(&[("Authorization", "Bearer x")]),
            "http://h/",
        )
        .unwrap_err();
        assert!(err.to_string().contains("`authorization`"), "{err}");
        let err = for_storage(None, &HeaderMap::new(), "http://h/?a=1&api_key=x").unwrap_err();
        assert!(err.to_string().contains("`api_key`"), "{err}");
        let (h, url) =
            for_storage(None, &headers(&[("x-team", "pay")]), "http://h/?page=2").unwrap();
        assert_eq!((h.len(), url.as_str()), (1, "http://h/?page=2"));
    }

    #[test]
    fn another_key_or_a_changed_value_or_another_name_does_not_open() {
        let seal = Seal::new(&[7; 32]).unwrap();
        let other = Seal::new(&[8; 32]).unwrap();
        let (stored, url) = for_storage(
            Some(&seal),
            &headers(&[("authorization", "Bearer s3cr3t")]),
            "http://h/",
        )
        .unwrap();
        let (mut h, mut u) = (stored.clone(), url.clone());
        assert!(opened(Some(&other), &mut h, &mut u).is_err());
        let (mut h, mut u) = (stored.clone(), url.clone());
        assert!(opened(None, &mut h, &mut u).is_err());
        // The same sealed value under another header's name does not open.
        let value = stored["authorization"].clone();
        let mut moved = HeaderMap::new();
        moved.insert("cookie", value);
        let mut u = url.clone();
        assert!(opened(Some(&seal), &mut moved, &mut u).is_err());
        assert!(Seal::new(&[1; 16]).is_err(), "a key has 32 bytes");
    }
}
