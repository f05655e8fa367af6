//! Redirect decisions: whether a 3xx is followed, where to, with which method, body and
//! headers. Pure: no I/O.
//!
//! The client keeps one [`RedirectState`] per call and hands it every 3xx response. The state
//! answers [`Action::Follow`] with the next URL — which the client must check like the first
//! one (`AddressGuard::check_host`, the allow-list, and dialling through the guard) —,
//! [`Action::Return`] to hand the 3xx to the caller, or an error.
//!
//! # Credentials across origins
//!
//! `Authorization`, `Cookie`, `Proxy-Authorization` and every `security.cross_origin_strip_headers` name
//! are sent only while the chain has never left the origin of the request: the first hop
//! that changes the scheme, the host or the port (the default port of the scheme counts as
//! that port) drops them, and they stay dropped for every later hop of the call — **also when
//! the chain comes back to the first origin** (A → B → A). Why: once B has answered, the next
//! URL is B's choice, and B could point a request carrying A's credentials at any path of A.
//! A subdomain or a parent domain is another host, so another origin.
//!
//! Other rules (RFC 9110 §15.4, as reqwest and browsers do): 301/302 turn a POST into a GET
//! without body; 303 turns any method but HEAD into a GET without body (unless
//! `redirect.keep_method_on_303`); 307/308 keep method and body. A body that cannot be sent
//! again (a stream) means the 3xx is returned instead of followed. At most
//! `min(redirect.max, security.max_redirects)` hops are followed, a request already made in
//! this call (same method and URL) is a loop, and both end the call with
//! [`ErrorKind::RedirectLimit`]. Targets must be `http`/`https` without userinfo, an
//! `https` → `http` hop is always refused, and with `redirect.allow_cross_origin = false` any
//! change of origin is: these are [`ErrorKind::Blocked`].

use http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use soulbase_net_core::{ErrorKind, NetError};
use soulbase_net_policy::{RedirectPolicy, SecurityPolicy};
use url::Url;

/// A 3xx response to decide on, and the request that got it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Redirect<'a> {
    /// The response status.
    pub(crate) status: StatusCode,
    /// The response's `Location` header, if any.
    pub(crate) location: Option<&'a HeaderValue>,
    /// The URL of the request that got this response.
    pub(crate) url: &'a Url,
    /// The method of that request.
    pub(crate) method: &'a Method,
    /// Whether its body can be sent again (see `Body::is_replayable`).
    pub(crate) body_replayable: bool,
}

/// What to do with a 3xx response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Make the next request.
    Follow(Follow),
    /// Hand the 3xx response to the caller as it is.
    Return,
}

/// The next request of a redirect chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Follow {
    /// Where to; still to be checked by the address guard and the allow-list.
    pub(crate) url: Url,
    /// With which method.
    pub(crate) method: Method,
    /// Whether the request body is sent again; when not, the request has no body and no
    /// body headers (see [`remove_body_headers`]).
    pub(crate) keep_body: bool,
    /// Whether this hop changes the origin (scheme, host or port).
    pub(crate) cross_origin: bool,
}

/// The redirect chain of one call: the requests made so far, and whether the chain ever left
/// the origin of the first one (see the module documentation for why that is never undone).
#[derive(Clone, Debug)]
pub(crate) struct RedirectState {
    /// Every request made, the first included, fragments removed.
    visited: Vec<(Method, Url)>,
    crossed: bool,
}

/// The headers that carry credentials and never follow a change of origin.
const SENSITIVE: [HeaderName; 3] = [
    header::AUTHORIZATION,
    header::COOKIE,
    header::PROXY_AUTHORIZATION,
];

/// The headers that describe a request body, removed when a hop drops the body.
const BODY_HEADERS: [HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::TRANSFER_ENCODING,
];

// === impl RedirectState ===

impl RedirectState {
    /// The state of a call that has not been redirected yet. Nothing is allocated until
    /// the first 3xx: most calls never see one.
    pub(crate) fn new() -> Self {
        RedirectState {
            visited: Vec::new(),
            crossed: false,
        }
    }

    /// Redirects followed so far.
    pub(crate) fn hops(&self) -> u32 {
        u32::try_from(self.visited.len().saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// Whether any hop so far changed the origin: credentials are then never sent again in
    /// this call.
    #[cfg(test)]
    pub(crate) fn crossed_origin(&self) -> bool {
        self.crossed
    }

    /// Decides on a 3xx response (see [`decide`]) and, when it is followed, records the hop.
    ///
    /// # Errors
    /// As [`decide`], and [`ErrorKind::RedirectLimit`] when the next request (method and
    /// URL) was already made in this call.
    pub(crate) fn next(
        &mut self,
        redirect: &RedirectPolicy,
        security: &SecurityPolicy,
        resp: &Redirect<'_>,
    ) -> Result<Action, NetError> {
        let action = decide(redirect, security, resp, self.hops())?;
        if let Action::Follow(follow) = &action {
            if self.visited.is_empty() {
                // The first hop: the request that was redirected is the call's first one.
                self.visited
                    .push((resp.method.clone(), without_fragment(resp.url)));
            }
            let key = (follow.method.clone(), without_fragment(&follow.url));
            if self.visited.contains(&key) {
                return Err(NetError::new(ErrorKind::RedirectLimit)
                    .with_message("redirect loop")
                    .at(&follow.method, follow.url.as_str()));
            }
            self.visited.push(key);
            self.crossed |= follow.cross_origin;
        }
        Ok(action)
    }

    /// Prepares the headers of the next request from those of the previous one: removes
    /// the credentials once the chain has left its origin (this hop or any earlier one), and
    /// the body headers when the hop drops the body.
    pub(crate) fn prepare_headers(
        &self,
        follow: &Follow,
        headers: &mut HeaderMap,
        strip_headers: &[String],
    ) {
        if self.crossed || follow.cross_origin {
            strip_sensitive(headers, strip_headers);
        }
        if !follow.keep_body {
            remove_body_headers(headers);
        }
    }
}

/// Decides on a 3xx response after `hops` redirects were already followed. Stateless: loops
/// and the credential rule need a [`RedirectState`].
///
/// Returned to the caller ([`Action::Return`]): redirects disabled; a status other than
/// 301, 302, 303, 307, 308 (so 300 and 304); no `Location`, or one that is not a URL; a hop
/// that keeps the body when the body cannot be sent again.
///
/// # Errors
/// - [`ErrorKind::RedirectLimit`] when `hops` already reached
///   `min(redirect.max, security.max_redirects)`;
/// - [`ErrorKind::Blocked`] for a target that is not `http`/`https`, carries userinfo, fails
///   any other check a request URL gets ([`soulbase_net_core::check_url`]: e.g. an IPv4 host
///   not written canonically, `http://0x7f.1/`), goes
///   from `https` to `http`, or changes origin while `redirect.allow_cross_origin` is off.
pub(crate) fn decide(
    redirect: &RedirectPolicy,
    security: &SecurityPolicy,
    resp: &Redirect<'_>,
    hops: u32,
) -> Result<Action, NetError> {
    if !redirect.enabled {
        return Ok(Action::Return);
    }
    let Some((method, keep_body)) = next_method(redirect, resp.status, resp.method) else {
        return Ok(Action::Return);
    };
    if keep_body && !resp.body_replayable {
        return Ok(Action::Return);
    }
    let Some(url) = resolve(resp.url, resp.location) else {
        return Ok(Action::Return);
    };
    let max = redirect.max.min(security.max_redirects);
    if hops >= u32::from(max) {
        return Err(NetError::new(ErrorKind::RedirectLimit)
            .with_message(format!(
                "more than {max} redirects (redirect.max, security.max_redirects)"
            ))
            .at(resp.method, resp.url.as_str()));
    }
    let blocked = |message: &str| {
        Err(NetError::new(ErrorKind::Blocked)
            .with_message(message.to_owned())
            .at(&method, url.as_str()))
    };
    if !matches!(url.scheme(), "http" | "https") {
        return blocked("redirect to a scheme other than http or https");
    }
    if !url.username().is_empty() || url.password().is_some() {
        return blocked("redirect to a url with userinfo");
    }
    // Every check a request URL gets (the canonical IPv4 host among them), on the
    // `Location` text as the URL parser read it.
    if let Some(Err(e)) = resp
        .location
        .and_then(|l| l.to_str().ok())
        .map(|l| soulbase_net_core::check_url(Some(resp.url), l))
    {
        let why = e.message().unwrap_or("not a valid request url");
        return blocked(&format!("redirect target refused: {why}"));
    }
    if resp.url.scheme() == "https" && url.scheme() == "http" {
        return blocked("redirect from https to http");
    }
    let cross_origin = resp.url.origin() != url.origin();
    if cross_origin && !redirect.allow_cross_origin {
        return blocked("redirect to another origin (redirect.allow_cross_origin is off)");
    }
    Ok(Action::Follow(Follow {
        url,
        method,
        keep_body,
        cross_origin,
    }))
}

/// The method of the next request and whether it keeps the body; `None` for a status that
/// is not followed.
fn next_method(
    redirect: &RedirectPolicy,
    status: StatusCode,
    method: &Method,
) -> Option<(Method, bool)> {
    match status {
        StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND if method == Method::POST => {
            Some((Method::GET, false))
        }
        StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND => Some((method.clone(), true)),
        StatusCode::SEE_OTHER if redirect.keep_method_on_303 => Some((method.clone(), true)),
        StatusCode::SEE_OTHER if method == Method::HEAD => Some((Method::HEAD, false)),
        StatusCode::SEE_OTHER => Some((Method::GET, false)),
        StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT => {
            Some((method.clone(), true))
        }
        _ => None,
    }
}

/// The `Location` resolved against the current URL (absolute, scheme-relative and relative
/// references alike); `None` when missing or not a URL.
fn resolve(current: &Url, location: Option<&HeaderValue>) -> Option<Url> {
    let location = location?.to_str().ok()?;
    current.join(location).ok()
}

fn without_fragment(url: &Url) -> Url {
    let mut url = url.clone();
    url.set_fragment(None);
    url
}

/// Removes `Authorization`, `Cookie`, `Proxy-Authorization` and every header named in
/// `strip_headers` (see [`strip_named`]).
pub(crate) fn strip_sensitive(headers: &mut HeaderMap, strip_headers: &[String]) {
    for name in &SENSITIVE {
        headers.remove(name);
    }
    strip_named(headers, strip_headers);
}

/// Removes every header named in `names` (case-insensitive; names that are not valid header
/// names are ignored, the policy validation refuses them).
pub(crate) fn strip_named(headers: &mut HeaderMap, names: &[String]) {
    for name in names {
        if let Ok(name) = HeaderName::from_bytes(name.as_bytes()) {
            headers.remove(name);
        }
    }
}

/// Removes the headers that describe a request body, for a hop that drops it.
pub(crate) fn remove_body_headers(headers: &mut HeaderMap) {
    for name in &BODY_HEADERS {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests;
