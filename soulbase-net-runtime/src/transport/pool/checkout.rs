//! Taking a connection for a request: the origin's state under its lock, an idle HTTP/1.1
//! connection or the shared HTTP/2 one, a connect under the per-origin cap, or a wait for
//! whichever comes first (see the module docs of [`super`]).

use std::{
    future::Future,
    net::IpAddr,
    pin::Pin,
    sync::{atomic::AtomicUsize, Arc},
    task::Poll,
    time::Duration,
};

use http::Uri;
use parking_lot::Mutex;
use soulbase_net_core::NetError;
use tokio::{
    sync::{oneshot, OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

use super::connection::spawn_connection;
use super::forms::host_header;
use super::{Facts, Next, Origin, Sender, Shared, SharedH2, State, Stream, DNS_RECHECK};
use crate::transport::body::RequestBody;
use crate::transport::connect::Conn;

// === impl Shared ===

impl<B: RequestBody> Shared<B> {
    /// The origin of `uri`, made on first use.
    pub(super) fn origin(&self, uri: &Uri) -> Result<Arc<Origin<B>>, NetError> {
        let https = crate::transport::connect::is_https(uri)?;
        let authority = uri
            .authority()
            .ok_or_else(|| NetError::invalid_request("url has no host"))?;
        let mut origins = self.origins.lock();
        let origins = if https {
            &mut origins.https
        } else {
            &mut origins.http
        };
        if let Some(origin) = origins.map.get(authority.as_str()) {
            return Ok(origin.clone());
        }
        let cap = self.cfg.per_origin_cap.max(1);
        origins.make_room(|origin| !origin.is_empty(cap));
        let map = &mut origins.map;
        let (host, port) = crate::transport::authority::host_port(authority.as_str());
        let header = host_header(authority, host, port, https)?;
        let host = crate::transport::authority::unbracketed(host);
        let origin = Arc::new(Origin {
            https,
            host: header,
            cap: Arc::new(Semaphore::new(self.cfg.per_origin_cap.max(1))),
            open: Arc::default(),
            name: host.parse::<IpAddr>().is_err().then(|| host.into()),
            state: Mutex::new(State::default()),
        });
        map.insert(authority.as_str().into(), origin.clone());
        Ok(origin)
    }

    /// A connection ready for a request, and how long opening it took when it was opened
    /// for this request.
    pub(super) async fn checkout(
        self: &Arc<Self>,
        origin: &Arc<Origin<B>>,
        uri: &Uri,
    ) -> Result<(Sender<B>, Option<Duration>), NetError> {
        loop {
            let (next, check_dns) = self.next(origin);
            if check_dns {
                self.follow_dns(origin);
            }
            match next {
                Next::Use(mut sender) => {
                    if sender.ready().await {
                        return Ok((sender, None));
                    }
                    // Closed while idle: dropped; look again.
                }
                Next::Connect(permit) => {
                    let (sender, took) = Box::pin(self.open(origin, uri, permit)).await?;
                    return Ok((sender, Some(took)));
                }
                // Rare (the cap is full): boxed, so that the common path's future stays small.
                Next::Wait { rx, may_connect } => {
                    if let Some(found) = Box::pin(self.wait(origin, uri, rx, may_connect)).await? {
                        return Ok(found);
                    }
                }
            }
        }
    }

    /// Waits for a connection given back, or (when `may_connect`) a slot freed under the
    /// cap, then opens one; `None` when the request should look again.
    pub(super) async fn wait(
        self: &Arc<Self>,
        origin: &Arc<Origin<B>>,
        uri: &Uri,
        mut rx: oneshot::Receiver<Sender<B>>,
        may_connect: bool,
    ) -> Result<Option<(Sender<B>, Option<Duration>)>, NetError> {
        let acquire = origin.cap.clone().acquire_owned();
        tokio::pin!(acquire);
        let got = std::future::poll_fn(|cx| {
            if let Poll::Ready(got) = Pin::new(&mut rx).poll(cx) {
                return Poll::Ready(Ok(got));
            }
            if may_connect {
                if let Poll::Ready(Ok(permit)) = acquire.as_mut().poll(cx) {
                    return Poll::Ready(Err(permit));
                }
            }
            Poll::Pending
        })
        .await;
        match got {
            Ok(Ok(mut sender)) => Ok(sender.ready().await.then_some((sender, None))),
            // The connect this request waited for failed: look again.
            Ok(Err(_)) => Ok(None),
            Err(permit) => {
                // A connection given back meanwhile goes back to the pool.
                rx.close();
                if let Ok(Sender::H1 { tx, facts }) = rx.try_recv() {
                    self.give_back(origin, tx, facts);
                }
                {
                    // As in `next`: the others wait for this connect when it may give HTTP/2.
                    let mut state = origin.state.lock();
                    state.h2_connecting = self.expects_h2(origin, &state);
                }
                let (sender, took) = self.open(origin, uri, permit).await?;
                Ok(Some((sender, Some(took))))
            }
        }
    }

    /// Looks at the origin's state once, under its lock; and says whether the origin's host
    /// name is due to be checked (see [`Follow`]).
    pub(super) fn next(&self, origin: &Origin<B>) -> (Next<B>, bool) {
        let mut state = origin.state.lock();
        let now = Instant::now();
        let check_dns = !state.dns.checking && state.dns.next.is_some_and(|at| now >= at);
        if check_dns {
            state.dns.checking = true;
        }
        (self.next_locked(origin, &mut state, now), check_dns)
    }

    /// [`Shared::next`] under the origin's lock. Connections whose address the name no
    /// longer has were taken out when the answer changed (see [`Shared::follow_dns`]).
    pub(super) fn next_locked(
        &self,
        origin: &Origin<B>,
        state: &mut State<B>,
        now: Instant,
    ) -> Next<B> {
        if let Some(h2) = &mut state.h2 {
            if !h2.tx.is_closed() && !self.too_old(h2.born, now) {
                h2.used = now;
                return Next::Use(Sender::H2 {
                    tx: h2.tx.clone(),
                    serial: h2.serial,
                    stream: Stream::new(&h2.streams),
                    heard: h2.heard.clone(),
                });
            }
            self.set_h2(state, None);
        }
        while let Some(idle) = self.pop_idle(state) {
            if idle.tx.is_closed()
                || crate::resilience::passed(idle.since, self.cfg.idle_timeout, now)
                || self.too_old(idle.facts.born, now)
            {
                continue;
            }
            return Next::Use(Sender::H1 {
                tx: idle.tx,
                facts: idle.facts,
            });
        }
        let connecting = state.h2_connecting;
        if !connecting {
            if let Ok(permit) = origin.cap.clone().try_acquire_owned() {
                state.h2_connecting = self.expects_h2(origin, state);
                return Next::Connect(permit);
            }
        }
        // Waiters that gave up (their request was dropped) go before a new one joins.
        state.waiters.retain(|w| !w.is_closed());
        let (tx, rx) = oneshot::channel();
        state.waiters.push_back(tx);
        Next::Wait {
            rx,
            may_connect: !connecting,
        }
    }

    /// Whether a connect to `origin` will or may give HTTP/2 — prior knowledge, or an `https`
    /// origin offered `h2` by ALPN that has not answered with HTTP/1.1 — so that the requests
    /// arriving meanwhile wait for it instead of each opening a connection (a burst of 256
    /// callers to a new HTTP/2 origin opened 256 connections, of which one was needed).
    pub(super) fn expects_h2(&self, origin: &Origin<B>, state: &State<B>) -> bool {
        self.cfg.offers_h2(origin.https) && (self.cfg.http2_only || state.speaks_h2 != Some(false))
    }

    /// Opens a connection to `origin` under `permit`.
    pub(super) async fn open(
        self: &Arc<Self>,
        origin: &Arc<Origin<B>>,
        uri: &Uri,
        permit: OwnedSemaphorePermit,
    ) -> Result<(Sender<B>, Duration), NetError> {
        // Whatever happens to this connect (failure, or the request dropped), waiters for an
        // HTTP/2-only connect are told to look again.
        let connecting = Connecting {
            origin,
            h2: self.cfg.offers_h2(origin.https),
        };
        let started = Instant::now();
        let mut conn = self.connector.connect(uri, permit).await?;
        let peer = conn.follows();
        if peer.is_some() {
            let mut state = origin.state.lock();
            state.dns.next.get_or_insert(started + DNS_RECHECK);
        }
        if origin.https {
            // Remembered for the next connect; an HTTP/1.1 answer frees the waiters (when
            // `connecting` ends) to open connections of their own.
            origin.state.lock().speaks_h2 = Some(conn.is_h2());
        }
        if self.cfg.http2_only || conn.is_h2() {
            let heard = conn.heard();
            let (tx, connection) = self
                .h2
                .handshake::<Conn, B>(conn)
                .await
                .map_err(crate::classify::send_error)?;
            let now = Instant::now();
            let mut state = origin.state.lock();
            state.h2_serial += 1;
            let serial = state.h2_serial;
            // When its task ends, the connection leaves the pool at once, not at the next
            // checkout: the pool's sender must not outlive it (see the module docs).
            let (pool, of) = (Arc::downgrade(self), Arc::downgrade(origin));
            spawn_connection(connection, origin.open.clone(), move || {
                if let (Some(pool), Some(origin)) = (pool.upgrade(), of.upgrade()) {
                    pool.forget_h2(&origin, serial);
                }
            });
            let streams = Arc::new(AtomicUsize::new(0));
            let h2 = SharedH2 {
                tx: tx.clone(),
                serial,
                streams: streams.clone(),
                heard: heard.clone(),
                peer,
                born: now,
                used: now,
            };
            self.set_h2(&mut state, Some(h2));
            state.h2_connecting = false;
            for waiter in state.waiters.drain(..) {
                let _ = waiter.send(Sender::H2 {
                    tx: tx.clone(),
                    serial,
                    stream: Stream::new(&streams),
                    heard: heard.clone(),
                });
            }
            drop(state);
            drop(connecting);
            self.start_reaper();
            self.keep_budget();
            let stream = Stream::new(&streams);
            let sender = Sender::H2 {
                tx,
                serial,
                stream,
                heard,
            };
            Ok((sender, started.elapsed()))
        } else {
            let proxied = conn.is_proxied();
            let (tx, connection) = self
                .h1
                .handshake::<Conn, B>(conn)
                .await
                .map_err(crate::classify::send_error)?;
            spawn_connection(connection, origin.open.clone(), || {});
            drop(connecting);
            let sender = Sender::H1 {
                tx,
                facts: Facts {
                    proxied,
                    born: Instant::now(),
                    peer,
                },
            };
            Ok((sender, started.elapsed()))
        }
    }
}

/// Clears an HTTP/2-only connect's mark when it ends, however it ends; the requests waiting
/// for it are told to look again (a successful connect has already served them).
pub(super) struct Connecting<'a, B> {
    origin: &'a Origin<B>,
    h2: bool,
}

impl<B> Drop for Connecting<'_, B> {
    fn drop(&mut self) {
        if !self.h2 {
            return;
        }
        let mut state = self.origin.state.lock();
        if state.h2_connecting {
            state.h2_connecting = false;
            state.waiters.clear();
        }
    }
}
