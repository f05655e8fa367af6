//! Content decoding: gzip, br and zstd response bodies, capped after decompression.
//!
//! Why the cap is applied again after decoding: a few kilobytes of gzip can decode to
//! gigabytes (a decompression bomb). The decoded stream goes through a [`LimitedBody`], so
//! decompression stops as soon as `max_bytes` decoded bytes have been produced.

use std::{
    fmt, io,
    pin::Pin,
    task::{Context, Poll},
};

use async_compression::tokio::bufread::{BrotliDecoder, GzipDecoder, ZstdDecoder};
use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap};
use http_body::{Body, Frame};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt};
use soulbase_net_core::{ErrorKind, NetError};
use tokio::io::{AsyncRead, BufReader};
use tokio_util::io::StreamReader;

use super::limited::{inner_error, LimitedBody};

/// Most content codings applied on top of each other that are decoded.
pub(super) const MAX_CODINGS: usize = 2;

/// How much decoded output is asked for at once.
const CHUNK: usize = 16 * 1024;

/// A content coding this crate decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coding {
    Gzip,
    Brotli,
    Zstd,
}

type Reader = Pin<Box<dyn AsyncRead + Send>>;

/// Decodes a response body according to its `Content-Encoding`, and caps the decoded bytes at
/// `max_bytes`.
///
/// - `gzip` (and `x-gzip`), `br` and `zstd` are decoded, at most two stacked codings
///   (`Content-Encoding: gzip, br` — decoded in reverse order); `identity` is ignored.
/// - When the body is decoded, `Content-Encoding` and `Content-Length` are removed from
///   `headers`, since they describe the encoded bytes.
/// - The body is passed through undecoded, with `headers` untouched, when `enabled` is false,
///   when there is no `Content-Encoding`, when a coding is not one of the above (the caller
///   sees the header), or when the body is known to be empty (`HEAD`, `204`, `304`).
/// - Whatever the path, the body returned never yields more than `max_bytes` data bytes: the
///   next byte is [`ErrorKind::TooLarge`]. A decompression bomb stops there.
///
/// Errors of `body` pass through unchanged; corrupt encoded data yields
/// [`ErrorKind::Decode`].
///
/// # Errors
/// [`ErrorKind::Decode`] when more than two codings are stacked.
///
/// # Examples
/// ```
/// # async fn run() -> Result<(), soulbase_net_core::NetError> {
/// use bytes::Bytes;
/// use http::{header, HeaderMap, HeaderValue};
/// use http_body_util::{BodyExt, Full};
/// use soulbase_net_runtime::body::{collect, decode};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
/// let body = Full::new(Bytes::from_static(b"plain")).map_err(|never| match never {});
/// let body = decode(body, &mut headers, 1024, true)?;
/// assert_eq!(collect(body).await?, "plain");
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
/// ```
pub fn decode<B>(
    body: B,
    headers: &mut HeaderMap,
    max_bytes: u64,
    enabled: bool,
) -> Result<UnsyncBoxBody<Bytes, NetError>, NetError>
where
    B: Body<Data = Bytes, Error = NetError> + Send + 'static,
{
    let codings = if enabled && body.size_hint().exact() != Some(0) {
        codings(headers)?
    } else {
        None
    };
    let Some(codings) = codings else {
        return Ok(UnsyncBoxBody::new(LimitedBody::new(body, max_bytes)));
    };
    headers.remove(header::CONTENT_ENCODING);
    headers.remove(header::CONTENT_LENGTH);
    let stream = body.map_err(io::Error::other).into_data_stream();
    let mut reader: Reader = Box::pin(StreamReader::new(stream));
    // The last coding applied is the first one removed.
    for coding in codings.into_iter().rev() {
        reader = decoder(coding, reader);
    }
    let decoded = ReaderBody {
        reader,
        buf: BytesMut::new(),
        done: false,
    };
    Ok(UnsyncBoxBody::new(LimitedBody::new(decoded, max_bytes)))
}

/// The codings to undo, in the order they were applied; `None` when nothing is to be
/// decoded (no header, only `identity`, or a coding we do not know).
fn codings(headers: &HeaderMap) -> Result<Option<Vec<Coding>>, NetError> {
    let mut out = Vec::new();
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let Ok(value) = value.to_str() else {
            return Ok(None);
        };
        for token in value.split(',').map(str::trim) {
            let coding = if token.is_empty() || token.eq_ignore_ascii_case("identity") {
                continue;
            } else if token.eq_ignore_ascii_case("gzip") || token.eq_ignore_ascii_case("x-gzip") {
                Coding::Gzip
            } else if token.eq_ignore_ascii_case("br") {
                Coding::Brotli
            } else if token.eq_ignore_ascii_case("zstd") {
                Coding::Zstd
            } else {
                return Ok(None);
            };
            out.push(coding);
        }
    }
    if out.len() > MAX_CODINGS {
        return Err(NetError::new(ErrorKind::Decode).with_message(format!(
            "{} stacked content codings, at most {MAX_CODINGS} are decoded",
            out.len()
        )));
    }
    Ok((!out.is_empty()).then_some(out))
}

fn decoder(coding: Coding, encoded: Reader) -> Reader {
    let encoded = BufReader::new(encoded);
    match coding {
        Coding::Gzip => {
            let mut d = GzipDecoder::new(encoded);
            // Concatenated gzip members are one body (RFC 1952 §2.2).
            d.multiple_members(true);
            Box::pin(d)
        }
        Coding::Brotli => Box::pin(BrotliDecoder::new(encoded)),
        Coding::Zstd => Box::pin(ZstdDecoder::new(encoded)),
    }
}

/// The decoded bytes of an [`AsyncRead`], as a body.
struct ReaderBody {
    reader: Reader,
    buf: BytesMut,
    done: bool,
}

impl Body for ReaderBody {
    type Data = Bytes;
    type Error = NetError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, NetError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if this.buf.capacity() < CHUNK {
            this.buf.reserve(CHUNK);
        }
        match tokio_util::io::poll_read_buf(this.reader.as_mut(), cx, &mut this.buf) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(0)) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Ok(_)) => Poll::Ready(Some(Ok(Frame::data(this.buf.split().freeze())))),
            Poll::Ready(Err(e)) => {
                this.done = true;
                Poll::Ready(Some(Err(decode_error(e))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

impl fmt::Debug for ReaderBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReaderBody")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// An error out of the decoders: the body's own error when it carried one (a timeout, the
/// wire cap, a reset), otherwise the encoded data was corrupt.
fn decode_error(e: io::Error) -> NetError {
    if e.get_ref().is_some_and(|inner| inner.is::<NetError>()) {
        if let Some(inner) = e.into_inner() {
            return inner_error(inner);
        }
        return NetError::new(ErrorKind::Decode);
    }
    NetError::decode(e).with_message("content-encoded body is corrupt")
}
