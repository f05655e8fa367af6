//! SLO targets for a host and how far the client may slow itself down when it misses them
//! (seed 001 §VIII and §X: lengthen backoff and lower the rate when the SLIs breach).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::validate::{fmt_duration, unit_closed, unit_half_open, Checker};

/// The largest `max_backoff_factor` a policy may set: past 8× the backoff stops being a
/// backoff and becomes an outage of the client's own making.
pub const MAX_BACKOFF_FACTOR: f64 = 8.0;

/// SLO targets per host and the self-healing controller that acts on them.
///
/// The runtime measures, per host and over a sliding `window` sampled every `interval`, the
/// SLIs of the attempts it makes: `retry_rate` (retries per first attempt), `timeout_rate`
/// and `error_ratio` (timed-out and failed attempts per attempt) and the attempts' p99
/// latency. When one is over its target for a whole window (with at least `min_samples`
/// attempts), the host's backoff factor is multiplied by `tighten_factor` (at most
/// `max_backoff_factor`) and its rate factor divided by it (at least `min_rate_factor`);
/// once every SLI is under target for a whole window, both step back by `recover_step`
/// toward 1, the policy's own values. The controller only lengthens waits and lowers rates:
/// it never adds a retry and never waits past the call's deadline.
///
/// Default is off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SloPolicy {
    /// Whether the controller acts for this host. Default is `false`.
    pub enabled: bool,
    /// Target for retries per first attempt, in `[0, 1]`. Default is 0.1.
    pub retry_rate: f64,
    /// Target for timed-out attempts per attempt, in `[0, 1]`. Default is 0.05.
    pub timeout_rate: f64,
    /// Target for failed attempts (timeouts, connection errors, 429 and 5xx) per attempt, in
    /// `[0, 1]`. Default is 0.1.
    pub error_ratio: f64,
    /// Target for the attempts' p99 latency (to the response head); `None` does not check
    /// latency. Default is `None` (`"off"`).
    #[serde(with = "crate::serde_opt")]
    pub p99: Option<Duration>,
    /// The window the SLIs are computed over. At least 5 × `interval`. Default is 30s.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// How often the window slides and the SLIs are compared with their targets. Default
    /// is 1s.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Attempts needed in the window before its SLIs count. Default is 20.
    pub min_samples: u32,
    /// The most the backoff may be multiplied by, in `[1, 8]`. Default is 4.
    pub max_backoff_factor: f64,
    /// The least the rate may be multiplied by, in `(0, 1]`. Default is 0.25.
    pub min_rate_factor: f64,
    /// What each breached window multiplies the backoff factor by (and divides the rate
    /// factor by); finite and > 1. Default is 2.
    pub tighten_factor: f64,
    /// What each healthy window takes off the backoff factor (as a share of
    /// `max_backoff_factor − 1`) and adds to the rate factor, in `(0, 1]`. Default is 0.25:
    /// back to 1 within 4 healthy windows.
    pub recover_step: f64,
}

impl Default for SloPolicy {
    fn default() -> Self {
        Self {
            enabled: false,
            retry_rate: 0.1,
            timeout_rate: 0.05,
            error_ratio: 0.1,
            p99: None,
            window: Duration::from_secs(30),
            interval: Duration::from_secs(1),
            min_samples: 20,
            max_backoff_factor: 4.0,
            min_rate_factor: 0.25,
            tighten_factor: 2.0,
            recover_step: 0.25,
        }
    }
}

impl SloPolicy {
    /// The rules hold whether or not the controller is enabled, so a section switched on
    /// later by an override is already known to be valid.
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        for (value, field) in [
            (self.retry_rate, "retry_rate"),
            (self.timeout_rate, "timeout_rate"),
            (self.error_ratio, "error_ratio"),
        ] {
            c.when(!unit_closed(value), field, || {
                format!("must be in [0, 1], got {value}")
            });
        }
        if let Some(p99) = self.p99 {
            c.nonzero(p99, "p99");
        }
        c.nonzero(self.interval, "interval");
        c.when(
            self.window < self.interval.saturating_mul(5),
            "window",
            || {
                format!(
                    "must be at least 5 × interval ({}), got {}",
                    fmt_duration(self.interval.saturating_mul(5)),
                    fmt_duration(self.window)
                )
            },
        );
        c.at_least_one(self.min_samples.into(), "min_samples");
        let f = self.max_backoff_factor;
        c.when(
            !(1.0..=MAX_BACKOFF_FACTOR).contains(&f),
            "max_backoff_factor",
            || format!("must be in [1, {MAX_BACKOFF_FACTOR}], got {f}"),
        );
        c.when(
            !unit_half_open(self.min_rate_factor),
            "min_rate_factor",
            || format!("must be in (0, 1], got {}", self.min_rate_factor),
        );
        let t = self.tighten_factor;
        c.when(!(t.is_finite() && t > 1.0), "tighten_factor", || {
            format!("must be finite and greater than 1, got {t}")
        });
        c.when(!unit_half_open(self.recover_step), "recover_step", || {
            format!("must be in (0, 1], got {}", self.recover_step)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NetPolicy;

    #[test]
    fn defaults_are_valid_and_off() {
        let p = NetPolicy::default();
        assert!(!p.slo.enabled);
        assert!(p.validate().is_ok());
    }

    #[test]
    fn every_bad_field_is_listed_with_its_path() {
        let slo = SloPolicy {
            enabled: true,
            retry_rate: 1.5,
            timeout_rate: -0.1,
            error_ratio: f64::NAN,
            p99: Some(Duration::ZERO),
            window: Duration::from_secs(4),
            interval: Duration::from_secs(1),
            min_samples: 0,
            max_backoff_factor: 9.0,
            min_rate_factor: 0.0,
            tighten_factor: 1.0,
            recover_step: 1.5,
        };
        let p = NetPolicy {
            slo,
            ..NetPolicy::default()
        };
        let err = p.validate().unwrap_err();
        let paths: Vec<&str> = err.problems().iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "slo.retry_rate",
                "slo.timeout_rate",
                "slo.error_ratio",
                "slo.p99",
                "slo.window",
                "slo.min_samples",
                "slo.max_backoff_factor",
                "slo.min_rate_factor",
                "slo.tighten_factor",
                "slo.recover_step",
            ]
        );
        assert_eq!(
            err.problems()[4].reason,
            "must be at least 5 × interval (5s), got 4s"
        );
    }

    #[test]
    fn the_layers_apply_to_slo_like_to_every_section() {
        let doc = crate::PolicyDocument::from_toml_str(
            r#"
            [default.slo]
            timeout_rate = 0.02
            [overrides."api.example.com".slo]
            enabled = true
            window = "10s"
            [tenants.t1.overrides."api.example.com".slo]
            max_backoff_factor = 8.0
            "#,
        )
        .unwrap();
        let r = crate::SnapshotResolver::new(doc).unwrap();
        let other = r.resolve(None, "other.example.com");
        assert!(!other.slo.enabled);
        assert_eq!(other.slo.timeout_rate, 0.02);
        let api = r.resolve(None, "api.example.com");
        assert!(api.slo.enabled);
        assert_eq!(api.slo.window, Duration::from_secs(10));
        assert_eq!(api.slo.timeout_rate, 0.02);
        assert_eq!(api.slo.max_backoff_factor, 4.0);
        let t1 = r.resolve(Some("t1"), "api.example.com");
        assert!(t1.slo.enabled);
        assert_eq!(t1.slo.max_backoff_factor, 8.0);
    }

    #[test]
    fn a_document_with_a_bad_slo_names_the_layer() {
        let err = crate::PolicyDocument::from_toml_str(
            "[overrides.\"api.example.com\".slo]\nwindow = \"2s\"\n",
        )
        .unwrap_err();
        assert_eq!(
            err.problems()[0].path,
            "overrides.\"api.example.com\".slo.window"
        );
    }

    #[test]
    fn a_zero_interval_is_refused() {
        let mut p = NetPolicy::default();
        p.slo.interval = Duration::ZERO;
        let err = p.validate().unwrap_err();
        assert_eq!(err.problems()[0].path, "slo.interval");
    }
}
