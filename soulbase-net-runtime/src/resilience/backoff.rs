//! Exponential backoff with full, equal or no jitter (seed 000 §5.1, seed 001 §VI).

use std::time::Duration;

use soulbase_net_policy::{BackoffCfg, JitterMode};

use super::random::{unit, Random};

/// The wait before retry `k` (k ≥ 1): the ceiling `d = min(cap, base·factor^(k-1))`
/// ([`BackoffCfg::max_delay`]), then jitter drawn from `rng`:
///
/// - full ([`JitterMode::Full`]): uniform in `[d·(1 − jitter), d]`, so `[0, d]` at the default
///   `jitter = 1` (AWS "full jitter");
/// - equal ([`JitterMode::Equal`]): uniform in `[d − d·jitter/2, d]`, so `[d/2, d]` at `jitter = 1`;
/// - none ([`JitterMode::None`]): `d` itself.
///
/// Never more than `cap`, never panics: a `jitter` outside `[0, 1]` is clamped, NaN counts as 1.
pub(crate) fn backoff_delay(cfg: &BackoffCfg, k: u32, rng: &mut dyn Random) -> Duration {
    let d = cfg.max_delay(k);
    let jitter = if cfg.jitter.is_nan() {
        1.0
    } else {
        cfg.jitter.clamp(0.0, 1.0)
    };
    // The fraction of `d` that is fixed; the rest is drawn.
    let fixed = match cfg.mode {
        JitterMode::Full => 1.0 - jitter,
        JitterMode::Equal => 1.0 - jitter / 2.0,
        _ => return d,
    };
    let frac = fixed + (1.0 - fixed) * unit(rng);
    scale(d, frac)
}

/// `d × frac` for `frac` in `[0, 1]`, never above `d` and never panicking.
pub(crate) fn scale(d: Duration, frac: f64) -> Duration {
    let frac = if frac.is_nan() {
        0.0
    } else {
        frac.clamp(0.0, 1.0)
    };
    Duration::try_from_secs_f64(d.as_secs_f64() * frac)
        .unwrap_or(d)
        .min(d)
}

#[cfg(test)]
mod tests;
