//! Cache hook policy: conditional GETs and stale-while-revalidate.

use serde::{Deserialize, Serialize};

use crate::size::ByteSize;
use crate::validate::Checker;

/// The `CacheHook` interceptor's behaviour: conditional GETs and fresh hits served locally.
///
/// With `enable_etag`, GET responses carrying `ETag` or `Last-Modified` are stored and later
/// requests are made conditional; with `swr`, a stale entry is served while it is revalidated
/// in the background (RFC 5861).
///
/// Default: conditional GETs on, stale-while-revalidate off, 10 000 entries of up to 1MiB.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CacheHookPolicy {
    /// Make GETs conditional on stored `ETag`/`Last-Modified`. Default is `true`.
    pub enable_etag: bool,
    /// Serve stale entries while revalidating. Default is `false`.
    pub swr: bool,
    /// Most entries kept. Default is 10 000.
    pub max_entries: u64,
    /// Largest body stored; larger responses pass through uncached. Default is 1MiB.
    pub max_entry_bytes: ByteSize,
}

impl Default for CacheHookPolicy {
    fn default() -> Self {
        Self {
            enable_etag: true,
            swr: false,
            max_entries: 10_000,
            max_entry_bytes: ByteSize::mib(1),
        }
    }
}

impl CacheHookPolicy {
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        if self.enable_etag || self.swr {
            c.at_least_one(self.max_entries, "max_entries");
            c.at_least_one(self.max_entry_bytes.as_u64(), "max_entry_bytes");
        }
    }
}
