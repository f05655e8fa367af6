//! Composing deadlines (seed 001 S75-5): the deadline a caller must give a group of calls,
//! from each call's worst case `W_retry` (its policy's `worst_case_latency`).
//!
//! Why in core: a service that fans out or chains calls sets the deadline of its own request
//! from its calls' budgets (P75-2: `deadline ≥ W_retry + margin`), whatever client it uses.

use std::time::Duration;

/// The deadline of calls made in parallel: the longest of their worst cases,
/// `max_i W_retry_i` (zero for no call).
///
/// ```
/// use std::time::Duration;
/// use soulbase_net_core::parallel_deadline;
///
/// let ms = Duration::from_millis;
/// assert_eq!(parallel_deadline([ms(300), ms(900), ms(450)]), ms(900));
/// assert_eq!(parallel_deadline([]), Duration::ZERO);
/// ```
pub fn parallel_deadline(worst: impl IntoIterator<Item = Duration>) -> Duration {
    worst.into_iter().max().unwrap_or_default()
}

/// The deadline of calls made one after the other: the sum of their worst cases,
/// `Σ_i W_retry_i` (saturating at `Duration::MAX`).
///
/// ```
/// use std::time::Duration;
/// use soulbase_net_core::serial_deadline;
///
/// let ms = Duration::from_millis;
/// assert_eq!(serial_deadline([ms(300), ms(900), ms(450)]), ms(1650));
/// assert_eq!(serial_deadline([Duration::MAX, ms(1)]), Duration::MAX);
/// ```
pub fn serial_deadline(worst: impl IntoIterator<Item = Duration>) -> Duration {
    worst
        .into_iter()
        .fold(Duration::ZERO, |sum, w| sum.saturating_add(w))
}
