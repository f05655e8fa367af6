//! Notes on an explanation's fields: what a value does for a call when the value alone does
//! not say — retries that cannot apply to the request, and the breaker's unit.
//!
//! Why notes: `retry.max_attempts = 2` reads as "two attempts", yet a POST without an
//! idempotency key (every gRPC call) gets one; `consecutive_failures = 5` reads as "five
//! failed calls", yet the breaker counts attempts. An explanation that only showed values
//! would leave both surprises to production.

use http::Method;

use crate::policy::NetPolicy;

/// What the explanation knows of the request (see `Explanation::for_request`).
#[derive(Clone, Debug)]
pub(super) struct RequestShape {
    pub(super) method: Method,
    pub(super) idempotent: bool,
}

/// The notes on `policy`'s fields, as (path, note), for `request` when it is known.
pub(super) fn notes(
    policy: &NetPolicy,
    request: Option<&RequestShape>,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    retry(policy, request, &mut out);
    breaker(policy, &mut out);
    out
}

/// When `retry.max_attempts` applies, and what is sent again without it.
fn retry(
    policy: &NetPolicy,
    request: Option<&RequestShape>,
    out: &mut Vec<(&'static str, String)>,
) {
    const PATH: &str = "retry.max_attempts";
    let r = &policy.retry;
    if !r.enabled {
        out.push((
            PATH,
            "retries are off (retry.enabled = false): one attempt per call".to_owned(),
        ));
        return;
    }
    if r.max_attempts <= 1 {
        out.push((PATH, "one attempt: nothing is retried".to_owned()));
        return;
    }
    let unprocessed = "sent again only when the server provably did not process it \
        (REFUSED_STREAM, above a GOAWAY's last stream) or, through the tower face, when an \
        attempt never left the client (DNS, connect)";
    let n = r.max_attempts;
    match request {
        Some(req) if !retryable(req) => out.push((
            PATH,
            format!(
                "cannot apply to this request: {} is not idempotent (GET, HEAD and OPTIONS are; \
                 a request marked idempotent or carrying an Idempotency-Key is); it gets one \
                 attempt, {unprocessed}",
                req.method
            ),
        )),
        Some(req) => out.push((
            PATH,
            format!(
                "applies to this {} request: up to {n} attempts on the outcomes retry.retry_on \
                 lists, within the retry budget and the deadline",
                req.method
            ),
        )),
        None => out.push((
            PATH,
            format!(
                "applies only to idempotent requests: GET, HEAD, OPTIONS, or marked idempotent \
                 (a POST or PATCH with an Idempotency-Key); any other request — a gRPC call is \
                 a POST — gets one attempt, {unprocessed}"
            ),
        )),
    }
    let buffer = r.replay_buffer;
    out.push((
        PATH,
        if buffer.as_u64() == 0 {
            "through the tower face (tonic) no body is kept (retry.replay_buffer = 0): a \
             request with a body is sent once, never again"
                .to_owned()
        } else {
            format!(
                "a body is sent again only when it can be replayed: through the tower face \
                 (tonic), one at hand whole and within retry.replay_buffer ({buffer}); a \
                 larger or still-streaming body, or a stream body of NetClient::send, is sent \
                 once"
            )
        },
    ));
}

/// The breaker counts failed attempts, not calls.
fn breaker(policy: &NetPolicy, out: &mut Vec<(&'static str, String)>) {
    let b = &policy.cbreaker;
    if !b.enabled {
        out.push((
            "cbreaker.enabled",
            "the breaker is off: no other cbreaker field applies".to_owned(),
        ));
        return;
    }
    let uncounted = "a request the server did not process, a cancelled one and the client's \
        own refusals count nothing";
    out.push((
        "cbreaker.consecutive_failures",
        if b.consecutive_failures == 0 {
            "off: only the failure ratio opens the circuit".to_owned()
        } else {
            format!(
                "opens the circuit after {} failed attempts in a row — attempts, not calls: a \
                 call that made 3 failed attempts counts 3 ({uncounted})",
                b.consecutive_failures
            )
        },
    ));
    out.push((
        "cbreaker.failure_ratio",
        format!(
            "the share of failed attempts among the attempts recorded over cbreaker.window \
             ({uncounted})"
        ),
    ));
    out.push((
        "cbreaker.min_samples",
        "attempts (not calls) recorded in cbreaker.window before the failure ratio counts"
            .to_owned(),
    ));
}

/// Whether the client may retry `req` on any listed outcome (`NetRequest::is_retryable_method`).
fn retryable(req: &RequestShape) -> bool {
    req.idempotent || matches!(req.method, Method::GET | Method::HEAD | Method::OPTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ByteSize;

    fn noted<'a>(notes: &'a [(&'static str, String)], path: &str) -> Vec<&'a str> {
        notes
            .iter()
            .filter(|(p, _)| *p == path)
            .map(|(_, n)| n.as_str())
            .collect()
    }

    fn shape(method: Method, idempotent: bool) -> RequestShape {
        RequestShape { method, idempotent }
    }

    #[test]
    fn retries_say_when_they_cannot_apply() {
        let mut p = NetPolicy::default();
        p.retry.max_attempts = 2;
        let general = notes(&p, None);
        let [applies, body] = noted(&general, "retry.max_attempts")[..] else {
            panic!("{general:?}");
        };
        assert!(applies.contains("only to idempotent requests"), "{applies}");
        assert!(applies.contains("gRPC"), "{applies}");
        assert!(body.contains("retry.replay_buffer (64KiB)"), "{body}");

        let post = notes(&p, Some(&shape(Method::POST, false)));
        let said = noted(&post, "retry.max_attempts");
        assert!(
            said[0].starts_with("cannot apply to this request: POST is not idempotent"),
            "{said:?}"
        );
        let keyed = notes(&p, Some(&shape(Method::POST, true)));
        assert!(noted(&keyed, "retry.max_attempts")[0]
            .starts_with("applies to this POST request: up to 2 attempts"));
        let get = notes(&p, Some(&shape(Method::GET, false)));
        assert!(noted(&get, "retry.max_attempts")[0].starts_with("applies to this GET request"));

        p.retry.replay_buffer = ByteSize::b(0);
        let none = notes(&p, None);
        assert!(noted(&none, "retry.max_attempts")[1].contains("no body is kept"));
        p.retry.enabled = false;
        let off = notes(&p, Some(&shape(Method::GET, false)));
        assert_eq!(
            noted(&off, "retry.max_attempts"),
            ["retries are off (retry.enabled = false): one attempt per call"]
        );
    }

    #[test]
    fn the_breaker_counts_failed_attempts() {
        let mut p = NetPolicy::default();
        assert_eq!(
            noted(&notes(&p, None), "cbreaker.enabled"),
            ["the breaker is off: no other cbreaker field applies"]
        );
        p.cbreaker.enabled = true;
        p.cbreaker.consecutive_failures = 5;
        let on = notes(&p, None);
        let [run] = noted(&on, "cbreaker.consecutive_failures")[..] else {
            panic!("{on:?}");
        };
        assert!(
            run.starts_with(
                "opens the circuit after 5 failed attempts in a row — attempts, not calls"
            ),
            "{run}"
        );
        assert!(noted(&on, "cbreaker.failure_ratio")[0].contains("failed attempts"));
        assert!(noted(&on, "cbreaker.min_samples")[0].starts_with("attempts (not calls)"));
        assert!(noted(&on, "cbreaker.enabled").is_empty());
    }
}
