//! Validation problems and the error that lists them all.
//!
//! Why a list: a policy document is written by a person, often under pressure during an
//! incident. Reporting only the first mistake turns one fix into a loop of edit, reload, read
//! the next error. Every check runs, and every problem is returned with the path of the field
//! in the document's own shape.

use std::fmt;
use std::time::Duration;

/// One thing wrong with a policy: where it is and why it is wrong.
///
/// `path` uses the document's shape, e.g. `default.retry.backoff.cap`,
/// `overrides."*.example.com".retry.max_attempts` or `tenants.t1.limits.per_tenant_concurrency`.
/// For [`NetPolicy::validate`](crate::NetPolicy::validate) it is relative to the policy
/// (`retry.max_attempts`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Problem {
    /// Where the problem is, in the document's shape.
    pub path: String,
    /// Why it is a problem, in words a person can act on.
    pub reason: String,
}

/// A policy or policy document that cannot be used, with every problem found.
///
/// `Display` prints one problem per line, as `path: reason`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct PolicyError {
    problems: Vec<Problem>,
}

// === impl Problem ===

impl Problem {
    /// A problem at `path`, for `reason`.
    pub fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.path, self.reason)
        }
    }
}

// === impl PolicyError ===

impl PolicyError {
    /// An error listing `problems`.
    ///
    /// An empty list still makes an error (with a generic problem), so that an error never
    /// says nothing.
    pub fn new(problems: Vec<Problem>) -> Self {
        if problems.is_empty() {
            return Self::single("", "invalid policy");
        }
        Self { problems }
    }

    /// An error with one problem.
    pub fn single(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            problems: vec![Problem::new(path, reason)],
        }
    }

    /// Every problem found, in document order.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// Takes the problems out of the error.
    pub fn into_problems(self) -> Vec<Problem> {
        self.problems
    }

    /// `Ok(())` when `problems` is empty, otherwise an error listing them.
    pub(crate) fn check(problems: Vec<Problem>) -> Result<(), Self> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Self { problems })
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// A policy error as the client's error, so that setup needs one `?`: kind
/// [`InvalidRequest`](soulbase_net_core::ErrorKind::InvalidRequest), code
/// `SCHEMA.VALIDATION_FAILED`, the message `invalid policy: ` followed by every problem (one
/// per line, as `path: reason`), and the `PolicyError` itself as the source, so the problems
/// stay retrievable with [`NetError::find_source`](soulbase_net_core::NetError::find_source).
///
/// # Examples
/// ```
/// use soulbase_net_core::{ErrorCode, NetError};
/// use soulbase_net_policy::{PolicyDocument, PolicyError};
///
/// fn load() -> Result<PolicyDocument, NetError> {
///     Ok(PolicyDocument::from_toml_str(
///         "[default]\nretry.max_attempts = 0\nretry.backoff.jitter = 2.0",
///     )?)
/// }
///
/// let err = load().unwrap_err();
/// assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
/// let message = err.message().unwrap();
/// assert!(message.contains("default.retry.max_attempts"), "{message}");
/// assert!(message.contains("default.retry.backoff.jitter"), "{message}");
/// let problems = err.find_source::<PolicyError>().unwrap().problems();
/// assert_eq!(problems.len(), 2);
/// ```
impl From<PolicyError> for soulbase_net_core::NetError {
    fn from(e: PolicyError) -> Self {
        soulbase_net_core::NetError::invalid_request(format!("invalid policy: {e}")).with_source(e)
    }
}

// === helpers for the checks of each sub-policy ===

/// Collects problems under a path prefix (`retry`, `retry.backoff`, …).
#[derive(Debug)]
pub(crate) struct Checker<'a> {
    prefix: String,
    out: &'a mut Vec<Problem>,
}

impl<'a> Checker<'a> {
    pub(crate) fn new(prefix: &str, out: &'a mut Vec<Problem>) -> Self {
        Self {
            prefix: prefix.to_owned(),
            out,
        }
    }

    /// A checker for a nested section, e.g. `retry` → `retry.backoff`.
    pub(crate) fn nested(&mut self, name: &str) -> Checker<'_> {
        Checker {
            prefix: join(&self.prefix, name),
            out: self.out,
        }
    }

    /// Records a problem at `field` under this checker's prefix.
    pub(crate) fn push(&mut self, field: &str, reason: impl Into<String>) {
        self.out
            .push(Problem::new(join(&self.prefix, field), reason.into()));
    }

    /// Records a problem when `bad` holds.
    pub(crate) fn when(&mut self, bad: bool, field: &str, reason: impl FnOnce() -> String) {
        if bad {
            self.push(field, reason());
        }
    }

    /// `field` must be a non-zero duration.
    pub(crate) fn nonzero(&mut self, d: Duration, field: &str) {
        self.when(d.is_zero(), field, || "must be greater than 0s".to_owned());
    }

    /// `field` must be at least 1.
    pub(crate) fn at_least_one(&mut self, n: u64, field: &str) {
        self.when(n == 0, field, || "must be at least 1".to_owned());
    }
}

fn join(prefix: &str, field: &str) -> String {
    match (prefix.is_empty(), field.is_empty()) {
        (true, _) => field.to_owned(),
        (_, true) => prefix.to_owned(),
        _ => format!("{prefix}.{field}"),
    }
}

/// Formats a duration for messages: `300ms`, `9s`, `27.3s`.
pub(crate) fn fmt_duration(d: Duration) -> String {
    if d == Duration::MAX {
        return "forever".to_owned();
    }
    if d < Duration::from_secs(1) {
        let nanos = d.subsec_nanos();
        return if nanos.is_multiple_of(1_000_000) {
            format!("{}ms", nanos / 1_000_000)
        } else if nanos.is_multiple_of(1_000) {
            format!("{}µs", nanos / 1_000)
        } else {
            format!("{nanos}ns")
        };
    }
    let millis = d.subsec_millis();
    if millis == 0 {
        return format!("{}s", d.as_secs());
    }
    let frac = format!("{millis:03}");
    format!("{}.{}s", d.as_secs(), frac.trim_end_matches('0'))
}

/// `true` when `x` lies in `[0, 1]` (NaN is not).
pub(crate) fn unit_closed(x: f64) -> bool {
    (0.0..=1.0).contains(&x)
}

/// `true` when `x` lies in `(0, 1]` (NaN is not).
pub(crate) fn unit_half_open(x: f64) -> bool {
    x > 0.0 && x <= 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_lists_every_problem_one_per_line() {
        let err = PolicyError::new(vec![
            Problem::new("default.retry.max_attempts", "must be at least 1"),
            Problem::new("tenants.t1.tls.verify_cert", "cannot be turned off"),
        ]);
        assert_eq!(
            err.to_string(),
            "default.retry.max_attempts: must be at least 1\ntenants.t1.tls.verify_cert: cannot be turned off"
        );
    }

    #[test]
    fn durations_read_like_a_person_wrote_them() {
        assert_eq!(fmt_duration(Duration::from_millis(300)), "300ms");
        assert_eq!(fmt_duration(Duration::from_secs(9)), "9s");
        assert_eq!(fmt_duration(Duration::from_millis(27_300)), "27.3s");
        assert_eq!(fmt_duration(Duration::from_millis(29_900)), "29.9s");
        assert_eq!(fmt_duration(Duration::from_millis(1_005)), "1.005s");
        assert_eq!(fmt_duration(Duration::from_micros(1_500)), "1500µs");
        assert_eq!(fmt_duration(Duration::MAX), "forever");
    }

    #[test]
    fn an_empty_error_still_says_something() {
        assert_eq!(PolicyError::new(vec![]).problems().len(), 1);
    }
}
