//! `HostPatternSet`: the best of many host patterns for a host, in one hash probe per label.

use std::collections::HashMap;

use super::{lookup_key, HostPattern, HostPatternError, Kind};

/// A set of host patterns that finds the best pattern for a host.
///
/// An exact pattern beats any wildcard; among wildcards the longest suffix wins
/// (`*.api.example.com` beats `*.example.com` for `v1.api.example.com`). Lookups cost one hash
/// probe per label of the host.
#[derive(Clone, Debug, Default)]
pub struct HostPatternSet {
    patterns: Vec<HostPattern>,
    exact: HashMap<String, usize>,
    wildcard: HashMap<String, usize>,
}

// === impl HostPatternSet ===

impl HostPatternSet {
    /// A set of `patterns`; when two are equal, the first one wins.
    pub fn new(patterns: impl IntoIterator<Item = HostPattern>) -> Self {
        let mut set = Self::default();
        for p in patterns {
            set.push(p);
        }
        set
    }

    /// Parses every pattern.
    ///
    /// # Errors
    /// The first invalid pattern.
    pub fn parse<S: AsRef<str>>(
        patterns: impl IntoIterator<Item = S>,
    ) -> Result<Self, HostPatternError> {
        let mut set = Self::default();
        for p in patterns {
            set.push(HostPattern::parse(p.as_ref())?);
        }
        Ok(set)
    }

    fn push(&mut self, p: HostPattern) {
        let index = self.patterns.len();
        let map = match &p.kind {
            Kind::Exact(h) => self.exact.entry(h.clone()),
            Kind::Wildcard(s) => self.wildcard.entry(s.clone()),
        };
        map.or_insert(index);
        self.patterns.push(p);
    }

    /// The patterns, in the order given.
    pub fn patterns(&self) -> &[HostPattern] {
        &self.patterns
    }

    /// `true` when the set has no pattern.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The index (in [`patterns`](Self::patterns)) of the best pattern for `host`: an exact
    /// match, else the wildcard with the longest suffix.
    pub fn best_match(&self, host: &str) -> Option<usize> {
        if self.patterns.is_empty() {
            return None;
        }
        let key = lookup_key(host);
        if let Some(&i) = self.exact.get(key.as_ref()) {
            return Some(i);
        }
        if self.wildcard.is_empty() {
            return None;
        }
        // Left to right, so the first suffix found is the longest.
        key.match_indices('.')
            .filter(|&(i, _)| i > 0)
            .find_map(|(i, _)| self.wildcard.get(&key[i + 1..]).copied())
    }

    /// Whether any pattern matches `host`.
    pub fn matches(&self, host: &str) -> bool {
        self.best_match(host).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_beats_wildcard_and_longest_suffix_wins() {
        let set =
            HostPatternSet::parse(["*.example.com", "*.api.example.com", "v1.api.example.com"])
                .unwrap();
        assert_eq!(set.best_match("v1.api.example.com"), Some(2));
        assert_eq!(set.best_match("v2.api.example.com"), Some(1));
        assert_eq!(set.best_match("x.example.com"), Some(0));
        assert_eq!(set.best_match("api.example.com"), Some(0));
        assert_eq!(set.best_match("example.com"), None);
        assert_eq!(set.best_match("other.org"), None);
    }
}
