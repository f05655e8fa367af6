//! `TraceUa`: W3C trace context, a request id and one user agent.

use soulbase_net_core::{
    bytes::Bytes,
    http::{header, HeaderMap, HeaderName, HeaderValue},
    Hooks, Interceptor, NetError, NetRequest,
};

use crate::hex;

#[cfg(feature = "otel")]
mod otel;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const DEFAULT_USER_AGENT: &str = concat!("soulbase-net/", env!("CARGO_PKG_VERSION"));

/// Adds a W3C `traceparent`, an `X-Request-Id` and one `User-Agent` to every request.
///
/// - `traceparent`: a request that already carries a valid one continues that trace (its
///   trace id and flags are kept, its span becomes the parent); otherwise a new trace is
///   started (random trace id, sampled). The trace id is fixed in
///   [`before`](Interceptor::before) and stays the same across retries and hedges, while
///   every attempt gets a span id of its own: `before` gives the first attempt's,
///   [`on_attempt`](Interceptor::on_attempt) a new one for every later attempt (the client
///   numbers attempts across the whole call, a resend included).
/// - With the `otel` feature, the current span's OpenTelemetry context comes first: when the
///   current `tracing` span has one (a subscriber with tracing-opentelemetry's layer, e.g.
///   `soulbase_net_observe::otel::layer`) or OpenTelemetry's own current context holds a
///   span, the `traceparent` carries that span's trace id and flags, and its span id as the
///   parent. The runtime's client runs `before` in the call's span and every `on_attempt` in
///   that attempt's own span, so the upstream's span becomes a child of the attempt that
///   reached it, in the trace of the request that caused the call. Without such a context
///   the rules above apply unchanged.
/// - `X-Request-Id`: kept when the caller set one, else a random 32-hex id; set once per call,
///   so retries carry the same id.
/// - `User-Agent`: replaces every `User-Agent` of the request with the configured one.
///   Default is `soulbase-net/<version>`.
/// - The `traceparent` and the `X-Request-Id` this interceptor makes are new on every request,
///   so they are marked never-indexed ([`HeaderValue::set_sensitive`]): over HTTP/2, HPACK
///   sends them as literals instead of adding each to the connection's header table, where
///   a value that never comes back would only push out the ones that do (`User-Agent`,
///   `Accept-Encoding`) and make every later lookup compare against it (measured over h2c:
///   6 % of the client's instructions per request). Over HTTP/1.1 nothing changes. The
///   mark also makes `{:?}` of the headers print these two as `Sensitive`; read them with
///   `to_str`.
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

/// `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`.
const TRACEPARENT_LEN: usize = 55;
/// Where the span id starts in a `traceparent`.
const SPAN_AT: usize = 36;
/// A new `X-Request-Id`: 32 hex digits.
const REQUEST_ID_LEN: usize = 32;

/// Which bytes are lower-case hex digits (the only digits `traceparent` allows).
const LOWER_HEX: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = matches!(b as u8, b'0'..=b'9' | b'a'..=b'f');
        b += 1;
    }
    table
};

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
        self.before_now(req)
    }

    /// What `before` does: nothing in it waits, so the client calls it in place (see
    /// [`Hooks::BEFORE_NOW`]).
    fn before_now(&self, req: &mut NetRequest) -> Result<(), NetError> {
        let new_id = !req.headers.contains_key(&REQUEST_ID);
        // The trace id and flags of the caller's valid `traceparent`, else a new trace; the
        // value then lives in the header, where `on_attempt` finds it for every later attempt.
        // One entry for both reading and writing it: a custom name's hash reads all its
        // bytes.
        let mut ids = [0u8; TRACEPARENT_LEN + REQUEST_ID_LEN];
        let (traceparent, request_id) = ids.split_at_mut(TRACEPARENT_LEN);
        let entry = req.headers.entry(TRACEPARENT);
        if let Some(value) = span_traceparent() {
            // The current span is the parent, its id as it is.
            traceparent.copy_from_slice(&value);
        } else {
            let given = match &entry {
                header::Entry::Occupied(given) => valid_traceparent(given.get()),
                header::Entry::Vacant(_) => None,
            };
            match given {
                Some(value) => traceparent.copy_from_slice(&value),
                None => {
                    traceparent[..3].copy_from_slice(b"00-");
                    traceparent[3..35].copy_from_slice(&hex::hex_u128(nonzero_u128()));
                    traceparent[35] = b'-';
                    traceparent[52..].copy_from_slice(b"-01");
                }
            }
            write_span(traceparent);
        }
        if new_id {
            request_id.copy_from_slice(&hex::hex_u128(nonzero_u128()));
        }
        // Both values in one allocation, shared by the two headers (and by the client's
        // copies of them).
        let ids = Bytes::from_owner(ids);
        let value = ascii_value(ids.slice(..TRACEPARENT_LEN));
        match entry {
            // Every value of the name goes, as `insert` would have it.
            header::Entry::Occupied(mut given) => {
                given.insert(value);
            }
            header::Entry::Vacant(slot) => {
                slot.insert(value);
            }
        }
        if new_id {
            req.headers
                .insert(REQUEST_ID, ascii_value(ids.slice(TRACEPARENT_LEN..)));
        }
        req.headers
            .insert(header::USER_AGENT, self.user_agent.clone());
        Ok(())
    }

    fn on_attempt(&self, req: &mut NetRequest, attempt: u32) {
        // Under OpenTelemetry, the attempt's own span (the client runs this hook in it).
        if let Some(value) = span_traceparent() {
            req.headers
                .insert(TRACEPARENT, ascii_value(Bytes::from_owner(value)));
            return;
        }
        // The first attempt goes out with the span `before` just made.
        if attempt <= 1 {
            return;
        }
        // The trace `before` set (or a valid one put in its place since): a new span of it.
        if let Some(mut value) = req.headers.get(&TRACEPARENT).and_then(valid_traceparent) {
            set_traceparent(&mut req.headers, &mut value);
        }
    }

    fn hooks(&self) -> Hooks {
        Hooks::BEFORE_NOW | Hooks::ON_ATTEMPT
    }

    fn name(&self) -> &'static str {
        "trace_ua"
    }
}

/// The `traceparent` of the current span's OpenTelemetry context, when there is one.
#[cfg(feature = "otel")]
fn span_traceparent() -> Option<[u8; TRACEPARENT_LEN]> {
    otel::current_traceparent()
}

/// Without the `otel` feature there is no span context to continue.
#[cfg(not(feature = "otel"))]
fn span_traceparent() -> Option<[u8; TRACEPARENT_LEN]> {
    None
}

/// A random 128-bit value other than zero (W3C forbids all-zero ids). Drawn from the whole
/// range and moved off zero: a range draw would cost a 128-bit division.
fn nonzero_u128() -> u128 {
    fastrand::u128(..).max(1)
}

/// Writes a new random span id (never zero) into a `traceparent`.
fn write_span(traceparent: &mut [u8]) {
    let span = fastrand::u64(..).max(1);
    traceparent[SPAN_AT..SPAN_AT + 16].copy_from_slice(&hex::hex_u64(span));
}

/// Writes a new random span id into `value` and sets it as the `traceparent`.
fn set_traceparent(headers: &mut HeaderMap, value: &mut [u8; TRACEPARENT_LEN]) {
    write_span(value);
    headers.insert(TRACEPARENT, ascii_value(Bytes::from_owner(*value)));
}

/// A header value of hex digits and dashes, held by a shared allocation, so the copies the
/// client makes of the request's headers share it instead of each copying it. Marked
/// never-indexed (see the type's docs): the value is new on every request.
fn ascii_value(value: Bytes) -> HeaderValue {
    // Hex digits and `-` are visible ASCII, always a valid header value: the fallback
    // (an empty value) is never taken.
    let mut value =
        HeaderValue::from_maybe_shared(value).unwrap_or_else(|_| HeaderValue::from_static(""));
    value.set_sensitive(true);
    value
}

/// A valid version-00 `traceparent` (surrounding whitespace allowed), as its 55 bytes.
fn valid_traceparent(value: &HeaderValue) -> Option<[u8; TRACEPARENT_LEN]> {
    let value = value.as_bytes().trim_ascii();
    let value: [u8; TRACEPARENT_LEN] = value.try_into().ok()?;
    let (trace_id, span_id, flags) = (&value[3..35], &value[36..52], &value[53..]);
    let is_hex = |s: &[u8]| s.iter().all(|b| LOWER_HEX[usize::from(*b)]);
    let valid = value.starts_with(b"00-")
        && value[35] == b'-'
        && value[52] == b'-'
        && is_hex(trace_id)
        && is_hex(span_id)
        && is_hex(flags)
        && trace_id.iter().any(|b| *b != b'0')
        && span_id.iter().any(|b| *b != b'0');
    valid.then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trace id and flags of a valid `traceparent`.
    fn parse_traceparent(value: &str) -> Option<(String, String)> {
        let value = valid_traceparent(&HeaderValue::from_str(value).ok()?)?;
        let text = std::str::from_utf8(&value).unwrap();
        Some((text[3..35].to_owned(), text[53..].to_owned()))
    }

    #[test]
    fn parses_only_valid_traceparents() {
        let (trace_id, flags) =
            parse_traceparent(" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(flags, "01");
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
        // The first attempt keeps the span `before` made.
        assert_eq!(req.headers["traceparent"], first);
        t.on_attempt(&mut req, 2);
        let second = req.headers["traceparent"].clone();
        t.on_attempt(&mut req, 3);
        let third = req.headers["traceparent"].clone();
        let (trace_id, flags) = parse_traceparent(first.to_str().unwrap()).unwrap();
        assert_eq!(flags, "01");
        for tp in [&second, &third] {
            assert_eq!(parse_traceparent(tp.to_str().unwrap()).unwrap().0, trace_id);
        }
        assert_ne!(first, second);
        assert_ne!(second, third);
        assert_eq!(req.headers["x-request-id"], id);
        // New on every request: never indexed by HPACK. The user agent repeats: indexed.
        assert!(req.headers["traceparent"].is_sensitive());
        assert!(req.headers["x-request-id"].is_sensitive());
        assert!(!req.headers["user-agent"].is_sensitive());
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
