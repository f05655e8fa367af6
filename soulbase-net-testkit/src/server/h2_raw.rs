//! HTTP/2 served with the `h2` crate instead of hyper, for
//! [`refuse_streams`](super::FaultServerBuilder::refuse_streams).
//!
//! Why not hyper: its server cannot reset a stream with `REFUSED_STREAM` (RFC 9113 §8.7: the
//! request was not processed, so any client may retry it), which is what a server at its
//! stream limit, or shutting down, sends. Every stream not refused goes through the same
//! [`answer`] as on hyper's path, with one difference: [`Reply::reset`](super::Reply::reset)
//! resets the request's stream (`INTERNAL_ERROR`), not the TCP connection.

use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::{JoinError, JoinSet};

use super::body::FaultBody;
use super::conn::ConnCtl;
use super::handler::{answer, Kept, Shared};
use super::reply::{Abort, Action};
use super::retire::Retire;

/// Serves one HTTP/2 connection on `io`, resetting every `every`-th stream it opens with
/// `REFUSED_STREAM` before reading it, and retiring the connection (GOAWAY) when asked.
pub(super) async fn serve<I>(
    io: I,
    every: u64,
    shared: &Arc<Shared>,
    ctl: &Arc<ConnCtl>,
    mut retire: Retire,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Ok(mut conn) = h2::server::handshake(io).await else {
        return;
    };
    let mut streams = JoinSet::new();
    let mut opened = 0u64;
    loop {
        tokio::select! {
            next = conn.accept() => {
                let Some(Ok((req, mut respond))) = next else { break };
                opened += 1;
                if opened.is_multiple_of(every) {
                    respond.send_reset(Reason::REFUSED_STREAM);
                    shared.refused.fetch_add(1, Ordering::SeqCst);
                } else {
                    streams.spawn(serve_stream(req, respond, shared.clone(), ctl.clone()));
                }
            }
            () = retire.asked() => {
                conn.graceful_shutdown();
                retire.begin();
            }
            Some(res) = streams.join_next(), if !streams.is_empty() => record(shared, res),
        }
    }
    // The connection is over; a stream left (a hang) has nobody to answer.
    streams.abort_all();
    while let Some(res) = streams.join_next().await {
        record(shared, res);
    }
}

fn record(shared: &Shared, res: Result<(), JoinError>) {
    if let Err(e) = res {
        if e.is_panic() {
            shared.record_panic(e.into_panic());
        }
    }
}

async fn serve_stream(
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    shared: Arc<Shared>,
    ctl: Arc<ConnCtl>,
) {
    let (parts, mut body) = req.into_parts();
    let head_only = parts.method == Method::HEAD;
    let mut kept = Kept::new(&shared);
    while let Some(Ok(data)) = body.data().await {
        kept.add(&data);
        // Read data holds the connection's window until released.
        let _ = body.flow_control().release_capacity(data.len());
    }
    match answer(parts, kept.bytes.freeze(), kept.len, &shared, &ctl).await {
        Action::Respond(res) => send(*res, head_only, respond).await,
        Action::Abort(Abort::Reset) => respond.send_reset(Reason::INTERNAL_ERROR),
        Action::Abort(Abort::Close) => ctl.kill_now(false),
        // Until the connection ends (the stream is dropped with it) or the server stops.
        Action::Abort(Abort::Hang) => shared.shutdown.fired().await,
    }
}

/// Sends the head, then the body's data and trailers as flow control allows.
async fn send(res: Response<FaultBody>, head_only: bool, mut respond: SendResponse<Bytes>) {
    let (mut head, body) = res.into_parts();
    strip_connection_headers(&mut head.headers);
    if let Some(n) = body.size_hint().exact() {
        head.headers
            .entry(header::CONTENT_LENGTH)
            .or_insert_with(|| HeaderValue::from(n));
    }
    let end = head_only || body.is_end_stream();
    let Ok(mut tx) = respond.send_response(Response::from_parts(head, ()), end) else {
        return;
    };
    if end {
        return;
    }
    let mut body = std::pin::pin!(body);
    while let Some(Ok(frame)) = body.frame().await {
        match frame.into_data() {
            Ok(data) => {
                if !send_data(&mut tx, data).await {
                    return;
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = tx.send_trailers(trailers);
                }
                return;
            }
        }
    }
    let _ = tx.send_data(Bytes::new(), true);
}

/// Sends `data` piece by piece as the stream's window opens; `false` if the stream is gone.
async fn send_data(tx: &mut SendStream<Bytes>, mut data: Bytes) -> bool {
    while !data.is_empty() {
        tx.reserve_capacity(data.len());
        let Some(Ok(n)) = poll_fn(|cx| tx.poll_capacity(cx)).await else {
            return false;
        };
        let piece = data.split_to(n.min(data.len()));
        if tx.send_data(piece, false).is_err() {
            return false;
        }
    }
    true
}

/// Removes the headers HTTP/2 forbids (RFC 9113 §8.2.2), which the `h2` crate refuses to send
/// (hyper drops them the same way).
fn strip_connection_headers(headers: &mut HeaderMap) {
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
    if headers.get(header::TE).is_some_and(|v| v != "trailers") {
        headers.remove(header::TE);
    }
}
