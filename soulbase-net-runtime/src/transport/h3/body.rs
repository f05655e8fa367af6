//! [`H3Body`]: the body of an HTTP/3 response, read from its request stream.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use http_body::Frame;
use soulbase_net_core::NetError;

use super::conn::Live;

type Stream = h3::client::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;

/// The data of an HTTP/3 response; keeps its connection alive while it is read. Errors are
/// [`NetError`]s already (see `Live::stream_failed`).
pub(crate) struct H3Body {
    stream: Stream,
    live: Live,
    done: bool,
}

impl H3Body {
    pub(super) fn new(stream: Stream, live: Live) -> Self {
        H3Body {
            stream,
            live,
            done: false,
        }
    }

    /// The next data frame, `None` at the end (trailers are not read).
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, NetError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.stream.poll_recv_data(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(mut data))) => {
                let bytes = data.copy_to_bytes(data.remaining());
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Poll::Ready(Ok(None)) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Err(e)) => {
                self.done = true;
                Poll::Ready(Some(Err(self.live.stream_failed(e))))
            }
        }
    }
}

impl http_body::Body for H3Body {
    type Data = Bytes;
    type Error = NetError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, NetError>>> {
        self.get_mut().poll_data(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

impl fmt::Debug for H3Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("H3Body")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
