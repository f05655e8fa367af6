use std::{
    collections::VecDeque,
    future::Future,
    io::{self, Write},
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{ready, Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use soulbase_net_core::{ErrorKind, NetError, Phase};
use tokio::{
    io::AsyncReadExt,
    time::{Instant, Sleep},
};

use super::*;

// === a scripted body ===

/// What a [`Drip`] does after its last chunk.
#[derive(Clone, Copy, Debug)]
enum End {
    Finish,
    Stall,
    Fail,
}

/// A body that yields its chunks one by one, waiting `every` before each.
#[derive(Debug)]
struct Drip {
    chunks: VecDeque<Bytes>,
    every: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    end: End,
}

impl Drip {
    fn new(chunks: impl IntoIterator<Item = Bytes>, every: Duration, end: End) -> Self {
        Drip {
            chunks: chunks.into_iter().collect(),
            every,
            sleep: None,
            end,
        }
    }

    /// `n` chunks of `len` bytes each, at once, then the end of the body.
    fn sized(n: usize, len: usize) -> Self {
        Drip::new(
            (0..n).map(|_| Bytes::from(vec![b'x'; len])),
            Duration::ZERO,
            End::Finish,
        )
    }
}

impl Body for Drip {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        if this.chunks.is_empty() {
            return match this.end {
                End::Finish => Poll::Ready(None),
                End::Stall => Poll::Pending,
                End::Fail => Poll::Ready(Some(Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "reset by peer",
                )))),
            };
        }
        if !this.every.is_zero() {
            let sleep = this
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(this.every)));
            ready!(sleep.as_mut().poll(cx));
            this.sleep = None;
        }
        Poll::Ready(this.chunks.pop_front().map(|c| Ok(Frame::data(c))))
    }
}

/// Reads frames until the end or the first error; returns the data bytes read and the error.
async fn drain<B>(body: B) -> (u64, Option<NetError>)
where
    B: Body<Data = Bytes, Error = NetError>,
{
    let mut body = std::pin::pin!(body);
    let mut read = 0u64;
    loop {
        match body.frame().await {
            None => return (read, None),
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, |d| d.len() as u64),
            Some(Err(e)) => return (read, Some(e)),
        }
    }
}

fn full(bytes: impl Into<Bytes>) -> http_body_util::combinators::UnsyncBoxBody<Bytes, NetError> {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

// === LimitedBody: size ===

#[tokio::test]
async fn a_body_of_exactly_the_limit_is_delivered_and_counted() {
    let counter = Arc::new(AtomicU64::new(0));
    let body = LimitedBody::new(Drip::sized(4, 256), 1024).counter(Arc::clone(&counter));
    let bytes = collect(body).await.unwrap();
    assert_eq!(bytes.len(), 1024);
    assert_eq!(counter.load(Ordering::Relaxed), 1024);
}

#[tokio::test]
async fn one_byte_over_the_limit_is_too_large_and_the_frame_is_not_delivered() {
    let chunks = [Bytes::from(vec![0; 1000]), Bytes::from(vec![0; 25])];
    let mut body = LimitedBody::new(Drip::new(chunks, Duration::ZERO, End::Finish), 1024);
    let counter = body.bytes_counter();
    let mut body = std::pin::pin!(body);
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap().len(), 1000);
    let err = body.frame().await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    let message = err.message().unwrap();
    assert!(message.contains("1024"), "{message}");
    assert!(message.contains("security.max_resp_bytes"), "{message}");
    assert_eq!(counter.load(Ordering::Relaxed), 1000);
    assert_eq!(body.bytes_read(), 1000);
    // Finished after the error.
    assert!(body.frame().await.is_none());
    assert!(body.is_end_stream());
}

#[tokio::test]
async fn the_cap_is_cumulative_over_many_small_frames() {
    let (read, err) = drain(LimitedBody::new(Drip::sized(1025, 1), 1024)).await;
    assert_eq!(read, 1024);
    assert_eq!(err.unwrap().kind(), ErrorKind::TooLarge);
}

#[tokio::test]
async fn a_zero_limit_allows_only_the_empty_body() {
    assert!(collect(LimitedBody::new(Drip::sized(0, 0), 0))
        .await
        .unwrap()
        .is_empty());
    let err = collect(LimitedBody::new(Drip::sized(1, 1), 0))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
}

#[tokio::test]
async fn one_counter_can_be_shared_by_several_bodies() {
    let counter = Arc::new(AtomicU64::new(0));
    for _ in 0..3 {
        let body = LimitedBody::new(Drip::sized(2, 10), 100).counter(Arc::clone(&counter));
        collect(body).await.unwrap();
    }
    assert_eq!(counter.load(Ordering::Relaxed), 60);
}

// === LimitedBody: errors ===

#[tokio::test]
async fn inner_errors_become_io_with_the_source_kept() {
    let body = Drip::new([Bytes::from_static(b"ab")], Duration::ZERO, End::Fail);
    let (read, err) = drain(LimitedBody::new(body, 1024)).await;
    assert_eq!(read, 2);
    let err = err.unwrap();
    assert_eq!(err.kind(), ErrorKind::Io);
    let source = err.find_source::<io::Error>().unwrap();
    assert_eq!(source.kind(), io::ErrorKind::ConnectionReset);
}

#[tokio::test]
async fn inner_net_errors_pass_through_unchanged() {
    let inner = LimitedBody::new(Drip::sized(3, 10), 20);
    let err = collect(LimitedBody::new(inner, 1024)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
}

// === LimitedBody: time ===

#[tokio::test(start_paused = true)]
async fn a_stalled_body_hits_the_read_timeout() {
    let body = Drip::new([Bytes::from_static(b"head")], Duration::ZERO, End::Stall);
    let start = Instant::now();
    let (read, err) =
        drain(LimitedBody::new(body, 1024).read_timeout(Duration::from_secs(5))).await;
    assert_eq!(read, 4);
    assert_eq!(err.unwrap().kind(), ErrorKind::Timeout(Phase::Read));
    assert_eq!(start.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_drip_just_under_the_read_timeout_hits_the_total_deadline() {
    let chunks = (0..100).map(|_| Bytes::from_static(b"d"));
    let body = Drip::new(chunks, Duration::from_millis(900), End::Finish);
    let start = Instant::now();
    let mut body = LimitedBody::new(body, 1024)
        .read_timeout(Duration::from_secs(1))
        .deadline(start + Duration::from_secs(5));
    let counter = body.bytes_counter();
    let (read, err) = drain(body).await;
    assert_eq!(err.unwrap().kind(), ErrorKind::Timeout(Phase::Total));
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    // Chunks came at 0.9s, 1.8s, … 4.5s: every gap was under the read timeout.
    assert_eq!(read, 5);
    assert_eq!(counter.load(Ordering::Relaxed), 5);
}

#[tokio::test(start_paused = true)]
async fn the_same_drip_without_a_deadline_completes() {
    let chunks = (0..10).map(|_| Bytes::from_static(b"d"));
    let body = Drip::new(chunks, Duration::from_millis(900), End::Finish);
    let body = LimitedBody::new(body, 1024).read_timeout(Duration::from_secs(1));
    assert_eq!(collect(body).await.unwrap().len(), 10);
}

#[tokio::test(start_paused = true)]
async fn the_read_timeout_only_runs_while_the_consumer_waits() {
    let body = LimitedBody::new(Drip::sized(3, 1), 1024).read_timeout(Duration::from_secs(1));
    let mut body = std::pin::pin!(body);
    for _ in 0..3 {
        assert!(body.frame().await.unwrap().is_ok());
        // The consumer is busy for longer than the read timeout between frames.
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    assert!(body.frame().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_deadline_already_past_fails_on_the_first_poll() {
    let body = LimitedBody::new(Drip::sized(1, 1), 1024).deadline(Instant::now());
    let (read, err) = drain(body).await;
    assert_eq!(read, 0);
    assert_eq!(err.unwrap().kind(), ErrorKind::Timeout(Phase::Total));
}

// === check_content_length ===

fn with_length(value: &'static str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static(value));
    headers
}

#[test]
fn a_declared_length_over_the_cap_is_refused_before_reading() {
    assert!(check_content_length(&with_length("1024"), 1024).is_ok());
    let err = check_content_length(&with_length("1025"), 1024).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    let message = err.message().unwrap();
    assert!(
        message.contains("1025") && message.contains("1024"),
        "{message}"
    );
    assert!(message.contains("security.max_resp_bytes"), "{message}");
    // Nothing declared, or nonsense: enforced while streaming instead.
    assert!(check_content_length(&HeaderMap::new(), 0).is_ok());
    assert!(check_content_length(&with_length("lots"), 0).is_ok());
    assert!(check_content_length(&with_length("99999999999999999999999"), 0).is_ok());
}

// === decode ===

const TEXT: &[u8] = b"the quick brown fox jumps over the lazy dog, again and again and again";

fn gzip(data: &[u8]) -> Bytes {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap().into()
}

fn brotli(data: &[u8]) -> Bytes {
    let mut out = Vec::new();
    {
        let mut enc = ::brotli::CompressorWriter::new(&mut out, 4096, 9, 22);
        enc.write_all(data).unwrap();
    }
    out.into()
}

async fn zstd(data: &[u8]) -> Bytes {
    let mut enc = async_compression::tokio::bufread::ZstdEncoder::new(data);
    let mut out = Vec::new();
    enc.read_to_end(&mut out).await.unwrap();
    out.into()
}

fn encoded_headers(values: &[&'static str], len: usize) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for v in values {
        headers.append(header::CONTENT_ENCODING, HeaderValue::from_static(v));
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers
}

async fn decode_all(
    encoded: Bytes,
    values: &[&'static str],
) -> (Result<Bytes, NetError>, HeaderMap) {
    let mut headers = encoded_headers(values, encoded.len());
    let result = match decode(full(encoded), &mut headers, 1 << 20, true) {
        Ok(body) => collect(body).await,
        Err(e) => Err(e),
    };
    (result, headers)
}

#[tokio::test]
async fn gzip_br_and_zstd_round_trip_and_drop_the_encoding_headers() {
    let cases = [
        (gzip(TEXT), "gzip"),
        (gzip(TEXT), "x-gzip"),
        (gzip(TEXT), "GZip"),
        (brotli(TEXT), "br"),
        (zstd(TEXT).await, "zstd"),
    ];
    for (encoded, coding) in cases {
        let (decoded, headers) = decode_all(encoded, &[coding]).await;
        assert_eq!(decoded.unwrap(), TEXT, "{coding}");
        assert!(headers.get(header::CONTENT_ENCODING).is_none(), "{coding}");
        assert!(headers.get(header::CONTENT_LENGTH).is_none(), "{coding}");
        assert!(headers.get(header::CONTENT_TYPE).is_some(), "{coding}");
    }
}

#[tokio::test]
async fn concatenated_gzip_members_are_one_body() {
    let mut both = gzip(b"first ").to_vec();
    both.extend_from_slice(&gzip(b"second"));
    let (decoded, _) = decode_all(both.into(), &["gzip"]).await;
    assert_eq!(decoded.unwrap(), "first second");
}

#[tokio::test]
async fn two_stacked_codings_are_undone_in_reverse_order() {
    // `gzip, br`: gzip was applied first, then br.
    let encoded = brotli(&gzip(TEXT));
    let (decoded, headers) = decode_all(encoded.clone(), &["gzip, br"]).await;
    assert_eq!(decoded.unwrap(), TEXT);
    assert!(headers.get(header::CONTENT_ENCODING).is_none());
    // The same list over two header lines, with identity ignored.
    let (decoded, _) = decode_all(encoded, &["gzip", "identity, br"]).await;
    assert_eq!(decoded.unwrap(), TEXT);
    let encoded = zstd(&gzip(TEXT)).await;
    let (decoded, _) = decode_all(encoded, &["gzip,zstd"]).await;
    assert_eq!(decoded.unwrap(), TEXT);
}

#[tokio::test]
async fn three_stacked_codings_are_refused() {
    let encoded = gzip(&gzip(&gzip(TEXT)));
    let (decoded, headers) = decode_all(encoded, &["gzip, gzip, gzip"]).await;
    assert_eq!(decoded.unwrap_err().kind(), ErrorKind::Decode);
    assert!(headers.get(header::CONTENT_ENCODING).is_some());
}

#[tokio::test]
async fn identity_unknown_codings_and_disabled_decoding_pass_through() {
    let (decoded, headers) = decode_all(Bytes::from_static(TEXT), &["identity"]).await;
    assert_eq!(decoded.unwrap(), TEXT);
    assert!(headers.get(header::CONTENT_LENGTH).is_some());
    let (decoded, headers) = decode_all(Bytes::from_static(TEXT), &["compress"]).await;
    assert_eq!(decoded.unwrap(), TEXT);
    assert_eq!(headers[header::CONTENT_ENCODING], "compress");

    let encoded = gzip(TEXT);
    let mut headers = encoded_headers(&["gzip"], encoded.len());
    let body = decode(full(encoded.clone()), &mut headers, 1 << 20, false).unwrap();
    assert_eq!(collect(body).await.unwrap(), encoded);
    assert_eq!(headers[header::CONTENT_ENCODING], "gzip");
}

#[tokio::test]
async fn an_empty_encoded_body_passes_through() {
    let mut headers = encoded_headers(&["gzip"], 120);
    let body = decode(full(Bytes::new()), &mut headers, 1 << 20, true).unwrap();
    assert!(collect(body).await.unwrap().is_empty());
    assert_eq!(headers[header::CONTENT_ENCODING], "gzip");
}

#[tokio::test]
async fn corrupt_encoded_data_is_a_decode_error() {
    let mut garbage = gzip(TEXT).to_vec();
    garbage.truncate(garbage.len() / 2);
    let (decoded, _) = decode_all(garbage.into(), &["gzip"]).await;
    assert_eq!(decoded.unwrap_err().kind(), ErrorKind::Decode);
    let (decoded, _) = decode_all(Bytes::from_static(b"not brotli at all"), &["br"]).await;
    assert_eq!(decoded.unwrap_err().kind(), ErrorKind::Decode);
}

#[tokio::test]
async fn the_cap_applies_to_decoded_bytes() {
    let data = vec![b'a'; 4096];
    let encoded = gzip(&data);
    for (max, ok) in [(4096, true), (4095, false)] {
        let mut headers = encoded_headers(&["gzip"], encoded.len());
        let body = decode(full(encoded.clone()), &mut headers, max, true).unwrap();
        match collect(body).await {
            Ok(b) => assert!(ok && b.len() == 4096),
            Err(e) => assert!(!ok && e.kind() == ErrorKind::TooLarge, "{e:?}"),
        }
    }
}

#[tokio::test]
async fn a_decompression_bomb_stops_at_the_limit() {
    const LIMIT: u64 = 64 * 1024;
    let bomb = gzip(&vec![0u8; 4 << 20]);
    // Fed to the decoder in small pieces, as a socket would.
    let pieces: Vec<Bytes> = bomb.chunks(256).map(Bytes::copy_from_slice).collect();
    let mut wire = LimitedBody::new(Drip::new(pieces, Duration::ZERO, End::Finish), 1 << 30);
    let wire_bytes = wire.bytes_counter();
    let mut headers = encoded_headers(&["gzip"], bomb.len());
    let (read, err) = drain(decode(wire, &mut headers, LIMIT, true).unwrap()).await;
    assert_eq!(err.unwrap().kind(), ErrorKind::TooLarge);
    assert!(read <= LIMIT, "{read}");
    let consumed = wire_bytes.load(Ordering::Relaxed);
    assert!(
        consumed < bomb.len() as u64 / 4,
        "{consumed} of {}",
        bomb.len()
    );
}

#[tokio::test(start_paused = true)]
async fn wire_errors_and_timeouts_pass_through_the_decoder() {
    let encoded = gzip(TEXT);
    let half = encoded.slice(..encoded.len() / 2);

    let fails = Drip::new([half.clone()], Duration::ZERO, End::Fail);
    let mut headers = encoded_headers(&["gzip"], encoded.len());
    let body = decode(LimitedBody::new(fails, 1024), &mut headers, 1024, true).unwrap();
    let err = collect(body).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(err.find_source::<io::Error>().is_some());

    let stalls = Drip::new([half], Duration::ZERO, End::Stall);
    let wire = LimitedBody::new(stalls, 1024).read_timeout(Duration::from_secs(2));
    let mut headers = encoded_headers(&["gzip"], encoded.len());
    let body = decode(wire, &mut headers, 1024, true).unwrap();
    let err = collect(body).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(Phase::Read));
}
