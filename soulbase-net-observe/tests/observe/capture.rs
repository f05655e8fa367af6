//! A tiny `tracing::Subscriber` that records spans (name, fields, closed) and events
//! (with the span they were in).

use std::{
    collections::HashMap,
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use parking_lot::Mutex;

thread_local! {
    /// The spans entered on this thread, innermost last.
    static STACK: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}
use tracing::{
    field::{Field, Visit},
    span::{Attributes, Id, Record},
    Event, Metadata, Subscriber,
};

#[derive(Clone, Debug, Default)]
pub(crate) struct SpanRec {
    pub(crate) id: u64,
    pub(crate) name: &'static str,
    pub(crate) fields: HashMap<String, String>,
    pub(crate) refs: usize,
    pub(crate) closed: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct EventRec {
    pub(crate) parent: Option<u64>,
    pub(crate) fields: HashMap<String, String>,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    next: AtomicU64,
    pub(crate) spans: Mutex<Vec<SpanRec>>,
    pub(crate) events: Mutex<Vec<EventRec>>,
}

impl State {
    pub(crate) fn named(&self, name: &str) -> Vec<SpanRec> {
        self.spans
            .lock()
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Capture(pub(crate) Arc<State>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Capture {
    fn with_span(&self, id: &Id, f: impl FnOnce(&mut SpanRec)) {
        let mut spans = self.0.spans.lock();
        if let Some(s) = spans.iter_mut().find(|s| s.id == id.into_u64()) {
            f(s);
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let id = self.0.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut rec = SpanRec {
            id,
            name: attrs.metadata().name(),
            refs: 1,
            ..SpanRec::default()
        };
        attrs.record(&mut Fields(&mut rec.fields));
        self.0.spans.lock().push(rec);
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        self.with_span(span, |s| values.record(&mut Fields(&mut s.fields)));
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let parent = if event.is_contextual() {
            STACK.with(|s| s.borrow().last().copied())
        } else {
            event.parent().map(Id::into_u64)
        };
        let mut rec = EventRec {
            parent,
            fields: HashMap::new(),
        };
        event.record(&mut Fields(&mut rec.fields));
        self.0.events.lock().push(rec);
    }

    fn enter(&self, id: &Id) {
        STACK.with(|s| s.borrow_mut().push(id.into_u64()));
    }

    fn exit(&self, id: &Id) {
        STACK.with(|s| {
            let mut s = s.borrow_mut();
            if let Some(i) = s.iter().rposition(|x| *x == id.into_u64()) {
                s.remove(i);
            }
        });
    }

    fn clone_span(&self, id: &Id) -> Id {
        self.with_span(id, |s| s.refs += 1);
        id.clone()
    }

    fn try_close(&self, id: Id) -> bool {
        let mut closed = false;
        self.with_span(&id, |s| {
            s.refs -= 1;
            if s.refs == 0 {
                s.closed = true;
                closed = true;
            }
        });
        closed
    }
}
