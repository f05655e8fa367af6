//! What the client learns from its own traffic: recent latencies per host (for the dynamic
//! timeout of seed 001) and frozen endpoints (seed 004's DomainsManager).

use std::{borrow::Cow, time::Duration};

use foldhash::HashMap;

use parking_lot::Mutex;
use soulbase_net_policy::{DynamicTimeout, EndpointPolicy};
use tokio::time::Instant;
use url::Url;

use crate::resilience::{attempt_timeout, Freezer, LatencyWindow};

/// Hosts whose latencies are kept; past this the map starts afresh.
const MAX_HOSTS: usize = 10_000;
/// Latencies kept per host.
const WINDOW: usize = 512;

/// Recent time-to-first-byte per host.
#[derive(Debug, Default)]
pub(crate) struct Latencies {
    windows: Mutex<HashMap<String, LatencyWindow>>,
}

impl Latencies {
    /// Records a successful attempt's time to first byte.
    pub(crate) fn record(&self, host: &str, ttfb: Duration) {
        let mut windows = self.windows.lock();
        if let Some(window) = windows.get_mut(host) {
            window.record(ttfb);
            return;
        }
        if windows.len() >= MAX_HOSTS {
            windows.clear();
        }
        windows
            .entry(host.to_owned())
            .or_insert_with(|| LatencyWindow::new(WINDOW))
            .record(ttfb);
    }

    /// The per-attempt timeout for `host`: learnt when the policy asks for it and enough
    /// latencies are known, else `fixed`.
    pub(crate) fn timeout(&self, host: &str, cfg: &DynamicTimeout, fixed: Duration) -> Duration {
        if !cfg.enabled {
            return fixed;
        }
        match self.windows.lock().get(host) {
            Some(window) => attempt_timeout(cfg, window, fixed),
            None => fixed,
        }
    }
}

/// Origins that failed to connect, frozen for `endpoints.frozen_duration`.
#[derive(Debug)]
pub(crate) struct Endpoints {
    frozen: Freezer<String>,
}

impl Default for Endpoints {
    fn default() -> Self {
        Endpoints {
            frozen: Freezer::new(MAX_HOSTS),
        }
    }
}

impl Endpoints {
    /// The URL to use for this attempt: `url` itself, or — when the policy lists alternative
    /// origins (`endpoints.urls`) — the same path on the first origin that is not frozen (when
    /// all are frozen, the one that thaws first).
    pub(crate) fn target<'u>(
        &self,
        url: &'u Url,
        p: &EndpointPolicy,
        now: Instant,
    ) -> Cow<'u, Url> {
        if p.urls.is_empty() {
            return Cow::Borrowed(url);
        }
        let own = origin(url);
        let mut candidates = vec![own.clone()];
        candidates.extend(
            p.urls
                .iter()
                .filter_map(|u| Url::parse(u).ok())
                .map(|u| origin(&u))
                .filter(|o| *o != own),
        );
        let chosen = self.frozen.choose(&candidates, now);
        match chosen
            .first()
            .and_then(|o| (*o != own).then(|| rebase(url, o)).flatten())
        {
            Some(other) => Cow::Owned(other),
            None => Cow::Borrowed(url),
        }
    }

    /// Freezes the origin of `url` after a connect or DNS failure, when the policy freezes.
    pub(crate) fn fail(&self, url: &Url, p: &EndpointPolicy, now: Instant) {
        if p.freeze && !p.urls.is_empty() {
            self.frozen.freeze(&origin(url), p.frozen_duration, now);
        }
    }
}

fn origin(url: &Url) -> String {
    url.origin().ascii_serialization()
}

/// `url` with the scheme, host and port of `origin`.
fn rebase(url: &Url, origin: &str) -> Option<Url> {
    let base = Url::parse(origin).ok()?;
    let mut out = url.clone();
    out.set_scheme(base.scheme()).ok()?;
    out.set_host(base.host_str()).ok()?;
    out.set_port(base.port()).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_origin_is_frozen_and_skipped_until_it_thaws() {
        let mut p = EndpointPolicy::default();
        p.urls = vec!["https://b.example:8443".to_owned()];
        p.frozen_duration = Duration::from_secs(600);
        let e = Endpoints::default();
        let url = Url::parse("https://a.example/v1/x?q=1").unwrap();
        let now = Instant::now();
        assert_eq!(
            e.target(&url, &p, now).as_str(),
            "https://a.example/v1/x?q=1"
        );
        e.fail(&url, &p, now);
        let moved = e.target(&url, &p, now);
        assert_eq!(moved.as_str(), "https://b.example:8443/v1/x?q=1");
        // Both frozen: the one that thaws first (a) is tried.
        e.fail(&moved, &p, now + Duration::from_secs(1));
        assert_eq!(
            e.target(&url, &p, now + Duration::from_secs(2)).host_str(),
            Some("a.example")
        );
        // After the freeze, a is back.
        let later = now + Duration::from_secs(601);
        assert_eq!(e.target(&url, &p, later).host_str(), Some("a.example"));
    }

    #[test]
    fn without_alternatives_nothing_changes_or_freezes() {
        let e = Endpoints::default();
        let p = EndpointPolicy::default();
        let url = Url::parse("http://a.example/").unwrap();
        e.fail(&url, &p, Instant::now());
        assert_eq!(*e.target(&url, &p, Instant::now()), url);
    }
}
