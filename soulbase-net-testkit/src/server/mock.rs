//! [`Mock`]: a route that matches on more than the path — method, query, headers, body — with
//! a priority and an expected number of matching requests ([`Times`]), in the manner of
//! wiremock's `Mock::given(..).respond_with(..).expect(..)`.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::Method;
use serde_json::Value;

use super::capture::CapturedRequest;
use super::script::Script;
use super::times::Times;

/// Priority of a route added without one (wiremock's default too): `1` is tried first, `255`
/// last.
pub(super) const DEFAULT_PRIORITY: u8 = 5;

type Predicate = Arc<dyn Fn(&CapturedRequest) -> bool + Send + Sync>;

/// One condition on a request besides its method and path.
#[derive(Clone)]
enum Matcher {
    Query(String, String),
    Header(String, String),
    HeaderExists(String),
    Body(Bytes),
    Json(Value),
    Custom(String, Predicate),
}

/// A route with matchers, a priority and an expectation; added with
/// [`FaultServerBuilder::mock`](crate::FaultServerBuilder::mock).
///
/// A request matches when its method (unless the mock takes [any](Mock::any)) and path are
/// equal to the mock's and every matcher holds. Among the matching routes, the one with the
/// lowest [`priority`](Mock::priority) answers; at equal priority, a route with a method comes
/// before one without, then the one added first. Requests no route matches get the server's
/// fallback (`404` unless set otherwise) and are listed by [`FaultServer::verify`](crate::FaultServer::verify).
///
/// Body matchers see the captured body (up to
/// [`capture_limit`](crate::FaultServerBuilder::capture_limit)).
///
/// # Examples
/// ```
/// use serde_json::json;
/// use soulbase_net_testkit::{FaultServer, Mock, Reply};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let srv = FaultServer::http1()
///     .mock(Mock::post("/orders")
///         .header("x-team", "pay")
///         .json_body(json!({"sku": "a1", "qty": 2}))
///         .priority(1)
///         .respond(Reply::status(201))
///         .expect(1)
///         .named("create order"))
///     .mock(Mock::post("/orders").respond(Reply::status(400)))
///     .start()
///     .await?;
/// // Nothing was sent: the expectation of "create order" fails.
/// let err = srv.verify().unwrap_err();
/// assert!(err.to_string().contains("create order"));
/// // Dropping the server panics with the same message.
/// let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(srv)));
/// assert!(dropped.is_err());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Mock {
    pub(super) method: Option<Method>,
    pub(super) path: String,
    matchers: Vec<Matcher>,
    pub(super) priority: u8,
    pub(super) script: Script,
    pub(super) expect: Option<Times>,
    name: Option<String>,
}

impl Mock {
    /// Matches requests with `method` on `path` (exact path, any query unless
    /// [`query`](Self::query) says otherwise). Answers `200` with an empty body until
    /// [`respond`](Self::respond) says otherwise; priority 5; no expectation.
    pub fn given(method: Method, path: impl Into<String>) -> Self {
        Self::new(Some(method), path.into())
    }

    /// Matches requests with any method on `path`.
    pub fn any(path: impl Into<String>) -> Self {
        Self::new(None, path.into())
    }

    /// Shorthand for [`Mock::given`]`(Method::GET, path)`.
    pub fn get(path: impl Into<String>) -> Self {
        Self::given(Method::GET, path)
    }

    /// Shorthand for [`Mock::given`]`(Method::POST, path)`.
    pub fn post(path: impl Into<String>) -> Self {
        Self::given(Method::POST, path)
    }

    /// Shorthand for [`Mock::given`]`(Method::PUT, path)`.
    pub fn put(path: impl Into<String>) -> Self {
        Self::given(Method::PUT, path)
    }

    /// Shorthand for [`Mock::given`]`(Method::PATCH, path)`.
    pub fn patch(path: impl Into<String>) -> Self {
        Self::given(Method::PATCH, path)
    }

    /// Shorthand for [`Mock::given`]`(Method::DELETE, path)`.
    pub fn delete(path: impl Into<String>) -> Self {
        Self::given(Method::DELETE, path)
    }

    pub(super) fn new(method: Option<Method>, path: String) -> Self {
        Self {
            method,
            path,
            matchers: Vec::new(),
            priority: DEFAULT_PRIORITY,
            script: Script::status(200),
            expect: None,
            name: None,
        }
    }

    /// Requires the query parameter `name` with the value `value` (after percent-decoding,
    /// `+` as a space); other parameters may be present too.
    pub fn query(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.matchers
            .push(Matcher::Query(name.into(), value.into()));
        self
    }

    /// Requires a header `name` (case-insensitive) with the value `value` (exact; any of the
    /// header's values may match).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.matchers.push(Matcher::Header(
            name.into().to_ascii_lowercase(),
            value.into(),
        ));
        self
    }

    /// Requires a header `name`, whatever its value.
    pub fn header_exists(mut self, name: impl Into<String>) -> Self {
        self.matchers
            .push(Matcher::HeaderExists(name.into().to_ascii_lowercase()));
        self
    }

    /// Requires the body to be exactly `body`.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.matchers.push(Matcher::Body(body.into()));
        self
    }

    /// Requires the body to be JSON equal to `value` (whatever the spacing and key order).
    pub fn json_body(mut self, value: Value) -> Self {
        self.matchers.push(Matcher::Json(value));
        self
    }

    /// Requires `predicate` to hold for the request; `what` describes it in messages.
    pub fn matching(
        mut self,
        what: impl Into<String>,
        predicate: impl Fn(&CapturedRequest) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.matchers
            .push(Matcher::Custom(what.into(), Arc::new(predicate)));
        self
    }

    /// Sets the priority: among the routes a request matches, the lowest number answers.
    /// Default is 5 (as for [`route`](crate::FaultServerBuilder::route)).
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// Answers with `script` (a [`Reply`](crate::Reply) or a [`Script`]); the n-th matching
    /// request gets the script's n-th reply. Default is `200` with an empty body.
    pub fn respond(mut self, script: impl Into<Script>) -> Self {
        self.script = script.into();
        self
    }

    /// Expects this many matching requests (a number or a range, see [`Times`]), checked by
    /// [`FaultServer::verify`](crate::FaultServer::verify) and when the server is dropped.
    /// Default is no expectation.
    pub fn expect(mut self, times: impl Into<Times>) -> Self {
        self.expect = Some(times.into());
        self
    }

    /// Names the mock in verification messages. Default is its method, path and matchers,
    /// e.g. `POST /orders [header x-team: pay]`.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Whether `req` matches the method, the path and every matcher.
    pub(super) fn matches(&self, req: &CapturedRequest) -> bool {
        self.method.as_ref().is_none_or(|m| *m == req.method)
            && self.path == req.uri.path()
            && self.matchers.iter().all(|m| m.holds(req))
    }

    /// The name given with [`named`](Self::named), or a description.
    pub(super) fn label(&self) -> String {
        if let Some(name) = &self.name {
            return name.clone();
        }
        let method = self.method.as_ref().map_or("ANY", Method::as_str);
        let mut s = format!("{method} {}", self.path);
        if !self.matchers.is_empty() {
            let what: Vec<String> = self.matchers.iter().map(|m| m.to_string()).collect();
            s.push_str(&format!(" [{}]", what.join(", ")));
        }
        s
    }
}

impl fmt::Debug for Mock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mock")
            .field("route", &self.label())
            .field("priority", &self.priority)
            .field("expect", &self.expect)
            .finish_non_exhaustive()
    }
}

// === impl Matcher ===

impl Matcher {
    fn holds(&self, req: &CapturedRequest) -> bool {
        match self {
            Matcher::Query(name, value) => {
                query_pairs(req.uri.query().unwrap_or("")).any(|(n, v)| n == *name && v == *value)
            }
            Matcher::Header(name, value) => req
                .headers
                .get_all(name.as_str())
                .iter()
                .any(|v| v.as_bytes() == value.as_bytes()),
            Matcher::HeaderExists(name) => req.headers.contains_key(name.as_str()),
            Matcher::Body(body) => req.body == *body,
            Matcher::Json(value) => {
                serde_json::from_slice::<Value>(&req.body).is_ok_and(|v| v == *value)
            }
            Matcher::Custom(_, predicate) => predicate(req),
        }
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Matcher::Query(n, v) => write!(f, "query {n}={v}"),
            Matcher::Header(n, v) => write!(f, "header {n}: {v}"),
            Matcher::HeaderExists(n) => write!(f, "header {n}"),
            Matcher::Body(b) => write!(f, "body {:?}", String::from_utf8_lossy(b)),
            Matcher::Json(v) => write!(f, "json body {v}"),
            Matcher::Custom(what, _) => f.write_str(what),
        }
    }
}

/// The `name=value` pairs of a query string, percent-decoded (`+` as a space).
fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(n), decode(v))
    })
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_decoded() {
        let pairs: Vec<_> = query_pairs("a=1&q=red%20shoes&b=x+y&flag&bad=%zz").collect();
        assert_eq!(pairs[1], ("q".into(), "red shoes".into()));
        assert_eq!(pairs[2], ("b".into(), "x y".into()));
        assert_eq!(pairs[3], ("flag".into(), String::new()));
        assert_eq!(pairs[4], ("bad".into(), "%zz".into()));
    }
}
