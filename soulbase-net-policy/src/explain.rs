//! Explaining a resolution: which layers of a document a call gets, and which layer each field
//! of its effective policy comes from.
//!
//! Why a separate walk rather than bookkeeping in the resolver: resolution runs on every call
//! and keeps only the merged policies; an explanation is asked for by a person, rarely. So it
//! reads the sections that apply and attributes each field of the resolver's own answer to the
//! last layer that states it (tables merge key by key, so the last layer naming a field wins).
//! Notes on fields whose value alone misleads (retries that cannot apply, the breaker's unit)
//! are in `explain/notes.rs`.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;
use soulbase_net_core::TimeoutCfg;

use crate::document::{quote_key, PolicyDocument};
use crate::host::{HostPattern, HostPatternSet};
use crate::policy::NetPolicy;
use crate::redact;
use crate::resolver::Snapshot;
use crate::validate::PolicyError;

mod notes;

use self::notes::RequestShape;

/// One layer of a policy document, as a call meets them: the built-in defaults, then
/// `default`, the best host override, the tenant, the best tenant + host override, the named
/// policy the request asks for, and the request's own timeouts.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyLayer {
    /// `NetPolicy::default()`: no section states the field.
    BuiltIn,
    /// The document's `[default]` section.
    Default,
    /// The best `[overrides."<pattern>"]` for the host.
    Host {
        /// The pattern as written in the document.
        pattern: String,
    },
    /// The tenant's `[tenants.<tenant>]` section.
    Tenant {
        /// The tenant id.
        tenant: String,
    },
    /// The best `[tenants.<tenant>.overrides."<pattern>"]` for the host.
    TenantHost {
        /// The tenant id.
        tenant: String,
        /// The pattern as written in the document.
        pattern: String,
    },
    /// The `[keys.<key>]` section the request names (`NetRequest::policy_key`).
    Key {
        /// The policy key.
        key: String,
    },
    /// The timeouts the request sets itself (`NetRequest::timeout`).
    RequestTimeouts,
}

/// A field of an effective policy and where its value comes from.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ExplainedField {
    /// The field's path in the document's shape, e.g. `retry.backoff.cap` or
    /// `dns.static_hosts."db.internal"`.
    pub path: String,
    /// The effective value, as the policy serialises it (`"2s"`, `3`, `["10.0.0.0/8"]`), with
    /// credentials masked: a proxy or endpoint URL's password as `***`
    /// (`"http://user:***@proxy.internal:3128/"`), the mTLS key as `"<redacted>"`. The value
    /// the client uses is in [`Explanation::policy`].
    pub value: Value,
    /// The layer that decided it: the last one that states it.
    pub layer: PolicyLayer,
    /// Earlier layers that state it too, overridden by `layer`, in order.
    pub overrides: Vec<PolicyLayer>,
    /// What the value does for this call when the value alone does not say, one line each:
    /// on `retry.max_attempts`, which requests it applies to (idempotent ones) and which
    /// bodies can be sent again (`retry.replay_buffer` through the tower face) — definite
    /// after [`Explanation::for_request`]; on the breaker's fields, that it counts failed
    /// attempts, not calls; on `cbreaker.enabled` when the breaker is off. Empty for most
    /// fields.
    pub notes: Vec<String>,
}

/// The effective policy of one call with the origin of each of its fields; see
/// [`Snapshot::explain`].
#[derive(Clone, Debug)]
pub struct Explanation {
    policy: Arc<NetPolicy>,
    layers: Vec<PolicyLayer>,
    fields: Vec<ExplainedField>,
    /// The request's method and idempotence, when told ([`Explanation::for_request`]).
    request: Option<RequestShape>,
}

// === impl PolicyLayer ===

impl PolicyLayer {
    /// What kind of layer this is: `built-in`, `default`, `host override`, `tenant`,
    /// `tenant+host` or `request`.
    pub fn kind(&self) -> &'static str {
        match self {
            PolicyLayer::BuiltIn => "built-in",
            PolicyLayer::Default => "default",
            PolicyLayer::Host { .. } => "host override",
            PolicyLayer::Tenant { .. } => "tenant",
            PolicyLayer::TenantHost { .. } => "tenant+host",
            PolicyLayer::Key { .. } | PolicyLayer::RequestTimeouts => "request",
        }
    }
}

impl fmt::Display for PolicyLayer {
    /// Where the layer is written: `default`, `overrides."*.example.com"`, `tenants.t1`,
    /// `tenants.t1.overrides."api.example.com"`, `keys.payments`; `built-in` and
    /// `request timeouts` for the two that are not in the document.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyLayer::BuiltIn => f.write_str("built-in"),
            PolicyLayer::Default => f.write_str("default"),
            PolicyLayer::Host { pattern } => write!(f, "overrides.{}", quote_key(pattern)),
            PolicyLayer::Tenant { tenant } => write!(f, "tenants.{}", quote_key(tenant)),
            PolicyLayer::TenantHost { tenant, pattern } => write!(
                f,
                "tenants.{}.overrides.{}",
                quote_key(tenant),
                quote_key(pattern)
            ),
            PolicyLayer::Key { key } => write!(f, "keys.{}", quote_key(key)),
            PolicyLayer::RequestTimeouts => f.write_str("request timeouts"),
        }
    }
}

// === impl Snapshot ===

impl Snapshot {
    /// The effective policy of a call to `host` on behalf of `tenant`, with the named policy
    /// `key` on top when given, and for each of its fields the layer it comes from.
    ///
    /// The policy is the one [`resolve`](Self::resolve) (or [`resolve_key`](Self::resolve_key))
    /// gives; fields absent from it (an optional section left unset) are not listed.
    ///
    /// # Errors
    /// `key` names no `[keys.<key>]` section of the document.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_policy::{PolicyDocument, PolicyLayer, SnapshotResolver};
    ///
    /// let doc = PolicyDocument::from_toml_str(r#"
    ///     [default]
    ///     retry.max_attempts = 3
    ///     [overrides."*.example.com"]
    ///     retry.max_attempts = 2
    ///     [tenants.t1]
    ///     limits.per_tenant_concurrency = 32
    /// "#)?;
    /// let why = SnapshotResolver::new(doc)?.snapshot().explain(Some("t1"), "api.example.com", None)?;
    /// let attempts = why.field("retry.max_attempts").unwrap();
    /// assert_eq!(attempts.value, 2);
    /// assert_eq!(attempts.layer.to_string(), r#"overrides."*.example.com""#);
    /// assert_eq!(attempts.overrides, [PolicyLayer::Default]);
    /// assert_eq!(why.field("limits.per_tenant_concurrency").unwrap().layer.kind(), "tenant");
    /// assert_eq!(why.field("timeout.total").unwrap().layer, PolicyLayer::BuiltIn);
    /// # Ok::<(), soulbase_net_policy::PolicyError>(())
    /// ```
    pub fn explain(
        &self,
        tenant: Option<&str>,
        host: &str,
        key: Option<&str>,
    ) -> Result<Explanation, PolicyError> {
        let policy = match key {
            None => self.resolve(tenant, host),
            Some(k) => self.resolve_key(tenant, host, k).ok_or_else(|| {
                PolicyError::single(
                    format!("keys.{}", quote_key(k)),
                    "the document has no such policy key",
                )
            })?,
        };
        let sections = sections(self.document(), tenant, host, key);
        let tree = serde_json::to_value(&*policy).unwrap_or(Value::Null);
        let mut fields = Vec::new();
        leaves(&tree, &mut Vec::new(), &mut |path, value| {
            let stating: Vec<&PolicyLayer> = sections
                .iter()
                .filter(|(_, section)| states(section, path))
                .map(|(layer, _)| layer)
                .collect();
            let (layer, overrides) = match stating.split_last() {
                Some((last, earlier)) => (
                    (*last).clone(),
                    earlier.iter().map(|l| (*l).clone()).collect(),
                ),
                None => (PolicyLayer::BuiltIn, Vec::new()),
            };
            fields.push(ExplainedField {
                path: path
                    .iter()
                    .map(|k| quote_key(k))
                    .collect::<Vec<_>>()
                    .join("."),
                value: redact::leaf(path, value),
                layer,
                overrides,
                notes: Vec::new(),
            });
        });
        let mut layers = vec![PolicyLayer::BuiltIn];
        layers.extend(sections.into_iter().map(|(layer, _)| layer));
        let mut why = Explanation {
            policy,
            layers,
            fields,
            request: None,
        };
        why.annotate();
        Ok(why)
    }
}

/// The sections of `doc` a call to `host` for `tenant` (with `key`) meets, in merge order.
fn sections<'d>(
    doc: &'d PolicyDocument,
    tenant: Option<&str>,
    host: &str,
    key: Option<&str>,
) -> Vec<(PolicyLayer, &'d Value)> {
    let mut out = vec![(PolicyLayer::Default, doc.default_section())];
    if let Some((pattern, section)) = best(doc.overrides(), host) {
        out.push((PolicyLayer::Host { pattern }, section));
    }
    if let Some((t, section)) = tenant.and_then(|t| Some((t, doc.tenant_section(t)?))) {
        out.push((
            PolicyLayer::Tenant {
                tenant: t.to_owned(),
            },
            section,
        ));
        if let Some((pattern, section)) = best(doc.tenant_overrides(t), host) {
            let tenant = t.to_owned();
            out.push((PolicyLayer::TenantHost { tenant, pattern }, section));
        }
    }
    if let Some((k, section)) = key.and_then(|k| doc.keys().find(|(name, _)| *name == k)) {
        out.push((PolicyLayer::Key { key: k.to_owned() }, section));
    }
    out
}

/// The section whose pattern is the best match for `host`, as the resolver picks it.
fn best<'d>(
    sections: impl Iterator<Item = (&'d str, &'d Value)>,
    host: &str,
) -> Option<(String, &'d Value)> {
    // A validated document's patterns all parse and are distinct, so indexes line up.
    let parsed: Vec<(HostPattern, &str, &Value)> = sections
        .filter_map(|(raw, v)| Some((HostPattern::parse(raw).ok()?, raw, v)))
        .collect();
    let set = HostPatternSet::new(parsed.iter().map(|(p, _, _)| p.clone()));
    let (_, raw, section) = parsed.get(set.best_match(host)?)?;
    Some(((*raw).to_owned(), *section))
}

/// Calls `f` with every leaf of `tree` (anything but a non-empty table) and its path.
fn leaves<'a>(tree: &'a Value, path: &mut Vec<&'a str>, f: &mut impl FnMut(&[&str], &Value)) {
    match tree {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                path.push(k);
                leaves(v, path, f);
                path.pop();
            }
        }
        leaf => f(path, leaf),
    }
}

/// Whether `section` states the field at `path` (or replaces a table above it whole).
fn states(section: &Value, path: &[&str]) -> bool {
    let mut node = section;
    for k in path {
        match node {
            Value::Object(map) => match map.get(*k) {
                Some(next) => node = next,
                None => return false,
            },
            _ => return true,
        }
    }
    true
}

// === impl Explanation ===

impl Explanation {
    /// The effective policy, exactly as the resolver gives it (with the request's timeouts,
    /// after [`with_request_timeouts`](Self::with_request_timeouts)).
    pub fn policy(&self) -> &NetPolicy {
        &self.policy
    }

    /// The layers the call meets, in the order they are applied, [`PolicyLayer::BuiltIn`]
    /// first.
    pub fn layers(&self) -> &[PolicyLayer] {
        &self.layers
    }

    /// Every field of the effective policy, in path order, with its origin.
    pub fn fields(&self) -> &[ExplainedField] {
        &self.fields
    }

    /// The field at `path` (`retry.max_attempts`), if the effective policy has it.
    pub fn field(&self, path: &str) -> Option<&ExplainedField> {
        self.fields.iter().find(|f| f.path == path)
    }

    /// Every note on a field, as (path, note), in path order (see
    /// [`ExplainedField::notes`]).
    pub fn notes(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.fields
            .iter()
            .flat_map(|f| f.notes.iter().map(move |n| (f.path.as_str(), n.as_str())))
    }

    /// The same call for a request with `method`, `idempotent` as the request says
    /// (`NetRequest::idempotent`; a POST or PATCH with an `Idempotency-Key` is): the note on
    /// `retry.max_attempts` then says whether retries can apply to it at all.
    ///
    /// ```
    /// use soulbase_net_policy::{PolicyDocument, SnapshotResolver};
    ///
    /// let doc = PolicyDocument::from_toml_str(r#"
    ///     [overrides."pricing.internal"]
    ///     retry.max_attempts = 2
    /// "#)?;
    /// let why = SnapshotResolver::new(doc)?.snapshot().explain(None, "pricing.internal", None)?
    ///     .for_request(&http::Method::POST, false);
    /// let note = &why.field("retry.max_attempts").unwrap().notes[0];
    /// assert!(note.starts_with("cannot apply to this request: POST is not idempotent"));
    /// # Ok::<(), soulbase_net_policy::PolicyError>(())
    /// ```
    pub fn for_request(mut self, method: &http::Method, idempotent: bool) -> Self {
        self.request = Some(RequestShape {
            method: method.clone(),
            idempotent,
        });
        self.annotate();
        self
    }

    /// Sets every field's notes from the policy and the request.
    fn annotate(&mut self) {
        for field in &mut self.fields {
            field.notes.clear();
        }
        for (path, note) in notes::notes(&self.policy, self.request.as_ref()) {
            if let Some(field) = self.fields.iter_mut().find(|f| f.path == path) {
                field.notes.push(note);
            }
        }
    }

    /// The same call with the timeouts a request sets itself (`NetRequest::timeout`) on
    /// top, as the client applies them: each one set replaces the policy's, and its field's
    /// layer becomes [`PolicyLayer::RequestTimeouts`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use soulbase_net_core::TimeoutCfg;
    /// use soulbase_net_policy::{PolicyLayer, SnapshotResolver};
    ///
    /// let why = SnapshotResolver::default().snapshot().explain(None, "example.com", None)?
    ///     .with_request_timeouts(&TimeoutCfg::default().with_total(Duration::from_secs(5)));
    /// assert_eq!(why.policy().timeout.total, Duration::from_secs(5));
    /// assert_eq!(why.field("timeout.total").unwrap().layer, PolicyLayer::RequestTimeouts);
    /// assert!(why.layers().contains(&PolicyLayer::RequestTimeouts));
    /// # Ok::<(), soulbase_net_policy::PolicyError>(())
    /// ```
    pub fn with_request_timeouts(mut self, timeouts: &TimeoutCfg) -> Self {
        if *timeouts == TimeoutCfg::default() {
            return self;
        }
        let mut policy = (*self.policy).clone();
        policy.timeout = policy.timeout.with_request(timeouts);
        let set = [
            ("timeout.connect", timeouts.connect.is_some()),
            ("timeout.ttfb", timeouts.ttfb.is_some()),
            ("timeout.read", timeouts.read.is_some()),
            ("timeout.write", timeouts.write.is_some()),
            ("timeout.total", timeouts.total.is_some()),
        ];
        let tree = serde_json::to_value(&policy).unwrap_or(Value::Null);
        for field in &mut self.fields {
            if !set.iter().any(|(path, on)| *on && field.path == *path) {
                continue;
            }
            let pointer = format!("/{}", field.path.replace('.', "/"));
            if let Some(v) = tree.pointer(&pointer) {
                field.value = v.clone();
            }
            let was = std::mem::replace(&mut field.layer, PolicyLayer::RequestTimeouts);
            if was != PolicyLayer::BuiltIn {
                field.overrides.push(was);
            }
        }
        self.layers.push(PolicyLayer::RequestTimeouts);
        self.policy = Arc::new(policy);
        self
    }
}
