//! Bounded label values: a cap on how many distinct hosts, tenants and keys become labels.
//!
//! Why: every distinct label value is a new time series kept forever by the registry and by
//! Prometheus. A client that calls user-supplied hosts would otherwise grow without bound, so
//! values past the cap share the label [`OTHER`].

use std::{
    fmt::{self, Write as _},
    hash::{BuildHasher as _, Hash, Hasher},
    sync::{Arc, LazyLock},
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
    // The client's events carry the scheme in lower case: two compares, not a case-blind
    // walk over the bytes.
    match scheme {
        "https" => return "https",
        "http" => return "http",
        _ => {}
    }
    if scheme.eq_ignore_ascii_case("https") {
        "https"
    } else if scheme.eq_ignore_ascii_case("http") {
        "http"
    } else {
        OTHER
    }
}

// === label sets ===

/// The process's hasher for label sets (see [`folded_hash`]), seeded once per process.
static LABEL_HASH: LazyLock<foldhash::fast::RandomState> = LazyLock::new(Default::default);

/// Implements `Hash` for a label set as one word: its fields hashed together by foldhash,
/// written to the family's hasher as a single `u64`.
///
/// Why: prometheus-client's families keep their series in a std `HashMap`, and SipHash costs
/// per write; a derived `Hash` writes every field (and a terminator after each string), so a
/// new series — each new host — paid about 500 instructions per hash, for the lookup, the
/// insert and every growth of the map (measured: about 5 k instructions per request over
/// 10 000 hosts with the full policy). Equal label sets still hash equal: the same fields go
/// through the same hasher. The sets with a bounded label ([`Label`]) are the ones a new
/// value reaches; the others keep the derived `Hash`.
macro_rules! folded_hash {
    ($set:ty { $($field:ident),+ }) => {
        impl Hash for $set {
            fn hash<H: Hasher>(&self, state: &mut H) {
                let mut folded = LABEL_HASH.build_hasher();
                $( self.$field.hash(&mut folded); )+
                state.write_u64(folded.finish());
            }
        }
    };
}

#[derive(Clone, Debug, PartialEq, Eq, EncodeLabelSet)]
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

#[derive(Clone, Debug, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BytesLabels {
    pub(crate) dir: &'static str,
    pub(crate) tenant: Label,
    pub(crate) host: Label,
}

#[derive(Clone, Debug, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TenantLabels {
    pub(crate) tenant: Label,
}

#[derive(Clone, Debug, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TenantHostLabels {
    pub(crate) tenant: Label,
    pub(crate) host: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub(crate) reason: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HostLabels {
    pub(crate) host: Label,
}

#[derive(Clone, Debug, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KeyLabels {
    pub(crate) key: Label,
}

#[derive(Clone, Debug, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LimitLabels {
    pub(crate) host: Label,
    pub(crate) scope: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, EncodeLabelSet)]
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

folded_hash!(RequestLabels {
    tenant,
    host,
    method,
    scheme,
    outcome,
    version
});
folded_hash!(BytesLabels { dir, tenant, host });
folded_hash!(TenantLabels { tenant });
folded_hash!(TenantHostLabels { tenant, host });
folded_hash!(HostLabels { host });
folded_hash!(KeyLabels { key });
folded_hash!(LimitLabels { host, scope });
folded_hash!(RuleLabels { rule });

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_are_labelled_whatever_their_case() {
        for (scheme, label) in [
            ("https", "https"),
            ("http", "http"),
            ("HTTPS", "https"),
            ("Http", "http"),
            ("ws", OTHER),
            ("httpx", OTHER),
            ("", OTHER),
        ] {
            assert_eq!(scheme_label(scheme), label, "{scheme}");
        }
    }

    fn request(host: &str, outcome: &'static str) -> RequestLabels {
        RequestLabels {
            tenant: Label::new(""),
            host: Label::new(host),
            method: "GET",
            scheme: "https",
            outcome,
            version: "h2",
        }
    }

    #[test]
    fn a_label_set_hashes_as_one_word_equal_for_equal_sets() {
        let state = std::hash::RandomState::new();
        let one = |set: &RequestLabels| std::hash::BuildHasher::hash_one(&state, set);
        // Separate allocations of equal values: equal sets, equal hashes.
        assert_eq!(
            one(&request("a.example", "200")),
            one(&request("a.example", "200"))
        );
        assert_ne!(
            one(&request("a.example", "200")),
            one(&request("b.example", "200"))
        );
        assert_ne!(
            one(&request("a.example", "200")),
            one(&request("a.example", "503"))
        );
        // The family's map finds a series by an equal set built anew.
        let mut series = std::collections::HashMap::new();
        for i in 0..1_000 {
            series.insert(request(&format!("h{i}.example"), "200"), i);
        }
        assert_eq!(series.get(&request("h737.example", "200")), Some(&737));
        assert_eq!(series.len(), 1_000);
        // One word reaches the outer hasher, whatever the set's size.
        struct Words(usize);
        impl Hasher for Words {
            fn finish(&self) -> u64 {
                0
            }
            fn write(&mut self, _: &[u8]) {
                self.0 += 100;
            }
            fn write_u64(&mut self, _: u64) {
                self.0 += 1;
            }
        }
        let mut words = Words(0);
        request("a.example", "200").hash(&mut words);
        assert_eq!(words.0, 1);
    }

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
