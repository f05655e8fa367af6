//! The QUIC connection an HTTP/3 [`FaultServer`](super::FaultServer) serves on, able to hide
//! the client's `SETTINGS_MAX_FIELD_SECTION_SIZE` from the h3 server (see
//! [`FaultServerBuilder::h3_ignore_header_limit`](super::FaultServerBuilder::h3_ignore_header_limit)).
//!
//! Why: h3 refuses to send a head over the size the peer announced (RFC 9114 §4.2.2), so a
//! client's own check of a response head's size is only reached through a server that does
//! not honour the setting. This one reads the client's control stream as it arrives and
//! renames that setting to a reserved identifier, which the server ignores (§7.2.4.1): it
//! then believes the client has no limit.

use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId};

/// HTTP/3's unidirectional stream type of the control stream.
const CONTROL_STREAM: u64 = 0x00;
/// HTTP/3's frame type of SETTINGS.
const SETTINGS_FRAME: u64 = 0x04;
/// `SETTINGS_MAX_FIELD_SECTION_SIZE`.
const MAX_FIELD_SECTION_SIZE: u64 = 0x06;
/// A reserved setting identifier (`0x1f * N + 0x21`, N = 0), one byte long like `0x06`.
const RESERVED_SETTING: u8 = 0x21;

/// A QUIC connection for h3's server; with `hide_limit`, the client's header size limit is
/// hidden from it.
pub(super) struct Conn {
    inner: h3_quinn::Connection,
    hide_limit: bool,
}

impl Conn {
    pub(super) fn new(conn: quinn::Connection, hide_limit: bool) -> Self {
        Conn {
            inner: h3_quinn::Connection::new(conn),
            hide_limit,
        }
    }
}

impl quic::OpenStreams<Bytes> for Conn {
    type BidiStream = h3_quinn::BidiStream<Bytes>;
    type SendStream = h3_quinn::SendStream<Bytes>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        quic::OpenStreams::<Bytes>::poll_open_bidi(&mut self.inner, cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        quic::OpenStreams::<Bytes>::poll_open_send(&mut self.inner, cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        quic::OpenStreams::<Bytes>::close(&mut self.inner, code, reason);
    }
}

impl quic::Connection<Bytes> for Conn {
    type RecvStream = Recv;
    type OpenStreams = h3_quinn::OpenStreams;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::RecvStream, ConnectionErrorIncoming>> {
        let inner = ready!(quic::Connection::<Bytes>::poll_accept_recv(
            &mut self.inner,
            cx
        ))?;
        Poll::Ready(Ok(Recv {
            inner,
            first: self.hide_limit,
        }))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, ConnectionErrorIncoming>> {
        quic::Connection::<Bytes>::poll_accept_bidi(&mut self.inner, cx)
    }

    fn opener(&self) -> Self::OpenStreams {
        quic::Connection::<Bytes>::opener(&self.inner)
    }
}

/// A unidirectional stream from the client; its first chunk is rewritten when it starts the
/// control stream and `first` is set.
pub(super) struct Recv {
    inner: h3_quinn::RecvStream,
    first: bool,
}

impl quic::RecvStream for Recv {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let data = ready!(self.inner.poll_data(cx))?;
        if !std::mem::take(&mut self.first) {
            return Poll::Ready(Ok(data));
        }
        Poll::Ready(Ok(data.map(hide_field_section_limit)))
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.inner.stop_sending(error_code);
    }

    fn recv_id(&self) -> StreamId {
        self.inner.recv_id()
    }
}

/// `chunk`, the start of a unidirectional stream, with `SETTINGS_MAX_FIELD_SECTION_SIZE`
/// renamed when it is a control stream whose SETTINGS frame it holds whole (h3's client
/// writes the stream type and SETTINGS at once); any other chunk as it is.
fn hide_field_section_limit(chunk: Bytes) -> Bytes {
    let Some((mut at, end)) = settings_frame(&chunk) else {
        return chunk;
    };
    let mut out = BytesMut::from(&chunk[..]);
    while at < end {
        let id_at = at;
        let Some(id) = varint(&chunk, &mut at) else {
            break;
        };
        let one_byte = at - id_at == 1;
        if varint(&chunk, &mut at).is_none() {
            break;
        }
        if id == MAX_FIELD_SECTION_SIZE && one_byte {
            out[id_at] = RESERVED_SETTING;
        }
    }
    out.freeze()
}

/// Where the settings of the SETTINGS frame starting the control stream `chunk` begin and
/// end, when `chunk` starts a control stream and holds that frame whole.
fn settings_frame(chunk: &[u8]) -> Option<(usize, usize)> {
    let mut at = 0;
    (varint(chunk, &mut at)? == CONTROL_STREAM).then_some(())?;
    (varint(chunk, &mut at)? == SETTINGS_FRAME).then_some(())?;
    let len = usize::try_from(varint(chunk, &mut at)?).ok()?;
    let end = at.checked_add(len).filter(|end| *end <= chunk.len())?;
    Some((at, end))
}

/// The QUIC variable-length integer at `*at` in `bytes` (RFC 9000 §16); moves `at` past it.
fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let first = *bytes.get(*at)?;
    let len = 1usize << (first >> 6);
    let raw = bytes.get(*at..*at + len)?;
    let mut value = u64::from(first & 0x3f);
    for b in &raw[1..] {
        value = value << 8 | u64::from(*b);
    }
    *at += len;
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_section_limit_is_renamed_and_nothing_else() {
        // Control stream, SETTINGS (length 8): QPACK_MAX_TABLE_CAPACITY = 0,
        // MAX_FIELD_SECTION_SIZE = 65536 (four bytes), QPACK_BLOCKED_STREAMS = 0.
        let settings = [
            0x00, 0x04, 0x08, 0x01, 0x00, 0x06, 0x80, 0x01, 0x00, 0x00, 0x07, 0x00,
        ];
        let out = hide_field_section_limit(Bytes::copy_from_slice(&settings));
        let mut want = settings;
        want[5] = RESERVED_SETTING;
        assert_eq!(&out[..], &want[..]);
        // A QPACK encoder stream (type 0x02) is left as it is.
        let other = [0x02, 0x04, 0x02, 0x06, 0x00];
        assert_eq!(
            &hide_field_section_limit(Bytes::copy_from_slice(&other))[..],
            &other[..]
        );
    }
}
