//! [`trace_init`]: `tracing` output for tests, filtered by `RUST_LOG`; [`CapturedLogs`]: what
//! the code under test logs, as text a test can assert on.

use std::sync::Arc;

use parking_lot::Mutex;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Installs a global `tracing` subscriber that writes through the test harness (so output is
/// shown only for failing tests, or with `--nocapture`). Safe to call from every test: only
/// the first call in a process installs anything, and an already-installed subscriber is kept.
///
/// The filter comes from `RUST_LOG` in `tracing` target syntax (`warn`,
/// `soulbase_net_runtime=debug,hyper=info`); without it, or if it does not parse, the level
/// is `warn`.
///
/// # Examples
/// ```
/// soulbase_net_testkit::trace_init();
/// tracing::warn!("visible in the captured test output");
/// ```
pub fn trace_init() {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|s| s.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::WARN));
    let fmt = tracing_subscriber::fmt::layer()
        .with_test_writer()
        .with_target(true);
    // Err means a global subscriber exists already (an earlier call, or the test's own).
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(filter)
        .try_init();
}

/// Everything logged through `tracing` on this thread (and so by the tasks of a
/// single-threaded test runtime) while its guard is held, kept as text.
///
/// # Examples
/// ```
/// let (logs, _guard) = soulbase_net_testkit::CapturedLogs::start(tracing::Level::DEBUG);
/// tracing::debug!(answer = 42, "said");
/// assert!(logs.text().contains("answer=42"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// Starts capturing events at `level` and above (no colours); capture ends when the
    /// returned guard is dropped.
    pub fn start(level: tracing::Level) -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = CapturedLogs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn trace_init_is_idempotent() {
        super::trace_init();
        super::trace_init();
        tracing::warn!("trace_init works");
    }
}
