//! Retiring a connection: a graceful shutdown (GOAWAY on HTTP/2, `Connection: close` on
//! HTTP/1.1) after its `retire_after`-th request, as nginx's `keepalive_requests` does, or on
//! [`FaultServer::retire_connections`](super::FaultServer::retire_connections), as
//! `nginx -s reload` does.
//!
//! Why the n-th request waits for the shutdown to begin ([`ConnCtl::took_request`]): its reply
//! must go out after the GOAWAY, or carry `Connection: close`, so that a client sending one
//! request after another never gets a further request onto the retiring connection.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::watch;

use super::conn::ConnCtl;
use super::handler::Shared;

/// When one connection is to retire; held by its serving loop.
pub(super) struct Retire {
    ctl: Arc<ConnCtl>,
    shared: Arc<Shared>,
    /// Bumped by [`FaultServer::retire_connections`](super::FaultServer::retire_connections);
    /// subscribed when the connection was accepted, so only later bumps concern it.
    all: watch::Receiver<u64>,
    begun: bool,
}

impl Retire {
    pub(super) fn new(ctl: Arc<ConnCtl>, shared: Arc<Shared>, all: watch::Receiver<u64>) -> Self {
        Self {
            ctl,
            shared,
            all,
            begun: false,
        }
    }

    /// Resolves when the connection is to retire; never again once it has begun.
    pub(super) async fn asked(&mut self) {
        if self.begun {
            return std::future::pending().await;
        }
        loop {
            tokio::select! {
                () = self.ctl.retire_asked() => return,
                // An error (the sender gone with the server) disables this branch.
                Ok(()) = self.all.changed() => {
                    // A connection that took no request yet retires at its first one.
                    if !self.ctl.retire_at_first_request() {
                        return;
                    }
                }
            }
        }
    }

    /// The serving loop has begun the graceful shutdown: counts the connection as retired and
    /// lets the reply that asked for it go on.
    pub(super) fn begin(&mut self) {
        self.begun = true;
        self.shared.retired.fetch_add(1, Ordering::SeqCst);
        self.ctl.retiring();
    }
}

impl std::fmt::Debug for Retire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retire")
            .field("connection", &self.ctl.id)
            .field("begun", &self.begun)
            .finish_non_exhaustive()
    }
}
