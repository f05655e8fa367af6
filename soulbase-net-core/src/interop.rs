//! [`NetRequest`] and [`NetResponse`] as the `http` crate's types: the conversions the
//! runtime's `tower::Service` face is made of, and [`RespBody`] as an `http_body::Body`.
//!
//! Why here: the types are core's, so their conversions can only live here (Rust's orphan
//! rule), and they are pure moves of fields — no I/O.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use http_body::{Frame, SizeHint};
use pin_project_lite::pin_project;
use sync_wrapper::SyncWrapper;

use crate::{
    body::Body,
    error::{redact_url, BoxError, NetError},
    request::NetRequest,
    response::{NetResponse, RespBody},
};

/// An `http::Request` as a [`NetRequest`]: method, URI, headers and extensions move over
/// as they are, so a `CancellationToken` in the extensions cancels the call as it would on a
/// `NetRequest`.
///
/// - The URI must be absolute (scheme and authority): the client needs to know where to
///   send it (a tonic client gets one with `with_origin`).
/// - A body that is already at its end (`is_end_stream`, e.g. `http_body_util::Empty`)
///   becomes [`Body::Empty`], so a bodiless GET can be retried and hedged. Any other body
///   becomes [`Body::Stream`]: it is read once, so this conversion alone never retries,
///   hedges or resends a request with a body. (The runtime's tower face does more before
///   converting: a body it has whole, within the policy's `retry.replay_buffer`, is kept so
///   that it can be sent again — a tonic unary call's, for one.) Its data may be any
///   [`Buf`] (copied into `Bytes` only when it is not one already); it need not be `Sync`.
/// - The version is not kept: the client picks HTTP/1.1 or HTTP/2 by ALPN, or by
///   HTTP/2 prior knowledge when its builder says so.
/// - Tenant, policy key, per-request timeouts and `idempotent` keep their defaults; an
///   `Interceptor` can set them from headers.
///
/// # Errors
/// [`ErrorKind::InvalidRequest`](crate::ErrorKind::InvalidRequest) for a URI without a
/// scheme or an authority. Everything else is checked when the request is sent
/// ([`NetRequest::validate`]).
///
/// # Examples
/// ```
/// use soulbase_net_core::{Body, ErrorKind, NetRequest};
///
/// let req = http::Request::get("https://api.example.com/u/1")
///     .header("x-team", "payments")
///     .body(http_body_util::Empty::<bytes::Bytes>::new())
///     .unwrap();
/// let req = NetRequest::try_from(req)?;
/// assert_eq!(req.url, "https://api.example.com/u/1");
/// assert_eq!(req.headers["x-team"], "payments");
/// assert!(matches!(req.body, Body::Empty));
///
/// let relative = http::Request::get("/u/1").body(http_body_util::Empty::<bytes::Bytes>::new()).unwrap();
/// assert_eq!(NetRequest::try_from(relative).unwrap_err().kind(), ErrorKind::InvalidRequest);
/// # Ok::<(), soulbase_net_core::NetError>(())
/// ```
impl<B> TryFrom<http::Request<B>> for NetRequest
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Error = NetError;

    fn try_from(req: http::Request<B>) -> Result<Self, NetError> {
        let (parts, body) = req.into_parts();
        if parts.uri.scheme().is_none() || parts.uri.authority().is_none() {
            return Err(NetError::invalid_request(format!(
                "request uri `{}` is not absolute: it needs a scheme and an authority",
                redact_url(&parts.uri.to_string())
            )));
        }
        let body = if body.is_end_stream() {
            Body::Empty
        } else {
            Body::stream(SyncBody::new(body))
        };
        let mut out = NetRequest::new(parts.method, parts.uri.to_string()).body(body);
        out.headers = parts.headers;
        out.extensions = parts.extensions;
        Ok(out)
    }
}

/// A [`NetResponse`] as an `http::Response`: status, headers and body move over; the
/// [`Elapsed`](crate::Elapsed) timings go into the extensions. The body streams as it
/// arrives (trailers included), with the limits of the call still applied to it.
///
/// # Examples
/// ```
/// # async fn run() -> Result<(), soulbase_net_core::NetError> {
/// use http_body_util::BodyExt;
/// use soulbase_net_core::{Elapsed, NetResponse, RespBody};
///
/// let res: http::Response<RespBody> = NetResponse::from_bytes(http::StatusCode::OK, "hi").into();
/// assert_eq!(res.status(), 200);
/// assert!(res.extensions().get::<Elapsed>().is_some());
/// assert_eq!(res.into_body().collect().await?.to_bytes(), "hi");
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
/// ```
impl From<NetResponse> for http::Response<RespBody> {
    fn from(res: NetResponse) -> Self {
        let mut out = http::Response::new(res.body);
        *out.status_mut() = res.status;
        *out.headers_mut() = res.headers;
        out.extensions_mut().insert(res.elapsed);
        out
    }
}

/// A buffered body is one data frame (none when empty); a stream yields its frames,
/// trailers included, and the errors the client's limits raise while it arrives.
impl http_body::Body for RespBody {
    type Data = Bytes;
    type Error = NetError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, NetError>>> {
        match self.get_mut() {
            RespBody::Bytes(b) if b.is_empty() => Poll::Ready(None),
            RespBody::Bytes(b) => Poll::Ready(Some(Ok(Frame::data(std::mem::take(b))))),
            RespBody::Stream(s) => Pin::new(s).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Bytes(b) => b.is_empty(),
            RespBody::Stream(s) => s.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Bytes(b) => SizeHint::with_exact(b.len() as u64),
            RespBody::Stream(s) => s.size_hint(),
        }
    }
}

pin_project! {
    /// A `Send` body made `Sync` (a [`NetRequest`] is shared by reference with interceptors),
    /// with its data turned into `Bytes`.
    ///
    /// Why it is sound without a lock: the body is only touched through `&mut` (polling);
    /// what `&self` methods must answer (`size_hint`, `is_end_stream`) is remembered after
    /// each poll instead of asked of the body.
    struct SyncBody<B> {
        #[pin]
        inner: SyncWrapper<B>,
        hint: SizeHint,
        end: bool,
    }
}

impl<B: http_body::Body> SyncBody<B> {
    fn new(inner: B) -> Self {
        SyncBody {
            hint: inner.size_hint(),
            end: inner.is_end_stream(),
            inner: SyncWrapper::new(inner),
        }
    }
}

impl<B> http_body::Body for SyncBody<B>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let mut inner = this.inner.get_pin_mut();
        let frame = inner.as_mut().poll_frame(cx);
        if frame.is_ready() {
            *this.hint = inner.size_hint();
            *this.end = inner.is_end_stream();
        }
        match frame {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                *this.end = true;
                *this.hint = SizeHint::with_exact(0);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(
                frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))
            ))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.end
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

impl<B> fmt::Debug for SyncBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncBody")
            .field("hint", &self.hint)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use http_body_util::{BodyExt, Empty, Full};

    use super::*;
    use crate::{Elapsed, ErrorKind};

    /// A body that is `Send` but not `Sync` (as tonic's and hyper's boxed bodies are), with
    /// its data in a `Buf` that is not `Bytes`.
    struct SendOnly {
        frames: VecDeque<Frame<VecDeque<u8>>>,
        _not_sync: std::cell::Cell<()>,
    }

    impl http_body::Body for SendOnly {
        type Data = VecDeque<u8>;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<VecDeque<u8>>, std::io::Error>>> {
            Poll::Ready(self.frames.pop_front().map(Ok))
        }

        fn is_end_stream(&self) -> bool {
            self.frames.is_empty()
        }
    }

    fn request<B>(uri: &str, body: B) -> http::Request<B> {
        http::Request::post(uri).body(body).unwrap()
    }

    #[test]
    fn method_uri_headers_and_extensions_move_over() {
        let mut req = request("http://api.example/a?q=1", Empty::<Bytes>::new());
        req.headers_mut()
            .insert("x-a", http::HeaderValue::from_static("1"));
        req.extensions_mut().insert(7u8);
        let net = NetRequest::try_from(req).unwrap();
        assert_eq!(net.method, http::Method::POST);
        assert_eq!(net.url, "http://api.example/a?q=1");
        assert_eq!(net.headers["x-a"], "1");
        assert_eq!(net.extensions.get::<u8>(), Some(&7));
        assert!(matches!(net.body, Body::Empty));
        assert!(net.validate(1024).is_ok());
    }

    #[test]
    fn uris_without_scheme_or_authority_are_refused() {
        for uri in ["/a", "api.example:80"] {
            let err = NetRequest::try_from(request(uri, Empty::<Bytes>::new())).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        }
    }

    #[tokio::test]
    async fn bodies_stream_as_bytes_with_trailers_and_need_not_be_sync() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let body = SendOnly {
            frames: VecDeque::from([
                Frame::data(VecDeque::from(b"ab".to_vec())),
                Frame::data(VecDeque::from(b"c".to_vec())),
                Frame::trailers(trailers),
            ]),
            _not_sync: std::cell::Cell::new(()),
        };
        let net = NetRequest::try_from(request("https://api.example/", body)).unwrap();
        assert!(!net.is_replayable());
        let Body::Stream(stream) = net.body else {
            panic!("expected a stream");
        };
        let collected = stream.into_inner().collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
        assert_eq!(collected.to_bytes(), "abc");
    }

    #[tokio::test]
    async fn sync_body_remembers_the_end_and_the_size() {
        let mut body = SyncBody::new(Full::new(Bytes::from_static(b"xyz")));
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(3));
        assert!(!http_body::Body::is_end_stream(&body));
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "xyz");
        assert!(http_body::Body::is_end_stream(&body));
        assert!(body.frame().await.is_none());
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(0));
    }

    #[tokio::test]
    async fn responses_keep_status_headers_timings_and_body() {
        let elapsed = Elapsed::default().with_ttfb(std::time::Duration::from_millis(5));
        let mut net = NetResponse::from_bytes(http::StatusCode::CREATED, "made").with_header(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain"),
        );
        net.elapsed = elapsed;
        let res = http::Response::<RespBody>::from(net);
        assert_eq!(res.status(), http::StatusCode::CREATED);
        assert_eq!(res.headers()["content-type"], "text/plain");
        assert_eq!(res.extensions().get::<Elapsed>(), Some(&elapsed));
        let body = res.into_body();
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(4));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "made");
    }

    /// A response body of scripted frames and errors.
    struct Scripted(VecDeque<Result<Frame<Bytes>, NetError>>);

    impl http_body::Body for Scripted {
        type Data = Bytes;
        type Error = NetError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, NetError>>> {
            Poll::Ready(self.0.pop_front())
        }
    }

    #[tokio::test]
    async fn streamed_response_bodies_pass_frames_and_errors_through() {
        let script = Scripted(VecDeque::from([
            Ok(Frame::data(Bytes::from_static(b"1"))),
            Err(NetError::new(ErrorKind::TooLarge)),
        ]));
        let mut body = RespBody::Stream(script.boxed_unsync());
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "1"
        );
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TooLarge);
    }

    #[tokio::test]
    async fn empty_buffered_bodies_end_at_once() {
        let mut body = RespBody::Bytes(Bytes::new());
        assert!(http_body::Body::is_end_stream(&body));
        assert!(body.frame().await.is_none());
    }
}
