//! Capacity over loopback: a route serves so many requests at once, the rest wait, and a
//! request holds its slot for its service time even after its client has gone.

use std::time::Duration;

use soulbase_net_testkit::{Capacity, FaultServer, Reply, Script};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

use crate::support::*;

const LONG: Duration = Duration::from_secs(1);
const SHORT_SERVICE: Duration = Duration::from_millis(50);

/// `/long` (1 s) and `/short` (50 ms) served by the same `cap`.
async fn server(cap: &Capacity, h2: bool) -> FaultServer {
    let b = if h2 {
        FaultServer::http2()
    } else {
        FaultServer::http1()
    };
    b.route(
        "/long",
        Script::capacity(cap, Reply::ok("long").delay(LONG)),
    )
    .route(
        "/short",
        Script::capacity(cap, Reply::ok("short").delay(SHORT_SERVICE)),
    )
    .start()
    .await
    .unwrap()
}

/// `/short` through `c`, answered only after a `/long` that arrived after `started` has had
/// its whole service time: freed when its client left, the slot would have served `/short`
/// within ~50 ms.
async fn short_waits_out_long(c: &H1Client, srv: &FaultServer, started: Instant) {
    let res = timeout(LONG + SHORT, get(c, &srv.url("/short")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body(res).await.unwrap(), "short");
    let took = started.elapsed();
    assert!(took >= LONG + SHORT_SERVICE, "{took:?}");
}

#[tokio::test]
async fn the_request_past_the_slots_waits_for_one() {
    let cap = Capacity::new(2);
    let srv = server(&cap, false).await;
    let started = Instant::now();
    let long = |c: H1Client, url: String| tokio::spawn(async move { get(&c, &url).await });
    let a = long(h1(), srv.url("/long"));
    let b = long(h1(), srv.url("/long"));
    cap.wait_for_arrivals(2).await;
    // Both slots are held for a second: the short request waits for one of them.
    let c = h1();
    let short = tokio::spawn({
        let url = srv.url("/short");
        async move { get(&c, &url).await }
    });
    cap.wait_for_arrivals(3).await;
    assert_eq!((cap.busy(), cap.queued()), (2, 1));
    let res = short.await.unwrap().unwrap();
    assert_eq!(body(res).await.unwrap(), "short");
    assert!(
        started.elapsed() >= LONG + SHORT_SERVICE,
        "{:?}",
        started.elapsed()
    );
    for r in [a, b] {
        assert_eq!(r.await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(
        (cap.arrivals(), cap.peak_queue(), cap.rejected()),
        (3, 1, 0)
    );
    assert!(cap.max_wait() > Duration::ZERO && cap.max_wait() <= LONG);
    assert_eq!(cap.slots(), 2);
    srv.join().await;
}

/// A client sends `/long` and closes its connection at once; the next request still waits
/// for the abandoned one's second.
#[tokio::test]
async fn a_client_that_closed_still_holds_its_slot_http1() {
    let cap = Capacity::new(1);
    let srv = server(&cap, false).await;
    let started = Instant::now();
    let mut gone = TcpStream::connect(srv.addr()).await.unwrap();
    gone.write_all(b"GET /long HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    cap.wait_for_arrivals(1).await;
    drop(gone);
    short_waits_out_long(&h1(), &srv, started).await;
    assert_eq!(cap.peak_queue(), 1);
    srv.join().await;
}

/// Over HTTP/2 the server does see the client give up (its stream is reset and the handler
/// dropped): the slot is held all the same.
#[tokio::test]
async fn a_client_that_gave_up_still_holds_its_slot_http2() {
    let cap = Capacity::new(1);
    let srv = server(&cap, true).await;
    let c = h2c();
    let started = Instant::now();
    let abandoned = tokio::spawn({
        let (c, url) = (c.clone(), srv.url("/long"));
        async move { get(&c, &url).await }
    });
    cap.wait_for_arrivals(1).await;
    // Dropping the response future resets the stream.
    abandoned.abort();
    assert!(abandoned.await.unwrap_err().is_cancelled());
    short_waits_out_long(&c, &srv, started).await;
    assert_eq!(srv.hits("/long"), 1);
    srv.join().await;
}

#[tokio::test]
async fn a_full_queue_gets_the_overload_reply_at_once() {
    let cap = Capacity::new(1)
        .queue_limit(1)
        .overload(Reply::status(429).retry_after(Duration::from_secs(1)));
    let srv = server(&cap, false).await;
    let send = |path: &str| {
        let (c, url) = (h1(), srv.url(path));
        tokio::spawn(async move { get(&c, &url).await })
    };
    let served = send("/long");
    cap.wait_for_arrivals(1).await;
    let queued = send("/short");
    cap.wait_for_arrivals(2).await;
    // One served, one waiting: the third is refused without waiting for either.
    let sent = Instant::now();
    let refused = get(&h1(), &srv.url("/short")).await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert!(sent.elapsed() < LONG, "{:?}", sent.elapsed());
    assert_eq!(queued.await.unwrap().unwrap().status(), 200);
    assert_eq!(served.await.unwrap().unwrap().status(), 200);
    assert_eq!(
        (cap.arrivals(), cap.rejected(), cap.peak_queue()),
        (3, 1, 1)
    );
    assert_eq!(srv.hits("/short"), 2);
    srv.join().await;
}
