//! Declared delivery semantics (seed 001 §VIII, P75-4, P75-5): what a route promises about
//! how often its calls take effect, and the settings that promise demands.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{hedge::HedgePolicy, retry::RetryPolicy};
use crate::validate::{fmt_duration, Checker};

/// How often a call may take effect at the server: seed 001's `sem`.
///
/// Why declared: the settings that keep each promise differ and contradict each other
/// (retries make duplicates; dropping them needs a key and a window), so a route states its
/// promise and the policy is checked against the seed's compatibility matrix when it loads,
/// and the client keeps it at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Semantics {
    /// At most once: a request that may have reached the server is never sent again. The
    /// client resends only what it knows was never sent (no connection, DNS, TLS, or a
    /// server that said it processed nothing); no hedging.
    #[serde(rename = "at_most_once")]
    AtMostOnce,
    /// At least once: retried until it succeeds, each copy with the same idempotency key, so
    /// the server drops duplicates within `dedup_window` (P75-4). A non-idempotent request
    /// without a key is refused before it is sent.
    #[serde(rename = "at_least_once")]
    AtLeastOnce,
    /// Exactly once, in the seed's engineering sense (`exactly_once*`): at least once, plus a
    /// declared reorder span the dedup window covers (P75-5) and ordered acknowledgements
    /// (the outbox's ordering keys).
    #[serde(rename = "exactly_once*", alias = "exactly_once")]
    ExactlyOnce,
}

impl Semantics {
    /// The name a policy document uses (`at_most_once`, `at_least_once`, `exactly_once*`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Semantics::AtMostOnce => "at_most_once",
            Semantics::AtLeastOnce => "at_least_once",
            Semantics::ExactlyOnce => "exactly_once*",
        }
    }

    /// Whether this promise needs an idempotency key and a dedup window (P75-4).
    pub const fn needs_key(self) -> bool {
        matches!(self, Semantics::AtLeastOnce | Semantics::ExactlyOnce)
    }
}

/// The delivery semantics a route declares, and the dedup window that keeps them.
///
/// Default: nothing declared (the client's usual rules: idempotent requests retried, others
/// not unless keyed).
///
/// # Examples
/// ```
/// use soulbase_net_policy::PolicyDocument;
///
/// let doc = PolicyDocument::from_toml_str(r#"
///     [overrides."payments.example.com".delivery]
///     sem = "at_least_once"
///     dedup_window = "10m"
///     reorder_span = "2m"
/// "#)?;
/// # let _ = doc;
/// # Ok::<(), soulbase_net_policy::PolicyError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DeliveryPolicy {
    /// The promise: `at_most_once`, `at_least_once` or `exactly_once*`. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sem: Option<Semantics>,
    /// `Δt_dedup`: how long the server (or the client's `IdempotencyKey` dedup store) drops a
    /// repeated key. Required by `at_least_once` and `exactly_once*` (P75-4); must be at least
    /// `reorder_span` (P75-5) and, with a local dedup store, equal to its window.
    #[serde(with = "crate::serde_opt")]
    pub dedup_window: Option<Duration>,
    /// `span_reorder`: the longest two copies of one call can arrive apart. Required by
    /// `exactly_once*`; at most `dedup_window` (P75-5).
    #[serde(with = "crate::serde_opt")]
    pub reorder_span: Option<Duration>,
}

impl DeliveryPolicy {
    /// Checks the seed's compatibility matrix against the rest of the policy.
    pub(crate) fn check(&self, retry: &RetryPolicy, hedge: &HedgePolicy, c: &mut Checker<'_>) {
        if let (Some(window), Some(span)) = (self.dedup_window, self.reorder_span) {
            c.when(span > window, "reorder_span", || {
                format!(
                    "must be at most dedup_window ({}): a copy arriving later than the window \
                     would be taken for a new call (P75-5)",
                    fmt_duration(window)
                )
            });
        }
        if let Some(window) = self.dedup_window {
            c.nonzero(window, "dedup_window");
        }
        let Some(sem) = self.sem else { return };
        if sem.needs_key() && self.dedup_window.is_none() {
            c.push(
                "dedup_window",
                format!(
                    "sem = \"{}\" needs dedup_window (Δt_dedup): retried copies are only safe \
                     when the server drops a repeated key within a known window (P75-4)",
                    sem.as_str()
                ),
            );
        }
        if sem == Semantics::ExactlyOnce && self.reorder_span.is_none() {
            c.push(
                "reorder_span",
                "sem = \"exactly_once*\" needs reorder_span (span_reorder), which dedup_window \
                 must cover (P75-5)",
            );
        }
        if sem == Semantics::AtMostOnce {
            if hedge.enabled {
                c.push(
                    "sem",
                    "at_most_once cannot be hedged: a hedge is a second copy while the first \
                     may be processing (set hedge.enabled = false)",
                );
            }
            if retry.enabled && retry.max_attempts > 2 {
                c.push(
                    "sem",
                    format!(
                        "at_most_once allows zero or few retries (retry.max_attempts at most 2, \
                         is {}); the client resends only what was never sent",
                        retry.max_attempts
                    ),
                );
            }
        }
    }
}
