//! FaultServer over HTTP/1.1: every fault observably happens.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{StatusCode, Version};
use http_body_util::Full;
use soulbase_net_testkit::{refused_addr, FaultServer, RandomFaults, Reply, Script};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

use crate::support::*;

#[tokio::test]
async fn status_headers_body_and_sequence() {
    let srv = FaultServer::http1()
        .route(
            "/flaky",
            Script::reply(Reply::status(503).header("retry-after", "2"))
                .times(2)
                .then(Reply::ok("hi")),
        )
        .route(
            "/dated",
            Reply::status(429)
                .retry_after_date(SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777)),
        )
        .route(
            "/secs",
            Reply::status(503).retry_after(Duration::from_secs(7)),
        )
        .start()
        .await
        .unwrap();
    let c = h1();
    let r = get(&c, &srv.url("/dated")).await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "Sun, 06 Nov 1994 08:49:37 GMT");
    let r = get(&c, &srv.url("/secs")).await.unwrap();
    assert_eq!(r.headers()["retry-after"], "7");
    let mut seen = Vec::new();
    for _ in 0..4 {
        let res = get(&c, &srv.url("/flaky")).await.unwrap();
        let retry = res
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        seen.push((res.status().as_u16(), retry, body(res).await.unwrap()));
    }
    assert_eq!(seen[0], (503, Some("2".into()), Bytes::new()));
    assert_eq!(seen[1].0, 503);
    assert_eq!(seen[2], (200, None, Bytes::from("hi")));
    assert_eq!(seen[3].0, 200);
    assert_eq!(srv.hits("/flaky"), 4);
    assert_eq!(srv.hits("/other"), 0);
    // keep-alive: one connection for all four
    assert_eq!(srv.connections(), 1);
    srv.join().await;
}

#[tokio::test]
async fn unmatched_path_is_404_and_counted() {
    let srv = FaultServer::builder().start().await.unwrap();
    let res = get(&h1(), &srv.url("/nope?x=1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(srv.hits("/nope"), 1);
    assert_eq!(srv.total_hits(), 1);
    srv.join().await;
}

#[tokio::test]
async fn captures_requests() {
    let srv = FaultServer::http1()
        .route_method(http::Method::POST, "/in", Reply::status(201))
        .route("/in", Reply::status(405))
        .start()
        .await
        .unwrap();
    let c = h1();
    let r = req("POST", &srv.url("/in?q=1"))
        .header("x-trace", "abc")
        .body(Full::new(Bytes::from_static(b"payload")))
        .unwrap();
    assert_eq!(c.request(r).await.unwrap().status(), 201);
    let r = req("GET", &srv.url("/in")).body(empty()).unwrap();
    assert_eq!(c.request(r).await.unwrap().status(), 405);
    let reqs = srv.requests("/in");
    assert_eq!(reqs.len(), 2);
    let first = &reqs[0];
    assert_eq!(first.method, http::Method::POST);
    assert_eq!(first.uri.path_and_query().unwrap().as_str(), "/in?q=1");
    assert_eq!(first.version, Version::HTTP_11);
    assert_eq!(first.header("x-trace"), Some("abc"));
    assert_eq!(first.body, Bytes::from_static(b"payload"));
    assert_eq!(first.body_len, 7);
    assert_eq!(first.connection, 1);
    assert_eq!(reqs[1].method, http::Method::GET);
    srv.join().await;
}

#[tokio::test]
async fn capture_limit_keeps_a_prefix_and_counts_all() {
    let srv = FaultServer::http1()
        .capture_limit(4)
        .route("/", Reply::ok(""))
        .start()
        .await
        .unwrap();
    let r = req("PUT", &srv.url("/"))
        .body(Full::new(Bytes::from(vec![b'x'; 1000])))
        .unwrap();
    h1().request(r).await.unwrap();
    let got = &srv.requests("/")[0];
    assert_eq!(got.body, Bytes::from_static(b"xxxx"));
    assert_eq!(got.body_len, 1000);
    srv.join().await;
}

#[tokio::test]
async fn delay_before_head() {
    let srv = FaultServer::http1()
        .route("/slow", Reply::ok("x").delay(Duration::from_millis(150)))
        .start()
        .await
        .unwrap();
    let c = h1();
    // a client with a shorter time-to-first-byte budget times out …
    assert!(
        timeout(Duration::from_millis(50), get(&c, &srv.url("/slow")))
            .await
            .is_err()
    );
    // … one with a longer budget gets the answer, no sooner than the delay.
    let t0 = Instant::now();
    let res = get(&c, &srv.url("/slow")).await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(150));
    assert_eq!(body(res).await.unwrap(), "x");
    srv.join().await;
}

#[tokio::test]
async fn slow_body_paces_chunks() {
    let every = Duration::from_millis(20);
    let srv = FaultServer::http1()
        .route("/drip", Reply::ok("0123456789").slow_body(2, every))
        .start()
        .await
        .unwrap();
    // From before the request: the server's pacing starts with the head.
    let t0 = Instant::now();
    let res = get(&h1(), &srv.url("/drip")).await.unwrap();
    let mut body = res.into_body();
    let mut chunks = Vec::new();
    while let Some(f) = http_body_util::BodyExt::frame(&mut body).await {
        if let Ok(d) = f.unwrap().into_data() {
            chunks.push(d);
        }
    }
    let all: Vec<u8> = chunks.iter().flat_map(|c| c.to_vec()).collect();
    assert_eq!(all, b"0123456789");
    assert!(chunks.len() >= 3, "{chunks:?}");
    assert!(t0.elapsed() >= every * 4, "{:?}", t0.elapsed());
    srv.join().await;
}

#[tokio::test]
async fn stall_after_head_is_a_read_timeout() {
    let srv = FaultServer::http1()
        .route("/stall", Reply::ok("never sent").stall_after_head())
        .start()
        .await
        .unwrap();
    let res = timeout(SHORT, get(&h1(), &srv.url("/stall")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-length"], "10");
    assert!(
        timeout(Duration::from_millis(200), body(res))
            .await
            .is_err(),
        "body must stall"
    );
    srv.join().await;
}

#[tokio::test]
async fn reset_before_head_is_a_reset() {
    let srv = FaultServer::http1()
        .route("/rst", Reply::reset())
        .start()
        .await
        .unwrap();
    let err = get(&h1(), &srv.url("/rst")).await.unwrap_err();
    assert!(is_reset(&err), "{err:?}");
    assert_eq!(srv.hits("/rst"), 1);
    srv.join().await;
}

#[tokio::test]
async fn reset_after_n_body_bytes() {
    let srv = FaultServer::http1()
        .route("/rst", Reply::huge(10 << 20).reset_after(1000))
        .start()
        .await
        .unwrap();
    let res = get(&h1(), &srv.url("/rst")).await.unwrap();
    assert_eq!(
        res.headers()["content-length"],
        (10u64 << 20).to_string().as_str()
    );
    let (n, err) = drain(res).await;
    let err = err.expect("body must fail");
    assert!(is_reset(&err), "{err:?}");
    assert!(n <= 1000, "{n}");
    srv.join().await;
}

#[tokio::test]
async fn close_before_head_and_mid_body() {
    let srv = FaultServer::http1()
        .route("/fin", Reply::close())
        .route("/mid", Reply::huge(1 << 20).close_after(1000))
        .start()
        .await
        .unwrap();
    let c = h1();
    let err = get(&c, &srv.url("/fin")).await.unwrap_err();
    assert!(!is_reset(&err), "{err:?}");
    assert!(hyper_err(&err).unwrap().is_incomplete_message(), "{err:?}");

    let res = get(&c, &srv.url("/mid")).await.unwrap();
    let (n, err) = drain(res).await;
    let err = err.expect("body must fail");
    assert!(!is_reset(&err), "{err:?}");
    assert_eq!(n, 1000);
    srv.join().await;
}

#[tokio::test]
async fn hang_never_answers() {
    let srv = FaultServer::http1()
        .route("/hang", Reply::hang())
        .start()
        .await
        .unwrap();
    assert!(
        timeout(Duration::from_millis(200), get(&h1(), &srv.url("/hang")))
            .await
            .is_err()
    );
    // The request reached the server (awaited: a loaded machine may take longer than the
    // 200 ms above to deliver it), and got no answer.
    timeout(Duration::from_secs(5), srv.wait_for_hits("/hang", 1))
        .await
        .unwrap();
    assert_eq!(srv.hits("/hang"), 1);
    srv.join().await;
}

#[tokio::test]
async fn blackhole_accepts_and_never_reads() {
    let srv = FaultServer::builder().blackhole().start().await.unwrap();
    let mut s = TcpStream::connect(srv.addr()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    assert!(timeout(Duration::from_millis(200), s.read(&mut buf))
        .await
        .is_err());
    assert_eq!(srv.connections(), 1);
    assert_eq!(srv.total_hits(), 0);
    srv.join().await;
}

#[tokio::test]
async fn refused_connections() {
    let addr = refused_addr().await.unwrap();
    let e = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);

    let mut srv = FaultServer::http1()
        .route("/", Reply::ok("up"))
        .start()
        .await
        .unwrap();
    let c = h1();
    assert_eq!(get(&c, &srv.url("/")).await.unwrap().status(), 200);
    srv.close_listener();
    // the listener closes asynchronously: wait (bounded) until connects are refused
    let mut refused = false;
    for _ in 0..200 {
        match TcpStream::connect(srv.addr()).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                refused = true;
                break;
            }
            _ => tokio::task::yield_now().await,
        }
    }
    assert!(refused);
    srv.shutdown().await;
    let e = TcpStream::connect(srv.addr()).await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
}

#[tokio::test]
async fn huge_bodies_stream_without_memory() {
    let srv = FaultServer::http1()
        .route("/4g", Reply::huge(4 << 30))
        .route("/chunked", Reply::huge(8 << 20).without_content_length())
        .route("/lie", Reply::ok("short").content_length(100))
        .start()
        .await
        .unwrap();
    let c = h1();
    // 4 GiB announced; read 16 MiB of it and hang up.
    let res = get(&c, &srv.url("/4g")).await.unwrap();
    assert_eq!(
        res.headers()["content-length"],
        (4u64 << 30).to_string().as_str()
    );
    let mut body = res.into_body();
    let mut n = 0usize;
    while n < 16 << 20 {
        let f = http_body_util::BodyExt::frame(&mut body)
            .await
            .unwrap()
            .unwrap();
        n += f.data_ref().map_or(0, |d| d.len());
        assert!(f.data_ref().unwrap().iter().all(|b| *b == 0));
    }
    drop(body);

    let res = get(&c, &srv.url("/chunked")).await.unwrap();
    assert!(res.headers().get("content-length").is_none());
    assert_eq!(res.headers()["transfer-encoding"], "chunked");
    let (n, err) = drain(res).await;
    assert!(err.is_none());
    assert_eq!(n, 8 << 20);

    let res = get(&c, &srv.url("/lie")).await.unwrap();
    assert_eq!(res.headers()["content-length"], "100");
    let (n, err) = drain(res).await;
    assert_eq!(n, 5);
    assert!(err.is_some(), "a lying Content-Length must end in an error");
    srv.join().await;
}

#[tokio::test]
async fn many_and_huge_headers() {
    let srv = FaultServer::http1()
        .route("/many", Reply::ok("").many_headers(500))
        .route("/huge", Reply::ok("").huge_header(1 << 20))
        .route("/big", Reply::ok("").huge_header(64 << 10))
        .start()
        .await
        .unwrap();
    // hyper's client accepts 100 headers by default …
    let err = get(&h1(), &srv.url("/many")).await.unwrap_err();
    assert!(hyper_err(&err).unwrap().is_parse_too_large(), "{err:?}");
    // … and more when asked.
    let roomy: H1Client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http1_max_headers(1000)
            .build_http();
    let res = get(&roomy, &srv.url("/many")).await.unwrap();
    assert_eq!(res.headers()["x-testkit-500"], "value-500");
    let err = get(&h1(), &srv.url("/huge")).await.unwrap_err();
    assert!(hyper_err(&err).unwrap().is_parse_too_large(), "{err:?}");
    let res = get(&h1(), &srv.url("/big")).await.unwrap();
    assert_eq!(res.headers()["x-testkit-huge"].len(), 64 << 10);
    srv.join().await;
}

#[tokio::test]
async fn redirects() {
    let other = FaultServer::http1()
        .route("/landing", Reply::ok("other"))
        .start()
        .await
        .unwrap();
    let srv = FaultServer::http1()
        .route("/rel", Reply::redirect(302, "/target"))
        .route("/abs", Reply::redirect(301, "{origin}/target"))
        .route("/scheme-rel", Reply::redirect(307, "//{authority}/target"))
        .route("/cross", Reply::redirect(308, other.url("/landing")))
        .route("/private", Reply::redirect(302, "http://10.0.0.1/"))
        .route("/target", Reply::ok("here"))
        .redirect_chain("/chain", 5, "/target")
        .redirect_loop("/loop")
        .start()
        .await
        .unwrap();
    let c = h1();
    let loc = |res: &http::Response<_>| res.headers()["location"].to_str().unwrap().to_owned();
    let r = get(&c, &srv.url("/rel")).await.unwrap();
    assert_eq!((r.status().as_u16(), loc(&r)), (302, "/target".to_owned()));
    let r = get(&c, &srv.url("/abs")).await.unwrap();
    assert_eq!((r.status().as_u16(), loc(&r)), (301, srv.url("/target")));
    let r = get(&c, &srv.url("/scheme-rel")).await.unwrap();
    assert_eq!(loc(&r), format!("//{}/target", srv.addr()));
    let r = get(&c, &srv.url("/cross")).await.unwrap();
    assert_eq!(loc(&r), other.url("/landing"));
    let r = get(&c, &loc(&r)).await.unwrap();
    assert_eq!(body(r).await.unwrap(), "other");
    let r = get(&c, &srv.url("/private")).await.unwrap();
    assert_eq!(loc(&r), "http://10.0.0.1/"); // never followed: tests stay on loopback

    // follow the chain by hand: exactly 5 redirects, then the target
    let mut url = srv.url("/chain/0");
    let mut hops = 0;
    loop {
        let r = get(&c, &url).await.unwrap();
        if !r.status().is_redirection() {
            assert_eq!(body(r).await.unwrap(), "here");
            break;
        }
        hops += 1;
        url = srv.url(&loc(&r));
        assert!(hops <= 5);
    }
    assert_eq!(hops, 5);
    // the loop never ends: a → b → a
    let r = get(&c, &srv.url("/loop/a")).await.unwrap();
    assert_eq!(loc(&r), "/loop/b");
    let r = get(&c, &srv.url("/loop/b")).await.unwrap();
    assert_eq!(loc(&r), "/loop/a");
    other.join().await;
    srv.join().await;
}

#[tokio::test]
async fn encoded_bodies_and_bomb() {
    use std::io::Read;
    let text = "compress me ".repeat(100);
    let srv = FaultServer::http1()
        .route("/gz", Reply::gzip(&text))
        .route("/br", Reply::brotli(&text))
        .route("/bomb", Reply::gzip_bomb(16 << 20))
        .start()
        .await
        .unwrap();
    let c = h1();
    let r = get(&c, &srv.url("/gz")).await.unwrap();
    assert_eq!(r.headers()["content-encoding"], "gzip");
    let mut out = String::new();
    flate2::read::GzDecoder::new(&body(r).await.unwrap()[..])
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(out, text);
    let r = get(&c, &srv.url("/br")).await.unwrap();
    assert_eq!(r.headers()["content-encoding"], "br");
    let mut out = String::new();
    brotli::Decompressor::new(&body(r).await.unwrap()[..], 4096)
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(out, text);

    let r = get(&c, &srv.url("/bomb")).await.unwrap();
    let wire = body(r).await.unwrap();
    let mut dec = flate2::read::GzDecoder::new(&wire[..]);
    let mut buf = vec![0u8; 1 << 16];
    let mut decoded = 0usize;
    loop {
        let n = dec.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        decoded += n;
    }
    assert_eq!(decoded, 16 << 20);
    assert!(
        wire.len() * 500 < decoded,
        "wire {} decoded {decoded}",
        wire.len()
    );
    srv.join().await;
}

#[tokio::test]
async fn echo_as_json() {
    let srv = FaultServer::http1()
        .route("/echo", Reply::echo())
        .start()
        .await
        .unwrap();
    let r = req("PATCH", &srv.url("/echo?a=b"))
        .header("x-one", "1")
        .header("x-one", "2")
        .body(Full::new(Bytes::from_static(b"{\"k\":1}")))
        .unwrap();
    let res = h1().request(r).await.unwrap();
    assert_eq!(res.headers()["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_slice(&body(res).await.unwrap()).unwrap();
    assert_eq!(v["method"], "PATCH");
    assert_eq!(v["path"], "/echo");
    assert_eq!(v["query"], "a=b");
    assert_eq!(v["version"], "HTTP/1.1");
    assert_eq!(v["headers"]["x-one"], serde_json::json!(["1", "2"]));
    assert_eq!(v["body"], "{\"k\":1}");
    assert_eq!(v["connection"], 1);
    srv.join().await;
}

#[tokio::test]
async fn conditional_requests_get_304() {
    let lm = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let srv = FaultServer::http1()
        .route(
            "/res",
            Reply::resource("v1 body").etag("\"v1\"").last_modified(lm),
        )
        .start()
        .await
        .unwrap();
    let c = h1();
    let send = |h: Option<(&'static str, String)>| {
        let mut b = req("GET", &srv.url("/res"));
        if let Some((k, v)) = h {
            b = b.header(k, v);
        }
        c.request(b.body(empty()).unwrap())
    };
    let r = send(None).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["etag"], "\"v1\"");
    assert_eq!(
        r.headers()["last-modified"],
        httpdate::fmt_http_date(lm).as_str()
    );
    assert_eq!(body(r).await.unwrap(), "v1 body");
    let r = send(Some(("if-none-match", "\"v0\", W/\"v1\"".into())))
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    assert_eq!(body(r).await.unwrap(), "");
    let r = send(Some(("if-none-match", "\"v2\"".into())))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = send(Some(("if-modified-since", httpdate::fmt_http_date(lm))))
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    let earlier = httpdate::fmt_http_date(lm - Duration::from_secs(60));
    let r = send(Some(("if-modified-since", earlier))).await.unwrap();
    assert_eq!(r.status(), 200);
    srv.join().await;
}

async fn statuses(seed: u64, n: usize) -> Vec<u16> {
    let srv = FaultServer::http1()
        .route(
            "/r",
            RandomFaults::seeded(seed)
                .fault(0.2, Reply::status(503))
                .fault(0.1, Reply::status(429))
                .otherwise(Reply::ok("ok")),
        )
        .start()
        .await
        .unwrap();
    let c = h1();
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(get(&c, &srv.url("/r")).await.unwrap().status().as_u16());
    }
    srv.join().await;
    out
}

#[tokio::test]
async fn seeded_random_script_repeats() {
    let a = statuses(42, 200).await;
    let b = statuses(42, 200).await;
    let c = statuses(43, 200).await;
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.contains(&503) && a.contains(&429) && a.contains(&200));
}

/// The statuses of streams `order` (three copies each, all first copies before any second),
/// by stream, from a per-request random script.
async fn statuses_by_stream(order: &[u32]) -> Vec<(u32, Vec<u16>)> {
    let srv = FaultServer::http1()
        .route(
            "/r",
            RandomFaults::seeded(5)
                .per_request("x-stream")
                .fault(0.5, Reply::status(503))
                .otherwise(Reply::ok("ok")),
        )
        .start()
        .await
        .unwrap();
    let c = h1();
    let mut out: Vec<(u32, Vec<u16>)> = order.iter().map(|s| (*s, Vec::new())).collect();
    for _copy in 0..3 {
        for (stream, seen) in &mut out {
            let r = req("GET", &srv.url("/r"))
                .header("x-stream", stream.to_string())
                .body(empty())
                .unwrap();
            seen.push(c.request(r).await.unwrap().status().as_u16());
        }
    }
    srv.join().await;
    out.sort_unstable();
    out
}

#[tokio::test]
async fn per_request_draws_do_not_depend_on_interleaving() {
    let forward: Vec<u32> = (0..40).collect();
    let backward: Vec<u32> = forward.iter().rev().copied().collect();
    let a = statuses_by_stream(&forward).await;
    let b = statuses_by_stream(&backward).await;
    assert_eq!(a, b);
    // Both replies occur, and streams differ from one another.
    let all: Vec<u16> = a.iter().flat_map(|(_, s)| s.clone()).collect();
    assert!(all.contains(&503) && all.contains(&200), "{all:?}");
    assert!(a.windows(2).any(|w| w[0].1 != w[1].1));
}

#[tokio::test]
async fn p_drop_rate_is_within_three_sigma() {
    const N: usize = 10_000;
    const P: f64 = 0.3;
    let srv = FaultServer::http1()
        .route("/lossy", Script::p_drop(2024, P, Reply::ok("ok")))
        .start()
        .await
        .unwrap();
    let url = srv.url("/lossy");
    let mut workers = Vec::new();
    for w in 0..4 {
        let url = url.clone();
        workers.push(tokio::spawn(async move {
            let c = h1();
            let (mut ok, mut reset) = (0usize, 0usize);
            for _ in (w..N).step_by(4) {
                match get(&c, &url).await {
                    Ok(r) => {
                        assert_eq!(r.status(), 200);
                        ok += 1;
                    }
                    Err(e) => {
                        assert!(is_reset(&e), "{e:?}");
                        reset += 1;
                    }
                }
            }
            (ok, reset)
        }));
    }
    let (mut ok, mut dropped) = (0, 0);
    for w in workers {
        let (o, d) = w.await.unwrap();
        ok += o;
        dropped += d;
    }
    assert_eq!(ok + dropped, N);
    assert_eq!(srv.hits("/lossy"), N as u64);
    let rate = dropped as f64 / N as f64;
    let sigma = (P * (1.0 - P) / N as f64).sqrt();
    println!(
        "p_drop measured {rate:.4} (expected {P}, 3σ = {:.4})",
        3.0 * sigma
    );
    assert!((rate - P).abs() <= 3.0 * sigma, "rate {rate}");
    srv.join().await;
}

#[tokio::test]
async fn join_reraises_a_handler_panic() {
    let srv = FaultServer::http1()
        .route(
            "/boom",
            Script::respond_with(|_| panic!("handler exploded")),
        )
        .start()
        .await
        .unwrap();
    assert!(get(&h1(), &srv.url("/boom")).await.is_err());
    let err = tokio::spawn(srv.join()).await.unwrap_err();
    assert!(err.is_panic());
    let payload = err.into_panic();
    assert_eq!(*payload.downcast_ref::<&str>().unwrap(), "handler exploded");
}

#[tokio::test]
async fn respond_with_sees_the_request_and_ipv6_works() {
    let srv = FaultServer::http1()
        .ipv6()
        .route(
            "/who",
            Script::respond_with(|r| Reply::ok(format!("conn {}", r.connection))),
        )
        .start()
        .await
        .unwrap();
    assert!(srv.url("/who").starts_with("http://[::1]:"));
    let res = get(&h1(), &srv.url("/who")).await.unwrap();
    assert_eq!(body(res).await.unwrap(), "conn 1");
    srv.join().await;
}

#[tokio::test]
async fn non_loopback_bind_is_refused() {
    let err = FaultServer::builder()
        .bind("0.0.0.0:0".parse().unwrap())
        .start()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn invalid_reply_input_is_a_500_not_a_panic() {
    let srv = FaultServer::http1()
        .route("/bad-status", Reply::status(1000))
        .route("/bad-header", Reply::ok("x").header("bad header", "v"))
        .start()
        .await
        .unwrap();
    let c = h1();
    assert_eq!(
        get(&c, &srv.url("/bad-status")).await.unwrap().status(),
        500
    );
    let r = get(&c, &srv.url("/bad-header")).await.unwrap();
    assert_eq!(r.status(), 500);
    assert!(String::from_utf8_lossy(&body(r).await.unwrap()).contains("invalid header"));
    srv.join().await;
}

#[tokio::test]
async fn wait_for_hits_wakes_when_a_request_arrives_not_when_it_is_answered() {
    let mut srv = FaultServer::http1()
        .route("/held", Reply::ok("late").delay(Duration::from_secs(30)))
        .start()
        .await
        .unwrap();
    // Nothing has arrived: the wait does not end on its own.
    assert!(
        timeout(Duration::from_millis(100), srv.wait_for_hits("/held", 1))
            .await
            .is_err()
    );
    let url = srv.url("/held");
    let call = tokio::spawn(async move { get(&h1(), &url).await });
    // The request arrives while its answer is still 30 s away.
    timeout(Duration::from_secs(5), srv.wait_for_hits("/held", 1))
        .await
        .expect("the request reached the server");
    assert_eq!(srv.hits("/held"), 1);
    assert!(!call.is_finished());
    assert!(
        timeout(Duration::from_millis(100), srv.wait_for_hits("/held", 2))
            .await
            .is_err()
    );
    call.abort();
    srv.shutdown().await;
}
