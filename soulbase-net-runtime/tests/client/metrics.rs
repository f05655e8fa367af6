//! The observe crate's metrics fed by the real client: a scripted scenario and the exact
//! counter values it must leave in the exposition.

use std::sync::Arc;

use soulbase_net_core::{NetClient, NetRequest};
use soulbase_net_observe::Metrics;
use soulbase_net_testkit::{FaultServer, Reply, Script};

use crate::support::{harness_with, loopback_policy};

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .trim()
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

#[tokio::test]
async fn a_scripted_scenario_leaves_exact_counters() {
    let srv = FaultServer::http1()
        .route("/ok", Reply::ok("x"))
        .route("/flaky", Script::status(503).times(1).then(Reply::ok("y")))
        .route("/moved", Reply::redirect(302, "/ok"))
        .start()
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let mut p = loopback_policy();
    p.retry.backoff.base = std::time::Duration::from_millis(2);
    let h = harness_with(p, |b| b.observer(metrics.clone()));
    for path in ["/ok", "/ok", "/flaky", "/moved"] {
        let res = h.client.send(NetRequest::get(srv.url(path))).await.unwrap();
        assert_eq!(res.status, 200, "{path}");
        res.bytes().await.unwrap();
    }
    let text = metrics.encode();
    let ok =
        r#"net_requests_total{tenant="",host="127.0.0.1",method="GET",scheme="http",outcome="ok"}"#;
    assert_eq!(sample(&text, ok), Some(4.0), "{text}");
    assert_eq!(
        sample(&text, r#"net_retry_total{reason="status_5xx"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"net_redirect_total{host="127.0.0.1"}"#),
        Some(1.0),
        "{text}"
    );
    let slis = metrics.slis();
    assert_eq!(slis.requests, 4);
    assert!((slis.retry_rate - 0.25).abs() < 1e-9, "{slis:?}");
    assert_eq!(slis.error_ratio, 0.0);
    srv.join().await;
}
