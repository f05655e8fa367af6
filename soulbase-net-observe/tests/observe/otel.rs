//! OpenTelemetry (feature `otel`), through a real client with TraceUa over loopback: the
//! client's spans exported by `otel::layer` into the SDK's in-memory exporter, and the
//! `traceparent` the upstream received, compared with them.

use std::sync::Arc;

use opentelemetry::{
    trace::{SpanId, SpanKind, Status, TraceId, TracerProvider as _},
    Value,
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, Sampler, SdkTracerProvider, SpanData};
use soulbase_net_core::{http::HeaderMap, NetRequest};
use soulbase_net_interceptors::TraceUa;
use soulbase_net_observe::{otel, TracingObserver};
use soulbase_net_policy::NetPolicy;
use soulbase_net_testkit::{FaultServer, Reply, Script};
use tracing::{subscriber::DefaultGuard, Instrument};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

const INBOUND_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const INBOUND_PARENT: &str = "00f067aa0ba902b7";

/// Spans exported in memory, from a subscriber that is the default on this thread (the
/// tests run on a current-thread runtime, the server's tasks included).
struct Exported {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
    _default: DefaultGuard,
}

impl Exported {
    fn install(sampler: Sampler) -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_sampler(sampler)
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber =
            tracing_subscriber::registry().with(otel::layer(provider.tracer("observe-test")));
        let default = tracing::subscriber::set_default(subscriber);
        Exported {
            exporter,
            provider,
            _default: default,
        }
    }

    fn spans(&self) -> Vec<SpanData> {
        self.provider.force_flush().unwrap();
        self.exporter.get_finished_spans().unwrap()
    }
}

/// A FaultServer on loopback answering `path` by `script`.
async fn serve(path: &str, script: impl Into<Script>) -> FaultServer {
    FaultServer::http1()
        .route(path, script)
        .start()
        .await
        .unwrap()
}

/// A client with TraceUa that may reach loopback only (and never the system resolver).
fn client() -> soulbase_net_runtime::Client {
    client_with(|_| {})
}

fn client_with(edit: impl FnOnce(&mut NetPolicy)) -> soulbase_net_runtime::Client {
    let mut policy = NetPolicy::default();
    policy.security.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    policy.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    edit(&mut policy);
    soulbase_net_runtime::Client::builder()
        .policy(policy)
        .interceptors(vec![Arc::new(TraceUa::new())])
        .observer(TracingObserver::new())
        .build()
        .unwrap()
}

/// The span of an inbound request whose `traceparent` names `flags`.
fn inbound_span(flags: &str) -> tracing::Span {
    let mut headers = HeaderMap::new();
    let traceparent = format!("00-{INBOUND_TRACE}-{INBOUND_PARENT}-{flags}");
    headers.insert("traceparent", traceparent.parse().unwrap());
    let span = tracing::info_span!("inbound", otel.kind = "server");
    span.set_parent(otel::inbound_context(&headers)).unwrap();
    span
}

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn text(span: &SpanData, key: &str) -> String {
    match attr(span, key) {
        Some(value) => value.as_str().into_owned(),
        None => panic!("no {key} on {span:#?}"),
    }
}

fn int(span: &SpanData, key: &str) -> i64 {
    match attr(span, key) {
        Some(Value::I64(n)) => *n,
        other => panic!("{key} is {other:?} on {span:#?}"),
    }
}

/// The W3C parts of a `traceparent`: trace id, parent span id, flags.
fn parts(traceparent: &str) -> (TraceId, SpanId, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!((p.len(), p[0]), (4, "00"), "{traceparent}");
    (
        TraceId::from_hex(p[1]).unwrap(),
        SpanId::from_hex(p[2]).unwrap(),
        p[3].to_owned(),
    )
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_continues_the_inbound_trace_as_one_tree() {
    let exported = Exported::install(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
    let srv = serve("/r", Script::status(503).times(1).then(Reply::ok("ok"))).await;
    let client = client();
    let inbound = inbound_span("01");
    let url = format!("{}?sig=s3cret&user=grace-hopper", srv.url("/r"));
    let res = client
        .send(NetRequest::get(url))
        .instrument(inbound.clone())
        .await
        .unwrap();
    assert_eq!(res.status, 200);
    drop(inbound);

    let spans = exported.spans();
    let trace = TraceId::from_hex(INBOUND_TRACE).unwrap();
    assert!(
        spans.iter().all(|s| s.span_context.trace_id() == trace),
        "one trace: {spans:#?}"
    );
    let inbound = spans.iter().find(|s| s.name == "inbound").unwrap();
    assert_eq!(
        inbound.parent_span_id,
        SpanId::from_hex(INBOUND_PARENT).unwrap()
    );
    assert!(inbound.parent_span_is_remote);

    // The call: the logical span, a child of the inbound request's.
    let calls: Vec<_> = spans
        .iter()
        .filter(|s| s.span_kind == SpanKind::Internal)
        .collect();
    assert_eq!(calls.len(), 1, "{spans:#?}");
    let call = calls[0];
    assert_eq!(call.name, "GET");
    assert_eq!(call.parent_span_id, inbound.span_context.span_id());
    assert_eq!(text(call, "http.request.method"), "GET");
    assert_eq!(text(call, "server.address"), "127.0.0.1");
    assert_eq!(int(call, "server.port"), i64::from(srv.addr().port()));
    assert_eq!(text(call, "url.full"), srv.url("/r"));
    assert_eq!(int(call, "http.response.status_code"), 200);
    assert_eq!(int(call, "http.request.resend_count"), 1);
    assert!(attr(call, "error.type").is_none());
    assert_eq!(call.status, Status::Unset);
    // TracingObserver's events are the call's span events, their numbers integers.
    let retry = call
        .events
        .iter()
        .find(|e| e.name == "retry scheduled")
        .unwrap_or_else(|| panic!("{call:#?}"));
    let event_attr = |key: &str| {
        retry
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
    };
    assert_eq!(event_attr("attempt"), Some(Value::I64(1)));
    assert!(matches!(event_attr("delay_ms"), Some(Value::I64(_))));
    assert_eq!(event_attr("reason"), Some(Value::from("status_5xx")));

    // The attempts: CLIENT spans, children of the call, in the order they were made.
    let mut attempts: Vec<_> = spans
        .iter()
        .filter(|s| s.span_kind == SpanKind::Client)
        .collect();
    attempts.sort_by_key(|s| int(s, "attempt"));
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    for a in &attempts {
        assert_eq!(a.name, "GET");
        assert_eq!(a.parent_span_id, call.span_context.span_id());
        assert_eq!(text(a, "http.request.method"), "GET");
        assert_eq!(text(a, "server.address"), "127.0.0.1");
        assert_eq!(int(a, "server.port"), i64::from(srv.addr().port()));
        assert_eq!(text(a, "url.full"), srv.url("/r"));
    }
    assert_eq!(int(attempts[0], "http.response.status_code"), 503);
    assert_eq!(text(attempts[0], "error.type"), "503");
    assert!(matches!(attempts[0].status, Status::Error { .. }));
    assert!(attr(attempts[0], "http.request.resend_count").is_none());
    assert_eq!(int(attempts[1], "http.response.status_code"), 200);
    assert_eq!(int(attempts[1], "http.request.resend_count"), 1);
    assert_eq!(attempts[1].status, Status::Unset);

    // No secret of the URL in any attribute of any span.
    for s in &spans {
        for kv in &s.attributes {
            let value = kv.value.as_str();
            assert!(
                !value.contains("s3cret") && !value.contains("grace-hopper"),
                "{}={value}",
                kv.key
            );
        }
    }

    // What the upstream saw: each attempt's own span as the parent, in the inbound trace.
    let sent = srv.requests("/r");
    assert_eq!(sent.len(), 2);
    for (request, attempt) in sent.iter().zip(&attempts) {
        let (trace_id, parent, flags) = parts(request.header("traceparent").unwrap());
        assert_eq!(trace_id, trace);
        assert_eq!(parent, attempt.span_context.span_id());
        assert_eq!(flags, "01");
    }
    srv.join().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_call_ends_in_error_with_its_type() {
    let exported = Exported::install(Sampler::AlwaysOn);
    let srv = FaultServer::http1()
        .route("/gone", Reply::status(404))
        .route("/reset", Reply::reset())
        .start()
        .await
        .unwrap();
    let client = client_with(|p| p.retry.max_attempts = 1);
    let res = client
        .send(NetRequest::get(srv.url("/gone")))
        .instrument(inbound_span("01"))
        .await
        .unwrap();
    assert_eq!(res.status, 404);
    // A connection reset before any answer: no status, the error kind as the type.
    let err = client
        .send(NetRequest::get(srv.url("/reset")))
        .instrument(inbound_span("01"))
        .await
        .unwrap_err();

    let spans = exported.spans();
    for kind in [SpanKind::Internal, SpanKind::Client] {
        let of_kind: Vec<_> = spans.iter().filter(|s| s.span_kind == kind).collect();
        assert_eq!(of_kind.len(), 2, "{spans:#?}");
        let (gone, reset) = (of_kind[0], of_kind[1]);
        assert_eq!(int(gone, "http.response.status_code"), 404);
        assert_eq!(text(gone, "error.type"), "404");
        assert!(matches!(gone.status, Status::Error { .. }));
        assert_eq!(text(reset, "error.type"), err.kind().label());
        assert!(attr(reset, "http.response.status_code").is_none());
        assert!(matches!(reset.status, Status::Error { .. }));
    }
    srv.join().await;
}

#[tokio::test(flavor = "current_thread")]
async fn without_an_inbound_span_each_call_is_a_trace_of_its_own() {
    let exported = Exported::install(Sampler::AlwaysOn);
    let srv = serve("/r", Reply::ok("ok")).await;
    let client = client();
    for _ in 0..2 {
        client.send(NetRequest::get(srv.url("/r"))).await.unwrap();
    }
    let spans = exported.spans();
    let sent = srv.requests("/r");
    let mut traces = Vec::new();
    for (request, kind) in sent.iter().zip([0, 1]) {
        let (trace_id, parent, flags) = parts(request.header("traceparent").unwrap());
        assert_eq!(flags, "01");
        // The span the upstream names is an exported attempt of that trace, whose call
        // is a root span.
        let attempt = spans
            .iter()
            .find(|s| s.span_context.span_id() == parent)
            .unwrap_or_else(|| panic!("call {kind}: no exported span {parent}: {spans:#?}"));
        assert_eq!(attempt.span_kind, SpanKind::Client);
        assert_eq!(attempt.span_context.trace_id(), trace_id);
        let call = spans
            .iter()
            .find(|s| s.span_context.span_id() == attempt.parent_span_id)
            .unwrap();
        assert_eq!(call.span_kind, SpanKind::Internal);
        assert_eq!(call.parent_span_id, SpanId::INVALID);
        traces.push(trace_id);
    }
    assert_ne!(traces[0], traces[1], "a new trace per call");
    srv.join().await;
}

#[tokio::test(flavor = "current_thread")]
async fn an_unsampled_inbound_trace_is_continued_unsampled() {
    let exported = Exported::install(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
    let srv = serve("/r", Reply::ok("ok")).await;
    client()
        .send(NetRequest::get(srv.url("/r")))
        .instrument(inbound_span("00"))
        .await
        .unwrap();
    // The caller decided not to sample: nothing is exported, and the upstream is told so,
    // in the same trace.
    assert!(exported.spans().is_empty());
    let sent = srv.requests("/r");
    let (trace_id, parent, flags) = parts(sent[0].header("traceparent").unwrap());
    assert_eq!(trace_id, TraceId::from_hex(INBOUND_TRACE).unwrap());
    assert_ne!(parent, SpanId::from_hex(INBOUND_PARENT).unwrap());
    assert_eq!(flags, "00");
    srv.join().await;
}

#[tokio::test(flavor = "current_thread")]
async fn without_opentelemetry_trace_ua_starts_a_fresh_trace() {
    // A subscriber with no OpenTelemetry layer, and a span: no OpenTelemetry context.
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry());
    let srv = serve("/r", Script::status(503).times(1).then(Reply::ok("ok"))).await;
    let client = client();
    for _ in 0..2 {
        client
            .send(NetRequest::get(srv.url("/r")))
            .instrument(tracing::info_span!("inbound"))
            .await
            .unwrap();
    }
    let sent = srv.requests("/r");
    assert_eq!(sent.len(), 3, "503 then 200, then 200");
    let tp: Vec<_> = sent
        .iter()
        .map(|r| parts(r.header("traceparent").unwrap()))
        .collect();
    // The first call's two attempts: one new trace, a span id of their own each.
    assert_eq!(tp[0].0, tp[1].0);
    assert_ne!(tp[0].1, tp[1].1);
    // The second call: another new trace. All sampled, none of them the zero id.
    assert_ne!(tp[2].0, tp[0].0);
    for (trace_id, parent, flags) in &tp {
        assert_ne!(*trace_id, TraceId::INVALID);
        assert_ne!(*parent, SpanId::INVALID);
        assert_eq!(flags, "01");
    }
    srv.join().await;
}
