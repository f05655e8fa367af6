//! The executor the pool's connections and hyper's HTTP/2 tasks are spawned on.

use std::{future::Future, pin::Pin};

/// Spawns on the current tokio runtime, boxing the future first.
///
/// Why boxed: hyper's HTTP/2 client spawns a task per request (the one that waits for the
/// response), and the type it spawns is an enum whose largest variant is the whole
/// connection task, kilobytes of codec state. Spawned unboxed, tokio copies that size into
/// the task's cell and again each time it sets the task's stage; boxed, it is copied once
/// into the box and the cell holds a pointer (measured over h2c: about 1.6 k instructions
/// per request). hyper-util's pooled client boxes them the same way, and the pool spawns
/// its connections' own tasks through it too.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BoxingExecutor;

impl<F> hyper::rt::Executor<F> for BoxingExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let fut: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(fut);
        tokio::spawn(fut);
    }
}
