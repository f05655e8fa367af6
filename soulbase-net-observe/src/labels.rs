//! Bounded label values: a cap on how many distinct hosts, tenants and keys become labels.
//!
//! Why: every distinct label value is a new time series kept forever by the registry and by
//! Prometheus. A client that calls user-supplied hosts would otherwise grow without bound, so
//! values past the cap share the label [`OTHER`].

use std::collections::HashSet;

use parking_lot::RwLock;
use prometheus_client::encoding::EncodeLabelSet;
use soulbase_net_core::http::Method;

/// The label value that stands for every value past a cap.
pub(crate) const OTHER: &str = "_other";

/// A set of admitted label values, at most `max` of them.
#[derive(Debug)]
pub(crate) struct LabelCap {
    max: usize,
    seen: RwLock<HashSet<String>>,
}

impl LabelCap {
    pub(crate) fn new(max: usize) -> Self {
        LabelCap {
            max,
            seen: RwLock::new(HashSet::new()),
        }
    }

    /// `value` if it is already admitted or there is room for it, else [`OTHER`].
    pub(crate) fn admit(&self, value: &str) -> String {
        if self.seen.read().contains(value) {
            return value.to_owned();
        }
        let mut seen = self.seen.write();
        if seen.contains(value) {
            return value.to_owned();
        }
        if seen.len() < self.max {
            seen.insert(value.to_owned());
            return value.to_owned();
        }
        OTHER.to_owned()
    }
}

/// The method as a label: the standard methods by name, any extension method as [`OTHER`].
pub(crate) fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => OTHER,
    }
}

/// The scheme as a label: `http`, `https` or [`OTHER`].
pub(crate) fn scheme_label(scheme: &str) -> &'static str {
    if scheme.eq_ignore_ascii_case("https") {
        "https"
    } else if scheme.eq_ignore_ascii_case("http") {
        "http"
    } else {
        OTHER
    }
}

// === label sets ===

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub(crate) tenant: String,
    pub(crate) host: String,
    pub(crate) method: &'static str,
    pub(crate) scheme: &'static str,
    pub(crate) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PhaseLabels {
    pub(crate) phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BytesLabels {
    pub(crate) dir: &'static str,
    pub(crate) tenant: String,
    pub(crate) host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub(crate) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HostLabels {
    pub(crate) host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KeyLabels {
    pub(crate) key: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LimitLabels {
    pub(crate) host: String,
    pub(crate) scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RuleLabels {
    pub(crate) rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SourceLabels {
    pub(crate) source: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_cap_become_other() {
        let cap = LabelCap::new(2);
        assert_eq!(cap.admit("a"), "a");
        assert_eq!(cap.admit("b"), "b");
        assert_eq!(cap.admit("c"), OTHER);
        assert_eq!(cap.admit("a"), "a");
        assert_eq!(LabelCap::new(0).admit("a"), OTHER);
    }

    #[test]
    fn methods_and_schemes_are_bounded() {
        assert_eq!(method_label(&Method::GET), "GET");
        let odd = Method::from_bytes(b"PROPFIND").unwrap();
        assert_eq!(method_label(&odd), OTHER);
        assert_eq!(scheme_label("HTTPS"), "https");
        assert_eq!(scheme_label("ftp"), OTHER);
    }
}
