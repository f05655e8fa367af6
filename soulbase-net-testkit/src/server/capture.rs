//! What a FaultServer saw: the captured requests and per-path counters.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, Uri, Version};
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

/// One request as the server received it, kept for assertions.
#[derive(Clone, Debug)]
pub struct CapturedRequest {
    /// Request method.
    pub method: Method,
    /// Request target as received (origin-form for HTTP/1.1, with authority for HTTP/2).
    pub uri: Uri,
    /// HTTP version of the connection (`HTTP/1.1` or `HTTP/2.0`).
    pub version: Version,
    /// Request headers.
    pub headers: HeaderMap,
    /// The request body, up to the server's capture limit (see
    /// [`FaultServerBuilder::capture_limit`](crate::FaultServerBuilder::capture_limit)).
    pub body: Bytes,
    /// The full length of the request body, including bytes past the capture limit.
    pub body_len: u64,
    /// Id of the connection the request came on: 1 for the first accepted connection, then 2, …
    pub connection: u64,
    /// The name (or description) of the route that answered; `None` for the fallback.
    pub(super) route: Option<Arc<str>>,
}

impl CapturedRequest {
    /// The value of `name` as a string, if present and valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The name of the [`Mock`](crate::Mock) that answered (given with
    /// [`Mock::named`](crate::Mock::named), else its description such as `POST /orders`), or
    /// `None` when no route matched and the fallback answered.
    pub fn route(&self) -> Option<&str> {
        self.route.as_deref()
    }

    /// The body parsed as JSON into `T` (wiremock's `body_json::<T>()`).
    ///
    /// # Errors
    /// The body is not JSON, or not a `T`; the error names the request and its route.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, JsonBodyError> {
        serde_json::from_slice(&self.body).map_err(|source| JsonBodyError {
            request: format!("{} {}", self.method, self.uri),
            route: self
                .route
                .as_deref()
                .unwrap_or("no route (fallback)")
                .to_owned(),
            source,
        })
    }

    /// The body parsed as a JSON value (as wiremock's `body_json`).
    ///
    /// # Errors
    /// The body is not JSON; the error names the request and its route.
    pub fn body_json(&self) -> Result<Value, JsonBodyError> {
        self.json()
    }

    /// The whole request — not only its body (for that, see [`json`](Self::json) and
    /// [`body_json`](Self::body_json)) — as the JSON document the echo reply sends:
    /// `{"method", "uri", "path", "query", "version", "headers": {name: [values]}, "body",
    /// "body_len", "connection"}`; the body is lossy UTF-8.
    pub fn to_json(&self) -> Value {
        let mut headers = Map::new();
        for name in self.headers.keys() {
            let values: Vec<Value> = self
                .headers
                .get_all(name)
                .iter()
                .map(|v| Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()))
                .collect();
            headers.insert(name.as_str().to_owned(), Value::Array(values));
        }
        json!({
            "method": self.method.as_str(),
            "uri": self.uri.to_string(),
            "path": self.uri.path(),
            "query": self.uri.query(),
            "version": format!("{:?}", self.version),
            "headers": headers,
            "body": self.text(),
            "body_len": self.body_len,
            "connection": self.connection,
        })
    }
}

/// A captured body that is not the JSON expected; returned by [`CapturedRequest::json`] and
/// [`CapturedRequest::body_json`].
#[derive(Debug)]
pub struct JsonBodyError {
    request: String,
    route: String,
    source: serde_json::Error,
}

impl JsonBodyError {
    /// The route that answered the request (its name or description).
    pub fn route(&self) -> &str {
        &self.route
    }
}

impl fmt::Display for JsonBodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "body of {} (route `{}`) is not the expected JSON",
            self.request, self.route
        )
    }
}

impl std::error::Error for JsonBodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Hits of one path (its requests are in the server's log of every request).
#[derive(Debug, Default)]
pub(crate) struct PathStats {
    pub(crate) hits: u64,
}
