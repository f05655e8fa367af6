//! One attempt: its span and events, the exchange on a pooled connection with the first-byte
//! timeout, the response body's limits and decoding, and the hyper request it sends.

use std::{
    future::Future,
    sync::{atomic::Ordering, Arc},
    task::Poll,
    time::Duration,
};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request};
use http_body_util::{BodyExt, Empty, Full};
use soulbase_net_core::{
    recent::{recall, Recent},
    Body, Direction, Elapsed, ErrorKind, NetError, NetEvent, NetRequest, NetResponse, Outcome,
    Phase, RespBody, Takes,
};
use tokio::time::Instant;
use tracing::{field::Empty as Unset, Span};
use url::Url;

use super::send::{record_outcome, Answer, Call};
use super::span::{in_scope, in_span};
use super::timer::Timer;
use super::urls::{host_of, shown_url};
use super::{
    body::{MeteredBody, Progress, SendBody},
    Inner,
};
use crate::{
    body::{check_content_length, check_declared_length, decode, LimitedBody},
    transport::body::ReqBody,
};

impl Inner {
    /// One attempt: connect (or reuse), write, wait for the head, hand over the body; `limit`
    /// bounds the attempt (the policy's attempt timeout, or the one learnt from latencies);
    /// `began` is when it started (the caller has just read the clock).
    #[allow(
        clippy::too_many_arguments,
        reason = "each is one fact about this attempt, passed down from the retry loop"
    )]
    pub(super) async fn attempt(
        &self,
        req: &mut NetRequest,
        url: &Url,
        call: &Call<'_>,
        limit: Duration,
        attempt: u32,
        hedge: bool,
        began: Instant,
    ) -> Answer {
        let span = attempt_span(call, url, attempt, hedge);
        // The `on_attempt` hooks run inside the attempt's span, so that what they take from
        // the current span (TraceUa's `traceparent` under OpenTelemetry) is this attempt's.
        in_scope(span.as_ref(), || {
            for interceptor in &self.interceptors.on_attempt {
                interceptor.on_attempt(req, attempt);
            }
            let event = || NetEvent::AttemptStarted {
                req: call.info(),
                attempt,
                hedge,
            };
            // A hedge's start is always told (see `Takes::ATTEMPT_STARTED`).
            if hedge {
                self.emit(event);
            } else {
                self.emit_taken(Takes::ATTEMPT_STARTED, event);
            }
        });
        // Boxed: the exchange holds the connection's own futures (hyper's send, the pool's
        // checkout, the first-byte timer), and every layer above an unboxed one (attempt,
        // retries, redirects, interceptors, the call) would carry that size and copy it once
        // per call. Measured: one allocation costs less than those copies.
        let result = in_span(
            Box::pin(self.exchange(req, url, call, limit, attempt, began)),
            span.clone(),
        )
        .await;
        let result = result.map(|mut res| {
            res.attempts = attempt;
            res
        });
        let result = result.map_err(|e| {
            if let ErrorKind::Timeout(phase) = e.kind() {
                self.emit(|| NetEvent::TimedOut {
                    req: call.info(),
                    phase,
                });
            }
            if e.kind() == ErrorKind::Blocked {
                let denied = e.find_source::<soulbase_net_policy::Denied>();
                self.emit(|| NetEvent::Blocked {
                    req: call.info(),
                    addr: denied.and_then(|d| d.addr),
                    rule: denied.map_or("address_guard", |d| d.rule.as_str()),
                });
            }
            e.at(&call.labels.method, url.as_str())
                .with_attempts(attempt)
        });
        let (outcome, elapsed) = match &result {
            Ok(res) => (Outcome::Response(res.status), res.elapsed),
            Err(e) => (
                Outcome::Error(e.kind()),
                Elapsed::default().with_total(began.elapsed()),
            ),
        };
        record_outcome(span.as_ref(), &outcome, 1);
        let _inside = span.as_ref().map(Span::enter);
        self.emit(|| NetEvent::AttemptFinished {
            req: call.info(),
            attempt,
            outcome,
            elapsed,
        });
        result
    }

    /// The exchange of one attempt (numbered `attempt` in the call): the transport sends the
    /// request; the first-byte timeout runs from when the connection took it; the response's
    /// body is wrapped in its limits and meter, and its errors carry `attempt`.
    ///
    /// Not an `async fn`, for the reason `Inner::send` gives: its future is boxed once per
    /// attempt, and an allocation of up to 1 KiB is one of the allocator's cheap ones.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn's future holds its arguments twice (see above)"
    )]
    pub(super) fn exchange<'a>(
        &'a self,
        req: &'a mut NetRequest,
        url: &'a Url,
        call: &'a Call<'a>,
        limit: Duration,
        attempt: u32,
        began: Instant,
    ) -> impl Future<Output = Answer> + Send + 'a {
        async move {
            let timeouts = call.timeouts;
            let transport = self.transports.get(call.policy)?;
            let progress = Arc::new(Progress::new(began));
            let limits = (
                call.policy.security.max_req_bytes.as_u64(),
                timeouts.write,
                progress.clone(),
            );
            let decoding = call.decoding.load(Ordering::Relaxed);
            // The request is built in a block of its own: moved into the transport's future, it
            // must not keep a slot of its own in this one.
            let request = {
                let h2 = transport.pool.expects_h2(url.scheme() == "https");
                let mut http_req = self.http_request(req, url, limits, h2)?;
                // Last, after every interceptor: whoever set them, they are not sent.
                let strip = &call.policy.security.strip_headers;
                if !strip.is_empty() {
                    crate::redirect::strip_named(http_req.headers_mut(), strip);
                }
                if let Some(auth) = proxy_auth(&transport, http_req.uri()) {
                    http_req
                        .headers_mut()
                        .insert(header::PROXY_AUTHORIZATION, auth);
                }
                transport.send(http_req)
            };
            tokio::pin!(request);
            // The first-byte clock starts when the connection takes the request (the body tells,
            // see `Progress`); until then only the total deadline applies (the connector bounds
            // connecting by itself). One timer: set to the earliest moment the first-byte phase
            // could end, and when it fires, either that is a timeout or it is set again — to the
            // phase's real end once the request was taken, else one first-byte timeout later.
            // Nothing on the connection's side has to wake this task.
            let ttfb_from = |taken_after: Duration| {
                let left_in_attempt = limit.saturating_sub(taken_after);
                let taken = began + taken_after;
                call.phase_deadline(Phase::Ttfb, taken, timeouts.ttfb.min(left_in_attempt))
            };
            // `ttfb_from(began)`, without measuring the nothing between `began` and itself.
            let first = call.phase_deadline(Phase::Ttfb, began, timeouts.ttfb.min(limit));
            // Reused from this thread's idle timers when there is one (see `timer`).
            let mut timer = Timer::at(first.0);
            let (res, connect) = std::future::poll_fn(|cx| {
                if let Poll::Ready(res) = request.as_mut().poll(cx) {
                    return Poll::Ready(res);
                }
                loop {
                    if std::pin::Pin::new(&mut timer).poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let now = Instant::now();
                    let (at, phase) = match progress.taken_after() {
                        Some(taken) => ttfb_from(taken),
                        // Not taken yet, so no first-byte timeout has begun (this `at` is in the
                        // future unless it is the total deadline): look again one timeout later.
                        None => {
                            let recheck = timeouts.ttfb.max(RECHECK_MIN);
                            call.phase_deadline(Phase::Ttfb, now, recheck)
                        }
                    };
                    if now >= at {
                        return Poll::Ready(Err(NetError::timeout(phase)));
                    }
                    timer.reset(at);
                }
            })
            .await?;
            let head_at = Instant::now();
            let ttfb = head_at.saturating_duration_since(began);
            // S75-4's `W_q_out` and `W_net` meet where the connection took the request (a
            // transport that never said so — none today — counts all of it as network).
            let queue_out = progress.taken_after().unwrap_or_default();
            let (mut parts, body) = res.into_parts();
            let max = call.policy.security.max_resp_bytes.as_u64();
            // The length the connection read from the head (hyper's exact size; zero for a
            // response without a body, like a HEAD's, whatever its header says): the header
            // is parsed again only when the connection cannot tell (HTTP/3).
            match http_body::Body::size_hint(&body).exact() {
                Some(len) => check_declared_length(len, max)?,
                None => check_content_length(&parts.headers, max)?,
            }
            let limited = LimitedBody::new(body, max)
                .read_timeout(timeouts.read)
                .deadline(call.deadline);
            // Body bytes only: a request without a body reports none.
            let sent = progress.sent();
            if sent > 0 {
                self.emit(|| NetEvent::Bytes {
                    req: call.info(),
                    dir: Direction::Out,
                    bytes: sent,
                });
            }
            // An error of the body (read timeout, deadline, size limit, reset, decoding) comes
            // after the head: this attempt reached the server, so the error counts it, as an
            // error of the exchange does (`attempt` sets the same number on those).
            let counted = move |e: NetError| e.with_attempts(attempt);
            // The byte meter wraps whatever the body is, unboxed: one box per response (two
            // for a decoded one, whose decoder is boxed already).
            let (observer, labels) = (&self.observer, &call.labels);
            let body = if decoding && parts.headers.contains_key(header::CONTENT_ENCODING) {
                let decoded = decode(limited, &mut parts.headers, max, decoding)?.map_err(counted);
                if self.observed {
                    MeteredBody::new(decoded, observer.clone(), labels.clone()).boxed_unsync()
                } else {
                    decoded.boxed_unsync()
                }
            } else if self.observed {
                let limited = limited.map_err(counted);
                MeteredBody::new(limited, observer.clone(), labels.clone()).boxed_unsync()
            } else {
                limited.map_err(counted).boxed_unsync()
            };
            Ok(Box::new(NetResponse {
                status: parts.status,
                content_type: parts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                headers: parts.headers,
                body: RespBody::Stream(body),
                elapsed: Elapsed::default()
                    .with_connect(connect)
                    .with_ttfb(ttfb)
                    .with_total(head_at.saturating_duration_since(call.started))
                    .with_queue_out(queue_out)
                    // `head_at - taken`, from the two spans already measured.
                    .with_network(ttfb.saturating_sub(queue_out)),
                bytes_in: 0,
                attempts: 1,
                url: url.as_str().to_owned(),
                version: parts.version,
            }))
        }
    }

    /// The client's own headers, set once per call on the request (so every attempt's copy of
    /// the headers has them without growing): the `User-Agent` when the request has none, and
    /// `Accept-Encoding` when the client decompresses and the request asks for no encoding
    /// itself. Returns whether responses are to be decoded (the client offered the encodings).
    pub(super) fn default_headers(&self, req: &mut NetRequest) -> bool {
        req.headers
            .entry(header::USER_AGENT)
            .or_insert_with(|| self.user_agent.clone());
        // One lookup: the entry says whether the caller asked for encodings and takes ours.
        self.decompress
            && match req.headers.entry(header::ACCEPT_ENCODING) {
                header::Entry::Vacant(entry) => {
                    entry.insert(HeaderValue::from_static(ACCEPT_ENCODING));
                    true
                }
                header::Entry::Occupied(_) => false,
            }
    }

    /// The hyper request for one attempt; `h2`: it is expected to go over HTTP/2 (see
    /// `attempt_headers`).
    pub(super) fn http_request(
        &self,
        req: &mut NetRequest,
        url: &Url,
        limits: (u64, Duration, Arc<Progress>),
        h2: bool,
    ) -> Result<Request<ReqBody>, NetError> {
        let uri = request_uri(url).map_err(|e| {
            NetError::invalid_request("url is not a valid request target").with_source(e)
        })?;
        let (max, write_timeout, progress) = limits;
        // Every body goes through `SendBody`, which tells the attempt when the connection
        // took the request; boxed once.
        let body: ReqBody = match &req.body {
            Body::Bytes(b) => send_body(Full::new(b.clone()), max, write_timeout, progress),
            Body::Json(_) | Body::Stream(_) => match std::mem::take(&mut req.body) {
                Body::Stream(s) => send_body(s.into_inner(), max, write_timeout, progress),
                other => {
                    let bytes = other.to_bytes()?.unwrap_or_default();
                    req.body = Body::Bytes(bytes.clone());
                    send_body(Full::new(bytes), max, write_timeout, progress)
                }
            },
            _ => send_body(Empty::new(), max, write_timeout, progress),
        };
        // Built in place: the builder would check again what `validate` and the parse of
        // `uri` already did.
        let mut http_req = Request::new(body);
        *http_req.method_mut() = req.method.clone();
        *http_req.uri_mut() = uri;
        *http_req.headers_mut() = attempt_headers(&req.headers, h2);
        Ok(http_req)
    }
}

/// The span an attempt runs in: `http.client.attempt`, an OpenTelemetry CLIENT span (one per
/// request on the wire, so the upstream's span is its child) with the HTTP client attributes
/// of the URL this attempt goes to (another base URL than the call's after a failover):
/// `http.request.method`, `server.address`, `server.port`, `url.full` (redacted as events
/// show it), `http.request.resend_count` from the second attempt on; at its end
/// `http.response.status_code`, `error.type` and the error status (see `record_outcome`).
fn attempt_span(call: &Call<'_>, url: &Url, attempt: u32, hedge: bool) -> Option<Span> {
    // Nothing takes INFO spans: nothing to build (see `request_span`).
    if !tracing::level_enabled!(tracing::Level::INFO) {
        return None;
    }
    let method = call.labels.method.as_str();
    let span = tracing::info_span!(
        "http.client.attempt",
        otel.kind = "client",
        otel.name = method,
        otel.status_code = Unset,
        http.request.method = method,
        server.address = host_of(url),
        server.port = url.port_or_known_default().map(i64::from),
        url.full = Unset,
        attempt = i64::from(attempt),
        hedge,
        http.request.resend_count = Unset,
        http.response.status_code = Unset,
        error.type = Unset,
    );
    // No subscriber wants it: no span (see `super::span`).
    if span.is_disabled() {
        return None;
    }
    // Only for a subscriber that wants the span: this allocates.
    span.record("url.full", shown_url(url));
    if attempt > 1 {
        span.record("http.request.resend_count", i64::from(attempt - 1));
    }
    Some(span)
}

/// The proxy credentials for an `http` request that goes to a proxy in absolute form; the
/// proxy consumes them. `https` requests carry none (the tunnel was authorised by CONNECT).
fn proxy_auth(transport: &crate::transport::Transport, uri: &http::Uri) -> Option<HeaderValue> {
    if uri.scheme_str() != Some("http") {
        return None;
    }
    transport
        .proxy
        .as_ref()?
        .intercept(uri)?
        .basic_auth()
        .cloned()
}

/// The headers one attempt sends: the request's, without `Proxy-Authorization` — proxy
/// credentials come from the proxy policy and go to the proxy only; one set on the request
/// would otherwise reach the origin.
///
/// For a request expected to go over HTTP/2 (`h2`) and without proxy credentials (a scan of
/// the names, nothing hashed), a clone: it keeps every entry's hash, where building the map
/// again hashes every name again. Over HTTP/1.1 the pool adds `Host`, which would grow a
/// clone's entries (a clone has no spare room): the map is built with room for it. Measured
/// per request with the two headers the client adds: the clone saves about 450 instructions
/// over h2c, and would cost about 400 over HTTP/1.1.
fn attempt_headers(headers: &HeaderMap, h2: bool) -> HeaderMap {
    let kept = |name: &header::HeaderName| name != header::PROXY_AUTHORIZATION;
    if h2 && headers.keys().all(kept) {
        return headers.clone();
    }
    let mut out = HeaderMap::with_capacity(headers.len() + 1);
    for (name, value) in headers {
        if kept(name) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// The request target of `url`, remembered per thread for the last few URLs (a hit is a
/// compare and a few reference counts instead of a parse and a copy).
fn request_uri(url: &Url) -> Result<http::Uri, http::uri::InvalidUri> {
    recall(&RECENT_URIS, 8, url.as_str(), str::parse)
}

/// `body` as sent for one attempt (see `SendBody`), boxed.
fn send_body<B>(body: B, max: u64, write_timeout: Duration, progress: Arc<Progress>) -> ReqBody
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<soulbase_net_core::BoxError>,
{
    SendBody::new(body, max, write_timeout, progress).boxed_unsync()
}

thread_local! {
    /// The last URLs this thread turned into request targets.
    static RECENT_URIS: Recent<http::Uri> = const { Recent::new() };
}

/// The least time before a first-byte timer that fired while the connection had not taken
/// the request yet looks again (a zero first-byte timeout would otherwise spin).
const RECHECK_MIN: Duration = Duration::from_millis(1);

/// The encodings the client decodes when it offers them itself.
const ACCEPT_ENCODING: &str = "gzip, br, zstd";
