//! [`LimitedBody`]: a response body with a size cap, a read (idle) timeout and a deadline.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{ready, Context, Poll},
    time::Duration,
};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use soulbase_net_core::{BoxError, ErrorKind, NetError, Phase};
use tokio::time::{Instant, Sleep};

use super::too_large;

pin_project! {
    /// A response body that enforces the limits of a call while it streams.
    ///
    /// - **Size**: at most `max_bytes` data bytes in all (a body of exactly `max_bytes` is
    ///   fine); the frame that would pass the limit is not delivered and
    ///   [`ErrorKind::TooLarge`] is returned instead.
    /// - **Read timeout** (idle time): while the body is polled and no frame arrives for
    ///   `read_timeout`, it fails with `Timeout(Read)`. The timer runs only while the
    ///   consumer waits for a frame — time the consumer spends elsewhere between polls is not
    ///   counted. Default is none.
    /// - **Deadline**: past this instant, it fails with `Timeout(Total)`, whether or not data
    ///   keeps dripping in. Default is none.
    /// - **Bytes in**: when given a counter, every delivered data byte is added to it, so a
    ///   holder can see what was read even when the body is dropped half way.
    ///
    /// Errors of the wrapped body become [`ErrorKind::Io`] with the original error as the
    /// source, unless they already are a [`NetError`], which passes through unchanged.
    /// After the first error the body is finished: it yields `None`.
    ///
    /// Timers are created on the first poll, which must happen inside a Tokio runtime.
    ///
    /// # Examples
    /// ```
    /// # async fn run() {
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use soulbase_net_core::ErrorKind;
    /// use soulbase_net_runtime::body::{collect, LimitedBody};
    ///
    /// let ok = LimitedBody::new(Full::new(Bytes::from_static(b"0123")), 4);
    /// assert_eq!(collect(ok).await.unwrap(), "0123");
    /// let over = LimitedBody::new(Full::new(Bytes::from_static(b"01234")), 4);
    /// assert_eq!(collect(over).await.unwrap_err().kind(), ErrorKind::TooLarge);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(run());
    /// ```
    pub struct LimitedBody<B> {
        #[pin]
        inner: B,
        max_bytes: u64,
        read: u64,
        counter: Option<Arc<AtomicU64>>,
        read_timeout: Option<Duration>,
        // Armed while the consumer waits for a frame; disarmed when one is delivered.
        #[pin]
        idle: Option<Sleep>,
        idle_armed: bool,
        deadline: Option<Instant>,
        #[pin]
        deadline_sleep: Option<Sleep>,
        done: bool,
    }
}

// === impl LimitedBody ===

impl<B> LimitedBody<B> {
    /// Wraps `inner`, allowing at most `max_bytes` data bytes, with no timeouts and a fresh
    /// byte counter.
    pub fn new(inner: B, max_bytes: u64) -> Self {
        LimitedBody {
            inner,
            max_bytes,
            read: 0,
            counter: None,
            read_timeout: None,
            idle: None,
            idle_armed: false,
            deadline: None,
            deadline_sleep: None,
            done: false,
        }
    }

    /// Fails with `Timeout(Read)` when no frame arrives for `timeout` while the body is
    /// polled. Default is none.
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = Some(timeout);
        self
    }

    /// Fails with `Timeout(Total)` once `deadline` has passed (the call's total deadline).
    /// Default is none.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Adds every delivered data byte to `counter` (shared with the client, which reports
    /// bytes in). Default is no counter (nothing is allocated or added per frame).
    pub fn counter(mut self, counter: Arc<AtomicU64>) -> Self {
        self.counter = Some(counter);
        self
    }

    /// The byte counter this body adds to (one is made now if it has none).
    pub fn bytes_counter(&mut self) -> Arc<AtomicU64> {
        Arc::clone(
            self.counter
                .get_or_insert_with(|| Arc::new(AtomicU64::new(0))),
        )
    }

    /// Data bytes delivered so far by this body.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    /// The size cap, in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = NetError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, NetError>>> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        // Timers are armed only when the body has to wait: a frame that is ready costs no
        // timer (most small bodies arrive with their head).
        let frame = match this.inner.poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                if let Some(at) = *this.deadline {
                    if this.deadline_sleep.is_none() {
                        this.deadline_sleep.set(Some(tokio::time::sleep_until(at)));
                    }
                    if let Some(sleep) = this.deadline_sleep.as_mut().as_pin_mut() {
                        if sleep.poll(cx).is_ready() {
                            *this.done = true;
                            return Poll::Ready(Some(Err(NetError::timeout(Phase::Total))));
                        }
                    }
                }
                if let Some(timeout) = *this.read_timeout {
                    if !*this.idle_armed {
                        let at = Instant::now() + timeout;
                        match this.idle.as_mut().as_pin_mut() {
                            Some(sleep) => sleep.reset(at),
                            None => this.idle.set(Some(tokio::time::sleep_until(at))),
                        }
                        *this.idle_armed = true;
                    }
                    if let Some(sleep) = this.idle.as_mut().as_pin_mut() {
                        ready!(sleep.poll(cx));
                        *this.done = true;
                        return Poll::Ready(Some(Err(NetError::timeout(Phase::Read))));
                    }
                }
                return Poll::Pending;
            }
        };
        // A body that keeps dripping must still stop at the deadline.
        if let Some(at) = *this.deadline {
            if matches!(&frame, Some(Ok(_))) && Instant::now() >= at {
                *this.done = true;
                return Poll::Ready(Some(Err(NetError::timeout(Phase::Total))));
            }
        }
        *this.idle_armed = false;
        match frame {
            None => {
                *this.done = true;
                Poll::Ready(None)
            }
            Some(Err(e)) => {
                *this.done = true;
                Poll::Ready(Some(Err(inner_error(e.into()))))
            }
            Some(Ok(frame)) => {
                let len = frame.data_ref().map_or(0, |d| d.remaining() as u64);
                let total = this.read.saturating_add(len);
                if total > *this.max_bytes {
                    *this.done = true;
                    return Poll::Ready(Some(Err(too_large(*this.max_bytes))));
                }
                *this.read = total;
                if let Some(counter) = this.counter.as_ref() {
                    counter.fetch_add(len, Ordering::Relaxed);
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.done {
            return SizeHint::with_exact(0);
        }
        self.inner.size_hint()
    }
}

impl<B> fmt::Debug for LimitedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitedBody")
            .field("max_bytes", &self.max_bytes)
            .field("read", &self.read)
            .field("read_timeout", &self.read_timeout)
            .field("deadline", &self.deadline)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// An error of the wrapped body: a [`NetError`] passes through (a lower layer already said
/// what happened), anything else is an i/o failure with its cause kept.
pub(super) fn inner_error(e: BoxError) -> NetError {
    match e.downcast::<NetError>() {
        Ok(e) => *e,
        Err(e) => {
            // A TLS alert after the response head (a refused client certificate on TLS 1.3)
            // is a TLS failure, not a plain I/O error.
            let kind = crate::tls::classify_error(&*e).unwrap_or(ErrorKind::Io);
            NetError::new(kind).with_source(e)
        }
    }
}
