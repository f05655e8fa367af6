//! `pool_keep_alive` over HTTP/2: PING frames on an idle h2c connection, seen by a relay
//! between the client and the FaultServer (the server does not report the pings it answers).

use std::{net::SocketAddr, time::Duration};

use soulbase_net_core::NetRequest;
use soulbase_net_runtime::Client;
use soulbase_net_testkit::{FaultServer, Reply};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
};

use crate::support::{bounded, harness_with, loopback_policy};

/// The HTTP/2 client connection preface.
const PREFACE_LEN: usize = 24;

/// The frame type of PING, and its ACK flag.
const PING: u8 = 0x6;
const ACK: u8 = 0x1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_keep_alive_pings_an_idle_connection() {
    bounded(async {
        let (srv, client, url, mut pings) = relayed(Some(Duration::from_millis(200))).await;
        let res = client.send(NetRequest::get(url.as_str())).await.unwrap();
        assert_eq!(res.text().await.unwrap(), "p");
        // The connection is idle now: PINGs keep coming (three, to see an interval, not a
        // one-off). Bounded by the test's limit.
        pings.wait_for(|n| *n >= 3).await.unwrap();
        // Still the one connection, and it still serves.
        let res = client.send(NetRequest::get(url.as_str())).await.unwrap();
        assert_eq!(res.text().await.unwrap(), "p");
        assert_eq!(srv.connections(), 1);
        srv.join().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_without_keep_alive_sends_no_ping() {
    bounded(async {
        let (srv, client, url, pings) = relayed(None).await;
        let res = client.send(NetRequest::get(url)).await.unwrap();
        assert_eq!(res.text().await.unwrap(), "p");
        // Idle for five times the interval the other test pings at: nothing is sent.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(*pings.borrow(), 0);
        srv.join().await;
    })
    .await;
}

/// An h2c FaultServer answering `/p` with `p`, a [PING-counting relay](ping_counting_relay)
/// in front of it, a client speaking h2c with `keep_alive`, the URL of `/p` through the
/// relay, and the relay's count.
async fn relayed(
    keep_alive: Option<Duration>,
) -> (FaultServer, Client, String, watch::Receiver<usize>) {
    let srv = FaultServer::http2()
        .route("/p", Reply::ok("p"))
        .start()
        .await
        .unwrap();
    let (addr, pings) = ping_counting_relay(srv.addr()).await;
    let h = harness_with(loopback_policy(), |b| {
        let b = b.http2_prior_knowledge(true);
        match keep_alive {
            Some(every) => b.pool_keep_alive(every),
            None => b,
        }
    });
    (srv, h.client, format!("http://{addr}/p"), pings)
}

/// A TCP relay on loopback to `upstream`, and the number of HTTP/2 PING frames (not
/// acknowledgements) the client side has sent through it so far.
async fn ping_counting_relay(upstream: SocketAddr) -> (SocketAddr, watch::Receiver<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (count, pings) = watch::channel(0);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(upstream).await.unwrap();
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
            });
            let count = count.clone();
            tokio::spawn(async move {
                let mut frames = Frames::default();
                let mut buf = vec![0; 16 * 1024];
                while let Ok(n) = from_client.read(&mut buf).await {
                    if n == 0 || to_server.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    let seen = frames.feed(&buf[..n]);
                    if seen > 0 {
                        count.send_modify(|c| *c += seen);
                    }
                }
            });
        }
    });
    (addr, pings)
}

/// Reads the frames of the client's side of an HTTP/2 connection as they pass.
#[derive(Default)]
struct Frames {
    pending: Vec<u8>,
    past_preface: bool,
}

impl Frames {
    /// Takes `bytes`; returns how many PING frames (not acks) they completed.
    fn feed(&mut self, bytes: &[u8]) -> usize {
        self.pending.extend_from_slice(bytes);
        let mut pings = 0;
        loop {
            if !self.past_preface {
                if self.pending.len() < PREFACE_LEN {
                    return pings;
                }
                self.pending.drain(..PREFACE_LEN);
                self.past_preface = true;
            }
            let Some(head) = self.pending.get(..9) else {
                return pings;
            };
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let (kind, flags) = (head[3], head[4]);
            if self.pending.len() < 9 + len {
                return pings;
            }
            if kind == PING && flags & ACK == 0 {
                pings += 1;
            }
            self.pending.drain(..9 + len);
        }
    }
}
