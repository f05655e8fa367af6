//! Endpoint policy: alternate base URLs and freezing of failed ones.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::redact;
use crate::validate::Checker;

/// Alternate endpoints and endpoint freezing: a base URL that failed is skipped for a while.
///
/// A base URL whose attempt failed in one of the ways `freeze_on` lists (by default: DNS or
/// connect error, timeout, 5xx) is frozen for `frozen_duration`; the next attempts use the
/// other `urls`. When every one is frozen, the one that thaws first is tried. Independently,
/// with `freeze_addresses`, an IP address of a name that failed to connect is skipped for
/// `frozen_duration` among the name's other addresses (when all are frozen, the one that thaws
/// first is dialled).
///
/// A URL's password (`https://user:password@eu.api.example.com`) is kept for the client and
/// masked wherever the policy is shown (`Debug`, `Snapshot::explain`, validation problems).
///
/// Default: freezing on for 10m on every failure kind, per
/// address too, no alternate URLs.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct EndpointPolicy {
    /// Freeze base URLs that failed. Default is `true`.
    pub freeze: bool,
    /// How long a failed base URL stays frozen. Default is 10m.
    #[serde(with = "humantime_serde")]
    pub frozen_duration: Duration,
    /// Alternate base URLs (scheme + authority, e.g. `https://eu.api.example.com`) for the
    /// request's origin; empty means only the request's own. Default is empty.
    pub urls: Vec<String>,
    /// Which failures of an attempt freeze its base URL. Default is all of them: `dns`,
    /// `connect`, `timeout`, `status_5xx`.
    pub freeze_on: Vec<FreezeOn>,
    /// Freeze single IP addresses of a name that failed to connect (skipped among the name's
    /// other addresses while frozen). Default is `true`.
    pub freeze_addresses: bool,
}

/// A kind of failure that freezes a base URL (`endpoints.freeze_on`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FreezeOn {
    /// The name did not resolve.
    Dns,
    /// No connection could be opened (refused, unreachable, TLS handshake failed).
    Connect,
    /// A phase timeout of the attempt (connect, first byte, read, write).
    Timeout,
    /// A 5xx answer.
    #[serde(rename = "status_5xx")]
    Status5xx,
}

impl EndpointPolicy {
    /// Whether a failure of kind `on` freezes a base URL under this policy.
    pub fn freezes_on(&self, on: FreezeOn) -> bool {
        self.freeze && self.freeze_on.contains(&on)
    }
}

impl Default for EndpointPolicy {
    fn default() -> Self {
        Self {
            freeze: true,
            frozen_duration: Duration::from_secs(600),
            urls: Vec::new(),
            freeze_on: vec![
                FreezeOn::Dns,
                FreezeOn::Connect,
                FreezeOn::Timeout,
                FreezeOn::Status5xx,
            ],
            freeze_addresses: true,
        }
    }
}

impl EndpointPolicy {
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        if self.freeze {
            c.nonzero(self.frozen_duration, "frozen_duration");
        }
        for (i, u) in self.urls.iter().enumerate() {
            let ok = url::Url::parse(u)
                .is_ok_and(|url| matches!(url.scheme(), "http" | "https") && url.has_host());
            c.when(!ok, &format!("urls[{i}]"), || {
                format!(
                    "`{}` is not an absolute http:// or https:// URL",
                    redact::url(u)
                )
            });
        }
    }
}

impl fmt::Debug for EndpointPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointPolicy")
            .field("freeze", &self.freeze)
            .field("frozen_duration", &self.frozen_duration)
            .field("urls", &redact::urls(&self.urls))
            .field("freeze_on", &self.freeze_on)
            .field("freeze_addresses", &self.freeze_addresses)
            .finish()
    }
}
