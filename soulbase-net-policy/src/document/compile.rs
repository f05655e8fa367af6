//! Compiling a document: every section deserialised on top of its parents, every reachable
//! combination of layers built and validated, and the lookup tables a resolver needs.
//!
//! Why each section separately: serde stops at the first error, so one pass over the whole
//! document would report one mistake. Here each section (and each combination of layers) is
//! deserialised on its own; when one fails, the offending field is reported with its path,
//! removed, and the section deserialised again, so every mistake is found in one run.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::tree::{join_path, merge, quote_key, remove_at};
use super::PolicyDocument;
use crate::host::{HostPattern, HostPatternSet};
use crate::policy::NetPolicy;
use crate::redact;
use crate::validate::{PolicyError, Problem};

/// Which layers make a policy: (host override, tenant, tenant+host override).
type Key = (Option<usize>, Option<usize>, Option<usize>);

/// Semantic problems of one effective policy, as (relative path, reason).
type ProblemSet = HashSet<(String, String)>;

/// Most fields removed from one section before giving up on it.
const MAX_REPAIRS: usize = 64;

/// A validated document, ready to resolve `(tenant, host)` without further merging.
#[derive(Debug)]
pub(crate) struct Compiled {
    hosts: HostPatternSet,
    tenants: HashMap<String, CompiledTenant>,
    policies: HashMap<Key, Arc<NetPolicy>>,
    /// The named policies (`keys.<name>`) by name → their index.
    keys: HashMap<String, usize>,
    /// Each combination of layers with each named policy on top.
    keyed: HashMap<(Key, usize), Arc<NetPolicy>>,
}

/// The named policy sections, compiled on the default, to put on top of every combination.
struct KeyLayers {
    layers: Vec<Layer>,
    keyed: HashMap<(Key, usize), Arc<NetPolicy>>,
}

#[derive(Debug)]
struct CompiledTenant {
    id: usize,
    hosts: HostPatternSet,
}

/// One effective policy under construction.
struct Layer {
    /// Where its problems are reported: `overrides."*.example.com"`, `a + b` for combinations.
    name: String,
    policy: NetPolicy,
    /// The merged value tree, the base for layers on top of this one.
    value: Value,
    /// The section as written, minus the fields that failed to deserialise.
    repaired: Value,
    problems: ProblemSet,
}

/// A host-pattern section that compiled, with its pattern.
struct HostLayer {
    pattern: HostPattern,
    layer: Layer,
}

#[derive(Default)]
struct Builder {
    problems: Vec<Problem>,
}

// === impl Compiled ===

impl Compiled {
    pub(crate) fn new(doc: &PolicyDocument) -> Result<Self, PolicyError> {
        let mut b = Builder::default();
        let base = serde_json::to_value(NetPolicy::default()).unwrap_or(Value::Null);
        let default = b.layer(&base, &doc.default, "default".to_owned(), false, &[]);
        let mut keys = KeyLayers {
            layers: Vec::new(),
            keyed: HashMap::new(),
        };
        let mut key_ids = HashMap::new();
        for (ki, (name, section)) in doc.keys.iter().enumerate() {
            let path = format!("keys.{}", quote_key(name));
            if name.is_empty() {
                b.push(path.clone(), "a policy key cannot be empty".to_owned());
            }
            let layer = b.layer(&default.value, section, path, false, &[&default]);
            keys.keyed
                .insert(((None, None, None), ki), Arc::new(layer.policy.clone()));
            keys.layers.push(layer);
            key_ids.insert(name.clone(), ki);
        }
        let mut policies = HashMap::new();
        policies.insert((None, None, None), Arc::new(default.policy.clone()));

        let globals = b.host_layers(&default, doc.overrides.iter(), "overrides");
        for (hi, h) in globals.iter().enumerate() {
            policies.insert((Some(hi), None, None), Arc::new(h.layer.policy.clone()));
            b.keyed(&mut keys, (Some(hi), None, None), &h.layer);
        }

        let mut tenants = HashMap::new();
        for (ti, (tid, section)) in doc.tenants.iter().enumerate() {
            let name = format!("tenants.{}", quote_key(tid));
            if tid.is_empty() {
                b.push(name.clone(), "a tenant id cannot be empty".to_owned());
            }
            let t = b.layer(
                &default.value,
                &section.policy,
                name.clone(),
                false,
                &[&default],
            );
            policies.insert((None, Some(ti), None), Arc::new(t.policy.clone()));
            b.keyed(&mut keys, (None, Some(ti), None), &t);
            let locals = b.host_layers(&t, section.overrides.iter(), &format!("{name}.overrides"));
            for (thi, th) in locals.iter().enumerate() {
                policies.insert(
                    (None, Some(ti), Some(thi)),
                    Arc::new(th.layer.policy.clone()),
                );
                b.keyed(&mut keys, (None, Some(ti), Some(thi)), &th.layer);
            }
            for (hi, h) in globals.iter().enumerate() {
                let name = format!("{} + {}", h.layer.name, t.name);
                let ht = b.layer(&h.layer.value, &t.repaired, name, true, &[&h.layer, &t]);
                policies.insert((Some(hi), Some(ti), None), Arc::new(ht.policy.clone()));
                b.keyed(&mut keys, (Some(hi), Some(ti), None), &ht);
                for (thi, th) in locals.iter().enumerate() {
                    // Only combinations some host can reach: both patterns must match it.
                    if !h.pattern.overlaps(&th.pattern) {
                        continue;
                    }
                    let name = format!("{} + {}", h.layer.name, th.layer.name);
                    let parents = [&ht, &th.layer];
                    let all = b.layer(&ht.value, &th.layer.repaired, name, true, &parents);
                    b.keyed(&mut keys, (Some(hi), Some(ti), Some(thi)), &all);
                    policies.insert((Some(hi), Some(ti), Some(thi)), Arc::new(all.policy));
                }
            }
            let hosts = HostPatternSet::new(locals.into_iter().map(|l| l.pattern));
            tenants.insert(tid.clone(), CompiledTenant { id: ti, hosts });
        }

        PolicyError::check(b.problems)?;
        Ok(Self {
            hosts: HostPatternSet::new(globals.into_iter().map(|l| l.pattern)),
            tenants,
            policies,
            keys: key_ids,
            keyed: keys.keyed,
        })
    }

    /// Built-in defaults for everyone, without validation.
    pub(crate) fn empty() -> Self {
        let mut policies = HashMap::new();
        policies.insert((None, None, None), Arc::new(NetPolicy::default()));
        Self {
            hosts: HostPatternSet::default(),
            tenants: HashMap::new(),
            policies,
            keys: HashMap::new(),
            keyed: HashMap::new(),
        }
    }

    /// The effective policy for `(tenant, host)`.
    pub(crate) fn resolve(&self, tenant: Option<&str>, host: &str) -> Arc<NetPolicy> {
        let key = self.combination(tenant, host);
        // Every reachable key was built; the fallbacks only guard against a bug here.
        self.policies
            .get(&key)
            .or_else(|| self.policies.get(&(None, None, None)))
            .cloned()
            .unwrap_or_default()
    }

    /// The effective policy for `(tenant, host)` with the named policy `name` on top; `None`
    /// when the document has no such key.
    pub(crate) fn resolve_key(
        &self,
        tenant: Option<&str>,
        host: &str,
        name: &str,
    ) -> Option<Arc<NetPolicy>> {
        let ki = *self.keys.get(name)?;
        let key = self.combination(tenant, host);
        self.keyed
            .get(&(key, ki))
            .or_else(|| self.keyed.get(&((None, None, None), ki)))
            .cloned()
    }

    /// Which layers apply to `(tenant, host)`.
    fn combination(&self, tenant: Option<&str>, host: &str) -> Key {
        let h = self.hosts.best_match(host);
        let t = tenant.and_then(|t| self.tenants.get(t));
        let th = t.and_then(|t| t.hosts.best_match(host));
        (h, t.map(|t| t.id), th)
    }

    /// The one policy every `(tenant, host)` gets, when the document has no overrides.
    pub(crate) fn uniform(&self) -> Option<Arc<NetPolicy>> {
        if self.hosts.is_empty() && self.tenants.is_empty() {
            self.policies.get(&(None, None, None)).cloned()
        } else {
            None
        }
    }

    /// How many distinct layer combinations were built (and validated), named policies
    /// included.
    pub(crate) fn combinations(&self) -> usize {
        self.policies.len() + self.keyed.len()
    }
}

// === impl Builder ===

impl Builder {
    fn push(&mut self, path: String, reason: String) {
        self.problems.push(Problem::new(path, reason));
    }

    /// Puts every named policy on top of the combination `key` (whose merged layer is
    /// `layer`), reporting only problems neither part has alone.
    fn keyed(&mut self, keys: &mut KeyLayers, key: Key, layer: &Layer) {
        for (ki, k) in keys.layers.iter().enumerate() {
            let name = format!("{} + {}", layer.name, k.name);
            let on_top = self.layer(&layer.value, &k.repaired, name, true, &[layer, k]);
            keys.keyed.insert((key, ki), Arc::new(on_top.policy));
        }
    }

    /// Where a problem at `rel` (relative to the policy) of `layer` is reported.
    fn at(name: &str, combo: bool, rel: &str) -> String {
        match (combo, rel.is_empty()) {
            (_, true) => name.to_owned(),
            (true, false) => format!("{name}: {rel}"),
            (false, false) => format!("{name}.{rel}"),
        }
    }

    /// Compiles the host-pattern sections under `prefix` on top of `parent`. Sections with an
    /// invalid or duplicate pattern are still checked, but left out of the result.
    fn host_layers<'a>(
        &mut self,
        parent: &Layer,
        sections: impl Iterator<Item = (&'a String, &'a Value)>,
        prefix: &str,
    ) -> Vec<HostLayer> {
        let mut out: Vec<HostLayer> = Vec::new();
        let mut seen: HashMap<HostPattern, String> = HashMap::new();
        for (raw, section) in sections {
            let name = format!("{prefix}.{}", quote_key(raw));
            let layer = self.layer(&parent.value, section, name.clone(), false, &[parent]);
            let pattern = match HostPattern::parse(raw) {
                Ok(p) => p,
                Err(e) => {
                    self.push(name, e.to_string());
                    continue;
                }
            };
            if let Some(first) = seen.get(&pattern) {
                let reason = format!("the same pattern as {first} once normalised ({pattern})");
                self.push(name, reason);
                continue;
            }
            seen.insert(pattern.clone(), name);
            out.push(HostLayer { pattern, layer });
        }
        out
    }

    /// Applies `section` on top of `parent` (a full value tree) and checks the result,
    /// reporting problems not already reported for one of `parents`.
    fn layer(
        &mut self,
        parent: &Value,
        section: &Value,
        name: String,
        combo: bool,
        parents: &[&Layer],
    ) -> Layer {
        let mut repaired = match section {
            Value::Object(_) => section.clone(),
            _ => {
                self.push(
                    name.clone(),
                    "expected a table (a partial policy)".to_owned(),
                );
                Value::Object(Map::new())
            }
        };
        crate::policy::retry::upgrade_switch_names(&mut repaired);
        let (policy, value) = self.deserialize(parent, &mut repaired, &name, combo);
        let problems = self.semantic(&policy, &name, combo, parents);
        Layer {
            name,
            policy,
            value,
            repaired,
            problems,
        }
    }

    /// Deserialises `parent ⊕ section`, reporting and removing bad fields until it succeeds.
    fn deserialize(
        &mut self,
        parent: &Value,
        section: &mut Value,
        name: &str,
        combo: bool,
    ) -> (NetPolicy, Value) {
        for _ in 0..MAX_REPAIRS {
            let mut merged = parent.clone();
            merge(&mut merged, section);
            match serde_path_to_error::deserialize::<_, NetPolicy>(merged.clone()) {
                Ok(policy) => return (policy, merged),
                Err(e) => {
                    let rel = join_path("", e.path());
                    self.push(Self::at(name, combo, &rel), reason(&e));
                    if !remove_at(section, e.path()) {
                        break;
                    }
                }
            }
        }
        // Nothing more can be removed: fall back to the parent alone.
        *section = Value::Object(Map::new());
        let policy = serde_json::from_value(parent.clone()).unwrap_or_default();
        (policy, parent.clone())
    }

    fn semantic(
        &mut self,
        policy: &NetPolicy,
        name: &str,
        combo: bool,
        parents: &[&Layer],
    ) -> ProblemSet {
        let mut set = ProblemSet::new();
        for p in policy.problems() {
            let key = (p.path, p.reason);
            let known = parents.iter().any(|l| l.problems.contains(&key));
            if !known && !set.contains(&key) {
                self.push(Self::at(name, combo, &key.0), key.1.clone());
            }
            set.insert(key);
        }
        set
    }
}

/// Why a field failed to deserialise, in serde's words — except the value serde quotes, when
/// the field holds or is above a credential (`invalid type: string "http://u:pw@h", expected
/// struct ProxyPolicy`).
fn reason(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let message = e.inner().to_string();
    let keys: Vec<&str> = e
        .path()
        .iter()
        .map_while(|seg| match seg {
            serde_path_to_error::Segment::Map { key } => Some(key.as_str()),
            _ => None,
        })
        .collect();
    if redact::concerns_secret(&keys) {
        redact::quoted(&message)
    } else {
        message
    }
}
