//! Request bodies: [`Body`] and the non-replayable [`BodyStream`].

use std::fmt;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt};

use crate::error::{BoxError, NetError};

/// The body of a [`NetRequest`](crate::NetRequest).
///
/// `Empty`, `Json` and `Bytes` bodies can be sent again, so requests carrying them may be
/// retried and hedged. A `Stream` body is read once: **a request with a stream body is never
/// retried or hedged**, whatever the policy says.
#[derive(Default)]
#[non_exhaustive]
pub enum Body {
    /// No body.
    #[default]
    Empty,
    /// A JSON value, serialised when sent (`Content-Type: application/json` unless set).
    Json(serde_json::Value),
    /// Raw bytes.
    Bytes(Bytes),
    /// A body produced while sending; not replayable.
    Stream(BodyStream),
}

/// A streamed request body: any `http_body::Body` of `Bytes`, boxed.
///
/// Its length is known only when the body says so (`size_hint().exact()`); a stream of
/// unknown length is checked against `security.max_req_bytes` while it is sent.
pub struct BodyStream {
    inner: BoxBody<Bytes, BoxError>,
}

// === impl Body ===

impl Body {
    /// A streamed body from any `http_body::Body` of `Bytes` (e.g. `StreamBody`).
    pub fn stream<B>(body: B) -> Self
    where
        B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        Body::Stream(BodyStream {
            inner: body.map_err(Into::into).boxed(),
        })
    }

    /// Whether the body can be sent again (everything but `Stream`).
    pub fn is_replayable(&self) -> bool {
        !matches!(self, Body::Stream(_))
    }

    /// Whether there is no body.
    pub fn is_empty(&self) -> bool {
        match self {
            Body::Empty => true,
            Body::Bytes(b) => b.is_empty(),
            Body::Json(_) => false,
            Body::Stream(s) => s.exact_len() == Some(0),
        }
    }

    /// A copy of a replayable body; `None` for a stream.
    pub fn try_clone(&self) -> Option<Body> {
        match self {
            Body::Empty => Some(Body::Empty),
            Body::Json(v) => Some(Body::Json(v.clone())),
            Body::Bytes(b) => Some(Body::Bytes(b.clone())),
            Body::Stream(_) => None,
        }
    }

    /// The bytes that will be sent for a replayable body (JSON serialised); `None` for a
    /// stream.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidRequest`](crate::ErrorKind::InvalidRequest) if the JSON value
    /// cannot be serialised.
    pub fn to_bytes(&self) -> Result<Option<Bytes>, NetError> {
        match self {
            Body::Empty => Ok(Some(Bytes::new())),
            Body::Bytes(b) => Ok(Some(b.clone())),
            Body::Json(v) => serde_json::to_vec(v)
                .map(|v| Some(Bytes::from(v)))
                .map_err(|e| {
                    NetError::invalid_request("json body could not be serialised").with_source(e)
                }),
            Body::Stream(_) => Ok(None),
        }
    }

    /// The `Content-Type` this body implies when the request sets none.
    pub fn default_content_type(&self) -> Option<&'static str> {
        match self {
            Body::Json(_) => Some("application/json"),
            _ => None,
        }
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Self {
        Body::Bytes(b)
    }
}

impl From<Vec<u8>> for Body {
    fn from(b: Vec<u8>) -> Self {
        Body::Bytes(Bytes::from(b))
    }
}

impl From<String> for Body {
    fn from(s: String) -> Self {
        Body::Bytes(Bytes::from(s))
    }
}

impl From<&'static str> for Body {
    fn from(s: &'static str) -> Self {
        Body::Bytes(Bytes::from_static(s.as_bytes()))
    }
}

impl From<serde_json::Value> for Body {
    fn from(v: serde_json::Value) -> Self {
        Body::Json(v)
    }
}

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Body::Empty => f.write_str("Empty"),
            Body::Json(_) => f.write_str("Json(..)"),
            Body::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Body::Stream(s) => fmt::Debug::fmt(s, f),
        }
    }
}

// === impl BodyStream ===

impl BodyStream {
    /// The exact length, when the body knows it.
    pub fn exact_len(&self) -> Option<u64> {
        http_body::Body::size_hint(&self.inner).exact()
    }

    /// The boxed body, to be sent.
    pub fn into_inner(self) -> BoxBody<Bytes, BoxError> {
        self.inner
    }
}

impl fmt::Debug for BodyStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.exact_len() {
            Some(n) => write!(f, "Stream({n} bytes)"),
            None => f.write_str("Stream(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::Full;

    use super::*;

    #[test]
    fn only_streams_are_not_replayable() {
        assert!(Body::Empty.is_replayable());
        assert!(Body::from("x").is_replayable());
        assert!(Body::Json(serde_json::json!({"a": 1})).is_replayable());
        let stream = Body::stream(Full::new(Bytes::from_static(b"abc")));
        assert!(!stream.is_replayable());
        assert!(stream.try_clone().is_none());
        assert!(matches!(stream.to_bytes(), Ok(None)));
    }

    #[test]
    fn json_bodies_serialise_and_imply_a_content_type() {
        let body = Body::Json(serde_json::json!({"a": [1, 2]}));
        assert_eq!(
            body.to_bytes().unwrap().unwrap(),
            Bytes::from_static(br#"{"a":[1,2]}"#)
        );
        assert_eq!(body.default_content_type(), Some("application/json"));
        assert_eq!(Body::from("x").default_content_type(), None);
    }

    #[test]
    fn stream_length_is_known_when_the_body_says_so() {
        let Body::Stream(s) = Body::stream(Full::new(Bytes::from_static(b"abcd"))) else {
            panic!("expected a stream");
        };
        assert_eq!(s.exact_len(), Some(4));
        assert_eq!(format!("{s:?}"), "Stream(4 bytes)");
    }

    #[test]
    fn debug_never_prints_body_contents() {
        let body = Body::from("secret-token");
        assert_eq!(format!("{body:?}"), "Bytes(12 bytes)");
        let json = Body::Json(serde_json::json!({"password": "hunter2"}));
        assert!(!format!("{json:?}").contains("hunter2"));
    }
}
