//! `A2aJws`: detached JWS (EdDSA) over the canonical JSON body, and its verification.

use std::{
    fmt,
    time::{Duration, SystemTime},
};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use ring::signature::{self, Ed25519KeyPair, KeyPair as _};
use soulbase_net_core::{
    http::{header, HeaderValue},
    Hooks, Interceptor, NetError, NetRequest,
};

const SCHEME: &str = "A2A ";

/// Signs every request: `Authorization: A2A <protected>..<signature>`, a detached JWS
/// (RFC 7515 Appendix F: the payload is left out of the serialisation) over the RFC 8785
/// canonical JSON of the body, with EdDSA (Ed25519).
///
/// The protected header is `{"alg":"EdDSA","iat":<unix seconds>,"kid":<key id>}`; the payload
/// is encoded as usual (`b64` is not used), and an empty body signs an empty payload. The
/// signature is made once per call in `before`, so retries carry the same one. The receiving
/// side checks it with [`verify`].
///
/// # Errors
/// `before` fails with `InvalidRequest` when the body is not JSON or is a stream.
///
/// # Examples
/// ```
/// use std::time::{Duration, SystemTime};
/// use ring::{rand::SystemRandom, signature::{Ed25519KeyPair, KeyPair}};
/// use soulbase_net_core::{Interceptor, NetRequest};
/// use soulbase_net_interceptors::{jws_verify, A2aJws};
///
/// let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
/// let signer = A2aJws::from_pkcs8(pkcs8.as_ref(), "agent-1").unwrap();
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let mut req = NetRequest::post("https://peer.example/a2a").json(&serde_json::json!({"b": 1, "a": 2})).unwrap();
/// signer.before(&mut req).await.unwrap();
/// let auth = req.headers["authorization"].to_str().unwrap();
/// let claims = jws_verify(auth, br#"{"a":2,"b":1}"#, signer.public_key(), Duration::from_secs(60), SystemTime::now()).unwrap();
/// assert_eq!(claims.kid.as_deref(), Some("agent-1"));
/// # });
/// ```
pub struct A2aJws {
    key: Ed25519KeyPair,
    kid: String,
}

/// What a verified signature says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwsClaims {
    /// The key id of the signer, if given.
    pub kid: Option<String>,
    /// When it was signed, in Unix seconds.
    pub iat: u64,
}

/// Why [`verify`] refused a signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JwsError {
    /// Not a detached JWS in the expected form.
    Malformed,
    /// An algorithm other than EdDSA, or a header this verifier does not understand
    /// (`crit`, `b64`).
    Unsupported,
    /// The body is not JSON.
    Body,
    /// The signature does not match the body and key.
    BadSignature,
    /// Signed outside the accepted time window.
    Expired,
}

impl fmt::Display for JwsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JwsError::Malformed => "malformed detached jws",
            JwsError::Unsupported => "unsupported jws header",
            JwsError::Body => "body is not json",
            JwsError::BadSignature => "jws signature does not match",
            JwsError::Expired => "jws signed outside the accepted window",
        })
    }
}

impl std::error::Error for JwsError {}

// === impl A2aJws ===

impl A2aJws {
    /// A signer with the Ed25519 key in `pkcs8` (v1 or v2 DER) and key id `kid`.
    ///
    /// # Errors
    /// `InvalidRequest` when `pkcs8` is not an Ed25519 PKCS#8 key.
    pub fn from_pkcs8(pkcs8: &[u8], kid: impl Into<String>) -> Result<Self, NetError> {
        let key = Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8)
            .map_err(|_| NetError::invalid_request("not an Ed25519 PKCS#8 key"))?;
        Ok(A2aJws {
            key,
            kid: kid.into(),
        })
    }

    /// The public key (32 bytes), for [`verify`].
    pub fn public_key(&self) -> &[u8] {
        self.key.public_key().as_ref()
    }

    /// The detached JWS (`<protected>..<signature>`) of `body` signed at `iat` (Unix seconds).
    ///
    /// # Errors
    /// `InvalidRequest` when `body` is neither empty nor JSON.
    pub fn sign(&self, body: &[u8], iat: u64) -> Result<String, NetError> {
        let payload = canonical(body)
            .map_err(|_| NetError::invalid_request("the body to sign is not JSON"))?;
        let protected = serde_json::json!({ "alg": "EdDSA", "iat": iat, "kid": self.kid });
        let protected = URL_SAFE_NO_PAD.encode(protected.to_string());
        let input = format!("{protected}.{}", URL_SAFE_NO_PAD.encode(payload));
        let sig = self.key.sign(input.as_bytes());
        Ok(format!(
            "{protected}..{}",
            URL_SAFE_NO_PAD.encode(sig.as_ref())
        ))
    }
}

impl fmt::Debug for A2aJws {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("A2aJws")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Interceptor for A2aJws {
    async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
        self.before_now(req)
    }

    /// What `before` does: signing waits for nothing, so the client calls it in place (see
    /// [`Hooks::BEFORE_NOW`]).
    fn before_now(&self, req: &mut NetRequest) -> Result<(), NetError> {
        let body = req
            .body_bytes()?
            .ok_or_else(|| NetError::invalid_request("a streamed body cannot be signed"))?;
        let jws = self.sign(&body, unix_secs(SystemTime::now()))?;
        let value = HeaderValue::from_str(&format!("{SCHEME}{jws}"))
            .map_err(|_| NetError::invalid_request("the key id is not a valid header value"))?;
        req.headers.insert(header::AUTHORIZATION, value);
        Ok(())
    }

    fn hooks(&self) -> Hooks {
        Hooks::BEFORE_NOW
    }

    fn name(&self) -> &'static str {
        "a2a_jws"
    }
}

/// Checks the detached JWS in `authorization` (with or without the `A2A ` scheme) against
/// `body` and the Ed25519 `public_key`, and that it was signed no more than `max_age` before
/// (or after) `now`.
///
/// # Errors
/// A [`JwsError`] saying what is wrong: a changed body or another key is
/// [`JwsError::BadSignature`], an old signature [`JwsError::Expired`].
pub fn verify(
    authorization: &str,
    body: &[u8],
    public_key: &[u8],
    max_age: Duration,
    now: SystemTime,
) -> Result<JwsClaims, JwsError> {
    let jws = authorization.trim();
    let jws = jws.strip_prefix(SCHEME).unwrap_or(jws).trim();
    let mut parts = jws.split('.');
    let (Some(protected), Some(""), Some(sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwsError::Malformed);
    };
    let header: serde_json::Value = URL_SAFE_NO_PAD
        .decode(protected)
        .ok()
        .and_then(|h| serde_json::from_slice(&h).ok())
        .ok_or(JwsError::Malformed)?;
    if header.get("alg").and_then(|a| a.as_str()) != Some("EdDSA")
        || header.get("crit").is_some()
        || header.get("b64").is_some()
    {
        return Err(JwsError::Unsupported);
    }
    let iat = header
        .get("iat")
        .and_then(serde_json::Value::as_u64)
        .ok_or(JwsError::Malformed)?;
    let sig = URL_SAFE_NO_PAD
        .decode(sig)
        .map_err(|_| JwsError::Malformed)?;
    let payload = canonical(body).map_err(|_| JwsError::Body)?;
    let input = format!("{protected}.{}", URL_SAFE_NO_PAD.encode(payload));
    signature::UnparsedPublicKey::new(&signature::ED25519, public_key)
        .verify(input.as_bytes(), &sig)
        .map_err(|_| JwsError::BadSignature)?;
    let now = unix_secs(now);
    if now.abs_diff(iat) > max_age.as_secs() {
        return Err(JwsError::Expired);
    }
    Ok(JwsClaims {
        kid: header
            .get("kid")
            .and_then(|k| k.as_str())
            .map(str::to_owned),
        iat,
    })
}

/// The RFC 8785 canonical form of a JSON body; an empty body stays empty.
fn canonical(body: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    if body.is_empty() {
        return Ok(Vec::new());
    }
    let value: serde_json::Value = serde_json::from_slice(body)?;
    serde_json_canonicalizer::to_vec(&value)
}

fn unix_secs(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

#[cfg(test)]
mod tests {
    use ring::rand::SystemRandom;

    use super::*;

    fn signer(kid: &str) -> A2aJws {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        A2aJws::from_pkcs8(pkcs8.as_ref(), kid).unwrap()
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn verify_accepts_the_body_and_rejects_changes() {
        let s = signer("k1");
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let body = br#"{"amount": 10, "to": "acct-1"}"#;
        let jws = format!("A2A {}", s.sign(body, unix_secs(at)).unwrap());
        let ok = verify(
            &jws,
            br#"{"to":"acct-1","amount":10}"#,
            s.public_key(),
            MINUTE,
            at,
        )
        .unwrap();
        assert_eq!(
            ok,
            JwsClaims {
                kid: Some("k1".into()),
                iat: 1_700_000_000
            }
        );

        let changed = br#"{"amount": 11, "to": "acct-1"}"#;
        assert_eq!(
            verify(&jws, changed, s.public_key(), MINUTE, at),
            Err(JwsError::BadSignature)
        );
        let other = signer("k1");
        assert_eq!(
            verify(&jws, body, other.public_key(), MINUTE, at),
            Err(JwsError::BadSignature)
        );
        let late = at + Duration::from_secs(61);
        assert_eq!(
            verify(&jws, body, s.public_key(), MINUTE, late),
            Err(JwsError::Expired)
        );
        assert!(verify(&jws, body, s.public_key(), MINUTE, at + MINUTE).is_ok());
        assert_eq!(
            verify(&jws, b"not json", s.public_key(), MINUTE, at),
            Err(JwsError::Body)
        );
    }

    #[test]
    fn malformed_and_unsupported() {
        let s = signer("k1");
        let jws = s.sign(b"", 0).unwrap();
        let (protected, sig) = jws.split_once("..").unwrap();
        let now = SystemTime::UNIX_EPOCH;
        for bad in ["", "a.b.c", "x..y..z", &format!("{protected}.e30.{sig}")] {
            assert_eq!(
                verify(bad, b"", s.public_key(), MINUTE, now),
                Err(JwsError::Malformed),
                "{bad}"
            );
        }
        let hs = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","iat":0}"#);
        let forged = format!("{hs}..{sig}");
        assert_eq!(
            verify(&forged, b"", s.public_key(), MINUTE, now),
            Err(JwsError::Unsupported)
        );
        assert!(verify(&jws, b"", s.public_key(), MINUTE, now).is_ok());
        assert!(A2aJws::from_pkcs8(b"nope", "k").is_err());
        assert!(!format!("{s:?}").is_empty());
    }
}
