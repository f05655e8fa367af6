//! HTTP/3 rows against Hypercorn (aioquic) serving httpbin over QUIC beside its TLS TCP
//! listener: GET, POST with a body, a 1 MiB body, 20 concurrent streams on one connection,
//! Alt-Svc discovery from an HTTP/2 response, an untrusted certificate, and `h3-or-tcp`
//! falling back to TCP when no UDP server answers.

use std::time::Duration;

use bytes::Bytes;
use http::Version;
use serde_json::Value;
use soulbase_net_core::{NetRequest, NetResponse};
use soulbase_net_policy::{HttpVersionPolicy, NetPolicy};

use super::{
    peers::Layout,
    scenario::{client, error, outcome, policy},
    Setup,
};
use crate::table::{row, Row};

/// The HTTP/3 rows.
pub(crate) async fn rows(l: &Layout, s: &Setup) -> Vec<Row> {
    let base = format!("https://127.0.0.1:{}", l.h3);
    let with = |version: HttpVersionPolicy| {
        let mut p = policy(l, s);
        p.http.version = version;
        p
    };
    let mut rows = Vec::new();

    let measured = match client(with(HttpVersionPolicy::H3)) {
        Ok((c, _)) => describe(c.send(NetRequest::get(format!("{base}/get"))).await),
        Err(e) => e,
    };
    rows.push(row(
        "h3.hypercorn.get",
        "status 200 over HTTP/3",
        measured.clone(),
        measured == "status 200 over HTTP/3",
    ));

    let measured = match client(with(HttpVersionPolicy::H3)) {
        Ok((c, _)) => {
            let req = NetRequest::post(format!("{base}/post")).body(Bytes::from_static(b"quic"));
            match c.send(req).await {
                Ok(res) if res.version == Version::HTTP_3 => echoed(res).await,
                other => describe(other),
            }
        }
        Err(e) => e,
    };
    rows.push(row(
        "h3.hypercorn.post-body",
        "httpbin saw the body `quic`",
        measured.clone(),
        measured == "`quic`",
    ));

    let mib = 1 << 20;
    let measured = match client(with(HttpVersionPolicy::H3)) {
        Ok((c, _)) => {
            let req =
                NetRequest::post(format!("{base}/anything")).body(Bytes::from(vec![b'q'; mib]));
            match c.send(req).await {
                Ok(res) if res.version == Version::HTTP_3 => echoed(res)
                    .await
                    .replace(&"q".repeat(mib), &format!("{mib} bytes of q")),
                other => describe(other),
            }
        }
        Err(e) => e,
    };
    rows.push(row(
        "h3.hypercorn.body-1MiB",
        format!("httpbin saw `{mib} bytes of q`"),
        measured.clone(),
        measured == format!("`{mib} bytes of q`"),
    ));

    rows.push(streams(&base, with(HttpVersionPolicy::H3)).await);

    let measured = match client(with(HttpVersionPolicy::Auto)) {
        Ok((c, _)) => {
            let mut seen = Vec::new();
            for _ in 0..2 {
                seen.push(describe(
                    c.send(NetRequest::get(format!("{base}/get"))).await,
                ));
            }
            seen.join(", then ")
        }
        Err(e) => e,
    };
    let expected = "status 200 over HTTP/2, then status 200 over HTTP/3";
    rows.push(row(
        "h3.hypercorn.alt-svc-discovery",
        expected,
        measured.clone(),
        measured == expected,
    ));

    let mut untrusting = with(HttpVersionPolicy::H3);
    untrusting.tls.extra_roots_pem.clear();
    untrusting.retry.enabled = false;
    let measured = match client(untrusting) {
        Ok((c, _)) => describe(c.send(NetRequest::get(format!("{base}/get"))).await),
        Err(e) => e,
    };
    rows.push(row(
        "h3.hypercorn.untrusted-cert",
        "tls_verify AUTH.FORBIDDEN",
        measured.clone(),
        measured == "tls_verify AUTH.FORBIDDEN",
    ));

    // nginx's HTTP/2 listener: TLS over TCP, and nothing on its UDP port.
    let tcp_only = format!("https://nginx.interop.test:{}/proto", l.nginx.h2);
    let mut racing = with(HttpVersionPolicy::H3OrTcp);
    racing.timeout.connect = Duration::from_secs(2);
    let measured = match client(racing) {
        Ok((c, _)) => describe(c.send(NetRequest::get(tcp_only)).await),
        Err(e) => e,
    };
    rows.push(row(
        "h3.udp-blocked.h3-or-tcp-falls-back",
        "status 200 over HTTP/2",
        measured.clone(),
        measured == "status 200 over HTTP/2",
    ));
    rows
}

/// 20 concurrent GETs under `p`: all 200 over HTTP/3, and one connection opened.
async fn streams(base: &str, p: NetPolicy) -> Row {
    let measured = match client(p) {
        Ok((c, _)) => {
            let calls = (0..20).map(|i| {
                let c = c.clone();
                let url = format!("{base}/get?stream={i}");
                tokio::spawn(async move { c.send(NetRequest::get(url)).await })
            });
            let mut ok = 0;
            for call in calls.collect::<Vec<_>>() {
                if let Ok(Ok(res)) = call.await {
                    if res.status == 200 && res.version == Version::HTTP_3 {
                        ok += 1;
                    }
                }
            }
            format!(
                "{ok}/20 over HTTP/3, {} connection(s)",
                c.connections_opened()
            )
        }
        Err(e) => e,
    };
    let expected = "20/20 over HTTP/3, 1 connection(s)";
    row(
        "h3.hypercorn.20-streams-one-connection",
        expected,
        measured.clone(),
        measured == expected,
    )
}

/// `status N over HTTP/x`, or the error.
fn describe(r: Result<NetResponse, soulbase_net_core::NetError>) -> String {
    match &r {
        Ok(res) => format!("{} over {}", outcome(&r), version(res.version)),
        Err(e) => error(e),
    }
}

/// `HTTP/3`, `HTTP/2`, `HTTP/1.1`.
fn version(v: Version) -> &'static str {
    match v {
        Version::HTTP_3 => "HTTP/3",
        Version::HTTP_2 => "HTTP/2",
        _ => "HTTP/1.1",
    }
}

/// The body httpbin echoes in `data`, quoted; or what went wrong.
async fn echoed(res: NetResponse) -> String {
    match res.json::<Value>().await {
        Ok(v) => format!("`{}`", v["data"].as_str().unwrap_or_default()),
        Err(e) => error(&e),
    }
}
