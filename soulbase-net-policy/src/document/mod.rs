//! `PolicyDocument`: a default policy plus overrides by host pattern, tenant and tenant+host,
//! read from and written to TOML or JSON.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde_json::{Map, Value};

use crate::policy::NetPolicy;
use crate::redact;
use crate::store::StoreConfig;
use crate::validate::PolicyError;

pub(crate) mod compile;
mod parse;
mod patch;
mod tree;

pub(crate) use self::tree::quote_key;

/// A policy document: the `default` policy, overrides by host pattern, by tenant and by
/// tenant + host pattern.
///
/// ```toml
/// [default]                                   # a full NetPolicy; omitted fields are built-in defaults
/// retry.max_attempts = 3
///
/// [overrides."*.example.com"]                 # host pattern: states only what it changes
/// retry.backoff.cap = "2s"
///
/// [tenants.t1]                                # tenant
/// limits.per_tenant_concurrency = 32
///
/// [tenants.t1.overrides."api.example.com"]    # tenant + host pattern
/// timeout.total = "10s"
///
/// [keys.payments]                             # a named policy, chosen per request
/// retry.enabled = false                       # (NetRequest::policy_key("payments"))
///
/// [store]                                     # where a fleet's shared state lives
/// redis = "redis://10.0.0.5:6379/"
/// ```
///
/// The effective policy for `(tenant, host)` is built in layers, each changing only the fields
/// it states: default ⊕ best host override ⊕ tenant ⊕ best tenant+host override; a request
/// that names a policy key gets that key's section on top of all of them (⊕ `keys.<name>`). Objects merge
/// key by key; scalars and lists replace. The best override for a host is its exact pattern,
/// else the wildcard with the longest suffix (see [`HostPatternSet`](crate::HostPatternSet)).
/// Since TOML has no null, an `Option` field switched on by a layer cannot be switched off
/// again by a later TOML layer (JSON `null` can).
///
/// Reading a document ([`from_toml_str`](Self::from_toml_str) and friends) checks everything
/// [`validate`](Self::validate) checks and reports every problem at once.
///
/// `Debug` shows the sections with their credentials masked (proxy and endpoint URLs'
/// passwords, the mTLS key, the `[store]`'s credentials); the document itself, its
/// [`to_value`](Self::to_value) and its TOML and JSON forms keep them as written.
#[derive(Clone, PartialEq)]
pub struct PolicyDocument {
    default: Value,
    overrides: BTreeMap<String, Value>,
    tenants: BTreeMap<String, TenantSection>,
    keys: BTreeMap<String, Value>,
    store: Option<StoreConfig>,
}

/// A tenant's section: its own override plus its host overrides.
#[derive(Clone, PartialEq)]
struct TenantSection {
    policy: Value,
    overrides: BTreeMap<String, Value>,
}

impl Default for PolicyDocument {
    fn default() -> Self {
        Self {
            default: Value::Object(Map::new()),
            overrides: BTreeMap::new(),
            tenants: BTreeMap::new(),
            keys: BTreeMap::new(),
            store: None,
        }
    }
}

impl Default for TenantSection {
    fn default() -> Self {
        Self {
            policy: Value::Object(Map::new()),
            overrides: BTreeMap::new(),
        }
    }
}

// === impl PolicyDocument ===

impl PolicyDocument {
    /// An empty document: every host and tenant gets the built-in defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// A document whose default section is `policy` in full, with no overrides.
    pub fn from_policy(policy: &NetPolicy) -> Self {
        let mut doc = Self::new();
        doc.set_default(policy);
        doc
    }

    /// Replaces the default section with `policy` in full.
    pub fn set_default(&mut self, policy: &NetPolicy) -> &mut Self {
        self.default = serde_json::to_value(policy).unwrap_or_else(|_| Value::Object(Map::new()));
        self
    }

    /// Replaces the default section with a partial policy (omitted fields are defaults).
    pub fn set_default_section(&mut self, section: Value) -> &mut Self {
        self.default = section;
        self
    }

    /// Sets the override for a host pattern (`api.example.com`, `*.example.com`): a partial
    /// policy such as `json!({"retry": {"max_attempts": 5}})`.
    pub fn set_override(&mut self, pattern: impl Into<String>, section: Value) -> &mut Self {
        self.overrides.insert(pattern.into(), section);
        self
    }

    /// Sets a tenant's override (a partial policy), keeping its host overrides.
    pub fn set_tenant(&mut self, tenant: impl Into<String>, section: Value) -> &mut Self {
        self.tenants.entry(tenant.into()).or_default().policy = section;
        self
    }

    /// Sets a tenant + host pattern override (a partial policy).
    pub fn set_tenant_override(
        &mut self,
        tenant: impl Into<String>,
        pattern: impl Into<String>,
        section: Value,
    ) -> &mut Self {
        let t = self.tenants.entry(tenant.into()).or_default();
        t.overrides.insert(pattern.into(), section);
        self
    }

    /// Sets the section of the named policy `key` (a partial policy), applied on top of the
    /// other layers for requests that name it with `NetRequest::policy_key`.
    pub fn set_key(&mut self, key: impl Into<String>, section: Value) -> &mut Self {
        self.keys.insert(key.into(), section);
        self
    }

    /// The `[store]` section: where the fleet's shared state lives (a Redis server, a Redis
    /// Cluster or the master sentinels name), if the document says.
    pub fn store(&self) -> Option<&StoreConfig> {
        self.store.as_ref()
    }

    /// Sets the `[store]` section.
    pub fn set_store(&mut self, store: StoreConfig) -> &mut Self {
        self.store = Some(store);
        self
    }

    /// The named policy sections as written, by key.
    pub fn keys(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.keys.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The default section as written.
    pub fn default_section(&self) -> &Value {
        &self.default
    }

    /// The host pattern overrides as written, by pattern.
    pub fn overrides(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.overrides.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The tenants named in the document.
    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.tenants.keys().map(String::as_str)
    }

    /// A tenant's own override as written.
    pub fn tenant_section(&self, tenant: &str) -> Option<&Value> {
        self.tenants.get(tenant).map(|t| &t.policy)
    }

    /// A tenant's host pattern overrides as written.
    pub fn tenant_overrides(&self, tenant: &str) -> impl Iterator<Item = (&str, &Value)> {
        self.tenants
            .get(tenant)
            .into_iter()
            .flat_map(|t| t.overrides.iter().map(|(k, v)| (k.as_str(), v)))
    }

    /// Checks every section and every combination of layers a resolver can produce, and
    /// returns every problem at once.
    ///
    /// # Errors
    /// A [`PolicyError`] whose problems have paths in the document's shape, e.g.
    /// `overrides."*.example.com".retry.backoff.cap`; a problem that only appears when layers
    /// are combined names the layers, e.g. `overrides."*.example.com" + tenants.t1: retry`.
    pub fn validate(&self) -> Result<(), PolicyError> {
        compile::Compiled::new(self).map(|_| ())
    }

    /// Reads a TOML document and validates it.
    ///
    /// # Errors
    /// Syntax errors, or every structural and semantic problem of the document.
    pub fn from_toml_str(s: &str) -> Result<Self, PolicyError> {
        let doc = Self::parse_toml(s)?;
        doc.validate()?;
        Ok(doc)
    }

    /// Reads a JSON document and validates it.
    ///
    /// # Errors
    /// Syntax errors, or every structural and semantic problem of the document.
    pub fn from_json_str(s: &str) -> Result<Self, PolicyError> {
        let doc = Self::parse_json(s)?;
        doc.validate()?;
        Ok(doc)
    }

    /// Reads a document from a `.toml` or `.json` file and validates it.
    ///
    /// # Errors
    /// An unreadable file, an unknown extension, or the problems of the document.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        let doc = Self::parse_path(path.as_ref())?;
        doc.validate()?;
        Ok(doc)
    }

    /// Reads a document from a value tree (as parsed from TOML or JSON) and validates it.
    ///
    /// # Errors
    /// Every structural and semantic problem of the document.
    pub fn from_value(value: Value) -> Result<Self, PolicyError> {
        let doc = Self::parse_value(value)?;
        doc.validate()?;
        Ok(doc)
    }

    /// The document as a value tree, the shape of its TOML and JSON forms.
    pub fn to_value(&self) -> Value {
        let mut top = Map::new();
        if !is_empty_table(&self.default) {
            top.insert("default".into(), self.default.clone());
        }
        if !self.overrides.is_empty() {
            top.insert("overrides".into(), to_object(&self.overrides));
        }
        if !self.tenants.is_empty() {
            let tenants = self
                .tenants
                .iter()
                .map(|(k, t)| (k.clone(), t.to_value()))
                .collect();
            top.insert("tenants".into(), Value::Object(tenants));
        }
        if !self.keys.is_empty() {
            top.insert("keys".into(), to_object(&self.keys));
        }
        if let Some(store) = &self.store {
            top.insert("store".into(), store.to_value());
        }
        Value::Object(top)
    }

    /// The document as TOML.
    ///
    /// # Errors
    /// When a section holds something TOML cannot write (a JSON `null`).
    pub fn to_toml_string(&self) -> Result<String, PolicyError> {
        toml::to_string(&self.to_value())
            .map_err(|e| PolicyError::single("", format!("cannot write as TOML: {e}")))
    }

    /// The document as pretty-printed JSON.
    pub fn to_json_string(&self) -> String {
        // Serialising a `Value` to a string cannot fail.
        serde_json::to_string_pretty(&self.to_value()).unwrap_or_default()
    }
}

impl fmt::Debug for PolicyDocument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyDocument")
            .field("default", &redact::section(&self.default))
            .field("overrides", &shown_sections(&self.overrides))
            .field("tenants", &self.tenants)
            .field("keys", &shown_sections(&self.keys))
            .field("store", &self.store)
            .finish()
    }
}

// === impl TenantSection ===

impl fmt::Debug for TenantSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantSection")
            .field("policy", &redact::section(&self.policy))
            .field("overrides", &shown_sections(&self.overrides))
            .finish()
    }
}

impl TenantSection {
    fn to_value(&self) -> Value {
        let mut out = match &self.policy {
            Value::Object(m) => m.clone(),
            _ => Map::new(),
        };
        if !self.overrides.is_empty() {
            out.insert("overrides".into(), to_object(&self.overrides));
        }
        Value::Object(out)
    }
}

/// Sections by name, as `Debug` shows them (credentials masked).
fn shown_sections(m: &BTreeMap<String, Value>) -> BTreeMap<&str, Value> {
    m.iter()
        .map(|(k, v)| (k.as_str(), redact::section(v)))
        .collect()
}

fn to_object(m: &BTreeMap<String, Value>) -> Value {
    Value::Object(m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

fn is_empty_table(v: &Value) -> bool {
    v.as_object().is_some_and(Map::is_empty)
}
