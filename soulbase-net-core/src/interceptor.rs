//! The [`Interceptor`] trait: hooks run around every request (seed 000 §4.2).

use std::sync::Arc;

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
/// Every method has a default that does nothing.
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

    /// Answers the request without sending it (a fresh cache entry, a duplicate inside a
    /// dedup window). Asked in order after every `before`; the first `Some` is the result of
    /// the call as it is: nothing is sent and no `after` or `on_error` runs.
    async fn respond(&self, _req: &NetRequest) -> Option<Result<NetResponse, NetError>> {
        None
    }

    /// Runs before every attempt, `attempt` counting from 1 (hedged attempts included).
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

    /// A short name for logs and events. Default is the type name.
    fn name(&self) -> &'static str {
        std::any::type_name::<Self>()
    }
}

#[async_trait::async_trait]
impl<T: Interceptor + ?Sized> Interceptor for Arc<T> {
    async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
        (**self).before(req).await
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

    fn name(&self) -> &'static str {
        (**self).name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;
    impl Interceptor for Nothing {}

    #[tokio::test]
    async fn defaults_change_nothing() {
        let mut req = NetRequest::get("http://h.example/").header("a", "1");
        let before = req.headers.clone();
        let i: Arc<dyn Interceptor> = Arc::new(Nothing);
        i.before(&mut req).await.unwrap();
        i.on_attempt(&mut req, 1);
        assert!(i.respond(&req).await.is_none());
        let mut res = NetResponse::from_bytes(http::StatusCode::OK, "x");
        assert!(!i.should_resend(&mut req, &mut res).await);
        i.after(&req, &mut res).await.unwrap();
        i.on_error(&req, &NetError::new(crate::ErrorKind::Io)).await;
        assert_eq!(req.headers, before);
        assert_eq!(res.status, http::StatusCode::OK);
        assert!(i.name().ends_with("Nothing"), "{}", i.name());
    }
}
