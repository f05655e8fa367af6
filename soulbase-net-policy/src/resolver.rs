//! Policy resolution: the `PolicyResolver` trait and `SnapshotResolver`, with lock-free reads
//! and atomic hot reload.
//!
//! Why whole snapshots: a reload swaps one immutable `Snapshot` (the compiled document and its
//! cache) with a single atomic store. A reader sees either the old snapshot or the new one,
//! never a mix; a request keeps the `Arc<NetPolicy>` it started with; and since every snapshot
//! has its own cache, a stale cache entry cannot outlive its document.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::document::compile::Compiled;
use crate::document::PolicyDocument;
use crate::policy::NetPolicy;
use crate::validate::PolicyError;

/// Entries of the per-snapshot `(tenant, host)` cache.
const CACHE_CAPACITY: u64 = 65_536;

/// Finds the policy for a call.
///
/// Implementations must be cheap and must not block: `resolve` runs on every request.
pub trait PolicyResolver: Send + Sync + fmt::Debug {
    /// The effective policy for `host` (as in the URL) on behalf of `tenant`.
    fn resolve(&self, tenant: Option<&str>, host: &str) -> Arc<NetPolicy>;

    /// A number that grows with every accepted change of policy. Default is 0 (never changes).
    fn version(&self) -> u64 {
        0
    }

    /// The effective policy for `host` on behalf of `tenant` with the named policy `key`
    /// (a document's `[keys.<key>]` section) on top: what a request with
    /// `NetRequest::policy_key(key)` gets. `None` when the resolver knows no such key; the
    /// client then refuses the request (`SCHEMA.VALIDATION_FAILED`).
    ///
    /// Default: `None` for every key (a resolver without named policies).
    fn resolve_key(&self, tenant: Option<&str>, host: &str, key: &str) -> Option<Arc<NetPolicy>> {
        let _ = (tenant, host, key);
        None
    }

    /// A consistent view for one call: every lookup through it answers from the policy as it
    /// was when the view was taken, whatever reloads land meanwhile. A call takes one view
    /// when it starts and resolves its redirect hops through it, so a reload applies to new
    /// calls only.
    ///
    /// Default: `None`, for resolvers that never change (lookups then go to
    /// [`resolve`](Self::resolve)). A resolver whose answers can change must return one.
    fn view(&self) -> Option<Arc<dyn PolicyView>> {
        None
    }
}

/// A fixed view of the policy (see [`PolicyResolver::view`]).
pub trait PolicyView: Send + Sync + fmt::Debug {
    /// The effective policy for `host` on behalf of `tenant`, in this view.
    fn resolve(&self, tenant: Option<&str>, host: &str) -> Arc<NetPolicy>;

    /// As [`PolicyResolver::resolve_key`], in this view.
    fn resolve_key(&self, tenant: Option<&str>, host: &str, key: &str) -> Option<Arc<NetPolicy>>;
}

impl<R: PolicyResolver + ?Sized> PolicyResolver for Arc<R> {
    fn resolve(&self, tenant: Option<&str>, host: &str) -> Arc<NetPolicy> {
        (**self).resolve(tenant, host)
    }

    fn version(&self) -> u64 {
        (**self).version()
    }

    fn resolve_key(&self, tenant: Option<&str>, host: &str, key: &str) -> Option<Arc<NetPolicy>> {
        (**self).resolve_key(tenant, host, key)
    }

    fn view(&self) -> Option<Arc<dyn PolicyView>> {
        (**self).view()
    }
}

impl PolicyView for Snapshot {
    fn resolve(&self, tenant: Option<&str>, host: &str) -> Arc<NetPolicy> {
        Snapshot::resolve(self, tenant, host)
    }

    fn resolve_key(&self, tenant: Option<&str>, host: &str, key: &str) -> Option<Arc<NetPolicy>> {
        Snapshot::resolve_key(self, tenant, host, key)
    }
}

/// One immutable, validated policy document with its compiled layers and resolution cache.
pub struct Snapshot {
    version: u64,
    document: PolicyDocument,
    compiled: Compiled,
    /// The answer for everyone when the document has no overrides: no cache, no key.
    uniform: Option<Arc<NetPolicy>>,
    cache: moka::sync::Cache<String, Arc<NetPolicy>>,
}

/// A [`PolicyResolver`] over a validated [`PolicyDocument`], reloadable at run time.
///
/// Reads are lock-free: `resolve` loads the current [`Snapshot`] (an `arc_swap` load); a
/// document without overrides answers with its one policy at once, otherwise it looks
/// in its bounded `(tenant, host)` cache (65 536 entries) and, on a miss, finds the best host
/// patterns and picks the policy precomputed for that combination of layers.
///
/// [`update`](Self::update) validates a whole new document first: an invalid one is rejected
/// whole and the current snapshot stays; a valid one replaces it atomically and the version
/// goes up by one.
///
/// # Examples
/// ```
/// use soulbase_net_policy::{PolicyDocument, PolicyResolver, SnapshotResolver};
/// let doc = PolicyDocument::from_toml_str(r#"
///     [overrides."*.example.com"]
///     retry.max_attempts = 2
/// "#).unwrap();
/// let resolver = SnapshotResolver::new(doc).unwrap();
/// assert_eq!(resolver.resolve(None, "api.example.com").retry.max_attempts, 2);
///
/// // An invalid update is refused and changes nothing.
/// assert!(resolver.update_toml_str("[default]\nretry.max_attempts = 0").is_err());
/// assert_eq!(resolver.version(), 1);
/// ```
pub struct SnapshotResolver {
    current: ArcSwap<Snapshot>,
    /// Serialises writers so versions are unique and increasing; readers never take it.
    update_lock: Mutex<()>,
}

// === impl Snapshot ===

impl Snapshot {
    fn new(version: u64, document: PolicyDocument, compiled: Compiled) -> Self {
        Self {
            version,
            document,
            uniform: compiled.uniform(),
            compiled,
            cache: moka::sync::Cache::new(CACHE_CAPACITY),
        }
    }

    /// This snapshot's version: 1 for the first document, +1 per accepted update.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The document this snapshot was compiled from.
    pub fn document(&self) -> &PolicyDocument {
        &self.document
    }

    /// How many combinations of layers were built and validated for this document.
    pub fn combinations(&self) -> usize {
        self.compiled.combinations()
    }

    /// The effective policy for `(tenant, host)` in this snapshot.
    pub fn resolve(&self, tenant: Option<&str>, host: &str) -> Arc<NetPolicy> {
        if let Some(p) = &self.uniform {
            return Arc::clone(p);
        }
        let key = cache_key(tenant, host);
        if let Some(p) = self.cache.get(&key) {
            return p;
        }
        let p = self.compiled.resolve(tenant, host);
        self.cache.insert(key, Arc::clone(&p));
        p
    }

    /// The effective policy for `(tenant, host)` with the named policy `key` on top, in this
    /// snapshot; `None` when the document has no `[keys.<key>]` section.
    pub fn resolve_key(
        &self,
        tenant: Option<&str>,
        host: &str,
        key: &str,
    ) -> Option<Arc<NetPolicy>> {
        // Its own cache keys: a length-prefixed name before the `(tenant, host)` key.
        let cached = format!("k{}:{key}{}", key.len(), cache_key(tenant, host));
        if let Some(p) = self.cache.get(&cached) {
            return Some(p);
        }
        let p = self.compiled.resolve_key(tenant, host, key)?;
        self.cache.insert(cached, Arc::clone(&p));
        Some(p)
    }
}

/// An unambiguous cache key: the tenant's length prefixes it, so no tenant/host pair can
/// collide with another.
fn cache_key(tenant: Option<&str>, host: &str) -> String {
    match tenant {
        Some(t) => format!("{}:{t}{host}", t.len()),
        None => format!("-{host}"),
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("version", &self.version)
            .field("combinations", &self.compiled.combinations())
            .field("cached", &self.cache.entry_count())
            .finish_non_exhaustive()
    }
}

// === impl SnapshotResolver ===

impl SnapshotResolver {
    /// A resolver over `doc`, at version 1.
    ///
    /// # Errors
    /// Every problem of `doc` (see [`PolicyDocument::validate`]).
    pub fn new(doc: PolicyDocument) -> Result<Self, PolicyError> {
        let compiled = Compiled::new(&doc)?;
        Ok(Self {
            current: ArcSwap::from_pointee(Snapshot::new(1, doc, compiled)),
            update_lock: Mutex::new(()),
        })
    }

    /// A resolver that gives `policy` to every tenant and host.
    ///
    /// # Errors
    /// Every problem of `policy` (see [`NetPolicy::validate`]), with paths under `default`.
    pub fn from_policy(policy: NetPolicy) -> Result<Self, PolicyError> {
        Self::new(PolicyDocument::from_policy(&policy))
    }

    /// Reads a `.toml` or `.json` document from `path`.
    ///
    /// # Errors
    /// An unreadable file or the problems of the document.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        Self::new(PolicyDocument::parse_path(path.as_ref())?)
    }

    /// The current snapshot, for callers that want several lookups from one consistent view.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Replaces the document: validated whole first, then swapped in atomically.
    /// Returns the new version.
    ///
    /// # Errors
    /// Every problem of `doc`; the current snapshot then stays in place.
    pub fn update(&self, doc: PolicyDocument) -> Result<u64, PolicyError> {
        // Compile outside the lock: a slow or invalid document never delays other writers.
        let compiled = Compiled::new(&doc)?;
        let _writer = self.update_lock.lock();
        let version = self.current.load().version.saturating_add(1);
        self.current
            .store(Arc::new(Snapshot::new(version, doc, compiled)));
        Ok(version)
    }

    /// [`update`](Self::update) from a TOML document.
    ///
    /// # Errors
    /// Syntax errors or the problems of the document; the current snapshot then stays.
    pub fn update_toml_str(&self, s: &str) -> Result<u64, PolicyError> {
        self.update(PolicyDocument::parse_toml(s)?)
    }

    /// [`update`](Self::update) from a JSON document.
    ///
    /// # Errors
    /// Syntax errors or the problems of the document; the current snapshot then stays.
    pub fn update_json_str(&self, s: &str) -> Result<u64, PolicyError> {
        self.update(PolicyDocument::parse_json(s)?)
    }

    /// [`update`](Self::update) from a `.toml` or `.json` file.
    ///
    /// # Errors
    /// An unreadable file or the problems of the document; the current snapshot then stays.
    pub fn reload_from_file(&self, path: impl AsRef<Path>) -> Result<u64, PolicyError> {
        self.update(PolicyDocument::parse_path(path.as_ref())?)
    }

    /// The current version: 1 at creation, +1 per accepted update.
    pub fn version(&self) -> u64 {
        self.current.load().version
    }

    /// The effective policy for `(tenant, host)` in the current snapshot.
    pub fn resolve(&self, tenant: Option<&str>, host: &str) -> Arc<NetPolicy> {
        self.current.load().resolve(tenant, host)
    }
}

impl Default for SnapshotResolver {
    /// A resolver giving the built-in defaults to everyone.
    fn default() -> Self {
        let doc = PolicyDocument::new();
        // The empty document is always valid; the fallback only avoids a panic path.
        let compiled = Compiled::new(&doc).ok();
        let compiled = compiled.unwrap_or_else(Compiled::empty);
        Self {
            current: ArcSwap::from_pointee(Snapshot::new(1, doc, compiled)),
            update_lock: Mutex::new(()),
        }
    }
}

impl PolicyResolver for SnapshotResolver {
    fn resolve(&self, tenant: Option<&str>, host: &str) -> Arc<NetPolicy> {
        SnapshotResolver::resolve(self, tenant, host)
    }

    fn version(&self) -> u64 {
        SnapshotResolver::version(self)
    }

    fn resolve_key(&self, tenant: Option<&str>, host: &str, key: &str) -> Option<Arc<NetPolicy>> {
        self.current.load().resolve_key(tenant, host, key)
    }

    fn view(&self) -> Option<Arc<dyn PolicyView>> {
        Some(self.snapshot())
    }
}

impl fmt::Debug for SnapshotResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotResolver")
            .field("current", &*self.current.load())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_do_not_collide() {
        assert_ne!(cache_key(Some("a"), "bc"), cache_key(Some("ab"), "c"));
        assert_ne!(cache_key(None, "1:ab"), cache_key(Some("a"), "b"));
        assert_ne!(cache_key(Some(""), "x"), cache_key(None, "x"));
    }

    #[test]
    fn default_resolver_gives_defaults() {
        let r = SnapshotResolver::default();
        assert_eq!(*r.resolve(Some("t"), "example.com"), NetPolicy::default());
        assert_eq!(r.version(), 1);
    }

    #[test]
    fn resolvers_are_object_safe_and_arc_blanket_works() {
        let r: Arc<dyn PolicyResolver> = Arc::new(SnapshotResolver::default());
        let wrapped = Arc::new(r);
        assert_eq!(wrapped.version(), 1);
        assert_eq!(*wrapped.resolve(None, "x.example"), NetPolicy::default());
    }
}
