//! `poll_ready` under the client's in-flight cap (`ClientBuilder::max_in_flight`).

use std::{
    future::{poll_fn, Future},
    sync::Arc,
    task::Poll,
    time::Duration,
};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Empty;
use soulbase_net_core::{ErrorCode, ErrorKind, LimitScope, NetEvent, NetRequest, Observer};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{FaultServer, Gate, Reply};
use tower::{Service, ServiceExt};

use super::{bounded, loopback_policy, LoopbackDialer};

/// Counts the calls refused by the client's own cap.
#[derive(Debug, Default)]
struct Refusals(parking_lot::Mutex<u32>);

impl Observer for Refusals {
    fn on_event(&self, ev: &NetEvent<'_>) {
        if let NetEvent::RateLimited {
            scope: LimitScope::ClientConcurrency,
            ..
        } = ev
        {
            *self.0.lock() += 1;
        }
    }
}

fn capped(policy: NetPolicy, max: usize, refusals: Arc<Refusals>) -> Client {
    Client::builder()
        .policy(policy)
        .dialer(Arc::new(LoopbackDialer::default()))
        .observer(refusals)
        .max_in_flight(max)
        .build()
        .unwrap()
}

type Req = http::Request<Empty<Bytes>>;

fn get(url: String) -> Req {
    http::Request::get(url).body(Empty::new()).unwrap()
}

/// `svc` once it is ready (its request type named, which tower cannot infer from here).
async fn ready(svc: &mut Client) -> &mut Client {
    ServiceExt::<Req>::ready(svc).await.unwrap()
}

/// Whether `svc` is ready now, polled once.
async fn ready_now(svc: &mut Client) -> bool {
    poll_fn(|cx| {
        Poll::Ready(match Service::<Req>::poll_ready(svc, cx) {
            Poll::Ready(r) => {
                r.unwrap();
                true
            }
            Poll::Pending => false,
        })
    })
    .await
}

#[tokio::test]
async fn poll_ready_is_pending_while_the_in_flight_cap_is_full() {
    let gate = Gate::new();
    let srv = FaultServer::builder()
        .route("/slow", Reply::ok("slow").after(&gate))
        .route("/fast", Reply::ok("fast"))
        .start()
        .await
        .unwrap();
    let refusals = Arc::new(Refusals::default());
    let client = capped(loopback_policy(), 1, refusals.clone());

    // One call takes the only slot and is held at the server.
    let mut first = client.clone();
    ready(&mut first).await;
    let held = tokio::spawn(first.call(get(srv.url("/slow"))));
    bounded(srv.wait_for_hits("/slow", 1)).await;

    // Another handle is not ready, and the other face refuses at once, without sending.
    let mut second = client.clone();
    assert!(!ready_now(&mut second).await);
    let err = client
        .send(NetRequest::get(srv.url("/fast")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimited);
    assert_eq!(err.code(), ErrorCode::QuotaRateLimited);
    assert_eq!(*refusals.0.lock(), 1);
    assert_eq!(srv.hits("/fast"), 0);

    // The held call ends; its slot wakes the waiting handle, whose call then goes out.
    gate.open();
    let res = bounded(held).await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    bounded(ready(&mut second)).await;
    let res = bounded(second.call(get(srv.url("/fast")))).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(srv.hits("/fast"), 1);
    srv.join().await;
}

#[tokio::test]
async fn a_reserved_slot_belongs_to_its_handle_and_comes_back_when_it_is_dropped() {
    let srv = FaultServer::builder()
        .route("/", Reply::ok("x"))
        .start()
        .await
        .unwrap();
    let client = capped(loopback_policy(), 1, Arc::default());
    let mut holder = client.clone();
    ready(&mut holder).await;
    // A clone starts with nothing reserved, and the cap is taken by `holder`.
    let mut other = holder.clone();
    assert!(!ready_now(&mut other).await);
    drop(holder);
    bounded(ready(&mut other)).await;
    let res = other.call(get(srv.url("/"))).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // Without a cap, every handle is always ready.
    let mut free = Client::builder().build().unwrap();
    assert!(ready_now(&mut free).await);
    srv.join().await;
}

#[tokio::test]
async fn send_waits_for_a_slot_when_the_policy_allows_a_wait() {
    let gate = Gate::new();
    let srv = FaultServer::builder()
        .route("/slow", Reply::ok("slow").after(&gate))
        .route("/next", Reply::ok("next"))
        .start()
        .await
        .unwrap();
    let mut policy = loopback_policy();
    policy.limits.max_wait = Duration::from_secs(10);
    let refusals = Arc::new(Refusals::default());
    let client = capped(policy, 1, refusals.clone());
    let held = tokio::spawn({
        let client = client.clone();
        let url = srv.url("/slow");
        async move { client.send(NetRequest::get(url)).await }
    });
    bounded(srv.wait_for_hits("/slow", 1)).await;

    // The second call waits for the slot (its future is pending, nothing sent) ...
    let mut next = Box::pin(client.send(NetRequest::get(srv.url("/next"))));
    let pending = poll_fn(|cx| Poll::Ready(next.as_mut().poll(cx).is_pending())).await;
    assert!(pending);
    assert_eq!(srv.hits("/next"), 0);
    // ... and goes out once the first ends.
    gate.open();
    assert_eq!(bounded(held).await.unwrap().unwrap().status, StatusCode::OK);
    assert_eq!(bounded(next).await.unwrap().status, StatusCode::OK);
    assert_eq!(srv.hits("/next"), 1);
    assert_eq!(*refusals.0.lock(), 0);
    srv.join().await;
}

#[test]
fn a_cap_of_zero_is_refused_when_the_client_is_built() {
    let err = Client::builder().max_in_flight(0).build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
}
