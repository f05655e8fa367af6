//! Body wrappers of the send pipeline: the request body as sent (write timeout, size limit
//! for streams, bytes out) and the response body as handed over (bytes in, reported once).

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{ready, Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::Method;
use http_body::{Body, Frame, SizeHint};
use soulbase_net_core::{BoxError, Direction, NetError, NetEvent, Observer, Phase, RequestInfo};
use tokio::time::{Instant, Sleep};

/// What the connection tells one attempt about its request, through the request body: when
/// it took the request (hyper asks the body for its size as it starts sending — where the
/// first-byte clock starts) and how many body bytes it sent.
///
/// Why not hyper-util's `capture_connection`: it costs a watch channel, a request extension
/// and a copy of the connection's metadata per request; this costs one small allocation,
/// shared with the body that is boxed anyway.
#[derive(Debug)]
pub(crate) struct Progress {
    began: Instant,
    /// Nanoseconds after `began`, plus one; zero until the connection took the request.
    taken: AtomicU64,
    sent: AtomicU64,
}

impl Progress {
    pub(crate) fn new(began: Instant) -> Self {
        Progress {
            began,
            taken: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        }
    }

    /// Notes that the connection took the request (only the first time counts).
    fn mark_taken(&self) {
        if self.taken.load(Ordering::Relaxed) == 0 {
            let nanos = u64::try_from(self.began.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
            let _ = self
                .taken
                .compare_exchange(0, nanos + 1, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// How long after `began` the connection took the request, if it has: the attempt's
    /// `W_q_out` as it is, without an instant to subtract again.
    pub(crate) fn taken_after(&self) -> Option<Duration> {
        match self.taken.load(Ordering::Relaxed) {
            0 => None,
            n => Some(Duration::from_nanos(n - 1)),
        }
    }

    /// The body bytes sent so far.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

/// The request body as hyper sends it: tells the attempt when the connection took the
/// request ([`Progress`]), counts bytes, refuses a stream that grows past `max_req_bytes`, and
/// fails with `Timeout(Write)` when the body stays idle (no chunk produced) for longer than
/// the write timeout once sending started. A connection that stops taking data is caught by
/// the first-byte and total deadlines.
pub(crate) struct SendBody<B> {
    inner: B,
    max: u64,
    progress: Arc<Progress>,
    write_timeout: Duration,
    idle: Option<Pin<Box<Sleep>>>,
}

impl<B> SendBody<B> {
    pub(crate) fn new(
        inner: B,
        max: u64,
        write_timeout: Duration,
        progress: Arc<Progress>,
    ) -> Self {
        SendBody {
            inner,
            max,
            progress,
            write_timeout,
            idle: None,
        }
    }
}

impl<B> Body for SendBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        this.progress.mark_taken();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let total = this
                        .progress
                        .sent
                        .fetch_add(data.len() as u64, Ordering::Relaxed)
                        + data.len() as u64;
                    if total > this.max {
                        return Poll::Ready(Some(Err(Box::new(NetError::invalid_request(format!(
                            "streamed body went over the limit of {} bytes (security.max_req_bytes)",
                            this.max
                        ))))));
                    }
                }
                let next = Instant::now() + this.write_timeout;
                if let Some(idle) = this.idle.as_mut() {
                    idle.as_mut().reset(next);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let timeout = this.write_timeout;
                let idle = this
                    .idle
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                ready!(idle.as_mut().poll(cx));
                Poll::Ready(Some(Err(Box::new(
                    NetError::timeout(Phase::Write).with_message("the request body stalled"),
                ))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.progress.mark_taken();
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.progress.mark_taken();
        self.inner.size_hint()
    }
}

/// Owned labels of a request, for events emitted after the call has returned. Shared (an
/// `Arc`) between the call and its response body, so handing them over costs no copy.
#[derive(Debug)]
pub(crate) struct OwnedInfo {
    pub(crate) id: u64,
    pub(crate) method: Method,
    pub(crate) scheme: &'static str,
    /// The URL the call was made to, as validated (shared with the call, not copied).
    pub(crate) target: Arc<url::Url>,
    /// Where the call's host label is in `target`'s text (see [`host_span`](super::urls::host_span)).
    pub(crate) host: std::ops::Range<usize>,
    pub(crate) tenant: Option<String>,
    /// The URL as events show it.
    pub(crate) shown: Shown,
}

/// How events show the call's URL (the text of [`shown_url`](super::urls::shown_url)),
/// without a copy of it where it can be a slice of the URL the call holds.
#[derive(Debug)]
pub(crate) enum Shown {
    /// The first this many bytes of the target's text: a validated URL has no userinfo, so
    /// the URL up to its path is what events show.
    Prefix(usize),
    /// The redacted copy of a URL with userinfo (validation refuses one: not on any path
    /// today, kept so that a credential can never reach an event).
    Redacted(String),
}

impl Shown {
    /// How events show `url`.
    pub(crate) fn of(url: &url::Url) -> Self {
        match super::urls::shown_prefix(url) {
            Some(len) => Shown::Prefix(len),
            None => Shown::Redacted(super::urls::shown_url(url)),
        }
    }
}

impl OwnedInfo {
    /// The host the call was made to, as policies and keys name it.
    pub(crate) fn host(&self) -> &str {
        self.target
            .as_str()
            .get(self.host.clone())
            .unwrap_or_default()
    }

    /// The borrowed labels events carry.
    pub(crate) fn info(&self) -> RequestInfo<'_> {
        RequestInfo {
            id: self.id,
            method: &self.method,
            scheme: self.scheme,
            host: self.host(),
            tenant: self.tenant.as_deref(),
            url: match &self.shown {
                Shown::Prefix(len) => self.target.as_str().get(..*len).unwrap_or_default(),
                Shown::Redacted(url) => url,
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The response body as the caller gets it: reports the bytes received once, when the
    /// body ends, fails, or is dropped unread. Wraps the limited body directly (no box in
    /// between), so a response costs one box and one dynamic call per frame.
    pub(crate) struct MeteredBody<B> {
        #[pin]
        inner: B,
        received: u64,
        report: Option<(Arc<dyn Observer>, Arc<OwnedInfo>)>,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            report(this.report, *this.received);
        }
    }
}

impl<B> MeteredBody<B> {
    pub(crate) fn new(inner: B, observer: Arc<dyn Observer>, info: Arc<OwnedInfo>) -> Self {
        MeteredBody {
            inner,
            received: 0,
            report: Some((observer, info)),
        }
    }
}

/// Reports the bytes received, the first time only, and only when there were some.
fn report(slot: &mut Option<(Arc<dyn Observer>, Arc<OwnedInfo>)>, received: u64) {
    if let Some((observer, info)) = slot.take().filter(|_| received > 0) {
        observer.on_event(&NetEvent::Bytes {
            req: info.info(),
            dir: Direction::In,
            bytes: received,
        });
    }
}

impl<B> Body for MeteredBody<B>
where
    B: Body<Data = Bytes, Error = NetError>,
{
    type Data = Bytes;
    type Error = NetError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, NetError>>> {
        let this = self.project();
        let polled = ready!(this.inner.poll_frame(cx));
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    *this.received += data.len() as u64;
                }
            }
            Some(Err(_)) | None => report(this.report, *this.received),
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
