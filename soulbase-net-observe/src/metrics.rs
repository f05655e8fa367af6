//! [`Metrics`]: an [`Observer`] that keeps the seed's metrics in a `prometheus-client` registry
//! and writes them in the OpenMetrics text format.

use std::{
    fmt,
    sync::{Arc, OnceLock},
    time::Duration,
};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use soulbase_net_core::{
    BreakerState, DnsSource, GaugeSource, LimitScope, NetEvent, Observer, OutboxStep, Outcome,
    RequestInfo, Takes,
};

use crate::{
    breakers::{BreakerCollector, BreakerShare},
    gauges::{GaugeCollector, GaugeState},
    hot,
    labels::{
        method_label, scheme_label, version_label, ByLabels, BytesLabels, HostLabels, KeyLabels,
        Label, LabelCap, LimitLabels, PhaseLabels, ReasonLabels, RequestLabels, RuleLabels,
        SourceLabels, StoreLabels, OTHER,
    },
    latency::Latency,
    sli::{SliCollector, SliState, Slis},
};

/// How many distinct `rule` labels `net_blocked_total` keeps before using `"_other"`.
const MAX_RULES: usize = 64;

/// The [`Interceptor::name`](soulbase_net_core::Interceptor::name) of `IdempotencyKey`, whose
/// answers are duplicates dropped by its dedup window.
const IDEMPOTENCY_KEY: &str = "idempotency_key";

/// Turns [`NetEvent`]s into Prometheus metrics and [`Slis`]. Cheap to share: wrap it in an
/// [`Arc`] and hand the same value to the client and to the scrape endpoint.
///
/// Metrics (counters get the `_total` suffix in the exposition):
///
/// | metric | labels | from |
/// | --- | --- | --- |
/// | `net_requests_total` | `tenant, host, method, scheme, outcome, version` | `RequestFinished`; `outcome` is [`Outcome::label`]; `version` is the final response's HTTP version, `h1`, `h2` or `h3` (`""` without a response) |
/// | `net_latency_ms` (histogram, [`LATENCY_BUCKETS_MS`](crate::LATENCY_BUCKETS_MS)) | `phase = connect, ttfb, total` | `connect`: attempts that opened a connection; `ttfb`: attempts that got a response; `total`: `RequestFinished` |
/// | `net_bytes_total` | `dir, tenant, host` | `Bytes` |
/// | `net_retry_total` | `reason` | `RetryScheduled`; the failed attempt's outcome label |
/// | `net_hedge_total` | `host` | `AttemptStarted` of a hedged copy (`hedge: true`) |
/// | `net_outbox_delivered_total`, `net_outbox_retried_total`, `net_outbox_dead_total` | — | `Outbox` events of an outbox given this observer |
/// | `net_outbox_lateness_ms` (histogram, [`LATENCY_BUCKETS_MS`](crate::LATENCY_BUCKETS_MS)) | — | `Outbox` deliveries: actual − `deliver_at` |
/// | `net_outbox_pending`, `net_outbox_oldest_pending_age_seconds` (gauges, at scrape) | — | the outbox's gauges |
/// | `net_store_errors_total` | `store, op` | `StoreError`: a shared store (`rate`, …) failed, timed out (`op` = what was asked) or was skipped for a moment after failing (`op="skip"`) |
/// | `net_answered_total` | `by` (the interceptor's name) | `Answered`: calls an interceptor answered without sending, e.g. `by="cache_hook"` for cache hits, `by="idempotency_key"` for duplicates dropped by the dedup window |
/// | `net_dedup_drops_total` | — | `Answered` by `idempotency_key` (and [`MetricsBuilder::dedup_by`]): duplicates dropped by a dedup window, the numerator of `net_sli_dup_drop_rate` |
/// | `net_circuit_open_total` | `host` (the breaker key without its scheme: `host`, or `host:port` off the scheme's default port, then `/tenant` when keyed by tenant) | `BreakerTransition` to open |
/// | `net_breaker_state` (gauge: 0 closed, 1 half-open, 2 open) | `key` | `BreakerTransition` |
/// | `net_circuit_open_ratio` (gauge, 0 to 1) | `host` (as in `net_requests_total`: no scheme, port or tenant) | `BreakerTransition`: of the host's breaker keys seen changing state, the share whose last transition was to open (half-open is not open); with breakers keyed by host, 0 or 1 for a host called on one port |
/// | `net_breaker_rejected_total` | `host` | `BreakerRejected` |
/// | `net_redirect_total` | `host` | `Redirected` |
/// | `net_rate_limited_total` | `host, scope` | `RateLimited` |
/// | `net_retry_budget_exhausted_total` | `host` | `RetryBudgetExhausted` |
/// | `net_resent_total` | `host` | `Resent`: requests the server did not process, sent again |
/// | `net_pool_retired_total` | `reason` (`goaway`, `dns_moved`, `idle_budget`) | `ConnectionRetired` |
/// | `net_blocked_total` | `rule` | `Blocked` |
/// | `net_timeouts_total` | `phase` | `TimedOut` |
/// | `net_dns_lookups_total` | `source` | `DnsResolved` |
/// | `net_sli_*` (gauges) | — | see [`Slis`], computed at scrape time; `net_sli_dup_drop_rate` counts `Answered` by `idempotency_key` (and [`MetricsBuilder::dedup_by`]) |
/// | `net_limiter_in_flight` (gauge) | `host` | calls holding the host's concurrency slot, read from the client at scrape time |
/// | `net_limiter_tenant_in_flight` (gauge) | `tenant` | calls holding one of the tenant's concurrency slots (all hosts), at scrape time |
/// | `net_limiter_queued` (gauge) | `host` | calls waiting for a place under the host's limits (bounded `max_wait` only), at scrape time |
/// | `net_limiter_window` (gauge) | `host` | the per-host AIMD window once a call used it, at scrape time |
/// | `net_limiter_global_window` (gauge) | — | the client-wide AIMD window (global scope), when used, at scrape time |
/// | `net_retry_budget_tokens` (gauge) | `tenant, host` | whole retries the retry budget allows now (`tenant=""` unless the budget is per tenant), at scrape time |
/// | `net_pool_open_connections` (gauge) | `host` | connections the client holds open to the host (in use, idle or opening; all its ports), at scrape time |
/// | `net_pool_idle_connections` (gauge) | `host` | connections kept for the host with no request on them (HTTP/1.1 idle ones, and an HTTP/2 or HTTP/3 connection with no stream in flight), at scrape time |
///
/// The five series of seed 001 §IX (`Threads.retry.rate`, `Threads.timeout.rate`,
/// `Threads.dedup.drop_rate`, `Threads.hedge.count`, `Threads.circuit.open_ratio`) are
/// `net_sli_retry_rate`, `net_sli_timeout_rate`, `net_sli_dup_drop_rate` (with the counters they
/// divide), `net_hedge_total` and `net_circuit_open_ratio`; `docs/observability.md` tabulates
/// them with their exact definitions.
///
/// A request without a tenant has `tenant=""`. Label values are bounded: past
/// [`MetricsBuilder::max_hosts`] distinct hosts (and breaker keys), [`MetricsBuilder::max_tenants`]
/// tenants and 64 block rules, new values are counted under `"_other"`; extension methods and
/// schemes other than `http`/`https` are `"_other"` too. The `by` of `net_answered_total` is an
/// interceptor's static name, so it has as many values as the program has interceptors.
///
/// The limiter and budget gauges come from each client that was given these metrics as its
/// observer ([`Observer::on_gauges`]; through a [`Fanout`](crate::Fanout) too). Values that
/// share a label — hosts past the cap, or one host called by several clients — are summed; a
/// dropped client's gauges disappear. Hosts a client has forgotten (idle entries evicted) are
/// not reported.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use soulbase_net_core::{http::{Method, StatusCode}, Elapsed, NetEvent, Observer, Outcome, RequestInfo};
/// use soulbase_net_observe::Metrics;
///
/// let metrics = Arc::new(Metrics::new());
/// let req = RequestInfo { id: 1, method: &Method::GET, scheme: "https", host: "api.example", tenant: None, url: "https://api.example/" };
/// metrics.on_event(&NetEvent::RequestFinished {
///     req,
///     outcome: Outcome::Response(StatusCode::OK),
///     attempts: 1,
///     elapsed: Elapsed::default(),
///     version: Some(soulbase_net_core::http::Version::HTTP_3),
/// });
/// let text = metrics.encode();
/// assert!(text.contains(
///     r#"net_requests_total{tenant="",host="api.example",method="GET",scheme="https",outcome="ok",version="h3"} 1"#
/// ));
/// assert_eq!(metrics.slis().requests, 1);
/// ```
pub struct Metrics {
    registry: Registry,
    hosts: Arc<LabelCap>,
    tenants: Arc<LabelCap>,
    keys: LabelCap,
    rules: LabelCap,
    no_tenant: Label,
    requests: Family<RequestLabels, Counter>,
    latency: Family<PhaseLabels, Latency>,
    bytes: Family<BytesLabels, Counter>,
    retries: Family<ReasonLabels, Counter>,
    hedges: Family<HostLabels, Counter>,
    answered: Family<ByLabels, Counter>,
    dedup_drops: Counter,
    store_errors: Family<StoreLabels, Counter>,
    outbox_delivered: Counter,
    outbox_retried: Counter,
    outbox_dead: Counter,
    outbox_lateness: Latency,
    /// The interceptors whose answers are dedup drops.
    dedup_by: Vec<&'static str>,
    circuit_open: Family<HostLabels, Counter>,
    breaker_state: Family<KeyLabels, Gauge>,
    breaker_share: Arc<BreakerShare>,
    breaker_rejected: Family<HostLabels, Counter>,
    redirects: Family<HostLabels, Counter>,
    rate_limited: Family<LimitLabels, Counter>,
    budget_exhausted: Family<HostLabels, Counter>,
    resent: Family<HostLabels, Counter>,
    retired: Family<ReasonLabels, Counter>,
    blocked: Family<RuleLabels, Counter>,
    timeouts: Family<PhaseLabels, Counter>,
    dns: Family<SourceLabels, Counter>,
    sli: Arc<SliState>,
    gauges: Arc<GaugeState>,
    /// This registry's number in the per-thread counter memo.
    owner: u64,
    /// The latency histograms of the phases every request reports, found once (on first
    /// use, so a series still appears only when first observed).
    total_ms: OnceLock<Latency>,
    ttfb_ms: OnceLock<Latency>,
    connect_ms: OnceLock<Latency>,
}

/// The phases of `net_latency_ms` that every request reports (each found once, see
/// `Metrics::total_ms`).
#[derive(Clone, Copy)]
enum LatencyPhase {
    Total,
    Ttfb,
    Connect,
}

/// Configures [`Metrics`]; from [`Metrics::builder`].
#[derive(Debug)]
pub struct MetricsBuilder {
    max_hosts: usize,
    max_tenants: usize,
    latency_window: usize,
    dedup_by: Vec<&'static str>,
    registry: Option<Registry>,
}

// === impl MetricsBuilder ===

impl MetricsBuilder {
    /// How many distinct hosts (and, separately, breaker keys) get their own label value;
    /// later ones share `"_other"`. Default is 1 000.
    pub fn max_hosts(mut self, max: usize) -> Self {
        self.max_hosts = max;
        self
    }

    /// How many distinct tenants get their own label value; later ones share `"_other"`.
    /// Default is 100.
    pub fn max_tenants(mut self, max: usize) -> Self {
        self.max_tenants = max;
        self
    }

    /// How many of the most recent request latencies the p50 / p99 SLIs are computed over;
    /// `0` turns the sample off (percentiles stay `0.0`). Default is 10 000.
    pub fn latency_window(mut self, len: usize) -> Self {
        self.latency_window = len;
        self
    }

    /// Counts the calls answered by the interceptor named `name` (its
    /// [`Interceptor::name`](soulbase_net_core::Interceptor::name)) as duplicates dropped, in
    /// [`Slis::dup_drop_rate`], besides `IdempotencyKey`'s (`"idempotency_key"`), which always
    /// are. For a service with a dedup interceptor of its own.
    pub fn dedup_by(mut self, name: &'static str) -> Self {
        if !self.dedup_by.contains(&name) {
            self.dedup_by.push(name);
        }
        self
    }

    /// Registers the metrics in `registry` (which may already hold the service's own metrics)
    /// instead of a new empty one, so that one exposition carries both. Default is a new
    /// registry.
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Builds the metrics and registers them. Every setting is valid, so this cannot fail.
    pub fn build(self) -> Metrics {
        let mut registry = self.registry.unwrap_or_default();
        let sli = Arc::new(SliState::new(self.latency_window));
        let hosts = Arc::new(LabelCap::new(self.max_hosts));
        let tenants = Arc::new(LabelCap::new(self.max_tenants));
        let gauges = Arc::new(GaugeState::new(hosts.clone(), tenants.clone()));
        let metrics = Metrics {
            hosts,
            tenants,
            keys: LabelCap::new(self.max_hosts),
            rules: LabelCap::new(MAX_RULES),
            no_tenant: Label::new(""),
            requests: Family::default(),
            latency: Family::default(),
            bytes: Family::default(),
            retries: Family::default(),
            hedges: Family::default(),
            answered: Family::default(),
            dedup_drops: Counter::default(),
            store_errors: Family::default(),
            outbox_delivered: Counter::default(),
            outbox_retried: Counter::default(),
            outbox_dead: Counter::default(),
            outbox_lateness: Latency::default(),
            dedup_by: self.dedup_by,
            circuit_open: Family::default(),
            breaker_state: Family::default(),
            breaker_share: Arc::new(BreakerShare::new(self.max_hosts)),
            breaker_rejected: Family::default(),
            redirects: Family::default(),
            rate_limited: Family::default(),
            budget_exhausted: Family::default(),
            resent: Family::default(),
            retired: Family::default(),
            blocked: Family::default(),
            timeouts: Family::default(),
            dns: Family::default(),
            sli: Arc::clone(&sli),
            gauges: Arc::clone(&gauges),
            registry: Registry::default(),
            owner: hot::next_owner(),
            total_ms: OnceLock::new(),
            ttfb_ms: OnceLock::new(),
            connect_ms: OnceLock::new(),
        };
        let r = &mut registry;
        // Families are handles on shared state: the registry gets clones.
        r.register(
            "net_requests",
            "Requests finished",
            metrics.requests.clone(),
        );
        r.register(
            "net_latency_ms",
            "Latency by phase, in milliseconds",
            metrics.latency.clone(),
        );
        r.register("net_bytes", "Bytes on the wire", metrics.bytes.clone());
        r.register(
            "net_retry",
            "Retries scheduled, by the failed attempt's outcome",
            metrics.retries.clone(),
        );
        r.register("net_hedge", "Hedged copies started", metrics.hedges.clone());
        r.register(
            "net_outbox_delivered",
            "Outbox items delivered and acknowledged",
            metrics.outbox_delivered.clone(),
        );
        r.register(
            "net_outbox_retried",
            "Outbox deliveries that failed and were rescheduled",
            metrics.outbox_retried.clone(),
        );
        r.register(
            "net_outbox_dead",
            "Outbox items moved to the dead letters",
            metrics.outbox_dead.clone(),
        );
        r.register(
            "net_outbox_lateness_ms",
            "How late outbox deliveries went out (actual - deliver_at)",
            metrics.outbox_lateness.clone(),
        );
        r.register(
            "net_store_errors",
            "Shared-store calls that failed, timed out or were skipped, by store and operation",
            metrics.store_errors.clone(),
        );
        r.register(
            "net_answered",
            "Calls an interceptor answered without sending, by interceptor",
            metrics.answered.clone(),
        );
        r.register(
            "net_dedup_drops",
            "Duplicate calls dropped by a dedup window (IdempotencyKey's, or a dedup_by interceptor's)",
            metrics.dedup_drops.clone(),
        );
        r.register(
            "net_circuit_open",
            "Circuit breakers that opened",
            metrics.circuit_open.clone(),
        );
        r.register(
            "net_breaker_state",
            "Breaker state: 0 closed, 1 half-open, 2 open",
            metrics.breaker_state.clone(),
        );
        r.register(
            "net_breaker_rejected",
            "Calls refused by an open breaker",
            metrics.breaker_rejected.clone(),
        );
        r.register(
            "net_redirect",
            "Redirects followed",
            metrics.redirects.clone(),
        );
        r.register(
            "net_rate_limited",
            "Calls refused or delayed by a limit",
            metrics.rate_limited.clone(),
        );
        r.register(
            "net_retry_budget_exhausted",
            "Retries refused by the retry budget",
            metrics.budget_exhausted.clone(),
        );
        r.register(
            "net_pool_retired",
            "Connections the pool retired: GOAWAY, a DNS move, the idle budget",
            metrics.retired.clone(),
        );
        r.register(
            "net_resent",
            "Requests the server did not process (GOAWAY, refused stream), sent again",
            metrics.resent.clone(),
        );
        r.register(
            "net_blocked",
            "Destinations refused by the address guard or allow-list",
            metrics.blocked.clone(),
        );
        r.register(
            "net_timeouts",
            "Timeouts fired, by phase",
            metrics.timeouts.clone(),
        );
        r.register(
            "net_dns_lookups",
            "Host names resolved, by answer source",
            metrics.dns.clone(),
        );
        r.register_collector(Box::new(SliCollector(sli)));
        r.register_collector(Box::new(BreakerCollector(metrics.breaker_share.clone())));
        r.register_collector(Box::new(GaugeCollector(gauges)));
        Metrics {
            registry,
            ..metrics
        }
    }
}

// === impl Metrics ===

impl Metrics {
    /// Metrics with the default settings of [`MetricsBuilder`] in a registry of their own.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder; see its setters for the defaults.
    pub fn builder() -> MetricsBuilder {
        MetricsBuilder {
            max_hosts: 1_000,
            max_tenants: 100,
            latency_window: 10_000,
            dedup_by: vec![IDEMPOTENCY_KEY],
            registry: None,
        }
    }

    /// The registry holding these metrics (and whatever it held before
    /// [`MetricsBuilder::registry`]).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The registry in the OpenMetrics text format (the Prometheus scrape format), ending in
    /// `# EOF`.
    ///
    /// Empty if a metric fails to encode, which only a collector the caller registered in the
    /// registry given to [`MetricsBuilder::registry`] can do.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail, and no metric of ours returns an error.
        if encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }

    /// The `Content-Type` that [`encode`](Self::encode)'s text needs on a scrape response:
    /// the OpenMetrics text format, version 1.0.0. (Prometheus reads it; served as
    /// `text/plain`, the `# EOF` line and exemplars would be misread.)
    pub const CONTENT_TYPE: &'static str =
        "application/openmetrics-text; version=1.0.0; charset=utf-8";

    /// A whole answer for a `/metrics` endpoint: status 200, `Content-Type`
    /// [`CONTENT_TYPE`](Self::CONTENT_TYPE), and [`encode`](Self::encode)'s text as the body.
    /// An `http::Response<String>` is what axum, hyper and tower-http serve as it is.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_core::http::{header::CONTENT_TYPE, StatusCode};
    /// use soulbase_net_observe::Metrics;
    ///
    /// let metrics = Metrics::new();
    /// // e.g. axum: `.route("/metrics", get(move || async move { metrics.http_response() }))`
    /// let res = metrics.http_response();
    /// assert_eq!(res.status(), StatusCode::OK);
    /// assert_eq!(res.headers()[CONTENT_TYPE], Metrics::CONTENT_TYPE);
    /// assert!(res.body().ends_with("# EOF\n"));
    /// ```
    pub fn http_response(&self) -> soulbase_net_core::http::Response<String> {
        let mut res = soulbase_net_core::http::Response::new(self.encode());
        res.headers_mut().insert(
            soulbase_net_core::http::header::CONTENT_TYPE,
            soulbase_net_core::http::HeaderValue::from_static(Self::CONTENT_TYPE),
        );
        res
    }

    /// The SLIs as of now: retry, timeout, error, dedup drop and hedge rates, p50 / p99.
    pub fn slis(&self) -> Slis {
        self.sli.snapshot()
    }

    fn host(&self, req: &RequestInfo<'_>) -> Label {
        self.hosts.admit(req.host)
    }

    fn tenant(&self, req: &RequestInfo<'_>) -> Label {
        req.tenant
            .map_or_else(|| self.no_tenant.clone(), |t| self.tenants.admit(t))
    }

    /// Observes `d` in the `net_latency_ms` series of `phase`.
    fn observe_ms(&self, phase: LatencyPhase, d: Duration) {
        let (memo, phase) = match phase {
            LatencyPhase::Total => (&self.total_ms, "total"),
            LatencyPhase::Ttfb => (&self.ttfb_ms, "ttfb"),
            LatencyPhase::Connect => (&self.connect_ms, "connect"),
        };
        memo.get_or_init(|| self.latency.get_or_create(&PhaseLabels { phase }).clone())
            .observe(d);
    }

    fn on_finished(
        &self,
        req: &RequestInfo<'_>,
        outcome: &Outcome,
        total: Duration,
        version: Option<soulbase_net_core::http::Version>,
    ) {
        let (method, scheme, outcome_label, version) = (
            method_label(req.method),
            scheme_label(req.scheme),
            outcome.label(),
            version_label(version),
        );
        let key = hot::Key {
            owner: self.owner,
            family: "requests",
            host: req.host,
            tenant: req.tenant,
            rest: [method, scheme, outcome_label, version],
        };
        hot::inc_by(key, 1, || {
            let labels = RequestLabels {
                tenant: self.tenant(req),
                host: self.host(req),
                method,
                scheme,
                outcome: outcome_label,
                version,
            };
            self.requests.get_or_create(&labels).clone()
        });
        self.observe_ms(LatencyPhase::Total, total);
        self.sli.on_finished(outcome, total.as_secs_f64() * 1000.0);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("slis", &self.slis())
            .finish_non_exhaustive()
    }
}

impl Observer for Metrics {
    fn on_gauges(&self, source: &Arc<dyn GaugeSource>) {
        self.gauges.attach(source);
    }

    /// None of the events that only say something starts: no metric counts them (a hedge's
    /// start, counted in `net_hedge_total`, comes anyway).
    fn takes(&self) -> Takes {
        Takes::NONE
    }

    fn on_event(&self, event: &NetEvent<'_>) {
        match *event {
            NetEvent::RequestFinished {
                req,
                outcome,
                elapsed,
                version,
                ..
            } => {
                self.on_finished(&req, &outcome, elapsed.total(), version);
            }
            NetEvent::AttemptStarted {
                req, hedge: true, ..
            } => {
                self.hedges
                    .get_or_create(&HostLabels {
                        host: self.host(&req),
                    })
                    .inc();
                self.sli.on_hedge();
            }
            NetEvent::Outbox { step, lateness } => match step {
                OutboxStep::Delivered => {
                    self.outbox_delivered.inc();
                    if let Some(late) = lateness {
                        self.outbox_lateness.observe(late);
                    }
                }
                OutboxStep::Retried => {
                    self.outbox_retried.inc();
                }
                OutboxStep::Dead => {
                    self.outbox_dead.inc();
                }
                _ => {}
            },
            NetEvent::StoreError { store, op, .. } => {
                self.store_errors
                    .get_or_create(&StoreLabels { store, op })
                    .inc();
            }
            NetEvent::Answered { by, .. } => {
                self.answered.get_or_create(&ByLabels { by }).inc();
                if self.dedup_by.contains(&by) {
                    self.dedup_drops.inc();
                    self.sli.on_dedup_drop();
                }
            }
            NetEvent::AttemptFinished {
                outcome, elapsed, ..
            } => {
                // A pooled connection reports zero connect time: not a connect latency.
                if !elapsed.connect().is_zero() {
                    self.observe_ms(LatencyPhase::Connect, elapsed.connect());
                }
                if matches!(outcome, Outcome::Response(_)) {
                    self.observe_ms(LatencyPhase::Ttfb, elapsed.ttfb());
                }
            }
            NetEvent::Bytes { req, dir, bytes } => {
                let key = hot::Key {
                    owner: self.owner,
                    family: "bytes",
                    host: req.host,
                    tenant: req.tenant,
                    rest: [dir.as_str(), "", "", ""],
                };
                hot::inc_by(key, bytes, || {
                    let labels = BytesLabels {
                        dir: dir.as_str(),
                        tenant: self.tenant(&req),
                        host: self.host(&req),
                    };
                    self.bytes.get_or_create(&labels).clone()
                });
            }
            NetEvent::RetryScheduled { reason, .. } => {
                self.retries
                    .get_or_create(&ReasonLabels {
                        reason: reason.label(),
                    })
                    .inc();
                self.sli.on_retry();
            }
            NetEvent::BreakerTransition { key, to, .. } => {
                self.breaker_share.on_transition(key, to, &self.hosts);
                if to == BreakerState::Open {
                    // The key is an origin (`https://h`, `http://h:8081`): the label is its
                    // host as the other families name it, with the port when it is not the
                    // scheme's default.
                    let host = key.split_once("://").map_or(key, |(_, rest)| rest);
                    self.circuit_open
                        .get_or_create(&HostLabels {
                            host: self.keys.admit(host),
                        })
                        .inc();
                }
                let key = self.keys.admit(key);
                self.breaker_state
                    .get_or_create(&KeyLabels { key })
                    .set(breaker_value(to));
            }
            NetEvent::BreakerRejected { req } => {
                self.breaker_rejected
                    .get_or_create(&HostLabels {
                        host: self.host(&req),
                    })
                    .inc();
            }
            NetEvent::Redirected { req, .. } => {
                self.redirects
                    .get_or_create(&HostLabels {
                        host: self.host(&req),
                    })
                    .inc();
            }
            NetEvent::RateLimited { req, scope } => {
                let labels = LimitLabels {
                    host: self.host(&req),
                    scope: scope_label(scope),
                };
                self.rate_limited.get_or_create(&labels).inc();
            }
            NetEvent::ConnectionRetired { reason, .. } => {
                self.retired
                    .get_or_create(&ReasonLabels {
                        reason: reason.as_str(),
                    })
                    .inc();
            }
            NetEvent::Resent { req, .. } => {
                self.resent
                    .get_or_create(&HostLabels {
                        host: self.host(&req),
                    })
                    .inc();
            }
            NetEvent::RetryBudgetExhausted { req, .. } => {
                self.budget_exhausted
                    .get_or_create(&HostLabels {
                        host: self.host(&req),
                    })
                    .inc();
            }
            NetEvent::Blocked { rule, .. } => {
                self.blocked
                    .get_or_create(&RuleLabels {
                        rule: self.rules.admit(rule),
                    })
                    .inc();
            }
            NetEvent::TimedOut { phase, .. } => {
                self.timeouts
                    .get_or_create(&PhaseLabels {
                        phase: phase.as_str(),
                    })
                    .inc();
            }
            NetEvent::DnsResolved { source, .. } => {
                self.dns
                    .get_or_create(&SourceLabels {
                        source: source_label(source),
                    })
                    .inc();
            }
            _ => {}
        }
    }
}

fn breaker_value(state: BreakerState) -> i64 {
    match state {
        BreakerState::Closed => 0,
        BreakerState::HalfOpen => 1,
        BreakerState::Open => 2,
    }
}

fn scope_label(scope: LimitScope) -> &'static str {
    match scope {
        LimitScope::HostConcurrency => "host_concurrency",
        LimitScope::TenantConcurrency => "tenant_concurrency",
        LimitScope::HostRate => "host_rate",
        LimitScope::Adaptive => "adaptive",
        LimitScope::Quota => "quota",
        LimitScope::GlobalRate => "global_rate",
        LimitScope::ClientConcurrency => "client_concurrency",
        _ => OTHER,
    }
}

fn source_label(source: DnsSource) -> &'static str {
    match source {
        DnsSource::Lookup => "lookup",
        DnsSource::Cache => "cache",
        DnsSource::Stale => "stale",
        DnsSource::Static => "static",
        DnsSource::Literal => "literal",
        _ => OTHER,
    }
}
