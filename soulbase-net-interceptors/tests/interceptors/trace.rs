//! TraceUa: headers as they arrive, constant request id and trace id across retries.

use std::sync::Arc;

use soulbase_net_core::{http::HeaderValue, NetRequest};
use soulbase_net_interceptors::TraceUa;
use soulbase_net_testkit::{FaultServer, Reply, Script};

use crate::support::client;

fn split(tp: &str) -> (String, String) {
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    assert_eq!(parts[0], "00");
    (parts[1].to_owned(), parts[2].to_owned())
}

#[tokio::test]
async fn headers_arrive_and_span_changes_per_retry() {
    let srv = FaultServer::http1()
        .route("/flaky", Script::status(503).times(1).then(Reply::echo()))
        .start()
        .await
        .unwrap();
    let ua = HeaderValue::from_static("billing/1.2");
    let c = client(vec![Arc::new(TraceUa::new().user_agent(ua))]);
    let res = c.send(NetRequest::get(srv.url("/flaky"))).await.unwrap();
    assert_eq!(res.status, 200);
    let seen = srv.requests("/flaky");
    assert_eq!(seen.len(), 2);
    let (t1, s1) = split(seen[0].header("traceparent").unwrap());
    let (t2, s2) = split(seen[1].header("traceparent").unwrap());
    assert_eq!(t1, t2, "trace id stable across attempts");
    assert_ne!(s1, s2, "new span id per attempt");
    let id = seen[0].header("x-request-id").unwrap();
    assert_eq!(id.len(), 32);
    assert_eq!(seen[1].header("x-request-id"), Some(id));
    for r in &seen {
        assert_eq!(r.headers.get_all("user-agent").iter().count(), 1);
        assert_eq!(r.header("user-agent"), Some("billing/1.2"));
    }
    srv.join().await;
}

#[tokio::test]
async fn continues_the_callers_trace() {
    let srv = FaultServer::http1()
        .route("/e", Reply::echo())
        .start()
        .await
        .unwrap();
    let c = client(vec![Arc::new(TraceUa::new())]);
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let req = NetRequest::get(srv.url("/e"))
        .header("traceparent", parent)
        .header("x-request-id", "req-7");
    c.send(req).await.unwrap();
    let seen = srv.requests("/e");
    let tp = seen[0].header("traceparent").unwrap();
    assert!(
        tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
        "{tp}"
    );
    assert!(tp.ends_with("-00"), "flags kept: {tp}");
    assert_ne!(tp, parent);
    assert_eq!(seen[0].header("x-request-id"), Some("req-7"));
    srv.join().await;
}

/// Asks for one resend after a 401; records the attempt numbers it sees.
#[derive(Default)]
struct ResendOn401 {
    attempts: parking_lot::Mutex<Vec<u32>>,
}

#[async_trait::async_trait]
impl soulbase_net_core::Interceptor for ResendOn401 {
    fn on_attempt(&self, _req: &mut NetRequest, attempt: u32) {
        self.attempts.lock().push(attempt);
    }
    async fn should_resend(
        &self,
        _req: &mut NetRequest,
        res: &mut soulbase_net_core::NetResponse,
    ) -> bool {
        res.status == 401
    }
}

#[tokio::test]
async fn a_resend_is_a_new_attempt_with_its_own_span() {
    let srv = FaultServer::http1()
        .route("/auth", Script::status(401).times(1).then(Reply::ok("in")))
        .start()
        .await
        .unwrap();
    let resend = Arc::new(ResendOn401::default());
    let c = client(vec![Arc::new(TraceUa::new()), resend.clone()]);
    let res = c.send(NetRequest::get(srv.url("/auth"))).await.unwrap();
    assert_eq!(res.status, 200);
    // Numbered across the call: the resend is attempt 2, not a second attempt 1.
    assert_eq!(*resend.attempts.lock(), [1, 2]);
    assert_eq!(res.attempts, 2);
    let seen = srv.requests("/auth");
    assert_eq!(seen.len(), 2);
    let (t1, s1) = split(seen[0].header("traceparent").unwrap());
    let (t2, s2) = split(seen[1].header("traceparent").unwrap());
    assert_eq!(t1, t2, "one trace");
    assert_ne!(s1, s2, "two spans");
    srv.join().await;
}
