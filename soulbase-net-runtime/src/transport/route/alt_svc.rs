//! `Alt-Svc` (RFC 7838): what an origin advertises about HTTP/3, and a bounded memory of it
//! and of which transport won an `h3-or-tcp` race, per origin.
//!
//! Only `h3` on the same host is taken (`h3=":port"`): an alternative on another host would
//! send the origin's requests to a name the policy and the address guard were not asked
//! about for it.

use std::time::Duration;

use foldhash::{HashMap, HashMapExt};
use parking_lot::Mutex;
use tokio::time::Instant;

/// Origins remembered at most; past this, expired entries go first, then the one that expires
/// soonest.
const MAX_ENTRIES: usize = 4096;

/// The freshness of an advertisement without `ma` (RFC 7838 §3.1: 24 hours).
const DEFAULT_MA: Duration = Duration::from_secs(86_400);

/// The longest an advertisement or a race's outcome is remembered, whatever `ma` says.
const MAX_MA: Duration = Duration::from_secs(7 * 86_400);

/// What an `Alt-Svc` header says about HTTP/3 on the same host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Advert {
    /// HTTP/3 on this UDP port, for this long.
    H3 { port: u16, max_age: Duration },
    /// `clear`: forget every alternative.
    Clear,
}

/// Parses an `Alt-Svc` value; `None` when it says nothing about same-host `h3`.
pub(crate) fn parse(value: &str) -> Option<Advert> {
    if value.trim().eq_ignore_ascii_case("clear") {
        return Some(Advert::Clear);
    }
    value.split(',').find_map(|entry| {
        let mut parts = entry.split(';');
        let (proto, authority) = parts.next()?.split_once('=')?;
        if proto.trim() != "h3" {
            return None;
        }
        let authority = authority.trim().strip_prefix('"')?.strip_suffix('"')?;
        // Same host only: `":443"`.
        let port: u16 = authority.strip_prefix(':')?.parse().ok()?;
        if port == 0 {
            return None;
        }
        let max_age = parts
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("ma"))
            .and_then(|(_, v)| v.trim().trim_matches('"').parse::<u64>().ok())
            .map_or(DEFAULT_MA, Duration::from_secs)
            .min(MAX_MA);
        Some(Advert::H3 { port, max_age })
    })
}

/// Per origin, something remembered until a moment: an advertised HTTP/3 port, or the winner
/// of a race.
#[derive(Debug)]
pub(crate) struct Memory<T> {
    entries: Mutex<HashMap<Box<str>, (T, Instant)>>,
}

impl<T: Copy> Memory<T> {
    pub(crate) fn new() -> Self {
        Memory {
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// What is remembered for `origin` at `now`, if it has not expired.
    pub(crate) fn get(&self, origin: &str, now: Instant) -> Option<T> {
        let mut entries = self.entries.lock();
        match entries.get(origin) {
            Some((value, until)) if *until > now => Some(*value),
            Some(_) => {
                entries.remove(origin);
                None
            }
            None => None,
        }
    }

    /// Remembers `value` for `origin` for `ttl` from `now`.
    pub(crate) fn put(&self, origin: &str, value: T, ttl: Duration, now: Instant) {
        let mut entries = self.entries.lock();
        if entries.len() >= MAX_ENTRIES && !entries.contains_key(origin) {
            entries.retain(|_, (_, until)| *until > now);
            if entries.len() >= MAX_ENTRIES {
                let soonest = entries
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(k, _)| k.clone());
                if let Some(k) = soonest {
                    entries.remove(&k);
                }
            }
        }
        entries.insert(origin.into(), (value, now + ttl.min(MAX_MA)));
    }

    /// Forgets `origin`.
    pub(crate) fn forget(&self, origin: &str) {
        self.entries.lock().remove(origin);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_host_h3_with_its_max_age() {
        assert_eq!(
            parse(r#"h3=":8443"; ma=60"#),
            Some(Advert::H3 {
                port: 8443,
                max_age: Duration::from_secs(60)
            })
        );
        assert_eq!(
            parse(r#"h2=":443", h3=":443""#),
            Some(Advert::H3 {
                port: 443,
                max_age: DEFAULT_MA
            })
        );
        assert_eq!(parse("clear"), Some(Advert::Clear));
        // Another host, drafts, nonsense: nothing.
        for v in [
            r#"h3="other.example:443""#,
            r#"h3-29=":443""#,
            r#"h3=":0""#,
            r#"h3=":x""#,
            "h3",
            "",
        ] {
            assert_eq!(parse(v), None, "{v}");
        }
        // `ma` is capped.
        assert_eq!(
            parse(r#"h3=":443"; ma=999999999"#),
            Some(Advert::H3 {
                port: 443,
                max_age: MAX_MA
            })
        );
    }

    #[test]
    fn memory_expires_and_stays_bounded() {
        let m = Memory::new();
        let now = Instant::now();
        m.put("a:443", 1u16, Duration::from_secs(10), now);
        assert_eq!(m.get("a:443", now), Some(1));
        assert_eq!(m.get("a:443", now + Duration::from_secs(10)), None);
        for i in 0..(MAX_ENTRIES + 10) {
            m.put(&format!("h{i}:443"), 2, Duration::from_secs(60), now);
        }
        assert!(m.len() <= MAX_ENTRIES);
        m.forget(&format!("h{}:443", MAX_ENTRIES + 9));
        assert_eq!(m.get(&format!("h{}:443", MAX_ENTRIES + 9), now), None);
    }
}
