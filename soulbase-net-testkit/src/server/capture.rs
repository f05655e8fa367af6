//! What a FaultServer saw: the captured requests and per-path counters.

use bytes::Bytes;
use http::{HeaderMap, Method, Uri, Version};
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

    /// The request as the JSON document the echo reply sends:
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

/// Hits and captured requests of one path.
#[derive(Debug, Default)]
pub(crate) struct PathStats {
    pub(crate) hits: u64,
    pub(crate) requests: Vec<CapturedRequest>,
}
