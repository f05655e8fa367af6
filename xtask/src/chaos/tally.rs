//! What a chaos run saw, counted: calls by outcome and error code, and the invariants —
//! nothing lost, nothing hung past its deadline, cancels honoured at once, no side effect
//! duplicated, no denied address dialled, no protection bypassed — as pass/fail rows.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    sync::Arc,
    time::Duration,
};

use parking_lot::Mutex;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::traffic::{Call, Kind, Outcome};
use super::world::Target;
use crate::table::{row, Row};

/// How far past its deadline a call may return, beyond the runtime's own lateness while it
/// ran (see [`Lateness`]).
pub(crate) const DEADLINE_SLACK: Duration = Duration::from_millis(100);

/// How late the runtime's timers fired during the run, measured by a canary timer that
/// asks to wake every [`CANARY_EVERY`] and notes how late it woke. On a loaded machine (a
/// load average of 12 on 2 cores was seen) every timer fires late, the client's deadline
/// timers too: a call is judged against its deadline + the worst lateness the canary saw
/// while the call ran + [`DEADLINE_SLACK`], so that the invariant measures the client, not
/// the machine.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lateness {
    /// When the canary woke and how late, in order.
    ticks: Vec<(Instant, Duration)>,
}

/// The canary timer of a [`Lateness`] measurement, running.
pub(crate) struct Canary {
    ticks: Arc<Mutex<Vec<(Instant, Duration)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Canary {
    /// Stops the canary and gives what it saw.
    pub(crate) fn stop(self) -> Lateness {
        self.task.abort();
        Lateness {
            ticks: std::mem::take(&mut *self.ticks.lock()),
        }
    }
}

/// How often the canary asks to wake.
pub(crate) const CANARY_EVERY: Duration = Duration::from_millis(10);

impl Lateness {
    /// Starts the canary: it runs until [`Canary::stop`].
    pub(crate) fn start() -> Canary {
        let ticks: Arc<Mutex<Vec<(Instant, Duration)>>> = Arc::default();
        let seen = ticks.clone();
        let task = tokio::spawn(async move {
            let mut due = Instant::now() + CANARY_EVERY;
            loop {
                tokio::time::sleep_until(due).await;
                let woke = Instant::now();
                seen.lock()
                    .push((woke, woke.saturating_duration_since(due)));
                due = woke + CANARY_EVERY;
            }
        });
        Canary { ticks, task }
    }

    /// The worst lateness of a wake between `from` and one canary period after `to` (a timer
    /// due just before `to` is seen late only after it).
    pub(crate) fn during(&self, from: Instant, to: Instant) -> Duration {
        let to = to + CANARY_EVERY;
        let start = self.ticks.partition_point(|(at, _)| *at < from);
        self.ticks[start..]
            .iter()
            .take_while(|(at, _)| *at <= to)
            .map(|(_, late)| *late)
            .max()
            .unwrap_or_default()
    }

    /// The worst lateness of the whole run.
    pub(crate) fn worst(&self) -> Duration {
        self.ticks
            .iter()
            .map(|(_, late)| *late)
            .max()
            .unwrap_or_default()
    }
}

/// One request as a server received it: its marker and its `Idempotency-Key`, if any.
#[derive(Clone, Debug)]
pub(crate) struct Arrival {
    pub(crate) id: String,
    pub(crate) key: Option<String>,
}

/// What was seen outside the calls themselves.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Requests as the servers received them.
    pub(crate) arrivals: Vec<Arrival>,
    /// Addresses the client asked to dial that were not loopback (each refused).
    pub(crate) denied_dials: Vec<String>,
    /// Requests for `no_proxy` hosts that reached the proxy anyway.
    pub(crate) proxy_leaks: usize,
}

/// Calls to one target, by outcome.
#[derive(Debug, Default, Clone)]
pub(crate) struct PerTarget {
    sent: u64,
    ok: u64,
    outcomes: BTreeMap<String, u64>,
}

/// The run, counted.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    pub(crate) sent: u64,
    pub(crate) succeeded: u64,
    pub(crate) attempts: u64,
    /// Failures and non-2xx answers, by `CODE (kind)` or `HTTP nnn`.
    pub(crate) failed: BTreeMap<String, u64>,
    pub(crate) by_kind: BTreeMap<&'static str, u64>,
    pub(crate) lost: Vec<String>,
    pub(crate) hung: Vec<String>,
    /// Calls whose caller cancelled them while they ran (the token fired before they ended).
    pub(crate) cancels_fired: u64,
    /// Calls that ended with the `cancelled` error.
    pub(crate) cancelled: u64,
    /// The latest a cancelled call returned after its cancel, in ms.
    pub(crate) worst_cancel_ms: u64,
    /// Cancelled calls that returned later than `DEADLINE_SLACK` after the cancel, and calls
    /// that ended `cancelled` although their token never fired.
    pub(crate) cancel_problems: Vec<String>,
    /// The largest `wall − limit` seen, in ms (negative: every call was early).
    pub(crate) worst_overrun_ms: i64,
    /// The worst lateness of the runtime's timers in the run (see [`Lateness`]), in ms.
    pub(crate) worst_lateness_ms: u64,
    /// The call with that overrun: target, limit and outcome.
    pub(crate) worst_call: String,
    pub(crate) duplicated: Vec<String>,
    pub(crate) non_idempotent_arrived: u64,
    pub(crate) key_problems: Vec<String>,
    pub(crate) denied_dials: Vec<String>,
    pub(crate) unsafe_successes: Vec<String>,
    pub(crate) proxy_leaks: usize,
    pub(crate) targets: Vec<(String, PerTarget)>,
}

fn label(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Answered(status) => format!("HTTP {status}"),
        Outcome::Failed { code, kind } => format!("{code} ({kind})"),
        Outcome::Lost(why) => format!("lost: {why}"),
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Get => "GET",
        Kind::Head => "HEAD",
        Kind::Post => "POST",
        Kind::IdempotentPost => "POST (idempotent)",
        Kind::Put => "PUT",
    }
}

/// Counts `calls` against `targets` and what the servers, dialer and proxy saw.
pub(crate) fn analyse(
    targets: &[Target],
    calls: &[Call],
    seen: Seen,
    lateness: &Lateness,
) -> Summary {
    let mut s = Summary {
        worst_overrun_ms: i64::MIN,
        worst_lateness_ms: lateness.worst().as_millis() as u64,
        targets: targets
            .iter()
            .map(|t| (t.name.to_owned(), PerTarget::default()))
            .collect(),
        denied_dials: seen.denied_dials,
        proxy_leaks: seen.proxy_leaks,
        ..Summary::default()
    };
    for c in calls {
        s.sent += 1;
        s.attempts += u64::from(c.attempts);
        *s.by_kind.entry(kind_name(c.kind)).or_default() += 1;
        let ok = matches!(c.outcome, Outcome::Answered(200..=299));
        let target = targets.get(c.target);
        if let Some((_, t)) = s.targets.get_mut(c.target) {
            t.sent += 1;
            if ok {
                t.ok += 1;
            } else {
                *t.outcomes.entry(label(&c.outcome)).or_default() += 1;
            }
        }
        if ok {
            s.succeeded += 1;
            if target.is_some_and(|t| t.must_fail) {
                s.unsafe_successes.push(c.id.clone());
            }
        } else {
            *s.failed.entry(label(&c.outcome)).or_default() += 1;
        }
        if let Outcome::Lost(why) = &c.outcome {
            s.lost.push(format!("{}: {why}", c.id));
            continue;
        }
        let late = lateness.during(c.began, c.began + c.wall);
        check_cancel(&mut s, c, late);
        let overrun = c.wall.as_millis() as i64 - c.limit.as_millis() as i64;
        if overrun > s.worst_overrun_ms {
            s.worst_overrun_ms = overrun;
            s.worst_call = format!(
                "{} {} of {} ms: {}",
                target.map_or("?", |t| t.name),
                kind_name(c.kind),
                c.limit.as_millis(),
                label(&c.outcome)
            );
        }
        if c.wall > c.limit + late + DEADLINE_SLACK {
            s.hung.push(format!(
                "{} took {} ms of {} ms, timers {} ms late ({})",
                c.id,
                c.wall.as_millis(),
                c.limit.as_millis(),
                late.as_millis(),
                label(&c.outcome)
            ));
        }
    }
    check_arrivals(&mut s, calls, &seen.arrivals);
    s
}

/// A cancelled call returns within `DEADLINE_SLACK` (+ the timers' lateness `late`) of its
/// cancel; only a cancel ends a call with the `cancelled` error.
fn check_cancel(s: &mut Summary, c: &Call, late: Duration) {
    let fired = c.cancel_after.filter(|at| *at <= c.wall);
    s.cancels_fired += u64::from(fired.is_some());
    let ended_cancelled = matches!(&c.outcome, Outcome::Failed { kind, .. } if kind == "cancelled");
    if !ended_cancelled {
        return;
    }
    s.cancelled += 1;
    match fired {
        Some(at) => {
            let after = c.wall.saturating_sub(at);
            s.worst_cancel_ms = s.worst_cancel_ms.max(after.as_millis() as u64);
            if after > DEADLINE_SLACK + late {
                s.cancel_problems.push(format!(
                    "{} returned {} ms after its cancel",
                    c.id,
                    after.as_millis()
                ));
            }
        }
        None => s
            .cancel_problems
            .push(format!("{} ended cancelled without a cancel", c.id)),
    }
}

/// Non-idempotent calls must arrive at most once; the copies of an idempotent POST must all
/// carry one `Idempotency-Key`.
fn check_arrivals(s: &mut Summary, calls: &[Call], arrivals: &[Arrival]) {
    let kinds: HashMap<&str, Kind> = calls.iter().map(|c| (c.id.as_str(), c.kind)).collect();
    let mut by_id: HashMap<&str, Vec<&Option<String>>> = HashMap::new();
    for a in arrivals {
        by_id.entry(a.id.as_str()).or_default().push(&a.key);
    }
    let mut ids: Vec<_> = by_id.into_iter().collect();
    ids.sort_by(|a, b| a.0.cmp(b.0));
    for (id, keys) in ids {
        match kinds.get(id) {
            Some(kind) if !kind.may_repeat() => {
                s.non_idempotent_arrived += 1;
                if keys.len() > 1 {
                    s.duplicated
                        .push(format!("{id} arrived {} times", keys.len()));
                }
            }
            Some(Kind::IdempotentPost) => {
                let first = keys[0];
                if first.is_none() || keys.iter().any(|k| k != &first) {
                    s.key_problems
                        .push(format!("{id}: keys {keys:?} over {} copies", keys.len()));
                }
            }
            Some(_) => {}
            None => s
                .duplicated
                .push(format!("{id} arrived but was never sent")),
        }
    }
}

fn first_few(items: &[String]) -> String {
    let shown: Vec<&str> = items.iter().take(3).map(String::as_str).collect();
    let more = items.len().saturating_sub(shown.len());
    let mut out = shown.join("; ");
    if more > 0 {
        let _ = write!(out, "; +{more} more");
    }
    out
}

fn count_row(id: &str, expected: &str, found: &[String], of: String) -> Row {
    let measured = if found.is_empty() {
        format!("0 {of}")
    } else {
        format!("{} {of}: {}", found.len(), first_few(found))
    };
    row(id, expected, measured, found.is_empty())
}

impl Summary {
    /// The invariants, one row each.
    pub(crate) fn rows(&self) -> Vec<Row> {
        let hung_of = format!(
            "(worst {:+} ms against the deadline; timers up to {} ms late)",
            if self.sent == 0 {
                0
            } else {
                self.worst_overrun_ms
            },
            self.worst_lateness_ms
        );
        let exercised = self.sent > 0 && self.succeeded > 0 && self.succeeded < self.sent;
        vec![
            row(
                "chaos.exercised",
                "calls sent; some succeed, some fail",
                format!(
                    "{} sent, {} succeeded, {} failed",
                    self.sent,
                    self.succeeded,
                    self.sent - self.succeeded
                ),
                exercised,
            ),
            count_row(
                "chaos.lost",
                "0 calls without answer or error",
                &self.lost,
                format!("of {}", self.sent),
            ),
            count_row(
                "chaos.hung",
                "0 calls past deadline + timer lateness + 100 ms",
                &self.hung,
                hung_of,
            ),
            count_row(
                "chaos.cancelled",
                "a cancelled call returns within 100 ms (+ timer lateness) of its cancel",
                &self.cancel_problems,
                format!(
                    "late of {} cancelled ({} cancels fired mid-call; latest {} ms after)",
                    self.cancelled, self.cancels_fired, self.worst_cancel_ms
                ),
            ),
            count_row(
                "chaos.duplicated",
                "0 non-idempotent calls arriving twice",
                &self.duplicated,
                format!("of {} that arrived", self.non_idempotent_arrived),
            ),
            count_row(
                "chaos.idempotency_key",
                "one key across every copy",
                &self.key_problems,
                "idempotent POSTs with a changed key".to_owned(),
            ),
            count_row(
                "chaos.denied_dials",
                "0 dials to denied addresses",
                &self.denied_dials,
                "dialled".to_owned(),
            ),
            count_row(
                "chaos.protections",
                "0 successes on must-fail targets",
                &self.unsafe_successes,
                "succeeded".to_owned(),
            ),
            row(
                "chaos.no_proxy",
                "0 no_proxy calls seen by the proxy",
                format!("{} seen", self.proxy_leaks),
                self.proxy_leaks == 0,
            ),
        ]
    }

    /// Calls by kind and by outcome, then per target.
    pub(crate) fn breakdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} calls ({} attempts): {} succeeded, {} failed",
            self.sent,
            self.attempts,
            self.succeeded,
            self.sent - self.succeeded
        );
        let kinds: Vec<String> = self
            .by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(out, "by method: {}", kinds.join(", "));
        let _ = writeln!(
            out,
            "closest to its deadline: {:+} ms, {}; the runtime's timers up to {} ms late",
            self.worst_overrun_ms, self.worst_call, self.worst_lateness_ms
        );
        let _ = writeln!(out, "failed by code:");
        for (code, n) in &self.failed {
            let _ = writeln!(out, "  {n:>6}  {code}");
        }
        let w = self.targets.iter().map(|(n, _)| n.len()).max().unwrap_or(6);
        let _ = writeln!(
            out,
            "\n{:<w$}  {:>5}  {:>5}  other outcomes",
            "target", "sent", "ok"
        );
        for (name, t) in &self.targets {
            let other: Vec<String> = t
                .outcomes
                .iter()
                .map(|(o, n)| format!("{o} ×{n}"))
                .collect();
            let _ = writeln!(
                out,
                "{name:<w$}  {:>5}  {:>5}  {}",
                t.sent,
                t.ok,
                other.join(", ")
            );
        }
        out
    }

    /// The counts as JSON (the rows are added by the caller).
    pub(crate) fn json(&self) -> Value {
        let targets: Vec<Value> = self
            .targets
            .iter()
            .map(|(name, t)| json!({"target": name, "sent": t.sent, "ok": t.ok, "outcomes": t.outcomes}))
            .collect();
        json!({
            "sent": self.sent,
            "succeeded": self.succeeded,
            "attempts": self.attempts,
            "failed_by_code": self.failed,
            "by_method": self.by_kind,
            "lost": self.lost.len(),
            "hung": self.hung.len(),
            "cancels_fired": self.cancels_fired,
            "cancelled": self.cancelled,
            "worst_cancel_ms": self.worst_cancel_ms,
            "cancel_problems": self.cancel_problems.len(),
            "worst_overrun_ms": self.worst_overrun_ms,
            "worst_timer_lateness_ms": self.worst_lateness_ms,
            "worst_call": self.worst_call,
            "duplicated": self.duplicated.len(),
            "non_idempotent_arrived": self.non_idempotent_arrived,
            "idempotency_key_problems": self.key_problems.len(),
            "denied_dials": self.denied_dials.len(),
            "unsafe_successes": self.unsafe_successes.len(),
            "no_proxy_leaks": self.proxy_leaks,
            "targets": targets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(name: &'static str, must_fail: bool) -> Target {
        Target {
            name,
            url: format!("http://{name}/"),
            weight: 1,
            must_fail,
        }
    }

    fn call(id: &str, kind: Kind, wall_ms: u64, outcome: Outcome) -> Call {
        Call {
            id: id.to_owned(),
            began: Instant::now(),
            target: 0,
            kind,
            limit: Duration::from_millis(1000),
            cancel_after: None,
            wall: Duration::from_millis(wall_ms),
            attempts: 1,
            outcome,
        }
    }

    fn arrival(id: &str, key: Option<&str>) -> Arrival {
        Arrival {
            id: id.to_owned(),
            key: key.map(str::to_owned),
        }
    }

    fn failing_rows(s: &Summary) -> Vec<String> {
        s.rows()
            .into_iter()
            .filter(|r| !r.passed)
            .map(|r| r.id)
            .collect()
    }

    #[test]
    fn a_clean_run_passes_every_row() {
        let calls = [
            call("a", Kind::Post, 20, Outcome::Answered(200)),
            call(
                "b",
                Kind::Get,
                1090,
                Outcome::Failed {
                    code: "PROVIDER.TIMEOUT".into(),
                    kind: "timeout_total".into(),
                },
            ),
        ];
        let seen = Seen {
            arrivals: vec![arrival("a", None), arrival("b", None), arrival("b", None)],
            ..Seen::default()
        };
        let s = analyse(&[target("t", false)], &calls, seen, &Lateness::default());
        assert!(failing_rows(&s).is_empty(), "{:?}", s.rows());
        assert_eq!(s.worst_overrun_ms, 90);
    }

    #[test]
    fn each_invariant_can_fail() {
        let calls = [
            call("post", Kind::Post, 20, Outcome::Answered(200)),
            call("late", Kind::Get, 1101, Outcome::Answered(503)),
            call(
                "gone",
                Kind::Get,
                6000,
                Outcome::Lost("no answer, no error".into()),
            ),
            call("idem", Kind::IdempotentPost, 20, Outcome::Answered(200)),
            call("stray", Kind::Get, 30, cancelled()),
        ];
        let seen = Seen {
            arrivals: vec![
                arrival("post", None),
                arrival("post", None),
                arrival("idem", Some("k1")),
                arrival("idem", Some("k2")),
            ],
            denied_dials: vec!["10.0.0.7:80".into()],
            proxy_leaks: 1,
        };
        let s = analyse(&[target("t", true)], &calls, seen, &Lateness::default());
        assert_eq!(
            failing_rows(&s),
            [
                "chaos.lost",
                "chaos.hung",
                "chaos.cancelled",
                "chaos.duplicated",
                "chaos.idempotency_key",
                "chaos.denied_dials",
                "chaos.protections",
                "chaos.no_proxy",
            ]
        );
        assert_eq!(s.hung.len(), 1);
        assert_eq!(s.unsafe_successes, ["post", "idem"]);
    }

    #[test]
    fn a_call_is_judged_against_the_lateness_of_the_timers_while_it_ran() {
        let late = call("late", Kind::Get, 1250, Outcome::Answered(503));
        let began = late.began;
        let tick = |ms: u64, late_ms: u64| {
            (
                began + Duration::from_millis(ms),
                Duration::from_millis(late_ms),
            )
        };
        // Timers 200 ms late while the call ran: 1 250 ms of 1 000 is within 1 000 + 200 + 100.
        let loaded = Lateness {
            ticks: vec![tick(500, 200), tick(900, 5)],
        };
        let s = analyse(
            &[target("t", false)],
            std::slice::from_ref(&late),
            Seen::default(),
            &loaded,
        );
        assert!(s.hung.is_empty(), "{:?}", s.hung);
        assert_eq!(s.worst_lateness_ms, 200);
        // The same lateness after the call ended excuses nothing.
        let after = Lateness {
            ticks: vec![tick(500, 5), tick(5000, 200)],
        };
        let s = analyse(&[target("t", false)], &[late], Seen::default(), &after);
        assert_eq!(s.hung.len(), 1, "{:?}", s.hung);
    }

    #[tokio::test]
    async fn the_canary_sees_a_blocked_runtime_as_late() {
        let canary = Lateness::start();
        tokio::task::yield_now().await;
        // This single-threaded runtime is blocked for 80 ms: the canary cannot wake on time.
        std::thread::sleep(Duration::from_millis(80));
        // Woken (late) once the runtime is free again.
        tokio::time::sleep(CANARY_EVERY * 3).await;
        let seen = canary.stop();
        assert!(seen.worst() >= Duration::from_millis(60), "{seen:?}");
    }

    fn cancelled() -> Outcome {
        Outcome::Failed {
            code: "PROVIDER.UNAVAILABLE".into(),
            kind: "cancelled".into(),
        }
    }

    #[test]
    fn cancels_are_honoured_at_once_and_only_cancels_cancel() {
        let cancel_at = |mut c: Call, ms: u64| {
            c.cancel_after = Some(Duration::from_millis(ms));
            c
        };
        let calls = [
            // Cancelled 40 ms after its cancel: in time.
            cancel_at(call("quick", Kind::Get, 240, cancelled()), 200),
            // Its token fired after it answered: nothing to honour.
            cancel_at(call("done", Kind::Get, 50, Outcome::Answered(200)), 300),
            // 150 ms after its cancel: too late.
            cancel_at(call("slow", Kind::Post, 350, cancelled()), 200),
            // Cancelled without a cancel.
            call("stray", Kind::Get, 30, cancelled()),
            call("ok", Kind::Get, 10, Outcome::Answered(200)),
        ];
        let s = analyse(
            &[target("t", false)],
            &calls,
            Seen::default(),
            &Lateness::default(),
        );
        assert_eq!(failing_rows(&s), ["chaos.cancelled"]);
        assert_eq!(
            (s.cancels_fired, s.cancelled, s.worst_cancel_ms),
            (2, 3, 150)
        );
        assert_eq!(
            s.cancel_problems,
            [
                "slow returned 150 ms after its cancel",
                "stray ended cancelled without a cancel"
            ]
        );
    }

    #[test]
    fn a_run_that_never_failed_did_not_exercise_anything() {
        let calls = [call("a", Kind::Get, 5, Outcome::Answered(200))];
        let s = analyse(
            &[target("t", false)],
            &calls,
            Seen::default(),
            &Lateness::default(),
        );
        assert_eq!(failing_rows(&s), ["chaos.exercised"]);
    }
}
