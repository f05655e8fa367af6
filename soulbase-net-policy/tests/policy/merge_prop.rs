//! Overrides change only the fields they state (property test).

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use soulbase_net_policy::*;

/// A partial override of a few scalar fields; `None` means "not stated".
#[derive(Clone, Debug, Default)]
struct Partial {
    max_attempts: Option<u32>,
    jitter: Option<f64>,
    redirect_max: Option<u8>,
    per_host: Option<u32>,
    swr: Option<bool>,
    prefer_ipv6: Option<bool>,
    connect_ms: Option<u64>,
    tls13: Option<bool>,
    max_resp: Option<u64>,
    strip: Option<Vec<String>>,
}

fn partial() -> impl Strategy<Value = Partial> {
    (
        (
            proptest::option::of(1u32..=3),
            proptest::option::of(0.0f64..=1.0),
            proptest::option::of(0u8..=20),
            proptest::option::of(1u32..100_000),
            proptest::option::of(any::<bool>()),
        ),
        (
            proptest::option::of(any::<bool>()),
            proptest::option::of(1u64..=2_000),
            proptest::option::of(any::<bool>()),
            proptest::option::of(1u64..u64::from(u32::MAX)),
            proptest::option::of(proptest::collection::vec("x-[a-z]{1,8}", 0..3)),
        ),
    )
        .prop_map(|((a, b, c, d, e), (f, g, h, i, j))| Partial {
            max_attempts: a,
            jitter: b,
            redirect_max: c,
            per_host: d,
            swr: e,
            prefer_ipv6: f,
            connect_ms: g,
            tls13: h,
            max_resp: i,
            strip: j,
        })
}

fn set(tree: &mut Map<String, Value>, path: &[&str], v: Value) {
    let (last, parents) = path.split_last().unwrap();
    let mut node = tree;
    for k in parents {
        node = node
            .entry(k.to_string())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .unwrap();
    }
    node.insert(last.to_string(), v);
}

impl Partial {
    /// The override as a value tree: only the stated fields.
    fn to_value(&self) -> Value {
        let mut m = Map::new();
        if let Some(v) = self.max_attempts {
            set(&mut m, &["retry", "max_attempts"], json!(v));
        }
        if let Some(v) = self.jitter {
            set(&mut m, &["retry", "backoff", "jitter"], json!(v));
        }
        if let Some(v) = self.redirect_max {
            set(&mut m, &["redirect", "max"], json!(v));
        }
        if let Some(v) = self.per_host {
            set(&mut m, &["limits", "per_host_concurrency"], json!(v));
        }
        if let Some(v) = self.swr {
            set(&mut m, &["cache", "swr"], json!(v));
        }
        if let Some(v) = self.prefer_ipv6 {
            set(&mut m, &["dns", "prefer_ipv6"], json!(v));
        }
        if let Some(v) = self.connect_ms {
            set(&mut m, &["timeout", "connect"], json!(format!("{v}ms")));
        }
        if let Some(v) = self.tls13 {
            set(
                &mut m,
                &["tls", "min_tls"],
                json!(if v { "1.3" } else { "1.2" }),
            );
        }
        if let Some(v) = self.max_resp {
            set(&mut m, &["security", "max_resp_bytes"], json!(v));
        }
        if let Some(v) = &self.strip {
            set(&mut m, &["security", "strip_headers"], json!(v));
        }
        Value::Object(m)
    }

    /// `base` with the stated fields changed, by hand.
    fn apply(&self, base: &NetPolicy) -> NetPolicy {
        let mut p = base.clone();
        if let Some(v) = self.max_attempts {
            p.retry.max_attempts = v;
        }
        if let Some(v) = self.jitter {
            p.retry.backoff.jitter = v;
        }
        if let Some(v) = self.redirect_max {
            p.redirect.max = v;
        }
        if let Some(v) = self.per_host {
            p.limits.per_host_concurrency = v;
        }
        if let Some(v) = self.swr {
            p.cache.swr = v;
        }
        if let Some(v) = self.prefer_ipv6 {
            p.dns.prefer_ipv6 = v;
        }
        if let Some(v) = self.connect_ms {
            p.timeout.connect = Duration::from_millis(v);
        }
        if let Some(v) = self.tls13 {
            p.tls.min_tls = if v {
                TlsVersion::Tls13
            } else {
                TlsVersion::Tls12
            };
        }
        if let Some(v) = self.max_resp {
            p.security.max_resp_bytes = ByteSize(v);
        }
        if let Some(v) = &self.strip {
            p.security.strip_headers = v.clone();
        }
        p
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn a_host_override_changes_only_what_it_states(h in partial()) {
        let mut doc = PolicyDocument::new();
        doc.set_override("*.example.com", h.to_value());
        let r = SnapshotResolver::new(doc).unwrap();
        let expected = h.apply(&NetPolicy::default());
        prop_assert_eq!(&*r.resolve(None, "api.example.com"), &expected);
        prop_assert_eq!(&*r.resolve(None, "example.org"), &NetPolicy::default());
    }

    #[test]
    fn layers_apply_in_order_each_changing_only_what_it_states(
        d in partial(), h in partial(), t in partial(), th in partial(),
    ) {
        let mut doc = PolicyDocument::new();
        doc.set_default_section(d.to_value())
            .set_override("*.example.com", h.to_value())
            .set_tenant("t1", t.to_value())
            .set_tenant_override("t1", "api.example.com", th.to_value());
        let r = SnapshotResolver::new(doc).unwrap();
        let dp = d.apply(&NetPolicy::default());
        let hp = h.apply(&dp);
        prop_assert_eq!(&*r.resolve(None, "other.org"), &dp);
        prop_assert_eq!(&*r.resolve(None, "api.example.com"), &hp);
        prop_assert_eq!(&*r.resolve(Some("t1"), "other.org"), &t.apply(&dp));
        prop_assert_eq!(&*r.resolve(Some("t1"), "www.example.com"), &t.apply(&hp));
        prop_assert_eq!(&*r.resolve(Some("t1"), "api.example.com"), &th.apply(&t.apply(&hp)));
    }
}
