//! The response body of a scripted reply: generated piece by piece (so gigabytes cost no
//! memory), optionally paced, and optionally cut (stall, reset, close) after N bytes.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use super::conn::ConnCtl;

/// Largest chunk handed to hyper at once.
const CHUNK: usize = 64 * 1024;
static ZEROS: [u8; CHUNK] = [0; CHUNK];

/// How long an armed cut waits for hyper to flush before it kills the connection anyway.
/// A safety net for protocols that flush on their own schedule (HTTP/2), not a synchronisation.
const CUT_FALLBACK: Duration = Duration::from_millis(100);

/// One stretch of body content.
#[derive(Clone, Debug)]
pub(crate) enum Piece {
    /// These bytes.
    Bytes(Bytes),
    /// These bytes, this many times.
    Repeat(Bytes, u64),
    /// This many zero bytes.
    Zeros(u64),
}

impl Piece {
    fn len(&self) -> u64 {
        match self {
            Piece::Bytes(b) => b.len() as u64,
            Piece::Repeat(b, n) => (b.len() as u64).saturating_mul(*n),
            Piece::Zeros(n) => *n,
        }
    }
}

/// Total length of a list of pieces.
pub(crate) fn pieces_len(pieces: &[Piece]) -> u64 {
    pieces.iter().map(Piece::len).fold(0, u64::saturating_add)
}

/// What happens when a body reaches its cut point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cut {
    /// Send nothing more, keep the connection open.
    Stall,
    /// Reset the connection (RST).
    Reset,
    /// Close the connection cleanly (FIN).
    Close,
}

#[derive(Debug)]
enum State {
    Sending,
    Stalled,
    Armed(Pin<Box<Sleep>>),
    Killed,
}

/// The body type of every FaultServer response.
#[derive(Debug)]
pub(crate) struct FaultBody {
    pieces: VecDeque<Piece>,
    exact_len: Option<u64>,
    sent: u64,
    pace: Option<(usize, Duration)>,
    sleep: Option<Pin<Box<Sleep>>>,
    cut: Option<(u64, Cut)>,
    ctl: Arc<ConnCtl>,
    state: State,
}

impl FaultBody {
    pub(crate) fn new(
        pieces: Vec<Piece>,
        exact_len: Option<u64>,
        pace: Option<(usize, Duration)>,
        cut: Option<(u64, Cut)>,
        ctl: Arc<ConnCtl>,
    ) -> Self {
        Self {
            pieces: pieces.into(),
            exact_len,
            sent: 0,
            pace,
            sleep: None,
            cut,
            ctl,
            state: State::Sending,
        }
    }

    pub(crate) fn empty(ctl: Arc<ConnCtl>) -> Self {
        Self::new(Vec::new(), Some(0), None, None, ctl)
    }

    /// Takes up to `max` bytes off the front.
    fn next_chunk(&mut self, max: usize) -> Option<Bytes> {
        loop {
            let front = self.pieces.front_mut()?;
            match front {
                Piece::Bytes(b) if b.is_empty() => {
                    self.pieces.pop_front();
                }
                Piece::Bytes(b) => {
                    if b.len() <= max {
                        let out = std::mem::take(b);
                        self.pieces.pop_front();
                        return Some(out);
                    }
                    return Some(b.split_to(max));
                }
                Piece::Repeat(b, n) => {
                    if *n == 0 || b.is_empty() {
                        self.pieces.pop_front();
                        continue;
                    }
                    *n -= 1;
                    let one = b.clone();
                    self.pieces.push_front(Piece::Bytes(one));
                }
                Piece::Zeros(n) => {
                    if *n == 0 {
                        self.pieces.pop_front();
                        continue;
                    }
                    let take = (*n).min(max as u64).min(CHUNK as u64) as usize;
                    *n -= take as u64;
                    return Some(Bytes::from_static(&ZEROS[..take]));
                }
            }
        }
    }

    fn remaining_is_empty(&self) -> bool {
        self.pieces.iter().all(|p| p.len() == 0)
    }

    fn start_cut(&mut self, cut: Cut) {
        match cut {
            Cut::Stall => self.state = State::Stalled,
            Cut::Reset | Cut::Close => {
                self.ctl.kill_after_flush(cut == Cut::Reset);
                self.state = State::Armed(Box::pin(tokio::time::sleep(CUT_FALLBACK)));
            }
        }
    }
}

impl Body for FaultBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        loop {
            match &mut this.state {
                State::Stalled | State::Killed => return Poll::Pending,
                State::Armed(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // The flush did not come in time: kill now (reset-ness was recorded).
                    this.ctl.kill_now(false);
                    this.state = State::Killed;
                    return Poll::Pending;
                }
                State::Sending => {}
            }
            if let Some(sleep) = &mut this.sleep {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.sleep = None;
            }
            let mut max = this.pace.map_or(CHUNK, |(n, _)| n.max(1));
            if let Some((at, cut)) = this.cut {
                let left = at.saturating_sub(this.sent);
                if left == 0 || this.remaining_is_empty() {
                    this.cut = None;
                    this.start_cut(cut);
                    continue;
                }
                max = max.min(usize::try_from(left).unwrap_or(usize::MAX));
            }
            return match this.next_chunk(max) {
                None => Poll::Ready(None),
                Some(chunk) => {
                    this.sent += chunk.len() as u64;
                    if let Some((_, every)) = this.pace {
                        this.sleep = Some(Box::pin(tokio::time::sleep(every)));
                    }
                    Poll::Ready(Some(Ok(Frame::data(chunk))))
                }
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.cut.is_none() && matches!(self.state, State::Sending) && self.remaining_is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact_len {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
