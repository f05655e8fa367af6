//! The [`Interceptor`] trait: hooks run around every request (seed 000 §4.2).

use std::{fmt, ops::BitOr, sync::Arc};

use crate::{error::NetError, request::NetRequest, response::NetResponse};

/// Code run around each request: adds headers, signs, checks, meters, caches.
///
/// The client runs `before` of every interceptor in order **once per request**, around the
/// retry loop; then `respond` (which may answer without sending); `on_attempt` before every
/// attempt (first, retries and hedges); `should_resend` on the final response; then `after`
/// in reverse order on a response, or `on_error` (reverse order) on an error. So what must stay
/// the same across attempts (request id, idempotency key, signature) is set in `before`, and
/// what must change per attempt (a trace span id) in `on_attempt`.
///
/// Every method has a default that does nothing. An interceptor that implements only some
/// of them says which in [`hooks`](Interceptor::hooks), and the client then skips the others
/// (each skipped `async` hook saves a boxed future per request). A `before` that needs no
/// `await` can be [`before_now`](Interceptor::before_now) instead, which costs no future.
///
/// # Examples
/// ```
/// use soulbase_net_core::{Interceptor, NetError, NetRequest};
///
/// /// Adds a fixed header to every request.
/// struct Team(&'static str);
///
/// #[async_trait::async_trait]
/// impl Interceptor for Team {
///     async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
///         req.headers.insert("x-team", http::HeaderValue::from_static(self.0));
///         Ok(())
///     }
/// }
///
/// # async fn run() -> Result<(), NetError> {
/// let mut req = NetRequest::get("https://api.example.com/");
/// Team("payments").before(&mut req).await?;
/// assert_eq!(req.headers["x-team"], "payments");
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
/// ```
#[async_trait::async_trait]
pub trait Interceptor: Send + Sync {
    /// Runs once before the request is sent; an error stops the request (no attempt is made)
    /// and is returned to the caller after `on_error`.
    ///
    /// # Errors
    /// Whatever the interceptor refuses, e.g. `Blocked` for a sandbox violation.
    async fn before(&self, _req: &mut NetRequest) -> Result<(), NetError> {
        Ok(())
    }

    /// [`before`](Interceptor::before) for an interceptor whose work needs no `await` (a
    /// header, a check of the URL, a signature over the bytes at hand): when
    /// [`hooks`](Interceptor::hooks) names [`Hooks::BEFORE_NOW`], the client calls this in
    /// `before`'s place, at the same point of the call, without the boxed future an `async`
    /// hook costs (about 200 instructions per request). Such an interceptor usually makes its
    /// `before` call this one too, for callers that run hooks themselves.
    ///
    /// # Errors
    /// As [`before`](Interceptor::before).
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_core::{Hooks, Interceptor, NetError, NetRequest};
    ///
    /// /// Adds a fixed header to every request, without a future.
    /// struct Team(&'static str);
    ///
    /// #[async_trait::async_trait]
    /// impl Interceptor for Team {
    ///     async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
    ///         self.before_now(req)
    ///     }
    ///
    ///     fn before_now(&self, req: &mut NetRequest) -> Result<(), NetError> {
    ///         req.headers.insert("x-team", http::HeaderValue::from_static(self.0));
    ///         Ok(())
    ///     }
    ///
    ///     fn hooks(&self) -> Hooks {
    ///         Hooks::BEFORE_NOW
    ///     }
    /// }
    ///
    /// let mut req = NetRequest::get("https://api.example.com/");
    /// Team("payments").before_now(&mut req).unwrap();
    /// assert_eq!(req.headers["x-team"], "payments");
    /// ```
    fn before_now(&self, _req: &mut NetRequest) -> Result<(), NetError> {
        Ok(())
    }

    /// Answers the request without sending it (a fresh cache entry, a duplicate inside a
    /// dedup window). Asked in order after every `before`; the first `Some` is the result of
    /// the call as it is: nothing is sent and no `after` or `on_error` runs.
    async fn respond(&self, _req: &NetRequest) -> Option<Result<NetResponse, NetError>> {
        None
    }

    /// Runs before every attempt, `attempt` counting from 1 across the whole call (retries,
    /// hedged attempts and a resend after [`should_resend`](Interceptor::should_resend)
    /// included, so no two attempts of a call share a number). The runtime's client calls it
    /// inside the attempt's own span (`http.client.attempt`), so the current span is the
    /// attempt's.
    fn on_attempt(&self, _req: &mut NetRequest, _attempt: u32) {}

    /// Asks the client to send the request once more after this response, e.g. a 401 after
    /// the interceptor refreshed its token (it may change `req`, such as its headers). Asked
    /// in order before any `after`; the client resends at most once per call, and only a
    /// request that can be sent again (not a stream body).
    async fn should_resend(&self, _req: &mut NetRequest, _res: &mut NetResponse) -> bool {
        false
    }

    /// Runs once on the final response (after retries and redirects), in reverse order.
    ///
    /// # Errors
    /// An error here replaces the response.
    async fn after(&self, _req: &NetRequest, _res: &mut NetResponse) -> Result<(), NetError> {
        Ok(())
    }

    /// Runs once when the request ends in an error, in reverse order; for observation or
    /// compensation.
    async fn on_error(&self, _req: &NetRequest, _err: &NetError) {}

    /// The hooks this interceptor implements; the client calls only these. Default is
    /// [`Hooks::ALL`], which is always right; naming fewer is an optimisation, and a hook
    /// left out is never called.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_core::{Hooks, Interceptor, NetRequest};
    ///
    /// /// Changes every attempt, nothing else.
    /// struct Stamp;
    ///
    /// impl Interceptor for Stamp {
    ///     fn on_attempt(&self, req: &mut NetRequest, attempt: u32) {
    ///         req.headers.insert("x-attempt", attempt.into());
    ///     }
    ///
    ///     fn hooks(&self) -> Hooks {
    ///         Hooks::ON_ATTEMPT
    ///     }
    /// }
    ///
    /// assert!(Stamp.hooks().contains(Hooks::ON_ATTEMPT));
    /// assert!(!Stamp.hooks().contains(Hooks::BEFORE));
    /// ```
    fn hooks(&self) -> Hooks {
        Hooks::ALL
    }

    /// The window in which this interceptor drops a repeated idempotency key (a dedup
    /// store's TTL), when it keeps one: the client holds a policy's declared
    /// `delivery.dedup_window` to it (seed 001 P75-5). Default is `None`.
    fn dedup_window(&self) -> Option<std::time::Duration> {
        None
    }

    /// A short name for logs and events. Default is the type name.
    fn name(&self) -> &'static str {
        std::any::type_name::<Self>()
    }
}

/// A set of [`Interceptor`] hooks, combined with `|`: what [`Interceptor::hooks`] returns.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hooks(u8);

impl Hooks {
    /// No hook.
    pub const NONE: Hooks = Hooks(0);
    /// [`Interceptor::before`].
    pub const BEFORE: Hooks = Hooks(1);
    /// [`Interceptor::respond`].
    pub const RESPOND: Hooks = Hooks(1 << 1);
    /// [`Interceptor::on_attempt`].
    pub const ON_ATTEMPT: Hooks = Hooks(1 << 2);
    /// [`Interceptor::should_resend`].
    pub const SHOULD_RESEND: Hooks = Hooks(1 << 3);
    /// [`Interceptor::after`].
    pub const AFTER: Hooks = Hooks(1 << 4);
    /// [`Interceptor::on_error`].
    pub const ON_ERROR: Hooks = Hooks(1 << 5);
    /// [`Interceptor::before_now`], called in place of [`Interceptor::before`] (which is
    /// then not called, whether named or not).
    pub const BEFORE_NOW: Hooks = Hooks(1 << 6);
    /// Every `async` hook and `on_attempt`: what an interceptor that names nothing gets.
    /// [`Hooks::BEFORE_NOW`] is not in it: naming it changes which `before` runs.
    pub const ALL: Hooks = Hooks(0b11_1111);

    /// Whether every hook of `other` is in this set.
    pub const fn contains(self, other: Hooks) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Hooks {
    type Output = Hooks;

    fn bitor(self, rhs: Hooks) -> Hooks {
        Hooks(self.0 | rhs.0)
    }
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(Hooks, &str); 7] = [
            (Hooks::BEFORE, "before"),
            (Hooks::BEFORE_NOW, "before_now"),
            (Hooks::RESPOND, "respond"),
            (Hooks::ON_ATTEMPT, "on_attempt"),
            (Hooks::SHOULD_RESEND, "should_resend"),
            (Hooks::AFTER, "after"),
            (Hooks::ON_ERROR, "on_error"),
        ];
        f.debug_set()
            .entries(
                NAMES
                    .iter()
                    .filter(|(hook, _)| self.contains(*hook))
                    .map(|(_, name)| name),
            )
            .finish()
    }
}

#[async_trait::async_trait]
impl<T: Interceptor + ?Sized> Interceptor for Arc<T> {
    async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
        (**self).before(req).await
    }

    fn before_now(&self, req: &mut NetRequest) -> Result<(), NetError> {
        (**self).before_now(req)
    }

    async fn respond(&self, req: &NetRequest) -> Option<Result<NetResponse, NetError>> {
        (**self).respond(req).await
    }

    fn on_attempt(&self, req: &mut NetRequest, attempt: u32) {
        (**self).on_attempt(req, attempt);
    }

    async fn should_resend(&self, req: &mut NetRequest, res: &mut NetResponse) -> bool {
        (**self).should_resend(req, res).await
    }

    async fn after(&self, req: &NetRequest, res: &mut NetResponse) -> Result<(), NetError> {
        (**self).after(req, res).await
    }

    async fn on_error(&self, req: &NetRequest, err: &NetError) {
        (**self).on_error(req, err).await;
    }

    fn hooks(&self) -> Hooks {
        (**self).hooks()
    }

    fn dedup_window(&self) -> Option<std::time::Duration> {
        (**self).dedup_window()
    }

    fn name(&self) -> &'static str {
        (**self).name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;
    impl Interceptor for Nothing {}

    #[test]
    fn an_arc_forwards_what_the_interceptor_declares() {
        struct Windowed;
        impl Interceptor for Windowed {
            fn dedup_window(&self) -> Option<std::time::Duration> {
                Some(std::time::Duration::from_secs(7))
            }
        }
        let inner: Arc<dyn Interceptor> = Arc::new(Windowed);
        let outer: Arc<dyn Interceptor> = Arc::new(inner);
        assert_eq!(
            outer.dedup_window(),
            Some(std::time::Duration::from_secs(7))
        );
        assert_eq!(Nothing.dedup_window(), None);
    }

    #[tokio::test]
    async fn defaults_change_nothing() {
        let mut req = NetRequest::get("http://h.example/").header("a", "1");
        let before = req.headers.clone();
        let i: Arc<dyn Interceptor> = Arc::new(Nothing);
        i.before(&mut req).await.unwrap();
        i.before_now(&mut req).unwrap();
        i.on_attempt(&mut req, 1);
        assert!(i.respond(&req).await.is_none());
        let mut res = NetResponse::from_bytes(http::StatusCode::OK, "x");
        assert!(!i.should_resend(&mut req, &mut res).await);
        i.after(&req, &mut res).await.unwrap();
        i.on_error(&req, &NetError::new(crate::ErrorKind::Io)).await;
        assert_eq!(req.headers, before);
        assert_eq!(res.status, http::StatusCode::OK);
        assert!(i.name().ends_with("Nothing"), "{}", i.name());
        assert_eq!(i.hooks(), Hooks::ALL);
    }

    #[test]
    fn hook_sets_combine_and_print_their_names() {
        let set = Hooks::BEFORE | Hooks::AFTER;
        assert!(set.contains(Hooks::BEFORE) && set.contains(Hooks::AFTER));
        assert!(!set.contains(Hooks::ON_ERROR));
        assert!(!set.contains(Hooks::BEFORE | Hooks::RESPOND));
        assert!(Hooks::ALL.contains(set) && set.contains(Hooks::NONE));
        assert_eq!(format!("{set:?}"), r#"{"before", "after"}"#);
        let every = Hooks::BEFORE
            | Hooks::RESPOND
            | Hooks::ON_ATTEMPT
            | Hooks::SHOULD_RESEND
            | Hooks::AFTER
            | Hooks::ON_ERROR;
        assert_eq!(every, Hooks::ALL);
        assert!(!Hooks::ALL.contains(Hooks::BEFORE_NOW));
        assert_eq!(
            format!("{:?}", Hooks::BEFORE_NOW | Hooks::ON_ATTEMPT),
            r#"{"before_now", "on_attempt"}"#
        );
    }

    #[test]
    fn an_arc_forwards_before_now() {
        struct Mark;
        impl Interceptor for Mark {
            fn before_now(&self, req: &mut NetRequest) -> Result<(), NetError> {
                req.headers
                    .insert("x-mark", http::HeaderValue::from_static("1"));
                Ok(())
            }
        }
        let inner: Arc<dyn Interceptor> = Arc::new(Mark);
        let outer: Arc<dyn Interceptor> = Arc::new(inner);
        let mut req = NetRequest::get("http://h.example/");
        outer.before_now(&mut req).unwrap();
        assert_eq!(req.headers["x-mark"], "1");
    }
}
