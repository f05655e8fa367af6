//! Patching a document: a fragment in the document's own shape laid over any of its layers,
//! giving a new, validated document.
//!
//! Why a fragment and not a setter per field: a service's tests want its production policy
//! file plus what a loopback test needs (a grant for `127.0.0.0/8`, a mock name server, a test
//! root), and that is a few lines of the same TOML the file is written in, aimed at whichever
//! layer they concern.

use serde_json::Value;

use super::parse::syntax_error;
use super::tree::merge;
use super::PolicyDocument;
use crate::validate::PolicyError;

// === impl PolicyDocument ===

impl PolicyDocument {
    /// A new document: this one with the TOML `fragment` laid over it. `self` is unchanged.
    ///
    /// The fragment has the document's shape (`[default]`, `[overrides."<pattern>"]`,
    /// `[tenants.<t>]`, `[tenants.<t>.overrides."<pattern>"]`, `[keys.<name>]`, `[store]`),
    /// so it can change any layer, and states only what it changes. It merges the way layers
    /// do: tables key by key; scalars and lists replace (a fragment's
    /// `security.grants.cidrs` replaces the document's list at that layer). A section the
    /// document lacks (a new host override, a new tenant) is added.
    ///
    /// The result is validated like a document read from a file: every layer and every
    /// combination of layers a resolver can produce.
    ///
    /// # Errors
    /// A [`PolicyError`] listing every problem, each with its path in the document's shape:
    /// TOML syntax errors of the fragment, sections or fields it gets wrong (e.g.
    /// `overrides."api.example.com".retry.max_attempts`), and problems of the merged document.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_policy::{PolicyDocument, PolicyResolver, SnapshotResolver};
    ///
    /// let prod = PolicyDocument::from_toml_str(r#"
    ///     [default]
    ///     timeout.total = "60s"
    ///
    ///     [overrides."api.example.com"]
    ///     retry.max_attempts = 5
    /// "#)?;
    /// let test = prod.merged_with_toml(r#"
    ///     [default]
    ///     security.grants.cidrs = ["127.0.0.0/8"]
    ///
    ///     [overrides."api.example.com"]
    ///     retry.backoff.base = "1ms"
    /// "#)?;
    ///
    /// let p = SnapshotResolver::new(test)?.resolve(None, "api.example.com");
    /// assert_eq!(p.retry.max_attempts, 5);                       // production's override, kept
    /// assert_eq!(p.retry.backoff.base.as_millis(), 1);            // the fragment's, added
    /// assert_eq!(p.security.grants.cidrs[0].to_string(), "127.0.0.0/8");
    /// assert!(prod.default_section()["security"].is_null());      // the original is unchanged
    ///
    /// let err = prod.merged_with_toml("[overrides.\"api.example.com\"]\nretry.max_attempts = 0").unwrap_err();
    /// assert_eq!(err.problems()[0].path, r#"overrides."api.example.com".retry.max_attempts"#);
    /// # Ok::<(), soulbase_net_policy::PolicyError>(())
    /// ```
    pub fn merged_with_toml(&self, fragment: &str) -> Result<Self, PolicyError> {
        let patch: Value =
            toml::from_str(fragment).map_err(|e| syntax_error("TOML", fragment, &e))?;
        self.merged_with_value(&patch)
    }

    /// As [`merged_with_toml`](Self::merged_with_toml), with the fragment as a value tree
    /// (as parsed from TOML or JSON). A JSON `null` switches off an optional field that an
    /// earlier layer switched on, which TOML cannot write.
    ///
    /// # Errors
    /// As [`merged_with_toml`](Self::merged_with_toml).
    pub fn merged_with_value(&self, fragment: &Value) -> Result<Self, PolicyError> {
        // The fragment's own shape first (unknown sections, a table that is not one), so its
        // mistakes are reported as its own rather than as odd results of the merge.
        Self::parse_value(fragment.clone())?;
        let mut tree = self.to_value();
        merge(&mut tree, fragment);
        Self::from_value(tree)
    }
}
