//! The cost of the observers on the hot path: the six events of a one-attempt request
//! (started, attempt started / finished, bytes out / in, finished), per request.

use std::{hint::black_box, sync::Arc, time::Duration};

use criterion::{criterion_group, criterion_main, Criterion};
use soulbase_net_core::{
    http::{Method, StatusCode},
    Direction, Elapsed, NetEvent, Observer, Outcome, RequestInfo,
};
use soulbase_net_observe::{Fanout, Metrics, TracingObserver};

fn one_request(obs: &dyn Observer, id: u64) {
    let req = RequestInfo {
        id,
        method: &Method::GET,
        scheme: "https",
        host: "api.example",
        tenant: Some("t1"),
        url: "https://api.example/v1/x",
    };
    let outcome = Outcome::Response(StatusCode::OK);
    let elapsed = Elapsed::default()
        .with_ttfb(Duration::from_millis(12))
        .with_total(Duration::from_millis(12));
    obs.on_event(&NetEvent::RequestStarted { req });
    obs.on_event(&NetEvent::AttemptStarted {
        req,
        attempt: 1,
        hedge: false,
    });
    obs.on_event(&NetEvent::Bytes {
        req,
        dir: Direction::Out,
        bytes: 128,
    });
    obs.on_event(&NetEvent::AttemptFinished {
        req,
        attempt: 1,
        outcome,
        elapsed,
    });
    obs.on_event(&NetEvent::Bytes {
        req,
        dir: Direction::In,
        bytes: 4096,
    });
    obs.on_event(&NetEvent::RequestFinished {
        req,
        outcome,
        attempts: 1,
        elapsed,
        version: Some(soulbase_net_core::http::Version::HTTP_11),
    });
}

fn observers(c: &mut Criterion) {
    let metrics = Arc::new(Metrics::new());
    let tracing = Arc::new(TracingObserver::new());
    let both = Fanout::new().with(metrics.clone()).with(tracing.clone());
    let mut id = 0u64;
    let mut next = || {
        id += 1;
        black_box(id)
    };
    c.bench_function("metrics/request", |b| {
        b.iter(|| one_request(&*metrics, next()))
    });
    // No subscriber is installed: the cost of matching the events, with logging disabled.
    c.bench_function("tracing_no_subscriber/request", |b| {
        b.iter(|| one_request(&*tracing, next()))
    });
    c.bench_function("fanout_metrics_tracing/request", |b| {
        b.iter(|| one_request(&both, next()))
    });
    c.bench_function("metrics/slis", |b| b.iter(|| black_box(metrics.slis())));
}

criterion_group!(benches, observers);
criterion_main!(benches);
