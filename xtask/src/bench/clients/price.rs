//! `cargo xtask bench --instructions --price-list [--update-budget] [--requests N]`: what each
//! feature costs, in instructions per request — the minimal client
//! ([`minimal_policy`](super::minimal_policy)) with one feature added at a time, each counted
//! under callgrind like the other clients (see [`super::super::instructions`]), over HTTP/1.1.
//! A feature's price is its variant's count minus the minimal client's (the retry budget's:
//! minus the retries variant's, the budget being a part of retries).
//!
//! The prices are checked against the budget's `<profile>-price` section: a price more than
//! [`PRICE_TOLERANCE`] above its budget, and more than [`floor`] above it (the run-to-run
//! spread of a difference of two counts), fails. `--update-budget` writes the prices as that
//! section. `cargo xtask ci` checks the `debug-price` section after the instruction budget.
#![allow(
    clippy::print_stdout,
    reason = "a command a person runs: the table goes to stdout"
)]

use std::{path::Path, sync::Arc, time::Duration};

use serde_json::Value;
use soulbase_net_interceptors::{
    A2aJws, Bearer, CacheHook, IdempotencyKey, QosBytes, SandboxGuard, Token, TraceUa,
};
use soulbase_net_policy::{NetPolicy, SecurityPolicy};
use soulbase_net_runtime::ClientBuilder;

use super::super::budget::{self, FLOOR_SHARE, PRICE_TOLERANCE};
use super::{never_binding, Kind};

/// The requests a price-list run counts by default: fewer than the other instruction runs,
/// so that CI's debug run of the sixteen clients stays within a few minutes.
pub(crate) const PRICE_REQUESTS: usize = 1000;

/// One feature the price list adds to the minimal client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Feature {
    /// The `TraceUa` interceptor: `traceparent`, `X-Request-Id`, `User-Agent`.
    TraceUa,
    /// `soulbase_net_observe::Metrics` as an observer.
    Metrics,
    /// The client's `tracing` spans (call and attempt), with a subscriber that takes them:
    /// a `tracing-subscriber` `Registry` without layers, installed in the counted process.
    /// Without a subscriber the client builds no span at all.
    Spans,
    /// The circuit breaker (`cbreaker.enabled`).
    Breaker,
    /// Retries (`retry.enabled`) without their budget.
    Retries,
    /// The retry budget, priced over [`Feature::Retries`].
    RetryBudget,
    /// A tenant on every request: its concurrency slot in the limiter (the per-host slot is
    /// always taken, in the minimal client too: the limit cannot be off) and its labels.
    Tenant,
    /// The AIMD window, at its maximum (four times the callers), so it never binds.
    Aimd,
    /// A per-host rate limit (`per_host_rate_rps`) far above any load.
    Rate,
    /// `Bearer` with a provider whose token lasts an hour: cached after the first request.
    Bearer,
    /// `IdempotencyKey::random()`: GETs are idempotent and get no key.
    Idempotency,
    /// `A2aJws`: an Ed25519 signature over the (empty) body of every request.
    Jws,
    /// `SandboxGuard` with the client's own security policy (loopback granted).
    Sandbox,
    /// `CacheHook` in memory: the bench's `200 ok` has no freshness lifetime and no
    /// validator, so nothing is stored and every request is a miss.
    Cache,
    /// `QosBytes` counting bytes per tenant and host, no budget.
    Qos,
}

/// The rows of the price list, in its order.
pub(crate) const FEATURES: [Feature; 15] = [
    Feature::TraceUa,
    Feature::Metrics,
    Feature::Spans,
    Feature::Breaker,
    Feature::Retries,
    Feature::RetryBudget,
    Feature::Tenant,
    Feature::Aimd,
    Feature::Rate,
    Feature::Bearer,
    Feature::Idempotency,
    Feature::Jws,
    Feature::Sandbox,
    Feature::Cache,
    Feature::Qos,
];

/// The `bench-client --client` key prefix of a price-list variant: `price:<feature>`.
const PREFIX: &str = "price:";

/// An Ed25519 key as PKCS#8 v1 (RFC 8410): the fixed prefix, then a seed of 32 bytes. A
/// throwaway key for the signing row.
const JWS_PKCS8: [u8; 48] = {
    let prefix = [
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    let mut der = [7u8; 48];
    let mut i = 0;
    while i < prefix.len() {
        der[i] = prefix[i];
        i += 1;
    }
    der
};

impl Feature {
    /// Its row's key in the budget; `price:<key>` names its client.
    pub(crate) fn key(self) -> &'static str {
        self.keys().0
    }

    /// Its client's key on the command line (`bench-client --client price:…`).
    pub(crate) fn client_key(self) -> &'static str {
        self.keys().1
    }

    fn keys(self) -> (&'static str, &'static str) {
        match self {
            Feature::TraceUa => ("trace_ua", "price:trace_ua"),
            Feature::Metrics => ("metrics", "price:metrics"),
            Feature::Spans => ("spans", "price:spans"),
            Feature::Breaker => ("breaker", "price:breaker"),
            Feature::Retries => ("retries", "price:retries"),
            Feature::RetryBudget => ("retry_budget", "price:retry_budget"),
            Feature::Tenant => ("tenant", "price:tenant"),
            Feature::Aimd => ("aimd", "price:aimd"),
            Feature::Rate => ("rate", "price:rate"),
            Feature::Bearer => ("bearer", "price:bearer"),
            Feature::Idempotency => ("idempotency", "price:idempotency"),
            Feature::Jws => ("a2a_jws", "price:a2a_jws"),
            Feature::Sandbox => ("sandbox", "price:sandbox"),
            Feature::Cache => ("cache", "price:cache"),
            Feature::Qos => ("qos", "price:qos"),
        }
    }

    /// Its row's name in the table.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Feature::TraceUa => "TraceUa interceptor",
            Feature::Metrics => "metrics observer (observe::Metrics)",
            Feature::Spans => "tracing spans (a Registry subscriber)",
            Feature::Breaker => "circuit breaker",
            Feature::Retries => "retries (no budget)",
            Feature::RetryBudget => "retry budget (over retries)",
            Feature::Tenant => "a tenant: per-tenant limit",
            Feature::Aimd => "AIMD window (never binding)",
            Feature::Rate => "per-host rate limit",
            Feature::Bearer => "Bearer (cached token)",
            Feature::Idempotency => "IdempotencyKey (GET: no key)",
            Feature::Jws => "A2A-JWS signing (Ed25519)",
            Feature::Sandbox => "SandboxGuard",
            Feature::Cache => "CacheHook (every request a miss)",
            Feature::Qos => "QosBytes (counting)",
        }
    }

    /// The feature `price:<key>` names.
    pub(crate) fn parse(client_key: &str) -> Option<Feature> {
        let key = client_key.strip_prefix(PREFIX)?;
        FEATURES.into_iter().find(|f| f.key() == key)
    }

    /// What its price is taken over: the retries variant for the retry budget, else the
    /// minimal client.
    pub(crate) fn over(self) -> Kind {
        match self {
            Feature::RetryBudget => Kind::Price(Feature::Retries),
            _ => Kind::SoulbaseMin,
        }
    }

    /// The minimal policy `p` with this feature on.
    pub(crate) fn adjust(self, p: &mut NetPolicy, callers: usize) {
        match self {
            Feature::Breaker => p.cbreaker.enabled = true,
            Feature::Retries => {
                p.retry.enabled = true;
                p.retry.budget.enabled = false;
            }
            Feature::RetryBudget => {
                p.retry.enabled = true;
                p.retry.budget.enabled = true;
            }
            Feature::Aimd => {
                p.limits.aimd.enabled = true;
                p.limits.aimd.max = never_binding(callers);
                p.limits.aimd.initial = p.limits.aimd.max;
            }
            Feature::Rate => p.limits.per_host_rate_rps = Some(10_000_000),
            _ => {}
        }
    }

    /// `builder` (of a client with the security policy `security`) with this feature's
    /// interceptor or observer.
    pub(crate) fn install(
        self,
        builder: ClientBuilder,
        security: &SecurityPolicy,
    ) -> Result<ClientBuilder, String> {
        Ok(match self {
            Feature::TraceUa => builder.interceptor(TraceUa::new()),
            Feature::Metrics => builder.observer(Arc::new(soulbase_net_observe::Metrics::new())),
            Feature::Bearer => builder.interceptor(Bearer::new(|| async {
                Ok(Token::expires_in("bench-token", Duration::from_secs(3600)))
            })),
            Feature::Idempotency => builder.interceptor(IdempotencyKey::random()),
            Feature::Jws => builder.interceptor(
                A2aJws::from_pkcs8(&JWS_PKCS8, "bench").map_err(|e| format!("bench: {e}"))?,
            ),
            Feature::Sandbox => {
                builder.interceptor(SandboxGuard::new(security).map_err(|e| format!("bench: {e}"))?)
            }
            Feature::Cache => builder.interceptor(CacheHook::new()),
            Feature::Qos => builder.interceptor(QosBytes::new()),
            _ => builder,
        })
    }

    /// The tenant its requests carry.
    pub(crate) fn tenant(self) -> Option<&'static str> {
        (self == Feature::Tenant).then_some("bench")
    }

    /// What the counted process needs before the client is built: the spans row's
    /// subscriber.
    pub(crate) fn prepare_process(self) -> Result<(), String> {
        if self != Feature::Spans {
            return Ok(());
        }
        use tracing_subscriber::util::SubscriberInitExt as _;
        tracing_subscriber::registry()
            .try_init()
            .map_err(|e| format!("bench: the spans row's subscriber: {e}"))
    }
}

/// The clients a price-list run counts: the minimal client, then each feature's variant.
pub(crate) fn clients() -> Vec<Kind> {
    std::iter::once(Kind::SoulbaseMin)
        .chain(FEATURES.map(Kind::Price))
        .collect()
}

/// One row of the price list.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Row {
    pub(crate) feature: Feature,
    /// Its variant's instructions per request.
    pub(crate) measured: f64,
    /// Over what its price is taken ([`Feature::over`]).
    pub(crate) price: f64,
    pub(crate) budget: Option<f64>,
    pub(crate) ok: bool,
}

/// The prices of the features among `measured` (what they are taken over must be there
/// too), each against the `section` of `budget`: more than [`PRICE_TOLERANCE`] and more
/// than `floor` above its budget, or without one, fails.
pub(crate) fn judge(
    measured: &[(Kind, f64)],
    budget: &Value,
    section: &str,
    floor: f64,
) -> Vec<Row> {
    let of = |kind| measured.iter().find(|(k, _)| *k == kind).map(|(_, m)| *m);
    let tolerance = budget::Tolerance {
        share: PRICE_TOLERANCE,
        floor,
    };
    measured
        .iter()
        .filter_map(|&(kind, m)| {
            let Kind::Price(feature) = kind else {
                return None;
            };
            let price = m - of(feature.over())?;
            let (b, ok) = budget::check(budget, section, feature.key(), price, tolerance);
            Some(Row {
                feature,
                measured: m,
                price,
                budget: b,
                ok,
            })
        })
        .collect()
}

/// The least slack a price has over its budget in a run whose minimal client counted
/// `minimal` instructions per request: [`FLOOR_SHARE`] of it.
pub(crate) fn floor(minimal: f64) -> f64 {
    minimal * FLOOR_SHARE
}

/// The price list as a Markdown table; `updating` says the prices become the budget.
pub(crate) fn print_table(minimal: f64, rows: &[Row], updating: bool) {
    println!(
        "\n| feature | instructions / request | price | budget | verdict |\n\
         | --- | --- | --- | --- | --- |\n\
         | minimal client | {minimal:.0} | — | — | — |"
    );
    for r in rows {
        let budget = r.budget.map_or("none".to_owned(), |b| format!("{b:+.0}"));
        let verdict = budget::verdict(updating, r.ok);
        println!(
            "| {} | {:.0} | {:+.0} | {budget} | {verdict} |",
            r.feature.label(),
            r.measured,
            r.price
        );
    }
}

/// The end of a price-list run: the table of `measured` against the `section` of `old` (the
/// budget document at `path`), then the budget rewritten (`update`) or the verdict.
pub(crate) fn finish(
    measured: &[(Kind, f64)],
    old: &Value,
    section: &str,
    update: bool,
    path: &Path,
    what: &str,
) -> Result<(), String> {
    let minimal = measured
        .iter()
        .find(|(k, _)| *k == Kind::SoulbaseMin)
        .map(|(_, m)| *m)
        .ok_or("bench --price-list: the minimal client was not counted")?;
    let slack = floor(minimal);
    let rows = judge(measured, old, section, slack);
    print_table(minimal, &rows, update);
    let over: Vec<&str> = rows
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.feature.key())
        .collect();
    let outcome = budget::Outcome {
        path,
        section,
        command: "bench --instructions --price-list",
        row: "price",
        written: "prices",
        within: format!(
            "{:.0} % (at least {slack:.0} instructions)",
            PRICE_TOLERANCE * 100.0
        ),
        allowed: format!("+{:.0} %, at least +{slack:.0},", PRICE_TOLERANCE * 100.0),
    };
    let update = update.then(|| budget::updated_rows(old, section, &self::section(&rows), what));
    budget::conclude(&outcome, &over, update)
}

/// The rows as the budget section holds them: each feature's key and price.
pub(crate) fn section(rows: &[Row]) -> Vec<(&'static str, f64)> {
    rows.iter().map(|r| (r.feature.key(), r.price)).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::bench::clients::{full_policy, minimal_policy};

    #[test]
    fn every_feature_is_named_and_parsed_back() {
        for f in FEATURES {
            assert_eq!(Feature::parse(f.client_key()), Some(f));
            assert_eq!(Kind::parse(f.client_key()), Some(Kind::Price(f)));
            assert_eq!(f.client_key(), format!("{PREFIX}{}", f.key()));
        }
        assert_eq!(Feature::parse("price:gzip"), None);
        assert_eq!(Feature::parse("trace_ua"), None);
        assert_eq!(clients().len(), FEATURES.len() + 1);
    }

    /// The policy rows add up to the full policy: each is one of its parts.
    #[test]
    fn the_policy_features_make_the_full_policy() {
        let mut p = minimal_policy(4);
        for f in [
            Feature::Breaker,
            Feature::RetryBudget,
            Feature::Aimd,
            Feature::Rate,
        ] {
            f.adjust(&mut p, 4);
        }
        assert_eq!(p, full_policy(4));
        let mut retries = minimal_policy(4);
        Feature::Retries.adjust(&mut retries, 4);
        assert!(retries.retry.enabled && !retries.retry.budget.enabled);
    }

    #[test]
    fn a_price_is_over_its_base_and_fails_above_five_percent_and_the_floor() {
        let budget = json!({ "instructions_per_request": { "release-price": {
            "trace_ua": 1000.0, "retry_budget": 100.0, "breaker": 300.0,
        } } });
        let measured = [
            (Kind::SoulbaseMin, 20_000.0),
            (Kind::Price(Feature::TraceUa), 21_050.0),
            (Kind::Price(Feature::Retries), 20_500.0),
            (Kind::Price(Feature::RetryBudget), 20_630.0),
            (Kind::Price(Feature::Breaker), 20_400.0),
            (Kind::Price(Feature::Jws), 30_000.0),
        ];
        let rows = judge(&measured, &budget, "release-price", 20.0);
        let got: Vec<(Feature, f64, bool)> =
            rows.iter().map(|r| (r.feature, r.price, r.ok)).collect();
        assert_eq!(
            got,
            [
                // 1050 ≤ 1000 × 1.05.
                (Feature::TraceUa, 1050.0, true),
                // No budget.
                (Feature::Retries, 500.0, false),
                // Over retries: 130 > 100 + max(5, 20).
                (Feature::RetryBudget, 130.0, false),
                // 400 > 300 × 1.05.
                (Feature::Breaker, 400.0, false),
                (Feature::Jws, 10_000.0, false),
            ]
        );
        // Within the floor: 115 ≤ 100 + 20, though 15 % over.
        let within = [
            (Kind::Price(Feature::Retries), 20_000.0),
            (Kind::Price(Feature::RetryBudget), 20_115.0),
        ];
        let within = judge(&within, &budget, "release-price", 20.0);
        assert_eq!(within.len(), 1, "only the budget has its base: {within:?}");
        assert!(within[0].ok);
        // A price whose base was not counted has no row.
        assert!(judge(&measured[1..2], &budget, "release-price", 20.0).is_empty());
        assert!((floor(30_000.0) - 600.0).abs() < 1e-9);
    }

    #[test]
    fn the_section_holds_each_price_by_key() {
        let budget = Value::Null;
        let measured = [
            (Kind::SoulbaseMin, 1000.0),
            (Kind::Price(Feature::Qos), 1200.5),
        ];
        let rows = judge(&measured, &budget, "debug-price", 1.0);
        assert!(!rows[0].ok);
        assert_eq!(section(&rows), [("qos", 200.5)]);
    }

    /// The checked-in budget prices every feature in both profiles.
    #[test]
    fn the_checked_in_budget_prices_every_feature() {
        let doc = budget::read(&crate::project_root().join(budget::BUDGET_FILE)).unwrap();
        for section in ["release-price", "debug-price"] {
            for f in FEATURES {
                let b = doc["instructions_per_request"][section][f.key()].as_f64();
                assert!(b.is_some(), "{section} {f:?}");
            }
        }
        assert_eq!(doc["price_tolerance"].as_f64(), Some(PRICE_TOLERANCE));
    }
}
