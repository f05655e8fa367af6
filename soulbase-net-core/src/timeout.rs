//! Per-request timeouts: [`TimeoutCfg`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Timeouts set on one request; each one left `None` comes from the resolved policy
/// (`timeout.*` in the policy document).
///
/// Serialised with human durations: `{ "ttfb": "250ms", "total": "2s" }`.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use soulbase_net_core::TimeoutCfg;
///
/// let t = TimeoutCfg::default().with_total(Duration::from_secs(2));
/// assert_eq!(t.total, Some(Duration::from_secs(2)));
/// assert_eq!(t.connect, None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimeoutCfg {
    /// Opening the connection (DNS, TCP, proxy tunnel, TLS). Default is the policy's.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub connect: Option<Duration>,
    /// From the request sent to the response head (time to first byte). Default is the
    /// policy's.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub ttfb: Option<Duration>,
    /// The whole call, every attempt and backoff included. Default is the policy's.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub total: Option<Duration>,
    /// The longest idle gap between two chunks of the response body. Default is the
    /// policy's.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub read: Option<Duration>,
    /// Writing the request body. Default is the policy's.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub write: Option<Duration>,
}

impl TimeoutCfg {
    /// Sets the connect timeout.
    pub fn with_connect(mut self, d: Duration) -> Self {
        self.connect = Some(d);
        self
    }

    /// Sets the time-to-first-byte timeout.
    pub fn with_ttfb(mut self, d: Duration) -> Self {
        self.ttfb = Some(d);
        self
    }

    /// Sets the total deadline.
    pub fn with_total(mut self, d: Duration) -> Self {
        self.total = Some(d);
        self
    }

    /// Sets the body read (idle) timeout.
    pub fn with_read(mut self, d: Duration) -> Self {
        self.read = Some(d);
        self
    }

    /// Sets the body write timeout.
    pub fn with_write(mut self, d: Duration) -> Self {
        self.write = Some(d);
        self
    }

    /// Whether every timeout is left to the policy.
    pub fn is_empty(&self) -> bool {
        *self == TimeoutCfg::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_uses_human_durations() {
        let t = TimeoutCfg::default()
            .with_ttfb(Duration::from_millis(250))
            .with_total(Duration::from_secs(2));
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, r#"{"ttfb":"250ms","total":"2s"}"#);
        let back: TimeoutCfg = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
        let parsed: TimeoutCfg =
            serde_json::from_str(r#"{"connect":"1s 500ms","read":"10m"}"#).unwrap();
        assert_eq!(parsed.connect, Some(Duration::from_millis(1500)));
        assert_eq!(parsed.read, Some(Duration::from_secs(600)));
    }

    #[test]
    fn unknown_fields_and_bad_durations_are_rejected() {
        assert!(serde_json::from_str::<TimeoutCfg>(r#"{"conect":"1s"}"#).is_err());
        assert!(serde_json::from_str::<TimeoutCfg>(r#"{"connect":"soon"}"#).is_err());
    }

    #[test]
    fn empty_means_all_from_policy() {
        assert!(TimeoutCfg::default().is_empty());
        assert!(!TimeoutCfg::default()
            .with_write(Duration::from_secs(1))
            .is_empty());
    }
}
