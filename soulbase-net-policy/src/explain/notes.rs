//! Notes on an explanation's fields: what a value does for a call when the value alone does
//! not say — retries that cannot apply to the request, and the breaker's unit.
//!
//! Why notes: `retry.max_attempts = 2` reads as "two attempts", yet a POST without an
//! idempotency key (every gRPC call) gets one; `consecutive_failures = 5` reads as "five
//! failed calls", yet the breaker counts attempts. An explanation that only showed values
//! would leave both surprises to production.

use http::Method;

use crate::policy::delivery::Semantics;
use crate::policy::NetPolicy;
use crate::validate::fmt_duration;

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
    delivery(policy, request, &mut out);
    out
}

/// What the declared semantics (`delivery.sem`) change for a call.
fn delivery(
    policy: &NetPolicy,
    request: Option<&RequestShape>,
    out: &mut Vec<(&'static str, String)>,
) {
    const PATH: &str = "delivery.sem";
    let d = &policy.delivery;
    let window = d
        .dedup_window
        .map_or_else(|| "unset".to_owned(), fmt_duration);
    let note = match d.sem {
        None => "nothing declared: the client's usual rules (idempotent requests retried, \
                 others sent once)"
            .to_owned(),
        Some(Semantics::AtMostOnce) => "at most once: a request that may have reached the \
            server is never sent again — a timeout or a 5xx is returned as it is; only a request \
            that never left the client (DNS, connect, TLS) or that the server did not process \
            (REFUSED_STREAM, above a GOAWAY) goes again; no hedging"
            .to_owned(),
        Some(sem) => {
            let mut note = format!(
                "{}: retried as retry says, every copy with the same Idempotency-Key, which the \
                 server drops within dedup_window ({window}) (P75-4)",
                sem.as_str()
            );
            if sem == Semantics::ExactlyOnce {
                let span = d
                    .reorder_span
                    .map_or_else(|| "unset".to_owned(), fmt_duration);
                note.push_str(&format!(
                    "; copies arrive at most reorder_span ({span}) apart, inside the window \
                     (P75-5); acknowledgements in order are the outbox's ordering keys"
                ));
            }
            match request {
                Some(req) if !retryable(req) => note.push_str(&format!(
                    "; this {} is not idempotent: it is refused before it is sent unless it \
                     carries an Idempotency-Key",
                    req.method
                )),
                None => note.push_str(
                    "; a request that is not idempotent and has no Idempotency-Key is refused \
                     before it is sent",
                ),
                Some(_) => {}
            }
            note
        }
    };
    out.push((PATH, note));
}

/// When `retry.max_attempts` applies, and what is sent again without it.
fn retry(
    policy: &NetPolicy,
    request: Option<&RequestShape>,
    out: &mut Vec<(&'static str, String)>,
) {
    const PATH: &str = "retry.max_attempts";
    let r = &policy.retry;
    if policy.delivery.sem == Some(Semantics::AtMostOnce) {
        out.push((
            PATH,
            "at most once (delivery.sem): an attempt that may have reached the server is never \
             retried; only one that never left the client (DNS, connect, TLS) goes again"
                .to_owned(),
        ));
        return;
    }
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
    fn declared_semantics_say_what_they_change() {
        let mut p = NetPolicy::default();
        assert!(noted(&notes(&p, None), "delivery.sem")[0].starts_with("nothing declared"));
        p.delivery.sem = Some(Semantics::AtMostOnce);
        let at_most = notes(&p, Some(&shape(Method::GET, false)));
        assert!(noted(&at_most, "delivery.sem")[0].contains("never sent again"));
        assert!(noted(&at_most, "retry.max_attempts")[0].contains("never retried"));
        p.delivery.sem = Some(Semantics::AtLeastOnce);
        p.delivery.dedup_window = Some(std::time::Duration::from_secs(600));
        let post = notes(&p, Some(&shape(Method::POST, false)));
        let said = noted(&post, "delivery.sem")[0];
        assert!(said.contains("dedup_window (600s)"), "{said}");
        assert!(
            said.contains("this POST is not idempotent: it is refused"),
            "{said}"
        );
        p.delivery.sem = Some(Semantics::ExactlyOnce);
        p.delivery.reorder_span = Some(std::time::Duration::from_secs(60));
        let keyed = notes(&p, Some(&shape(Method::POST, true)));
        let said = noted(&keyed, "delivery.sem")[0];
        assert!(
            said.starts_with("exactly_once*") && said.contains("reorder_span (60s)"),
            "{said}"
        );
        assert!(!said.contains("refused"), "{said}");
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
