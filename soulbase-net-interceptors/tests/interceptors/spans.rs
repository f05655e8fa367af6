//! The client's spans, seen by a real subscriber around a real call: the call runs inside
//! `http.client.request` (so logs from interceptors and observers are its children), each
//! attempt (and its `on_attempt` hooks) inside `http.client.attempt`, with OpenTelemetry field
//! names, and the span carries the trace id of the `traceparent` TraceUa sent.

use std::{
    cell::RefCell,
    collections::HashMap,
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use parking_lot::Mutex;
use soulbase_net_core::{Interceptor, NetRequest, NetResponse};
use soulbase_net_interceptors::TraceUa;
use soulbase_net_testkit::{FaultServer, Reply, Script};
use tracing::{
    field::{Field, Visit},
    span::{Attributes, Id, Record},
    Event, Instrument, Metadata, Subscriber,
};

#[derive(Clone, Debug, Default)]
struct SpanRec {
    id: u64,
    name: &'static str,
    meta: Option<&'static Metadata<'static>>,
    parent: Option<u64>,
    fields: HashMap<String, String>,
}

#[derive(Clone, Debug)]
struct EventRec {
    parent: Option<u64>,
    fields: HashMap<String, String>,
}

/// Records spans (with their contextual parent) and events (with the span they were in).
#[derive(Clone, Default)]
struct Capture {
    next: Arc<AtomicU64>,
    spans: Arc<Mutex<Vec<SpanRec>>>,
    events: Arc<Mutex<Vec<EventRec>>>,
}

thread_local! {
    /// The spans entered on this thread, innermost last (the test runs on one thread).
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

fn current() -> Option<u64> {
    STACK.with(|s| s.borrow().last().copied())
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let parent = if attrs.is_contextual() {
            current()
        } else {
            attrs.parent().map(Id::into_u64)
        };
        let mut rec = SpanRec {
            id,
            name: attrs.metadata().name(),
            meta: Some(attrs.metadata()),
            parent,
            fields: HashMap::new(),
        };
        attrs.record(&mut Fields(&mut rec.fields));
        self.spans.lock().push(rec);
        Id::from_u64(id)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some(s) = self
            .spans
            .lock()
            .iter_mut()
            .find(|s| s.id == span.into_u64())
        {
            values.record(&mut Fields(&mut s.fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let parent = if event.is_contextual() {
            current()
        } else {
            event.parent().map(Id::into_u64)
        };
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        self.events.lock().push(EventRec { parent, fields });
    }
    fn current_span(&self) -> tracing_core::span::Current {
        let meta = current().and_then(|id| {
            let spans = self.spans.lock();
            spans
                .iter()
                .find(|s| s.id == id)
                .and_then(|s| s.meta.map(|m| (id, m)))
        });
        match meta {
            Some((id, meta)) => tracing_core::span::Current::new(Id::from_u64(id), meta),
            None => tracing_core::span::Current::none(),
        }
    }
    fn enter(&self, span: &Id) {
        STACK.with(|s| s.borrow_mut().push(span.into_u64()));
    }
    fn exit(&self, span: &Id) {
        STACK.with(|s| {
            let mut s = s.borrow_mut();
            if let Some(i) = s.iter().rposition(|id| *id == span.into_u64()) {
                s.remove(i);
            }
        });
    }
}

/// Logs from inside the call, as any interceptor might.
#[derive(Debug)]
struct Logs;

#[async_trait::async_trait]
impl Interceptor for Logs {
    async fn before(&self, _req: &mut NetRequest) -> Result<(), soulbase_net_core::NetError> {
        tracing::info!(marker = "before", "from an interceptor");
        Ok(())
    }
    async fn after(
        &self,
        _req: &NetRequest,
        _res: &mut NetResponse,
    ) -> Result<(), soulbase_net_core::NetError> {
        tracing::info!(marker = "after", "from an interceptor");
        Ok(())
    }
    fn on_attempt(&self, _req: &mut NetRequest, attempt: u32) {
        tracing::info!(marker = "on_attempt", attempt, "from an interceptor");
    }
    fn hooks(&self) -> soulbase_net_core::Hooks {
        use soulbase_net_core::Hooks;
        Hooks::BEFORE | Hooks::AFTER | Hooks::ON_ATTEMPT
    }
    fn name(&self) -> &'static str {
        "logs"
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_runs_inside_its_span_with_the_trace_it_sends() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    let srv = FaultServer::http1()
        .route("/r", Script::status(503).times(1).then(Reply::ok("ok")))
        .start()
        .await
        .unwrap();
    let client = soulbase_net_runtime::Client::builder()
        .policy(crate::support::loopback_policy())
        .interceptors(vec![Arc::new(TraceUa::new()), Arc::new(Logs)])
        .observer(Arc::new(soulbase_net_observe::TracingObserver::new()))
        .build()
        .unwrap();
    // The caller's own work runs in its span (an inbound request's, say).
    let res = client
        .send(NetRequest::get(srv.url("/r")))
        .instrument(tracing::info_span!("inbound"))
        .await
        .unwrap();
    assert_eq!(res.status, 200);

    let spans = capture.spans.lock().clone();
    let outer_id = spans.iter().find(|s| s.name == "inbound").unwrap().id;
    let calls: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "http.client.request")
        .collect();
    assert_eq!(calls.len(), 1, "{spans:?}");
    let call = calls[0];
    assert_eq!(call.parent, Some(outer_id), "a child of the caller's span");
    let f = &call.fields;
    // Exported through OpenTelemetry, the call is the logical (INTERNAL) span and ends in
    // error only when the call does.
    assert_eq!(f["otel.kind"], "internal");
    assert_eq!(f["otel.name"], "GET");
    assert!(!f.contains_key("otel.status_code"), "{f:?}");
    assert_eq!(f["http.request.method"], "GET");
    assert_eq!(f["server.address"], "127.0.0.1");
    assert_eq!(f["server.port"], srv.addr().port().to_string());
    assert_eq!(f["url.full"], srv.url("/r"));
    assert_eq!(f["http.response.status_code"], "200");
    assert_eq!(f["http.request.resend_count"], "1");
    // The trace the upstream saw is the span's.
    let sent = srv.requests("/r");
    let traceparent = sent[1].header("traceparent").unwrap();
    let trace_id = traceparent.split('-').nth(1).unwrap();
    assert_eq!(f["trace_id"], trace_id);
    assert_eq!(
        sent[0].header("traceparent").unwrap().split('-').nth(1),
        Some(trace_id),
        "one trace for both attempts"
    );
    // Two attempts, children of the call.
    let attempts: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "http.client.attempt")
        .collect();
    assert_eq!(attempts.len(), 2);
    assert!(attempts.iter().all(|a| a.parent == Some(call.id)));
    // Each attempt is a CLIENT span with the HTTP client attributes of its own request.
    for a in &attempts {
        let f = &a.fields;
        assert_eq!(f["otel.kind"], "client");
        assert_eq!(f["otel.name"], "GET");
        assert_eq!(f["http.request.method"], "GET");
        assert_eq!(f["server.address"], "127.0.0.1");
        assert_eq!(f["server.port"], srv.addr().port().to_string());
        assert_eq!(f["url.full"], srv.url("/r"));
    }
    assert_eq!(attempts[0].fields["http.response.status_code"], "503");
    assert_eq!(attempts[0].fields["error.type"], "503");
    assert_eq!(attempts[0].fields["otel.status_code"], "error");
    assert!(!attempts[0].fields.contains_key("http.request.resend_count"));
    assert_eq!(attempts[1].fields["http.response.status_code"], "200");
    assert_eq!(attempts[1].fields["http.request.resend_count"], "1");
    assert!(!attempts[1].fields.contains_key("otel.status_code"));
    // Logs from interceptors and the observer's events are the call's.
    let events = capture.events.lock().clone();
    let in_call = |marker: &str| {
        events
            .iter()
            .find(|e| e.fields.get("marker").map(String::as_str) == Some(marker))
            .map(|e| e.parent)
    };
    assert_eq!(in_call("before"), Some(Some(call.id)));
    assert_eq!(in_call("after"), Some(Some(call.id)));
    // `on_attempt` runs inside the attempt's own span.
    let on_attempt: Vec<_> = events
        .iter()
        .filter(|e| e.fields.get("marker").map(String::as_str) == Some("on_attempt"))
        .map(|e| e.parent)
        .collect();
    assert_eq!(on_attempt, vec![Some(attempts[0].id), Some(attempts[1].id)]);
    let retry = events
        .iter()
        .find(|e| e.fields.get("message").map(String::as_str) == Some("retry scheduled"))
        .unwrap();
    assert_eq!(retry.parent, Some(call.id), "{events:?}");
    srv.join().await;
}
