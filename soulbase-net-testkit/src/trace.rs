//! [`trace_init`]: `tracing` output for tests, filtered by `RUST_LOG`.

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

#[cfg(test)]
mod tests {
    #[test]
    fn trace_init_is_idempotent() {
        super::trace_init();
        super::trace_init();
        tracing::warn!("trace_init works");
    }
}
