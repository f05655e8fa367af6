//! `TraceUa`: W3C trace context, a request id and one user agent.

use soulbase_net_core::{
    bytes::Bytes,
    http::{header, HeaderMap, HeaderName, HeaderValue},
    Interceptor, NetError, NetRequest,
};

use crate::hex;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const DEFAULT_USER_AGENT: &str = concat!("soulbase-net/", env!("CARGO_PKG_VERSION"));

/// Adds a W3C `traceparent`, an `X-Request-Id` and one `User-Agent` to every request.
///
/// - `traceparent`: a request that already carries a valid one continues that trace (its
///   trace id and flags are kept, its span becomes the parent); otherwise a new trace is
///   started (random trace id, sampled). The trace id is fixed in
///   [`before`](Interceptor::before) and stays the same across retries and hedges, while
///   every attempt gets a new span id ([`on_attempt`](Interceptor::on_attempt)).
/// - `X-Request-Id`: kept when the caller set one, else a random 32-hex id; set once per call,
///   so retries carry the same id.
/// - `User-Agent`: replaces every `User-Agent` of the request with the configured one.
///   Default is `soulbase-net/<version>`.
///
/// # Examples
/// ```
/// use soulbase_net_core::{http::HeaderValue, Interceptor, NetRequest};
/// use soulbase_net_interceptors::TraceUa;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let trace = TraceUa::new().user_agent(HeaderValue::from_static("billing/1.2"));
/// let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// let mut req = NetRequest::get("https://api.example.com/").header("traceparent", parent);
/// trace.before(&mut req).await.unwrap();
/// trace.on_attempt(&mut req, 1);
/// let tp = req.headers["traceparent"].to_str().unwrap();
/// assert!(tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
/// assert_ne!(tp, parent);
/// assert_eq!(req.headers["user-agent"], "billing/1.2");
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct TraceUa {
    user_agent: HeaderValue,
}

/// The trace of one call, kept in the request's extensions between `before` and the attempts.
#[derive(Clone, Debug)]
struct TraceContext {
    trace_id: String,
    flags: String,
}

// === impl TraceUa ===

impl Default for TraceUa {
    fn default() -> Self {
        TraceUa {
            user_agent: HeaderValue::from_static(DEFAULT_USER_AGENT),
        }
    }
}

impl TraceUa {
    /// The interceptor with the default user agent (`soulbase-net/<version>`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the `User-Agent` sent with every request. Default is `soulbase-net/<version>`.
    pub fn user_agent(mut self, value: HeaderValue) -> Self {
        self.user_agent = value;
        self
    }
}

#[async_trait::async_trait]
impl Interceptor for TraceUa {
    async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
        let ctx = req
            .headers
            .get(&TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_traceparent)
            .unwrap_or_else(|| TraceContext {
                trace_id: hex::random_128(),
                flags: "01".to_owned(),
            });
        set_traceparent(&mut req.headers, &ctx);
        req.extensions.insert(ctx);
        if !req.headers.contains_key(&REQUEST_ID) {
            if let Ok(id) = HeaderValue::from_str(&hex::random_128()) {
                req.headers.insert(REQUEST_ID, id);
            }
        }
        req.headers
            .insert(header::USER_AGENT, self.user_agent.clone());
        Ok(())
    }

    fn on_attempt(&self, req: &mut NetRequest, _attempt: u32) {
        if let Some(ctx) = req.extensions.get::<TraceContext>() {
            set_traceparent(&mut req.headers, ctx);
        }
    }

    fn name(&self) -> &'static str {
        "trace_ua"
    }
}

/// Sets `traceparent` with the trace of `ctx` and a new random span id.
fn set_traceparent(headers: &mut HeaderMap, ctx: &TraceContext) {
    let mut span = fastrand::u64(..);
    if span == 0 {
        span = 1;
    }
    // 00-<trace id>-<span id>-<flags>, built without the formatter (every attempt).
    let mut value = String::with_capacity(55);
    value.push_str("00-");
    value.push_str(&ctx.trace_id);
    value.push('-');
    hex::push_hex(&mut value, &span.to_be_bytes());
    value.push('-');
    value.push_str(&ctx.flags);
    // Handed over as `Bytes` without another copy.
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(value.into_bytes())) {
        headers.insert(TRACEPARENT, value);
    }
}

/// The trace id and flags of a valid version-00 `traceparent`.
fn parse_traceparent(value: &str) -> Option<TraceContext> {
    let mut parts = value.trim().split('-');
    let (version, trace_id, span_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let is_hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let valid = version == "00"
        && parts.next().is_none()
        && is_hex(trace_id, 32)
        && is_hex(span_id, 16)
        && is_hex(flags, 2)
        && trace_id.bytes().any(|b| b != b'0')
        && span_id.bytes().any(|b| b != b'0');
    valid.then(|| TraceContext {
        trace_id: trace_id.to_owned(),
        flags: flags.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_valid_traceparents() {
        let ok =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(ok.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ok.flags, "01");
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx",
            "00-4bf92f-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }

    #[tokio::test]
    async fn new_trace_new_span_per_attempt_same_request_id() {
        let t = TraceUa::new();
        let mut req = NetRequest::get("http://h.example/")
            .header("user-agent", "a")
            .header("user-agent", "b");
        t.before(&mut req).await.unwrap();
        let first = req.headers["traceparent"].clone();
        let id = req.headers["x-request-id"].clone();
        t.on_attempt(&mut req, 1);
        let second = req.headers["traceparent"].clone();
        t.on_attempt(&mut req, 2);
        let third = req.headers["traceparent"].clone();
        let ctx = parse_traceparent(first.to_str().unwrap()).unwrap();
        for tp in [&second, &third] {
            assert_eq!(
                parse_traceparent(tp.to_str().unwrap()).unwrap().trace_id,
                ctx.trace_id
            );
        }
        assert_ne!(second, third);
        assert_eq!(req.headers["x-request-id"], id);
        assert_eq!(req.headers.get_all("user-agent").iter().count(), 1);
        assert_eq!(req.headers["user-agent"], DEFAULT_USER_AGENT);
    }

    #[tokio::test]
    async fn keeps_a_caller_request_id() {
        let t = TraceUa::new();
        let mut req = NetRequest::get("http://h.example/").header("x-request-id", "abc");
        t.before(&mut req).await.unwrap();
        assert_eq!(req.headers["x-request-id"], "abc");
    }
}
