//! What the client learns from its own traffic: recent latencies per host (for the dynamic
//! timeout of seed 001) and frozen endpoints (seed 004's DomainsManager).

use std::{
    borrow::Cow,
    path::PathBuf,
    time::{Duration, SystemTime},
};

use foldhash::HashMap;

use parking_lot::RwLock;
use soulbase_net_core::NetError;
use soulbase_net_policy::{DynamicTimeout, EndpointPolicy, FreezeOn};
use tokio::time::Instant;
use url::Url;

use crate::resilience::{attempt_timeout, Freezer, LatencyHistogram};

/// Hosts whose latencies are kept; past this a shard starts afresh.
const MAX_HOSTS: usize = 10_000;
/// Shards of the latency map (a power of two).
const SHARDS: usize = 16;

/// Recent time-to-first-byte per host, for the dynamic timeout: a
/// [`LatencyHistogram`] per host (recorded and read with atomics, no copy), in a map split
/// into shards by the host's hash. Recording and reading take only the host's shard's read
/// lock (shared: callers do not wait for each other); a new host takes its write lock once.
#[derive(Debug, Default)]
pub(crate) struct Latencies {
    shards: [RwLock<HashMap<String, LatencyHistogram>>; SHARDS],
}

impl Latencies {
    fn shard(&self, host: &str) -> &RwLock<HashMap<String, LatencyHistogram>> {
        use std::hash::BuildHasher;
        let hash = foldhash::fast::FixedState::with_seed(0).hash_one(host);
        &self.shards[(hash as usize) & (SHARDS - 1)]
    }

    /// Records a successful attempt's time to first byte.
    pub(crate) fn record(&self, host: &str, ttfb: Duration) {
        let shard = self.shard(host);
        if let Some(h) = shard.read().get(host) {
            h.record(ttfb);
            return;
        }
        let mut map = shard.write();
        if !map.contains_key(host) && map.len() >= MAX_HOSTS / SHARDS {
            map.clear();
        }
        map.entry(host.to_owned()).or_default().record(ttfb);
    }

    /// The per-attempt timeout for `host`: learnt when the policy asks for it and enough
    /// latencies are known, else `fixed`.
    pub(crate) fn timeout(&self, host: &str, cfg: &DynamicTimeout, fixed: Duration) -> Duration {
        if !cfg.enabled {
            return fixed;
        }
        match self.shard(host).read().get(host) {
            Some(h) => attempt_timeout(cfg, h, fixed),
            None => fixed,
        }
    }
}

/// Base URLs (origins) frozen after a failure or by hand, for `endpoints.frozen_duration`;
/// saved to a file when the client persists them.
#[derive(Debug)]
pub(crate) struct Endpoints {
    frozen: Freezer<String>,
    /// Where the frozen origins are saved (next to the DNS cache file), if anywhere.
    file: Option<PathBuf>,
}

impl Default for Endpoints {
    fn default() -> Self {
        Endpoints {
            frozen: Freezer::new(MAX_HOSTS),
            file: None,
        }
    }
}

impl Endpoints {
    /// Frozen origins saved to (and first loaded from) `file`. Entries already thawed, or
    /// that cannot be read, are left out; an unreadable file is an error.
    pub(crate) fn persisted(file: PathBuf) -> Result<Self, NetError> {
        let read = crate::dns::load_frozen(&file)?;
        Ok(Self::restored(file, read))
    }

    /// As [`Endpoints::persisted`], with `file` already read into `read` (the frozen origins
    /// and when each thaws).
    pub(crate) fn restored(file: PathBuf, read: Vec<(String, SystemTime)>) -> Self {
        let now = Instant::now();
        let wall = SystemTime::now();
        let frozen = Freezer::new(MAX_HOSTS);
        for (origin, thaws) in read {
            if let Ok(left) = thaws.duration_since(wall) {
                frozen.freeze(&origin, left, now);
            }
        }
        Endpoints {
            frozen,
            file: Some(file),
        }
    }

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

    /// Freezes the origin of `url` after a failure of kind `on`, when the policy freezes on
    /// it and has alternatives to move to. Returns whether it froze something (then the
    /// frozen set may be saved: [`Endpoints::save`]).
    pub(crate) fn fail(&self, url: &Url, p: &EndpointPolicy, on: FreezeOn, now: Instant) -> bool {
        if p.freezes_on(on) && !p.urls.is_empty() {
            self.frozen.freeze(&origin(url), p.frozen_duration, now);
            return true;
        }
        false
    }

    /// Freezes the origin of `url` for `duration`, whatever the policy (by hand).
    pub(crate) fn freeze(&self, url: &Url, duration: Duration, now: Instant) {
        self.frozen.freeze(&origin(url), duration, now);
    }

    /// Thaws the origin of `url`. Returns whether it was frozen.
    pub(crate) fn unfreeze(&self, url: &Url) -> bool {
        self.frozen.unfreeze(&origin(url))
    }

    /// The frozen origins and how long each stays frozen from `now`.
    pub(crate) fn frozen(&self, now: Instant) -> Vec<(String, Duration)> {
        let mut out: Vec<(String, Duration)> = self
            .frozen
            .entries(now)
            .into_iter()
            .map(|(o, t)| (o, t.saturating_duration_since(now)))
            .collect();
        out.sort();
        out
    }

    /// A job that saves the frozen set to the client's file (blocking: run it off the async
    /// threads), or `None` when the client does not persist.
    pub(crate) fn save(&self) -> Option<impl FnOnce() -> Result<(), NetError> + Send + 'static> {
        let file = self.file.clone()?;
        let now = Instant::now();
        let wall = SystemTime::now();
        let entries: Vec<(String, SystemTime)> = self
            .frozen
            .entries(now)
            .into_iter()
            .map(|(o, t)| (o, wall + t.saturating_duration_since(now)))
            .collect();
        Some(move || crate::dns::save_frozen(&file, &entries))
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
    fn hosts_do_not_share_latencies() {
        let mut cfg = DynamicTimeout::default(); // p99 × 1.5 in 100ms..9s after 50
        cfg.enabled = true;
        let fixed = Duration::from_secs(9);
        let l = Latencies::default();
        for _ in 0..100 {
            l.record("slow.example", Duration::from_secs(2));
            l.record("fast.example", Duration::from_millis(80));
        }
        for _ in 0..30 {
            l.record("new.example", Duration::from_millis(1));
        }
        let slow = l.timeout("slow.example", &cfg, fixed);
        let fast = l.timeout("fast.example", &cfg, fixed);
        // 2s × 1.5 and 80ms × 1.5, each within its bucket's 1/16.
        assert!(
            slow >= Duration::from_secs(3) && slow <= Duration::from_millis(3_188),
            "{slow:?}"
        );
        assert!(
            fast >= Duration::from_millis(120) && fast <= Duration::from_millis(128),
            "{fast:?}"
        );
        // Too few of its own samples: the fixed timeout, whatever the other hosts know.
        assert_eq!(l.timeout("new.example", &cfg, fixed), fixed);
        assert_eq!(l.timeout("unknown.example", &cfg, fixed), fixed);
    }

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
        e.fail(&url, &p, FreezeOn::Connect, now);
        let moved = e.target(&url, &p, now);
        assert_eq!(moved.as_str(), "https://b.example:8443/v1/x?q=1");
        // Both frozen: the one that thaws first (a) is tried.
        e.fail(&moved, &p, FreezeOn::Connect, now + Duration::from_secs(1));
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
        e.fail(&url, &p, FreezeOn::Connect, Instant::now());
        assert_eq!(*e.target(&url, &p, Instant::now()), url);
    }
}
