//! A one-shot, level-triggered signal (shutdown, connection kill) that any number of tasks can
//! await; awaiting after it fired returns at once.

use tokio::sync::watch;

/// A signal that fires once and stays fired.
#[derive(Debug, Clone)]
pub(crate) struct Signal {
    tx: std::sync::Arc<watch::Sender<bool>>,
}

impl Default for Signal {
    fn default() -> Self {
        Self::new()
    }
}

impl Signal {
    pub(crate) fn new() -> Self {
        let (tx, _rx) = watch::channel(false);
        Self {
            tx: std::sync::Arc::new(tx),
        }
    }

    /// Fires the signal; idempotent.
    pub(crate) fn fire(&self) {
        self.tx.send_replace(true);
    }

    /// Resolves once the signal has fired.
    pub(crate) async fn fired(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`, so `wait_for` can only fail if it is dropped, which
        // cannot happen while we borrow it; either way, returning is the right outcome.
        let _ = rx.wait_for(|fired| *fired).await;
    }
}
