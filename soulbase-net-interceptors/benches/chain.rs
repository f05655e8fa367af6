//! The cost of an interceptor chain on the hot path, per request: `before` of TraceUa,
//! IdempotencyKey and SandboxGuard on an idempotent JSON POST, then one `on_attempt`.
#![allow(
    clippy::expect_used,
    reason = "a benchmark: a setup failure must stop it"
)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use soulbase_net_core::{Interceptor, NetRequest};
use soulbase_net_interceptors::{IdempotencyKey, SandboxGuard, TraceUa};
use soulbase_net_policy::SecurityPolicy;

fn chain(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime builds");
    let guard = SandboxGuard::new(&SecurityPolicy::default()).expect("the default policy is valid");
    let chain: Vec<Box<dyn Interceptor>> = vec![
        Box::new(TraceUa::new()),
        Box::new(IdempotencyKey::random()),
        Box::new(guard),
    ];
    c.bench_function("interceptors/trace+idempotency+sandbox per request", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut req = NetRequest::post("https://api.example.com/v1/orders")
                    .body(r#"{"sku":"A-1"}"#)
                    .idempotent(true);
                for i in &chain {
                    i.before(&mut req).await.expect("a public host passes");
                }
                for i in &chain {
                    i.on_attempt(&mut req, 1);
                }
                black_box(req)
            })
        })
    });
}

criterion_group!(benches, chain);
criterion_main!(benches);
