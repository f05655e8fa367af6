//! The current span's OpenTelemetry context as a `traceparent` (feature `otel`).

use opentelemetry::{
    trace::{SpanContext, TraceContextExt},
    Context,
};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{SPAN_AT, TRACEPARENT_LEN};
use crate::hex;

/// The `traceparent` naming the current span: its trace id, its span id as the parent and
/// its flags (the sampling decision). The current span is the current `tracing` span's
/// OpenTelemetry span (through tracing-opentelemetry's layer), else OpenTelemetry's own
/// current context (a span entered with the OpenTelemetry API). `None` when neither holds a
/// valid span context: no OpenTelemetry layer, or no span.
pub(super) fn current_traceparent() -> Option<[u8; TRACEPARENT_LEN]> {
    let from_tracing = tracing::Span::current().context();
    let span = from_tracing.span();
    if span.span_context().is_valid() {
        return Some(traceparent(span.span_context()));
    }
    Context::map_current(|cx| {
        let span = cx.span();
        let context = span.span_context();
        context.is_valid().then(|| traceparent(context))
    })
}

/// `00-<trace id>-<span id>-<flags>` of a span context.
fn traceparent(context: &SpanContext) -> [u8; TRACEPARENT_LEN] {
    let mut value = [b'-'; TRACEPARENT_LEN];
    value[..2].copy_from_slice(b"00");
    hex::write_hex(&mut value[3..35], &context.trace_id().to_bytes());
    hex::write_hex(
        &mut value[SPAN_AT..SPAN_AT + 16],
        &context.span_id().to_bytes(),
    );
    hex::write_hex(&mut value[53..], &[context.trace_flags().to_u8()]);
    value
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{
        Span as _, SpanId, TraceFlags, TraceId, TraceState, Tracer, TracerProvider,
    };
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use soulbase_net_core::{Interceptor, NetRequest};
    use tracing::Instrument;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::TraceUa;

    const CALLERS: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// What a `traceparent` should be for a span context.
    fn expected(context: &SpanContext) -> String {
        format!("00-{}-{}-01", context.trace_id(), context.span_id())
    }

    #[test]
    fn the_current_tracing_spans_context_comes_first() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("t")));
        let _default = tracing::subscriber::set_default(subscriber);
        let trace = TraceUa::new();
        let call = tracing::info_span!("call");
        // Even a caller's own `traceparent` gives way to the current span's context.
        let mut req = NetRequest::get("http://h.example/").header("traceparent", CALLERS);
        block_on(trace.before(&mut req).instrument(call.clone())).unwrap();
        let call_context = call.context().span().span_context().clone();
        assert!(call_context.is_valid());
        assert_eq!(req.headers["traceparent"], expected(&call_context).as_str());
        // Every attempt, the first included, names its own span as the parent.
        for n in 1..=2 {
            let attempt = call.in_scope(|| tracing::info_span!("attempt"));
            attempt.in_scope(|| trace.on_attempt(&mut req, n));
            let context = attempt.context().span().span_context().clone();
            assert_eq!(context.trace_id(), call_context.trace_id());
            assert_eq!(req.headers["traceparent"], expected(&context).as_str());
        }
    }

    #[test]
    fn opentelemetrys_own_current_span_counts_too() {
        let provider = SdkTracerProvider::builder().build();
        let span = provider.tracer("t").start("op");
        let context = span.span_context().clone();
        let _attached = Context::current_with_span(span).attach();
        let mut req = NetRequest::get("http://h.example/");
        block_on(TraceUa::new().before(&mut req)).unwrap();
        assert_eq!(req.headers["traceparent"], expected(&context).as_str());
    }

    #[test]
    fn formats_a_span_context_as_w3c() {
        let context = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        assert_eq!(
            &traceparent(&context)[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        let unsampled = SpanContext::new(
            context.trace_id(),
            context.span_id(),
            TraceFlags::default(),
            false,
            TraceState::default(),
        );
        assert!(traceparent(&unsampled).ends_with(b"-00"));
    }

    #[test]
    fn no_span_no_traceparent() {
        assert!(current_traceparent().is_none());
    }
}
