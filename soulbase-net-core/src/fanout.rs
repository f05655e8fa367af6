//! [`Fanout`]: one [`Observer`] that forwards every event to several, e.g. metrics and tracing.

use std::{fmt, sync::Arc};

use crate::{GaugeSource, NetEvent, Observer, Takes};

/// Forwards each event (and each client's gauge source) to every observer it holds, in the
/// order they were added. A client given several observers (`ClientBuilder::observer` called
/// more than once) holds them in one of these.
///
/// Default is empty (events are dropped).
///
/// # Examples
/// ```
/// use std::sync::{atomic::{AtomicU64, Ordering}, Arc};
/// use soulbase_net_core::{Fanout, NetEvent, NoopObserver, Observer};
///
/// #[derive(Default)]
/// struct Count(AtomicU64);
/// impl Observer for Count {
///     fn on_event(&self, _: &NetEvent<'_>) {
///         self.0.fetch_add(1, Ordering::Relaxed);
///     }
/// }
///
/// let (a, b) = (Arc::new(Count::default()), Arc::new(Count::default()));
/// let observer = Fanout::new().with(a.clone()).with(b.clone()).with(Arc::new(NoopObserver));
/// assert_eq!(observer.len(), 3);
/// # let _ = observer;
/// ```
#[derive(Clone, Default)]
pub struct Fanout {
    observers: Vec<Arc<dyn Observer>>,
}

impl Fanout {
    /// A fan-out with no observers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `observer` after those already held.
    pub fn with(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Adds `observer` after those already held.
    pub fn push(&mut self, observer: Arc<dyn Observer>) {
        self.observers.push(observer);
    }

    /// How many observers are held.
    pub fn len(&self) -> usize {
        self.observers.len()
    }

    /// Whether no observer is held.
    pub fn is_empty(&self) -> bool {
        self.observers.is_empty()
    }
}

impl fmt::Debug for Fanout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fanout")
            .field("observers", &self.observers.len())
            .finish()
    }
}

impl Observer for Fanout {
    fn on_event(&self, event: &NetEvent<'_>) {
        for observer in &self.observers {
            observer.on_event(event);
        }
    }

    fn on_gauges(&self, source: &Arc<dyn GaugeSource>) {
        for observer in &self.observers {
            observer.on_gauges(source);
        }
    }

    /// What any of its observers takes.
    fn takes(&self) -> Takes {
        self.observers
            .iter()
            .fold(Takes::NONE, |takes, observer| takes | observer.takes())
    }
}

impl FromIterator<Arc<dyn Observer>> for Fanout {
    fn from_iter<I: IntoIterator<Item = Arc<dyn Observer>>>(iter: I) -> Self {
        Fanout {
            observers: iter.into_iter().collect(),
        }
    }
}
