//! Before the attempts: the `before` interceptors, the request's final checks (its body
//! serialised once, its size, its `Idempotency-Key`), `respond` interceptors that answer
//! without a request (reported as `NetEvent::Answered`), a resend asked for by
//! `should_resend`, and `after` / `on_error`.

use std::sync::{atomic::Ordering, Arc};

use bytes::Bytes;
use http::{header, HeaderValue, Method};
use soulbase_net_core::{Body, NetError, NetEvent, NetRequest};
use soulbase_net_policy::DeliveryPolicy;
use url::Url;

use super::chain::Before;
use super::send::{record_trace, Answer, Attempts, Call, Processing};
use super::Inner;

impl Inner {
    /// Interceptors and the attempt; `after` or `on_error` at the end.
    pub(super) async fn run(&self, req: &mut NetRequest, url: Arc<Url>, call: &Call<'_>) -> Answer {
        // What `before` may change that the parsed URL depends on (see `Target`); without
        // interceptors nothing can, and the URL parsed by `send` stands.
        let target = (!self.interceptors.before.is_empty()).then(|| Target::of(req, &url));
        // `w(proc)` of S75-4: the hooks before the attempts, with the checks between them.
        let hooks = &self.interceptors;
        let mut processing = Processing::start(
            call.segments,
            !(hooks.before.is_empty() && hooks.respond.is_empty()),
        );
        for before in &self.interceptors.before {
            let done = match before {
                Before::Now(interceptor) => interceptor.before_now(req),
                Before::Later(interceptor) => interceptor.before(req).await,
            };
            if let Err(e) = done {
                return Err(self.after_error(req, e).await);
            }
        }
        record_trace(req);
        let prepared = prepare_body(req).and_then(|()| {
            // What `before` added to the headers needs no check of its own: a `HeaderValue`
            // holds no CR, LF or NUL (http refuses them when one is built; only `unsafe` code
            // can make one that does).
            let url = match target {
                Some(before) if !before.holds(req, &url) => req.validate_shared(u64::MAX)?,
                _ => url,
            };
            req.check_body_size(call.policy.security.max_req_bytes.as_u64())?;
            ensure_idempotency_key(req)?;
            keeps_delivery(req, &call.policy.delivery, self.interceptors.dedup_window)?;
            Ok(url)
        });
        let url = match prepared {
            Ok(url) => url,
            Err(e) => return Err(self.after_error(req, e).await),
        };
        let decoding = self.default_headers(req);
        call.decoding.store(decoding, Ordering::Relaxed);
        for interceptor in &self.interceptors.respond {
            if let Some(answer) = interceptor.respond(req).await {
                // Observers learn who answered (a cache hit, a dedup drop) from here, not
                // from a call of their own to each interceptor.
                self.emit(|| NetEvent::Answered {
                    req: call.info(),
                    by: interceptor.name(),
                });
                return answer.map(Box::new);
            }
        }
        processing.stop();
        let mut attempts = Attempts::default();
        // A resend starts from the request as the caller built it (after `before`), not from
        // the last redirect hop's (which may have turned a POST into a GET, dropped the body
        // or stripped credentials). Only when an interceptor may ask for one, and the body
        // can be sent again. Copied lazily: `follow` keeps a copy the first time a redirect
        // is about to change the request; without a redirect the request is still the
        // caller's (the attempts change only per-attempt headers, which `on_attempt` sets
        // again on the resend's attempts), and no copy is made. Boxed, as the resend below:
        // both are rare, and what the call's future holds is copied with it on every call.
        let resendable = !self.interceptors.should_resend.is_empty() && req.body.is_replayable();
        let mut original: super::follow::Kept = None;
        let mut result = self
            .follow(
                req,
                url,
                call,
                &mut attempts,
                resendable.then_some(&mut original),
            )
            .await;
        if let (Ok(res), true) = (&mut result, resendable) {
            let mut resend = false;
            let to_resend = match original.as_deref_mut() {
                Some((original, _)) => original,
                None => &mut *req,
            };
            for interceptor in &self.interceptors.should_resend {
                if interceptor.should_resend(to_resend, res).await {
                    resend = true;
                    break;
                }
            }
            if resend {
                drop(result);
                let url = match original {
                    Some(original) => {
                        let (original, url) = *original;
                        *req = original;
                        Ok(url)
                    }
                    // The request's own URL, checked again (it was moved into the first send).
                    None => req.validate_shared(u64::MAX),
                };
                result = match url {
                    Ok(url) => {
                        attempts.this_send = 0;
                        Box::pin(self.follow(req, url, call, &mut attempts, None)).await
                    }
                    Err(e) => Err(e),
                };
            }
        }
        match result {
            Ok(mut res) => {
                let _processing =
                    Processing::start(call.segments, !self.interceptors.after.is_empty());
                for interceptor in self.interceptors.after.iter().rev() {
                    if let Err(e) = interceptor.after(req, &mut res).await {
                        return Err(self.after_error(req, e).await);
                    }
                }
                Ok(res)
            }
            Err(e) => Err(self.after_error(req, e).await),
        }
    }
}

/// What the request's URL is made of (its URL and query pairs), to see whether `before`
/// interceptors changed it without keeping a copy (an allocation per call).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The request's URL is the parsed URL's text, and it has no query pairs: it is
    /// unchanged while that still holds (a compare, nothing hashed).
    Parsed,
    /// A fingerprint of the URL and the query pairs: 64 bits of foldhash. A change that
    /// keeps the fingerprint would have to be built for it, and interceptors are the
    /// client's own code.
    Print(u64),
}

impl Target {
    fn of(req: &NetRequest, url: &Url) -> Self {
        if is_parsed(req, url) {
            Target::Parsed
        } else {
            Target::Print(target_print(req))
        }
    }

    /// Whether `req` still makes the URL it made when this was taken.
    fn holds(self, req: &NetRequest, url: &Url) -> bool {
        match self {
            Target::Parsed => is_parsed(req, url),
            Target::Print(print) => print == target_print(req),
        }
    }
}

/// Whether the request's URL is `url`'s text, without query pairs to add to it.
fn is_parsed(req: &NetRequest, url: &Url) -> bool {
    req.query.is_empty() && req.url == url.as_str()
}

fn target_print(req: &NetRequest) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    req.url.hash(&mut h);
    req.query.hash(&mut h);
    h.finish()
}

/// Gives an idempotent POST or PATCH an `Idempotency-Key` when it has none, so that every
/// copy of the call (retries, hedges, a resend) carries the same key and the server can drop
/// duplicates — whatever the retry setting: hedged copies are copies too. The key comes from
/// the OS CSPRNG ([`soulbase_net_core::new_idempotency_key`]).
fn ensure_idempotency_key(req: &mut NetRequest) -> Result<(), NetError> {
    const IDEMPOTENCY_KEY: &str = "idempotency-key";
    let wants_key = req.idempotent && matches!(req.method, Method::POST | Method::PATCH);
    if !wants_key || req.headers.contains_key(IDEMPOTENCY_KEY) {
        return Ok(());
    }
    let key = soulbase_net_core::new_idempotency_key()?;
    // 32 hex digits: always a valid header value. New for every call, so never indexed by
    // HTTP/2's HPACK (see `TraceUa`'s ids).
    if let Ok(mut value) = HeaderValue::from_str(&key) {
        value.set_sensitive(true);
        req.headers.insert(IDEMPOTENCY_KEY, value);
    }
    Ok(())
}

/// Refuses, before anything is sent, a call its policy's declared semantics cannot keep
/// (seed 001 P75-4, P75-5): under `at_least_once` or `exactly_once*`, a request that is not
/// idempotent and carries no `Idempotency-Key` (its copies could not be told apart), or one
/// whose declared `dedup_window` differs from the window of the client's own dedup store.
fn keeps_delivery(
    req: &NetRequest,
    delivery: &DeliveryPolicy,
    local_window: Option<std::time::Duration>,
) -> Result<(), NetError> {
    let Some(sem) = delivery.sem.filter(|s| s.needs_key()) else {
        return Ok(());
    };
    if !req.is_retryable_method() && !req.headers.contains_key("idempotency-key") {
        return Err(NetError::invalid_request(format!(
            "the policy declares sem = \"{}\" for this call: a {} that is not idempotent needs \
             an Idempotency-Key header (mark it idempotent, give it a key, or add the \
             IdempotencyKey interceptor), so that the server can drop its copies (seed 001 P75-4)",
            sem.as_str(),
            req.method
        )));
    }
    if let (Some(declared), Some(local)) = (delivery.dedup_window, local_window) {
        if declared != local {
            return Err(NetError::invalid_request(format!(
                "the policy declares delivery.dedup_window = {declared:?}, but the client's \
                 dedup store drops repeated keys for {local:?}: the two must be equal \
                 (seed 001 P75-5)"
            )));
        }
    }
    Ok(())
}

/// Serialises a JSON body once (so every attempt sends the same bytes) and sets its
/// `Content-Type` when the request has none.
fn prepare_body(req: &mut NetRequest) -> Result<(), NetError> {
    if let Body::Json(_) = &req.body {
        let bytes: Bytes = req.body.to_bytes()?.unwrap_or_default();
        req.headers
            .entry(header::CONTENT_TYPE)
            .or_insert(HeaderValue::from_static("application/json"));
        req.body = Body::Bytes(bytes);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idempotent_post_gets_a_never_indexed_key_and_a_get_none() {
        let mut post = NetRequest::post("http://h.example/").idempotent(true);
        ensure_idempotency_key(&mut post).unwrap();
        let key = &post.headers["idempotency-key"];
        assert_eq!(key.len(), 32);
        assert!(
            key.is_sensitive(),
            "new for every call: never indexed by HPACK"
        );
        let mut get = NetRequest::get("http://h.example/");
        ensure_idempotency_key(&mut get).unwrap();
        assert!(get.headers.get("idempotency-key").is_none());
    }
}
