//! Redirect policy: whether and how far redirects are followed.

use serde::{Deserialize, Serialize};

use crate::validate::Checker;

/// Most redirects any policy may allow: browsers stop at about 20.
pub(crate) const MAX_REDIRECTS: u8 = 20;

/// Following redirects.
///
/// Every hop is checked again by the address guard and the host allow-list; `Authorization`,
/// `Cookie` and `security.cross_origin_strip_headers` are dropped when a hop changes origin; 303 turns the
/// request into a GET unless `keep_method_on_303`; 307/308 keep method and body.
///
/// Default: on, at most 5 hops, cross-origin allowed, 303 → GET.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RedirectPolicy {
    /// Whether redirects are followed; when off, the 3xx response is returned. Default is `true`.
    pub enabled: bool,
    /// Most hops followed, at most 20. Default is 5.
    pub max: u8,
    /// Whether a hop may go to another origin. Default is `true`.
    pub allow_cross_origin: bool,
    /// Keep the method (and body) on 303 instead of switching to GET. Default is `false`.
    pub keep_method_on_303: bool,
}

impl Default for RedirectPolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            max: 5,
            allow_cross_origin: true,
            keep_method_on_303: false,
        }
    }
}

impl RedirectPolicy {
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        c.when(self.max > MAX_REDIRECTS, "max", || {
            format!("must be at most {MAX_REDIRECTS}, got {}", self.max)
        });
    }
}
