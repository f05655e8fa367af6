//! The interceptors' answers as the observe crate's metrics see them, through a real client:
//! a duplicate answered from `IdempotencyKey`'s dedup window is a dedup drop with no call of
//! its own; a cache hit is an answer, not a drop.

use std::sync::Arc;

use soulbase_net_core::{Interceptor, NetRequest};
use soulbase_net_observe::Metrics;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{FaultServer, Reply};

use crate::support::{loopback_policy, RecordingDialer};

/// A loopback client with `interceptors` whose events go to `metrics`.
fn observed(interceptors: Vec<Arc<dyn Interceptor>>, metrics: &Arc<Metrics>) -> Client {
    Client::builder()
        .policy(loopback_policy())
        .dialer(Arc::new(RecordingDialer::default()))
        .interceptors(interceptors)
        .observer(metrics.clone())
        .build()
        .unwrap()
}

/// The value of the first sample line of `series`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

const BY_IDEMPOTENCY: &str = r#"net_answered_total{by="idempotency_key"}"#;

/// Two identical idempotent POSTs with derived keys: the second is the first's duplicate.
fn post(url: &str) -> NetRequest {
    NetRequest::post(url)
        .idempotent(true)
        .tenant("t1")
        .body("pay 5")
}

#[tokio::test]
async fn a_duplicate_answered_from_the_window_feeds_the_dup_drop_rate() {
    use std::time::Duration;

    use soulbase_net_interceptors::IdempotencyKey;

    let srv = FaultServer::http1()
        .route("/o", Reply::echo())
        .start()
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let keys = Arc::new(
        IdempotencyKey::derived(Duration::from_secs(3600)).dedup_window(Duration::from_secs(60)),
    );
    let c = observed(vec![keys.clone()], &metrics);
    let first = c.send(post(&srv.url("/o"))).await.unwrap();
    let first = first.text().await.unwrap();
    let second = c.send(post(&srv.url("/o"))).await.unwrap();
    assert_eq!(second.text().await.unwrap(), first);
    assert_eq!((srv.hits("/o"), keys.dedup_drops()), (1, 1));
    let slis = metrics.slis();
    assert_eq!((slis.requests, slis.dup_drop_rate), (2, 0.5), "{slis:?}");
    let text = metrics.encode();
    assert_eq!(sample(&text, BY_IDEMPOTENCY), Some(1.0), "{text}");
    assert_eq!(sample(&text, "net_sli_dup_drop_rate"), Some(0.5), "{text}");
    srv.join().await;
}

#[cfg(all(feature = "idempotency", feature = "cache"))]
#[tokio::test]
async fn a_cache_hit_is_an_answer_but_not_a_dup_drop() {
    use std::time::Duration;

    use soulbase_net_interceptors::{CacheHook, IdempotencyKey};

    let srv = FaultServer::http1()
        .route(
            "/r",
            Reply::resource("hello").header("cache-control", "max-age=60"),
        )
        .route("/o", Reply::echo())
        .start()
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let keys =
        IdempotencyKey::derived(Duration::from_secs(3600)).dedup_window(Duration::from_secs(60));
    let c = observed(vec![Arc::new(CacheHook::new()), Arc::new(keys)], &metrics);
    for _ in 0..2 {
        let res = c.send(NetRequest::get(srv.url("/r"))).await.unwrap();
        assert_eq!(res.text().await.unwrap(), "hello");
        let res = c.send(post(&srv.url("/o"))).await.unwrap();
        res.bytes().await.unwrap();
    }
    assert_eq!((srv.hits("/r"), srv.hits("/o")), (1, 1));
    let slis = metrics.slis();
    assert_eq!((slis.requests, slis.dup_drop_rate), (4, 0.25), "{slis:?}");
    let text = metrics.encode();
    assert_eq!(
        sample(&text, r#"net_answered_total{by="cache_hook"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, BY_IDEMPOTENCY), Some(1.0), "{text}");
    srv.join().await;
}
