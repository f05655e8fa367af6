//! A future run inside a span only when there is one: the call's and each attempt's span is
//! `None` unless a subscriber wants it. `tracing`'s `Instrumented` would enter and leave even
//! `Span::none()` on every poll and again when it is dropped, and with `tracing`'s `log`
//! bridge compiled in, every enter, exit, clone and drop of a disabled span still asks `log`
//! whether it logs (about 25 instructions each, a few hundred per call).

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use tracing::{instrument::Instrumented, Instrument, Span};

pin_project_lite::pin_project! {
    /// `inner` polled as it is, or inside its span (`tracing`'s `Instrumented`, which also
    /// drops it inside the span) when the span is a real one.
    #[project = InSpanProj]
    pub(super) enum InSpan<F> {
        /// No span: nothing to enter.
        Plain { #[pin] inner: F },
        /// A span a subscriber wants.
        Traced { #[pin] inner: Instrumented<F> },
    }
}

/// `future`, run inside `span` when there is one.
pub(super) fn in_span<F: Future>(future: F, span: Option<Span>) -> InSpan<F> {
    match span {
        None => InSpan::Plain { inner: future },
        Some(span) => InSpan::Traced {
            inner: future.instrument(span),
        },
    }
}

/// `f`, run inside `span` when there is one.
pub(super) fn in_scope<T>(span: Option<&Span>, f: impl FnOnce() -> T) -> T {
    match span {
        None => f(),
        Some(span) => span.in_scope(f),
    }
}

impl<F: Future> Future for InSpan<F> {
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        match self.project() {
            InSpanProj::Plain { inner } => inner.poll(cx),
            InSpanProj::Traced { inner } => inner.poll(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_future_runs_inside_a_real_span_and_plainly_without_one() {
        // No subscriber: every span is disabled, so the future runs plain.
        let plain = in_span(async { Span::current().is_none() }, None);
        assert!(matches!(plain, InSpan::Plain { .. }));
        assert!(plain.await);
        // With a subscriber, the span is real and the future sees it as the current one.
        let subscriber = tracing_subscriber::fmt()
            .with_writer(std::io::sink)
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);
        let span = tracing::info_span!("outer");
        let traced = in_span(
            async { Span::current().metadata().map(|m| m.name()) },
            Some(span.clone()),
        );
        assert!(matches!(traced, InSpan::Traced { .. }));
        assert_eq!(traced.await, Some("outer"));
        assert!(in_scope(None, || Span::current().is_none()));
        assert_eq!(
            in_scope(Some(&span), || Span::current().metadata().map(|m| m.name())),
            Some("outer")
        );
    }
}
