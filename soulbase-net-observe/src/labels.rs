//! Bounded label values: a cap on how many distinct hosts, tenants and keys become labels.
//!
//! Why: every distinct label value is a new time series kept forever by the registry and by
//! Prometheus. A client that calls user-supplied hosts would otherwise grow without bound, so
//! values past the cap share the label [`OTHER`].

use std::{
    fmt::{self, Write as _},
    sync::Arc,
};

use foldhash::{HashSet, HashSetExt};

use parking_lot::RwLock;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use soulbase_net_core::http::{Method, Version};

/// The label value that stands for every value past a cap.
pub(crate) const OTHER: &str = "_other";

/// A label value shared by every series that uses it: cloning it never allocates.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Label(Arc<str>);

impl Label {
    pub(crate) fn new(value: &str) -> Self {
        Label(Arc::from(value))
    }
}

impl EncodeLabelValue for Label {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        encoder.write_str(&self.0)
    }
}

/// A set of admitted label values, at most `max` of them.
///
/// Why interned: the hot path looks a value up under a read lock and clones an `Arc`, so
/// counting an event for a known host allocates nothing. Once full, a value it does not hold
/// is answered with [`OTHER`] under the read lock too: values are never removed, so nothing
/// is admitted after that, and a client calling thousands of hosts does not take the write
/// lock for each of them. Hashed with foldhash (seeded per process): values come from
/// request URLs.
#[derive(Debug)]
pub(crate) struct LabelCap {
    max: usize,
    other: Label,
    seen: RwLock<HashSet<Arc<str>>>,
}

impl LabelCap {
    pub(crate) fn new(max: usize) -> Self {
        LabelCap {
            max,
            other: Label::new(OTHER),
            seen: RwLock::new(HashSet::new()),
        }
    }

    /// `value` if it is already admitted or there is room for it, else [`OTHER`].
    pub(crate) fn admit(&self, value: &str) -> Label {
        {
            let seen = self.seen.read();
            if let Some(known) = seen.get(value) {
                return Label(Arc::clone(known));
            }
            if seen.len() >= self.max {
                return self.other.clone();
            }
        }
        let mut seen = self.seen.write();
        if let Some(known) = seen.get(value) {
            return Label(Arc::clone(known));
        }
        if seen.len() < self.max {
            let label: Arc<str> = Arc::from(value);
            seen.insert(Arc::clone(&label));
            return Label(label);
        }
        self.other.clone()
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

/// The HTTP version of a call's final response as a label: `h1` (HTTP/1.x), `h2`, `h3`, or
/// `""` when the call ended without a response.
pub(crate) fn version_label(version: Option<Version>) -> &'static str {
    match version {
        None => "",
        Some(Version::HTTP_2) => "h2",
        Some(Version::HTTP_3) => "h3",
        Some(_) => "h1",
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
    pub(crate) tenant: Label,
    pub(crate) host: Label,
    pub(crate) method: &'static str,
    pub(crate) scheme: &'static str,
    pub(crate) outcome: &'static str,
    pub(crate) version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PhaseLabels {
    pub(crate) phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BytesLabels {
    pub(crate) dir: &'static str,
    pub(crate) tenant: Label,
    pub(crate) host: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TenantLabels {
    pub(crate) tenant: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TenantHostLabels {
    pub(crate) tenant: Label,
    pub(crate) host: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub(crate) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HostLabels {
    pub(crate) host: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KeyLabels {
    pub(crate) key: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LimitLabels {
    pub(crate) host: Label,
    pub(crate) scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RuleLabels {
    pub(crate) rule: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SourceLabels {
    pub(crate) source: &'static str,
}

/// An interceptor's name: static strings, so as many values as the program has interceptors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ByLabels {
    pub(crate) by: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StoreLabels {
    pub(crate) store: &'static str,
    pub(crate) op: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_cap_become_other() {
        let cap = LabelCap::new(2);
        assert_eq!(cap.admit("a"), Label::new("a"));
        assert_eq!(cap.admit("b"), Label::new("b"));
        assert_eq!(cap.admit("c"), Label::new(OTHER));
        assert_eq!(cap.admit("a"), Label::new("a"));
        assert_eq!(LabelCap::new(0).admit("a"), Label::new(OTHER));
    }

    #[test]
    fn a_full_cap_answers_new_values_under_the_read_lock() {
        let cap = Arc::new(LabelCap::new(1));
        assert_eq!(cap.admit("a"), Label::new("a"));
        // A reader holds the set: a call that wanted the write lock would wait for it.
        let held = cap.seen.read();
        let (tx, rx) = std::sync::mpsc::channel();
        let asker = {
            let cap = Arc::clone(&cap);
            std::thread::spawn(move || tx.send(cap.admit("b")).unwrap())
        };
        let answer = rx.recv_timeout(std::time::Duration::from_secs(10));
        drop(held);
        asker.join().unwrap();
        assert_eq!(answer, Ok(Label::new(OTHER)));
    }

    #[test]
    fn methods_and_schemes_are_bounded() {
        assert_eq!(method_label(&Method::GET), "GET");
        let odd = Method::from_bytes(b"PROPFIND").unwrap();
        assert_eq!(method_label(&odd), OTHER);
        assert_eq!(scheme_label("HTTPS"), "https");
        assert_eq!(scheme_label("ftp"), OTHER);
        assert_eq!(version_label(Some(Version::HTTP_3)), "h3");
        assert_eq!(version_label(Some(Version::HTTP_2)), "h2");
        assert_eq!(version_label(Some(Version::HTTP_10)), "h1");
        assert_eq!(version_label(None), "");
    }
}
