//! Endpoint policy: alternate base URLs and freezing of failed ones.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::validate::Checker;

/// Alternate endpoints and endpoint freezing (seed 004 DomainsManager).
///
/// A base URL whose attempt failed (connect error, timeout, 5xx) is frozen for
/// `frozen_duration`; the next attempts use the other `urls`. When every one is frozen, the one
/// that unfreezes first is tried.
///
/// Default: freezing on for 10m (seed 004 `url_frozen_duration`), no alternate URLs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
}

impl Default for EndpointPolicy {
    fn default() -> Self {
        Self {
            freeze: true,
            frozen_duration: Duration::from_secs(600),
            urls: Vec::new(),
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
                format!("`{u}` is not an absolute http:// or https:// URL")
            });
        }
    }
}
