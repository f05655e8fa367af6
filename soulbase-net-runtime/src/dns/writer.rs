//! The persistence writer: one thread of its own that writes the cache and frozen-endpoints
//! files, in the order the writes were handed to it, so that no async worker ever waits for
//! a disk (a stalled network filesystem, a FIFO nobody reads) and a later snapshot is never
//! overwritten by an earlier one.
//!
//! Writes are rare (a change of the frozen set, a resolver's last write), so one thread for
//! the process is enough; while one file's write is stalled, the writes queued after it wait
//! too (they are usually on the same disk anyway).

use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use soulbase_net_core::NetError;

type Job = Box<dyn FnOnce() + Send>;

/// The writer's queue; `None` when its thread could not be started (then writes are made
/// on the thread that hands them over, as before there was a writer).
static QUEUE: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();

fn queue() -> Option<&'static mpsc::Sender<Job>> {
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name("soulbase-persist".into())
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// A write handed to the writer, which may be waited for (with a bound).
#[derive(Debug)]
pub(crate) struct Pending(mpsc::Receiver<()>);

impl Pending {
    /// Waits up to `bound` for the write to end (succeeded or failed). Blocking. Returns
    /// whether it ended.
    pub(crate) fn wait(&self, bound: Duration) -> bool {
        !matches!(
            self.0.recv_timeout(bound),
            Err(mpsc::RecvTimeoutError::Timeout)
        )
    }
}

/// Hands `job` (a blocking write of `what`) to the writer thread and returns at once. A
/// failed write is logged (`warn`): there is no caller left to report it to.
pub(crate) fn write_behind(
    what: &'static str,
    job: impl FnOnce() -> Result<(), NetError> + Send + 'static,
) -> Pending {
    let (done_tx, done_rx) = mpsc::channel();
    let run: Job = Box::new(move || {
        if let Err(e) = job() {
            tracing::warn!(error = %e, "{what} not saved");
        }
        let _ = done_tx.send(());
    });
    match queue() {
        Some(tx) => {
            if let Err(mpsc::SendError(run)) = tx.send(run) {
                // The writer thread is gone (a job panicked): write here rather than lose it.
                run();
            }
        }
        None => run(),
    }
    Pending(done_rx)
}
