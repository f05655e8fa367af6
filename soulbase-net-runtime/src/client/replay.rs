//! What lets the tower face send a request again: a copy of its body read ahead into memory
//! (`retry.replay_buffer`), and the mark by which the retry loop knows a request came through
//! the tower face.
//!
//! Why read ahead at all: an `http::Request`'s body is a stream, and a stream is sent once —
//! so without a copy no gRPC call could be retried, not even after the server refused its
//! stream. A gRPC unary request's body is small and finite: tonic encodes its one message when
//! the body is first polled, and the body ends at the next poll.
//!
//! Why only what is at hand: the body is read only as far as its frames are ready when the call
//! starts, never waiting for one. A client or bidirectional stream's next message may wait for
//! the server's answer, which cannot come before the request is sent: waiting for the end of
//! such a body would hang the call. A body that is not at hand whole, or is larger than the
//! limit, goes out once, the frames read so far first, exactly as it would have without them.

use std::{
    collections::VecDeque,
    future::poll_fn,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use soulbase_net_core::{Body, BoxError, ErrorKind, NetRequest, Outcome, Phase};

use super::{urls::host_of, Inner};

/// The mark of a request that came through the tower face (in its extensions).
///
/// The retry loop sends such a request again, whatever its method, when its body could be
/// kept and the attempt never left the client (see [`never_sent`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct TowerCall;

/// A body's frames read ahead that did not make a whole copy, then the rest of the body.
struct ReadAhead {
    /// Frames read ahead, in order: data, then possibly the frame that stopped the reading
    /// (data over the limit, trailers, or an error).
    read: VecDeque<Result<Frame<Bytes>, BoxError>>,
    /// Bytes of data in `read`.
    read_len: u64,
    /// The body after what was read; `None` once it ended (trailers or an error were read).
    rest: Option<BoxBody<Bytes, BoxError>>,
}

impl Inner {
    /// Prepares a request that came through the tower face: the body kept whole when it is at
    /// hand and within the policy's `retry.replay_buffer`, an `Idempotency-Key` header taken
    /// as the caller's word that the request may be repeated (as
    /// `NetRequest::idempotency_key` says it), and the [`TowerCall`] mark where it matters.
    pub(super) async fn prepare_tower_call(&self, req: &mut NetRequest) {
        if !req.body.is_replayable() {
            if let Some(limit) = self.replay_limit(req) {
                let body = std::mem::take(&mut req.body);
                req.body = read_ahead(body, limit).await;
            }
        }
        if req.headers.contains_key(IDEMPOTENCY_KEY) {
            req.idempotent = true;
        }
        // Only where it changes something: a request retryable by its method needs no mark,
        // and one whose body was not kept cannot go again anyway (and a mark costs
        // allocations).
        if !req.is_retryable_method() && req.body.is_replayable() {
            req.extensions.insert(TowerCall);
        }
    }

    /// The `retry.replay_buffer` of the policy the call will run under, resolved as
    /// `Inner::send` resolves it; `None` when the request is invalid (`send` says why) or
    /// names an unknown policy key.
    fn replay_limit(&self, req: &NetRequest) -> Option<u64> {
        let url = req.validate_shared(u64::MAX).ok()?;
        let view = self.resolver.view();
        let policy = self.policy_for(
            view.as_ref(),
            req.tenant.as_deref(),
            host_of(&url),
            req.policy_key.as_deref(),
        )?;
        Some(policy.retry.replay_buffer.as_u64())
    }
}

/// The header by which a caller says the server drops repeats of the request.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Whether an attempt that ended with `outcome` provably never left the client: no
/// connection could be had (name resolution, connect, or their timeouts, TLS handshake
/// included), so no byte of the request was written. Such an attempt is safe to make again
/// whatever the method; a request the server received but did not process is
/// `NotProcessed`, which the retry loop resends on its own.
pub(super) fn never_sent(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Error(
            ErrorKind::Dns
                | ErrorKind::Connect
                | ErrorKind::Timeout(Phase::Dns | Phase::Connect | Phase::Tls)
        )
    )
}

/// `body` as bytes when it is a stream whose frames are all ready now and whose data ends
/// within `limit` bytes without trailers; otherwise as a stream that yields what was read,
/// then the rest.
pub(super) async fn read_ahead(body: Body, limit: u64) -> Body {
    let Body::Stream(stream) = body else {
        return body;
    };
    let mut rest = stream.into_inner();
    if http_body::Body::size_hint(&rest).lower() > limit {
        return Body::stream(rest);
    }
    let mut kept = Vec::new();
    let mut len = 0u64;
    let stopped = loop {
        // One poll, whatever it answers: a frame not ready now is not waited for.
        match poll_fn(|cx| Poll::Ready(http_body::Body::poll_frame(Pin::new(&mut rest), cx))).await
        {
            Poll::Ready(None) => return Body::Bytes(concat(kept, len)),
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if len.saturating_add(data.len() as u64) <= limit => {
                    len += data.len() as u64;
                    kept.push(data);
                }
                Ok(data) => break Some(Ok(Frame::data(data))),
                // Trailers: bytes cannot carry them.
                Err(frame) => break Some(Ok(frame)),
            },
            Poll::Ready(Some(Err(e))) => break Some(Err(e)),
            Poll::Pending => break None,
        }
    };
    let mut read: VecDeque<_> = kept.into_iter().map(|d| Ok(Frame::data(d))).collect();
    let mut rest = Some(rest);
    match stopped {
        Some(Ok(frame)) => {
            match frame.data_ref() {
                Some(data) => len += data.len() as u64,
                // Trailers are a body's last frame.
                None => rest = None,
            }
            read.push_back(Ok(frame));
        }
        // A body that failed is not polled again.
        Some(Err(e)) => {
            rest = None;
            read.push_back(Err(e));
        }
        None => {}
    }
    Body::stream(ReadAhead {
        read,
        read_len: len,
        rest,
    })
}

/// The data read, as one `Bytes` (no copy when it came in one frame).
fn concat(kept: Vec<Bytes>, len: u64) -> Bytes {
    match <[Bytes; 1]>::try_from(kept) {
        Ok([one]) => one,
        Err(kept) => {
            let mut all = BytesMut::with_capacity(usize::try_from(len).unwrap_or(0));
            for data in kept {
                all.extend_from_slice(&data);
            }
            all.freeze()
        }
    }
}

// === impl ReadAhead ===

impl http_body::Body for ReadAhead {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(next) = this.read.pop_front() {
            if let Ok(data) = next.as_ref().map(Frame::data_ref) {
                let n = data.map_or(0, |d| d.len() as u64);
                this.read_len = this.read_len.saturating_sub(n);
            }
            return Poll::Ready(Some(next));
        }
        match &mut this.rest {
            Some(rest) => http_body::Body::poll_frame(Pin::new(rest), cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty()
            && self
                .rest
                .as_ref()
                .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self
            .rest
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), http_body::Body::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(self.read_len));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(self.read_len));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Full};
    use tokio::sync::mpsc;

    use super::*;

    type Sender = mpsc::UnboundedSender<Result<Frame<Bytes>, BoxError>>;

    /// A body fed through a channel: a frame sent before it is polled is ready, and the
    /// body ends when the sender is dropped.
    struct Channel(mpsc::UnboundedReceiver<Result<Frame<Bytes>, BoxError>>);

    impl http_body::Body for Channel {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            self.0.poll_recv(cx)
        }
    }

    /// A body whose `frames` are all ready; it ends after them unless the sender is kept.
    fn body(frames: Vec<Result<Frame<Bytes>, BoxError>>) -> (Body, Sender) {
        let (tx, rx) = mpsc::unbounded_channel();
        for f in frames {
            tx.send(f).unwrap();
        }
        (Body::stream(Channel(rx)), tx)
    }

    fn data(chunks: &[&'static str]) -> Vec<Result<Frame<Bytes>, BoxError>> {
        chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
            .collect()
    }

    async fn collect(body: Body) -> Result<(Bytes, Option<http::HeaderMap>), BoxError> {
        let Body::Stream(s) = body else {
            panic!("not a stream: {body:?}");
        };
        let collected = s.into_inner().collect().await?;
        let trailers = collected.trailers().cloned();
        Ok((collected.to_bytes(), trailers))
    }

    #[tokio::test]
    async fn a_body_at_hand_within_the_limit_is_kept_whole() {
        let (b, tx) = body(data(&["ab", "cd", "ef"]));
        drop(tx);
        assert!(matches!(read_ahead(b, 6).await, Body::Bytes(b) if b == "abcdef"));
        let one = read_ahead(Body::stream(Full::new(Bytes::from("x"))), 1).await;
        assert!(matches!(one, Body::Bytes(b) if b == "x"));
        // A body that is not a stream is left as it is.
        assert!(matches!(read_ahead(Body::Empty, 0).await, Body::Empty));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_goes_out_whole_as_a_stream() {
        let (b, tx) = body(data(&["ab", "cd", "ef"]));
        drop(tx);
        let b = read_ahead(b, 3).await;
        assert_eq!(collect(b).await.unwrap().0, "abcdef");
        // Known to be too large before reading: not read at all.
        let b = read_ahead(Body::stream(Full::new(Bytes::from("abcd"))), 3).await;
        assert!(matches!(&b, Body::Stream(s) if s.exact_len() == Some(4)));
        assert_eq!(collect(b).await.unwrap().0, "abcd");
        // A limit of 0 keeps nothing.
        let b = read_ahead(Body::stream(Full::new(Bytes::from("a"))), 0).await;
        assert!(matches!(b, Body::Stream(_)));
    }

    #[tokio::test]
    async fn a_body_still_being_produced_is_not_waited_for() {
        let (b, tx) = body(data(&["first"]));
        let b = read_ahead(b, 1024).await;
        assert!(matches!(b, Body::Stream(_)), "{b:?}");
        tx.send(Ok(Frame::data(Bytes::from(" then")))).unwrap();
        drop(tx);
        assert_eq!(collect(b).await.unwrap().0, "first then");
    }

    #[tokio::test]
    async fn trailers_and_errors_end_the_copy_and_go_out_in_order() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-sum", http::HeaderValue::from_static("1"));
        let mut frames = data(&["ab"]);
        frames.push(Ok(Frame::trailers(trailers.clone())));
        // The sender is kept: nothing may be read after the trailers.
        let (b, _tx) = body(frames);
        let b = read_ahead(b, 64).await;
        let got = collect(b).await.unwrap();
        assert_eq!(got, (Bytes::from("ab"), Some(trailers)));

        let mut frames = data(&["ab"]);
        frames.push(Err(BoxError::from("broken")));
        let (b, _tx) = body(frames);
        let b = read_ahead(b, 64).await;
        assert_eq!(collect(b).await.unwrap_err().to_string(), "broken");
    }

    #[test]
    fn only_attempts_that_found_no_connection_were_never_sent() {
        let never = [
            ErrorKind::Dns,
            ErrorKind::Connect,
            ErrorKind::Timeout(Phase::Dns),
            ErrorKind::Timeout(Phase::Connect),
            ErrorKind::Timeout(Phase::Tls),
        ];
        for kind in never {
            assert!(never_sent(Outcome::Error(kind)), "{kind:?}");
        }
        let maybe = [
            ErrorKind::Io,
            ErrorKind::NotProcessed,
            ErrorKind::Timeout(Phase::Ttfb),
            ErrorKind::Timeout(Phase::Read),
            ErrorKind::Timeout(Phase::Write),
            ErrorKind::Timeout(Phase::Total),
        ];
        for kind in maybe {
            assert!(!never_sent(Outcome::Error(kind)), "{kind:?}");
        }
        assert!(!never_sent(Outcome::Response(
            http::StatusCode::BAD_GATEWAY
        )));
    }
}
