//! Retry policy: attempts, exponential backoff with jitter, what to retry on, and the retry budget.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::size::ByteSize;
use crate::validate::{unit_closed, Checker};

mod backoff;

pub use self::backoff::{BackoffCfg, JitterMode};

/// Retries of idempotent requests, within a retry budget.
///
/// A request is retried only when it is idempotent (or GET/HEAD/OPTIONS), its body can be
/// replayed, the outcome is listed in [`retry_on`](Self::retry_on), attempts remain, the
/// [`budget`](Self::budget) allows it and the next attempt can still finish before the total
/// deadline.
///
/// Default: on, 3 attempts, 100ms × 2ⁿ full-jitter backoff capped at 5s, every retryable
/// outcome, `Retry-After` respected, a 20 % retry budget, a 64 KiB replay buffer for the
/// tower face.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Whether failed attempts are retried at all. Default is `true`.
    pub enabled: bool,
    /// Attempts including the first; only idempotent requests get more than one.
    /// Default is 3.
    pub max_attempts: u32,
    /// Delay between attempts. Default is 100ms × 2ⁿ with full jitter, capped at 5s.
    pub backoff: BackoffCfg,
    /// Which outcomes are retried. Default is all of them.
    pub retry_on: RetryOn,
    /// Whether a `Retry-After` header on 429/503 (seconds or HTTP date) replaces the computed
    /// backoff when it is not longer than `backoff.cap`. Default is `true`.
    pub respect_retry_after: bool,
    /// The retry budget: how much extra traffic retries may add. Default is 20 % with a
    /// floor of 10 retries per second over a 10s window, per host.
    pub budget: RetryBudget,
    /// How much of a request body the client's `tower::Service` face (tonic's channel) reads
    /// ahead to keep a copy it can send again. A body whose frames are all at hand when the
    /// call starts and that ends within this size (a gRPC unary request) is kept whole and may
    /// be retried or resent as the rules above allow; a larger one, or one still being
    /// produced (a client stream), is sent once. `0` keeps none. At most 16 MiB: the copy is
    /// held for the whole call. `NetClient::send` is not concerned: its bodies are bytes or
    /// streams as built. Default is 64 KiB.
    pub replay_buffer: ByteSize,
}

/// The largest `retry.replay_buffer`: a copy of the body is held in memory for as long as its
/// call runs, and a service keeps many calls in flight.
pub(crate) const MAX_REPLAY_BUFFER: ByteSize = ByteSize::mib(16);

/// Which outcomes are retried. Default is every one of them.
///
/// Each switch is named after the [`ErrorKind::label`](soulbase_net_core::ErrorKind::label)
/// of the outcomes it covers, so an error maps to its switch by name:
///
/// | switch | outcomes (`ErrorKind`) |
/// | --- | --- |
/// | `dns` | `Dns` |
/// | `connect` | `Connect`: the TCP connection could not be opened (refused, unreachable) |
/// | `io` | `Io`: the connection failed after it was opened (reset, closed before the response was complete, an unparsable answer) |
/// | `timeout_connect` | `Timeout(Dns)`, `Timeout(Connect)`, `Timeout(Tls)`: the phases of opening a connection |
/// | `timeout_ttfb` | `Timeout(Ttfb)` |
/// | `timeout_read` | `Timeout(Read)` |
/// | `status_5xx` | `Status(500..=599)` (a response, or its error) except 501 and 505 |
/// | `status_429` | `Status(429)` |
///
/// No switch retries the others (`Tls`, `TlsVerify`, `Blocked`, `InvalidRequest`,
/// `Timeout(Write)`, `Timeout(Total)`, other statuses, …): they would fail the same way again
/// or are decisions, not accidents.
///
/// The names before this one still load (serde aliases): `http_5xx`, `http_429`, `dns_err`,
/// `connect_err` (now `connect`; a reset after connecting is `io`, on by default),
/// `connect_timeout`, `ttfb_timeout`, `read_timeout`. A document that writes one field under
/// both names is refused as a duplicate.
///
/// # Examples
/// ```
/// use soulbase_net_policy::PolicyDocument;
///
/// let doc = PolicyDocument::from_toml_str(r#"
///     [default]
///     retry.retry_on = { io = false, timeout_read = false }
///     [overrides."old.example.com"]
///     retry.retry_on.connect_err = false   # the old name of `connect`
/// "#).unwrap();
/// let p = soulbase_net_policy::SnapshotResolver::new(doc).unwrap();
/// let on = &p.resolve(None, "api.example.com").retry.retry_on;
/// assert!(!on.io && !on.timeout_read && on.connect);
/// assert!(!p.resolve(None, "old.example.com").retry.retry_on.connect);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetryOn {
    /// `Status(5xx)`: HTTP 5xx responses, except 501 and 505 (they repeat). Default is `true`.
    #[serde(alias = "http_5xx")]
    pub status_5xx: bool,
    /// `Status(429)`: HTTP 429 responses. Default is `true`.
    #[serde(alias = "http_429")]
    pub status_429: bool,
    /// `Dns`: name resolution failures. Default is `true`.
    #[serde(alias = "dns_err")]
    pub dns: bool,
    /// `Connect`: the TCP connection could not be opened (refused, unreachable,
    /// reset while dialling). Default is `true`.
    #[serde(alias = "connect_err")]
    pub connect: bool,
    /// `Io`: the connection was reset or closed after it was opened, before the response was
    /// complete (the request may have reached the server; only idempotent, replayable
    /// requests are retried). Default is `true`.
    pub io: bool,
    /// `Timeout(Dns)`, `Timeout(Connect)`, `Timeout(Tls)`: timeouts while opening a
    /// connection. Default is `true`.
    #[serde(alias = "connect_timeout")]
    pub timeout_connect: bool,
    /// `Timeout(Ttfb)`: time-to-first-byte timeouts. Default is `true`.
    #[serde(alias = "ttfb_timeout")]
    pub timeout_ttfb: bool,
    /// `Timeout(Read)`: idle timeouts while reading the body. Default is `true`.
    #[serde(alias = "read_timeout")]
    pub timeout_read: bool,
}

/// A retry budget (after Finagle's `RetryBudget` and gRPC retry throttling):
/// retries may add at most `retry_ratio` of the requests seen in `window`, plus
/// `min_retries_per_sec`, so that retries cannot multiply load during an outage.
///
/// Default is on, 20 %, 10 retries per second floor, 10s window, per host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetryBudget {
    /// Whether the budget is enforced. Default is `true`.
    pub enabled: bool,
    /// Retries allowed per request, in `[0, 1]`. Default is 0.2.
    pub retry_ratio: f64,
    /// Retries always allowed per second, whatever the ratio. Default is 10.
    pub min_retries_per_sec: u32,
    /// How long a deposit stays in the budget. Default is 10s.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Keep one budget per (host, tenant) instead of per host. Default is `false`.
    pub per_tenant: bool,
}

// === impl RetryPolicy ===

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            max_attempts: 3,
            backoff: BackoffCfg::default(),
            retry_on: RetryOn::default(),
            respect_retry_after: true,
            budget: RetryBudget::default(),
            replay_buffer: ByteSize::kib(64),
        }
    }
}

impl RetryPolicy {
    /// The attempts a request may make: `max_attempts` when retries are enabled, else 1.
    /// Never 0.
    pub fn effective_attempts(&self) -> u32 {
        if self.enabled {
            self.max_attempts.max(1)
        } else {
            1
        }
    }

    /// Sum of the worst-case backoff delays before retries `1..attempts`.
    pub fn worst_case_backoff(&self) -> Duration {
        self.backoff.total_max_delay(self.effective_attempts() - 1)
    }

    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        c.when(self.max_attempts == 0, "max_attempts", || {
            "must be at least 1 (it counts the first attempt); use `enabled = false` to turn retries off"
                .to_owned()
        });
        c.when(
            self.replay_buffer > MAX_REPLAY_BUFFER,
            "replay_buffer",
            || {
                format!(
                "must be at most {MAX_REPLAY_BUFFER} (a copy is held per call in flight), got {}",
                self.replay_buffer
            )
            },
        );
        self.backoff.check(&mut c.nested("backoff"));
        let mut b = c.nested("budget");
        let budget = &self.budget;
        b.when(!unit_closed(budget.retry_ratio), "retry_ratio", || {
            format!("must be between 0 and 1, got {}", budget.retry_ratio)
        });
        if budget.enabled {
            b.nonzero(budget.window, "window");
        }
    }
}

// === impl RetryOn, RetryBudget ===

/// The names of `retry_on`'s switches before they took the names of the error kinds they
/// cover: (old, new).
const OLD_SWITCH_NAMES: [(&str, &str); 7] = [
    ("http_5xx", "status_5xx"),
    ("http_429", "status_429"),
    ("dns_err", "dns"),
    ("connect_err", "connect"),
    ("connect_timeout", "timeout_connect"),
    ("ttfb_timeout", "timeout_ttfb"),
    ("read_timeout", "timeout_read"),
];

/// Renames old `retry.retry_on` switches in a (partial) policy section to their new names,
/// before the section is merged over a full policy that already has the new names: the
/// serde aliases alone would then see both and refuse a duplicate. A section that writes
/// both names keeps both, and is refused as a duplicate.
pub(crate) fn upgrade_switch_names(section: &mut serde_json::Value) {
    let Some(on) = section
        .get_mut("retry")
        .and_then(|r| r.get_mut("retry_on"))
        .and_then(|o| o.as_object_mut())
    else {
        return;
    };
    for (old, new) in OLD_SWITCH_NAMES {
        if !on.contains_key(new) {
            if let Some(v) = on.remove(old) {
                on.insert(new.to_owned(), v);
            }
        }
    }
}

impl Default for RetryOn {
    fn default() -> Self {
        Self {
            status_5xx: true,
            status_429: true,
            dns: true,
            connect: true,
            io: true,
            timeout_connect: true,
            timeout_ttfb: true,
            timeout_read: true,
        }
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self {
            enabled: true,
            retry_ratio: 0.2,
            min_retries_per_sec: 10,
            window: Duration::from_secs(10),
            per_tenant: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replay_buffer_is_at_most_16_mib() {
        let mut p = crate::NetPolicy::default();
        assert_eq!(p.retry.replay_buffer, ByteSize::kib(64));
        p.retry.replay_buffer = MAX_REPLAY_BUFFER;
        assert!(p.validate().is_ok());
        p.retry.replay_buffer = ByteSize::b(0);
        assert!(p.validate().is_ok(), "0 keeps no copy");
        p.retry.replay_buffer = ByteSize::b(MAX_REPLAY_BUFFER.as_u64() + 1);
        let err = p.validate().unwrap_err();
        let [problem] = err.problems() else {
            panic!("{err}");
        };
        assert_eq!(problem.path, "retry.replay_buffer");
        assert!(
            problem.reason.starts_with("must be at most 16MiB"),
            "{}",
            problem.reason
        );
    }

    #[test]
    fn effective_attempts() {
        let mut r = RetryPolicy::default();
        assert_eq!(r.effective_attempts(), 3);
        r.enabled = false;
        assert_eq!(r.effective_attempts(), 1);
        r.enabled = true;
        r.max_attempts = 0;
        assert_eq!(r.effective_attempts(), 1);
    }
}
