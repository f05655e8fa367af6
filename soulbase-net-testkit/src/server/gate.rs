//! [`Gate`]: holds replies back until the test opens it, so a test can act at a known point
//! of a request (the server has it, the client waits for the answer) without sleeping.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use tokio::sync::Notify;

/// A gate that replies wait at ([`Reply::after`](crate::Reply::after)) before their head is
/// sent; [`open`](Self::open) lets every waiting and later reply through. Clones share one
/// gate.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use soulbase_net_testkit::{FaultServer, Gate, Reply};
///
/// let gate = Gate::new();
/// let srv = FaultServer::http1()
///     .route("/held", Reply::ok("now").after(&gate))
///     .start()
///     .await
///     .unwrap();
/// // ... start a request, wait for `srv.wait_for_hits("/held", 1)`, act, then:
/// gate.open();
/// assert!(gate.is_open());
/// # drop(srv);
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Gate {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    open: AtomicBool,
    notify: Notify,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens the gate for good: every reply waiting at it goes on, later ones do not wait.
    pub fn open(&self) {
        self.inner.open.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    /// Whether [`open`](Self::open) was called.
    pub fn is_open(&self) -> bool {
        self.inner.open.load(Ordering::SeqCst)
    }

    /// Waits until the gate is open.
    pub(crate) async fn passed(&self) {
        loop {
            // Registered before the check, so an `open` between the two is not missed.
            let notified = self.inner.notify.notified();
            if self.is_open() {
                return;
            }
            notified.await;
        }
    }
}
