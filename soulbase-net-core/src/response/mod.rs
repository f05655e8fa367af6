//! Responses: [`NetResponse`], its body [`RespBody`] and timings [`Elapsed`].

use std::{fmt, time::Duration};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt};
use serde::de::DeserializeOwned;

use crate::error::{ErrorKind, NetError};

/// Where the time of a call (or of one attempt) went.
///
/// Beside the phases (`connect`, `ttfb`, `total`), the four segments of seed 001's S75-4,
/// `W_q_in + w(proc) + W_q_out + W_net ≤ timeout`, measured per call:
///
/// | field | S75-4 | what |
/// | --- | --- | --- |
/// | `queue_in` | `W_q_in` | waiting for the call's slots: the client's in-flight cap, the host's and tenant's limits (concurrency, rate, adaptive), a fleet's shared rate, a redirect hop's host limits |
/// | `processing` | `w(proc)` | the interceptors' `before`, `respond` and `after` hooks, with the request's final checks between them; zero for a client without interceptors |
/// | `queue_out` | `W_q_out` | the answering attempt, from its start until a connection took the request: a pooled connection or a new one (`connect` is part of it), or a free HTTP/2 stream |
/// | `network` | `W_net` | the answering attempt, from the connection taking the request to the response head |
///
/// `queue_in` and `processing` are the call's; `queue_out` and `network` are the answering
/// attempt's (an [`AttemptFinished`](crate::NetEvent::AttemptFinished) event carries its own
/// attempt's). What `total` holds beyond [`Elapsed::segments`] is earlier attempts, the waits
/// between them, and the client's own bookkeeping. A segment the client did not wait in is
/// zero, without a clock read.
///
/// Held as nanoseconds (lossless up to 584 years; a longer span saturates), read as
/// [`Duration`]s: seven `Duration`s would make every response 56 bytes larger, and a response
/// is moved through each layer of a call.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use soulbase_net_core::Elapsed;
///
/// let ms = Duration::from_millis;
/// let e = Elapsed::default()
///     .with_queue_in(ms(5))
///     .with_processing(ms(1))
///     .with_queue_out(ms(3))
///     .with_network(ms(20));
/// assert_eq!(e.segments(), ms(29));
/// assert_eq!(e.network(), ms(20));
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Elapsed {
    connect: u64,
    ttfb: u64,
    total: u64,
    queue_in: u64,
    processing: u64,
    queue_out: u64,
    network: u64,
}

/// `d` in nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One timing of [`Elapsed`]: its reader and its builder method.
macro_rules! timing {
    ($($(#[$doc:meta])* $field:ident $with:ident;)*) => {
        impl Elapsed {
            $(
                $(#[$doc])*
                pub fn $field(&self) -> Duration {
                    Duration::from_nanos(self.$field)
                }

                #[doc = concat!("With `", stringify!($field), "` set to `d`.")]
                #[must_use]
                pub fn $with(mut self, d: Duration) -> Self {
                    self.$field = nanos(d);
                    self
                }
            )*
        }
    };
}

timing! {
    /// Opening the connection: DNS, TCP, proxy tunnel and TLS; zero for a pooled connection.
    connect with_connect;
    /// From the start of the attempt to the response head.
    ttfb with_ttfb;
    /// The whole call, from the first attempt to the response head of the last one.
    total with_total;
    /// S75-4's `W_q_in`: the call's wait for its limiter slots.
    queue_in with_queue_in;
    /// S75-4's `w(proc)`: the call's time in its interceptors' hooks.
    processing with_processing;
    /// S75-4's `W_q_out`: the attempt's wait for a connection to take the request.
    queue_out with_queue_out;
    /// S75-4's `W_net`: the attempt's time from the connection taking the request to the
    /// response head.
    network with_network;
}

impl Elapsed {
    /// S75-4's `budget_total`: `queue_in + processing + queue_out + network`.
    pub fn segments(&self) -> Duration {
        self.queue_in() + self.processing() + self.queue_out() + self.network()
    }
}

impl fmt::Debug for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Elapsed")
            .field("connect", &self.connect())
            .field("ttfb", &self.ttfb())
            .field("total", &self.total())
            .field("queue_in", &self.queue_in())
            .field("processing", &self.processing())
            .field("queue_out", &self.queue_out())
            .field("network", &self.network())
            .finish()
    }
}

/// The body of a [`NetResponse`]: already buffered, or still arriving.
///
/// A streamed body yields [`NetError`]s of its own: the read timeout
/// (`Timeout(Read)`) and the size limit (`TooLarge`) are enforced while it streams.
#[non_exhaustive]
pub enum RespBody {
    /// The whole body.
    Bytes(Bytes),
    /// A body still arriving.
    Stream(UnsyncBoxBody<Bytes, NetError>),
}

/// Reads `body` to its end. A body of one data frame (most small answers) is that frame, not
/// a copy; the frames of a longer one are kept as they come and copied once, at the end, into
/// one buffer of their total length. Trailers are not part of the bytes.
async fn read_to_end(mut body: UnsyncBoxBody<Bytes, NetError>) -> Result<Bytes, NetError> {
    let mut first: Option<Bytes> = None;
    let mut more: Vec<Bytes> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        if first.is_none() {
            first = Some(data);
        } else {
            more.push(data);
        }
    }
    let Some(first) = first else {
        return Ok(Bytes::new());
    };
    if more.is_empty() {
        return Ok(first);
    }
    let total = more.iter().map(Bytes::len).sum::<usize>() + first.len();
    let mut joined = BytesMut::with_capacity(total);
    joined.extend_from_slice(&first);
    for data in &more {
        joined.extend_from_slice(data);
    }
    Ok(joined.freeze())
}

/// A response to a [`NetRequest`](crate::NetRequest).
///
/// # Examples
/// ```
/// # async fn run() -> Result<(), soulbase_net_core::NetError> {
/// use soulbase_net_core::NetResponse;
///
/// let resp = NetResponse::from_bytes(http::StatusCode::OK, r#"{"id":7}"#);
/// let value: serde_json::Value = resp.error_for_status()?.json().await?;
/// assert_eq!(value["id"], 7);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
/// ```
pub struct NetResponse {
    /// The status of the final response (after redirects).
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    /// The `Content-Type` header, if any and valid UTF-8.
    pub content_type: Option<String>,
    /// The body.
    pub body: RespBody,
    /// Timings of the call.
    pub elapsed: Elapsed,
    /// Body bytes received so far: the whole body once buffered; for a stream, what was read
    /// before it was handed over (the observer reports the final count).
    pub bytes_in: u64,
    /// Attempts made, the successful one included.
    pub attempts: u32,
    /// The URL of the final response (after redirects), without userinfo.
    pub url: String,
    /// The HTTP version the final response came over (`HTTP/3` when the runtime used QUIC).
    /// `HTTP/1.1` for a response made by [`from_bytes`](Self::from_bytes).
    pub version: http::Version,
}

// === impl NetResponse ===

impl NetResponse {
    /// A buffered response with `status` and `body` and no headers; for tests and test
    /// doubles of [`NetClient`](crate::NetClient).
    pub fn from_bytes(status: StatusCode, body: impl Into<Bytes>) -> Self {
        let body = body.into();
        NetResponse {
            status,
            headers: HeaderMap::new(),
            content_type: None,
            bytes_in: body.len() as u64,
            body: RespBody::Bytes(body),
            elapsed: Elapsed::default(),
            attempts: 1,
            url: String::new(),
            version: http::Version::HTTP_11,
        }
    }

    /// Sets a header (builder style, for test doubles); keeps `content_type` in step.
    pub fn with_header(mut self, name: header::HeaderName, value: header::HeaderValue) -> Self {
        if name == header::CONTENT_TYPE {
            self.content_type = value.to_str().ok().map(str::to_owned);
        }
        self.headers.insert(name, value);
        self
    }

    /// The whole body, reading a stream to its end.
    ///
    /// # Errors
    /// What the stream yields: `Timeout(Read)`, `TooLarge`, `Io`.
    pub async fn bytes(self) -> Result<Bytes, NetError> {
        match self.body {
            RespBody::Bytes(b) => Ok(b),
            RespBody::Stream(s) => read_to_end(s).await,
        }
    }

    /// The body decoded as UTF-8 text (invalid sequences are replaced).
    ///
    /// # Errors
    /// As [`NetResponse::bytes`].
    pub async fn text(self) -> Result<String, NetError> {
        let bytes = self.bytes().await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The body decoded as JSON.
    ///
    /// # Errors
    /// As [`NetResponse::bytes`], and [`ErrorKind::Decode`] (`SCHEMA.VALIDATION_FAILED`) if
    /// the body is not valid JSON of type `T`.
    pub async fn json<T: DeserializeOwned>(self) -> Result<T, NetError> {
        let url = self.url.clone();
        let bytes = self.bytes().await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            let err = NetError::decode(e).with_message("response body is not the expected json");
            if url.is_empty() {
                err
            } else {
                err.with_context(url)
            }
        })
    }

    /// Turns an error status (4xx, 5xx) into an [`ErrorKind::Status`] error, whose code follows
    /// the table of [`status_code`](crate::status_code): 5xx → `PROVIDER.UNAVAILABLE`,
    /// 429 → `QUOTA.RATE_LIMITED`, 401/403/407 → `AUTH.FORBIDDEN`, 408 →
    /// `PROVIDER.TIMEOUT`, other 4xx → `SCHEMA.VALIDATION_FAILED`. The error carries the
    /// attempts made and the `Retry-After` delay when the response has one (seconds or an
    /// HTTP date). Other statuses pass through.
    ///
    /// # Errors
    /// As above.
    pub fn error_for_status(self) -> Result<Self, NetError> {
        match self.status_error() {
            Some(err) => Err(err),
            None => Ok(self),
        }
    }

    /// Like [`NetResponse::error_for_status`], keeping the response.
    ///
    /// # Errors
    /// As [`NetResponse::error_for_status`].
    pub fn error_for_status_ref(&self) -> Result<&Self, NetError> {
        match self.status_error() {
            Some(err) => Err(err),
            None => Ok(self),
        }
    }

    fn status_error(&self) -> Option<NetError> {
        if !(self.status.is_client_error() || self.status.is_server_error()) {
            return None;
        }
        let mut err = NetError::new(ErrorKind::Status(self.status)).with_attempts(self.attempts);
        if !self.url.is_empty() {
            err = err.with_context(self.url.clone());
        }
        if let Some(after) = self.retry_after(std::time::SystemTime::now()) {
            err = err.with_retry_after(after);
        }
        Some(err)
    }

    /// The `Retry-After` header as a delay from `now`: delta-seconds or an HTTP date (a date
    /// in the past is a zero delay). `None` when absent or unparsable.
    pub fn retry_after(&self, now: std::time::SystemTime) -> Option<Duration> {
        parse_retry_after(self.headers.get(header::RETRY_AFTER)?, now)
    }
}

/// Parses a `Retry-After` value (RFC 9110 §10.2.3): delta-seconds or an HTTP date.
///
/// # Examples
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use http::HeaderValue;
/// use soulbase_net_core::parse_retry_after;
///
/// let now = UNIX_EPOCH + Duration::from_secs(784_111_717); // Sun, 06 Nov 1994 08:48:37 GMT
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("120"), now), Some(Duration::from_secs(120)));
/// let date = HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT");
/// assert_eq!(parse_retry_after(&date, now), Some(Duration::from_secs(60)));
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("soon"), now), None);
/// ```
pub fn parse_retry_after(
    value: &header::HeaderValue,
    now: std::time::SystemTime,
) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

impl fmt::Debug for NetResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetResponse")
            .field("status", &self.status)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("content_type", &self.content_type)
            .field("body", &self.body)
            .field("elapsed", &self.elapsed)
            .field("bytes_in", &self.bytes_in)
            .field("attempts", &self.attempts)
            .field("url", &self.url)
            .field("version", &self.version)
            .finish()
    }
}

impl fmt::Debug for RespBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RespBody::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            RespBody::Stream(_) => f.write_str("Stream(..)"),
        }
    }
}

#[cfg(test)]
mod tests;
