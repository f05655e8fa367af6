//! nginx rows: HTTP/1.1 and HTTP/2 over TLS, the CacheHook's 304 path, body size limits,
//! gzip, mTLS, untrusted/expired certificates, a TLS-1.2-only port, Retry-After on 429/503,
//! slow responses, and SPKI pins of the real server certificate.

use std::time::Duration;

use soulbase_net_core::NetRequest;
use soulbase_net_interceptors::CacheHook;
use soulbase_net_policy::{ByteSize, MtlsCfg, NetPolicy, TlsVersion};
use soulbase_net_runtime::Client;

use super::{
    peers::Layout,
    scenario::{client, client_with, error, eventually, log_lines, outcome, policy},
    Setup,
};
use crate::table::{row, Row};

/// The nginx rows.
pub(crate) async fn rows(l: &Layout, s: &Setup) -> Vec<Row> {
    let base = |port: u16| format!("https://nginx.interop.test:{port}");
    let p = || policy(l, s);
    let mut rows = Vec::new();

    for (id, port, want) in [
        ("nginx.tls.http1", l.nginx.h1, "HTTP/1.1 TLSv1.3"),
        ("nginx.tls.http2", l.nginx.h2, "HTTP/2.0 TLSv1.3"),
    ] {
        let got = body_of(p(), &format!("{}/proto", base(port))).await;
        let passed = got.as_deref().map(str::trim) == Ok(want);
        rows.push(row(
            id,
            format!("200, nginx says {want}"),
            show(&got),
            passed,
        ));
    }

    rows.push(cache_304(l, s, &base(l.nginx.h1)).await);

    let large = format!("{}/large.bin", base(l.nginx.h1));
    for (id, limit, want) in [
        ("nginx.body.8MiB-under-16MiB", 16, "8388608 bytes"),
        (
            "nginx.body.8MiB-over-4MiB",
            4,
            "too_large PROVIDER.UNAVAILABLE",
        ),
    ] {
        let mut limited = p();
        limited.security.max_resp_bytes = ByteSize::mib(limit);
        let got = len(&bytes_of(limited, &large).await);
        rows.push(row(id, want, got.clone(), got == want));
    }

    rows.push(gzip(l, s, &base(l.nginx.h1)).await);

    let mut with_cert = p();
    let mut mtls = MtlsCfg::default();
    mtls.client_cert_pem = s.pki.client_cert_pem.clone();
    mtls.client_key_pem = s.pki.client_key_pem.clone();
    with_cert.tls.mtls = Some(mtls);
    let mtls_url = format!("{}/mtls", base(l.nginx.mtls));
    let got = body_of(with_cert, &mtls_url).await;
    rows.push(row(
        "nginx.mtls.with-client-cert",
        "200, nginx verify=SUCCESS",
        show(&got),
        got.as_deref()
            .is_ok_and(|b| b.starts_with("verify=SUCCESS") && b.contains("interop-client")),
    ));
    let r = send(p(), NetRequest::get(&mtls_url)).await;
    rows.push(row(
        "nginx.mtls.without-client-cert",
        "status 400 (no required certificate)",
        r.clone(),
        r.starts_with("status 400"),
    ));

    for (id, port) in [
        ("nginx.tls.untrusted-cert", l.nginx.untrusted),
        ("nginx.tls.expired-cert", l.nginx.expired),
    ] {
        let r = send(p(), NetRequest::get(format!("{}/proto", base(port)))).await;
        rows.push(row(
            id,
            "tls_verify AUTH.FORBIDDEN",
            r.clone(),
            r == "tls_verify AUTH.FORBIDDEN",
        ));
    }

    let tls12 = format!("{}/proto", base(l.nginx.tls12));
    let got = body_of(p(), &tls12).await;
    rows.push(row(
        "nginx.tls.1.2-only-port",
        "200 over TLSv1.2",
        show(&got),
        got.as_deref().is_ok_and(|b| b.contains("TLSv1.2")),
    ));
    let mut min13 = p();
    min13.tls.min_tls = TlsVersion::Tls13;
    let r = send(min13, NetRequest::get(&tls12)).await;
    rows.push(row(
        "nginx.tls.1.2-only-with-min-1.3",
        "tls PROVIDER.UNAVAILABLE (no common version)",
        r.clone(),
        r == "tls PROVIDER.UNAVAILABLE",
    ));

    for (id, path, code) in [
        (
            "nginx.retry-after.429",
            "limited",
            "status 429 (QUOTA.RATE_LIMITED)",
        ),
        (
            "nginx.retry-after.503",
            "unavailable",
            "status 503 (PROVIDER.UNAVAILABLE)",
        ),
    ] {
        // A Retry-After longer than backoff.cap stops the retries, so the cap allows 1s.
        let mut waits = p();
        waits.retry.backoff.cap = Duration::from_secs(2);
        rows.push(retry_after(waits, &format!("{}/{path}", base(l.nginx.h1)), id, code).await);
    }

    let mut ttfb = p();
    ttfb.retry.enabled = false;
    ttfb.timeout.ttfb = Duration::from_secs(1);
    let r = send(
        ttfb,
        NetRequest::get(format!("{}/slow/delay/3", base(l.nginx.h1))),
    )
    .await;
    rows.push(row(
        "nginx.slow.ttfb-1s-vs-3s",
        "timeout_ttfb PROVIDER.TIMEOUT",
        r.clone(),
        r == "timeout_ttfb PROVIDER.TIMEOUT",
    ));
    let mut read = p();
    read.retry.enabled = false;
    read.timeout.read = Duration::from_secs(1);
    // httpbin's drip (through nginx, unbuffered): one byte every 2s.
    let drip = format!("{}/slow/drip?duration=6&numbytes=3", base(l.nginx.h1));
    let r = bytes_of(read, &drip).await;
    rows.push(row(
        "nginx.slow.read-gap-1s-vs-2s",
        "timeout_read PROVIDER.TIMEOUT",
        len(&r),
        len(&r) == "timeout_read PROVIDER.TIMEOUT",
    ));

    for (id, pin, want_ok) in [
        ("nginx.pin.match", s.pki.server_pin.clone(), true),
        ("nginx.pin.mismatch", s.pki.other_pin.clone(), false),
    ] {
        let mut pinned = p();
        pinned.tls.pinset_sha256 = Some(vec![pin]);
        let r = send(
            pinned,
            NetRequest::get(format!("{}/proto", base(l.nginx.h1))),
        )
        .await;
        let want = if want_ok {
            "status 200"
        } else {
            "tls_verify AUTH.FORBIDDEN"
        };
        rows.push(row(id, want, r.clone(), r == want));
    }
    rows
}

/// Two GETs through a CacheHook: nginx sees a plain GET (200) then a conditional one (304);
/// the caller gets the body both times.
async fn cache_304(l: &Layout, s: &Setup, base: &str) -> Row {
    let id = "nginx.cache.etag-304";
    let expected = "client 200+200 same body; nginx 200 then 304";
    let url = format!("{base}/hello.txt");
    let (c, _) = match client_with(policy(l, s), |b| b.interceptor(CacheHook::new())) {
        Ok(c) => c,
        Err(e) => return row(id, expected, e, false),
    };
    let mut seen = Vec::new();
    for _ in 0..2 {
        match c.send(NetRequest::get(&url)).await {
            Ok(res) => {
                let status = res.status.as_u16();
                let body = res.text().await.unwrap_or_default();
                seen.push((status, body));
            }
            Err(e) => return row(id, expected, error(&e), false),
        }
    }
    let port = l.nginx.h1.to_string();
    let nginx_statuses = || -> Vec<String> {
        log_lines(&l.nginx_log)
            .iter()
            .filter(|line| line.starts_with(&port) && line.contains(" /hello.txt "))
            .filter_map(|line| line.split(' ').nth(3).map(str::to_owned))
            .collect()
    };
    eventually(Duration::from_secs(2), || nginx_statuses().len() >= 2).await;
    let statuses = nginx_statuses();
    let passed = seen
        .iter()
        .all(|(s, b)| *s == 200 && b == "hello from nginx\n")
        && statuses == ["200", "304"];
    row(
        id,
        expected,
        format!(
            "client {:?}; nginx {}",
            seen.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            statuses.join(" then ")
        ),
        passed,
    )
}

/// A text file gzip-encoded by nginx and decoded by the client.
async fn gzip(l: &Layout, s: &Setup, base: &str) -> Row {
    let id = "nginx.gzip";
    let expected = "body decoded = file; nginx sent < 1/4 of it";
    let want = std::fs::read_to_string(l.dir.join("www").join("text.txt")).unwrap_or_default();
    let got = body_of(policy(l, s), &format!("{base}/text.txt")).await;
    let port = l.nginx.h1.to_string();
    let sent = || -> Option<usize> {
        log_lines(&l.nginx_log)
            .iter()
            .rev()
            .find(|line| line.starts_with(&port) && line.contains(" /text.txt "))
            .and_then(|line| line.split(' ').nth(4)?.parse().ok())
    };
    eventually(Duration::from_secs(2), || sent().is_some()).await;
    let sent = sent().unwrap_or(usize::MAX);
    let same = got.as_deref() == Ok(want.as_str());
    row(
        id,
        expected,
        format!(
            "decoded {} bytes (same: {same}); nginx sent {sent} of {}",
            got.as_ref().map_or(0, String::len),
            want.len()
        ),
        same && !want.is_empty() && sent < want.len() / 4,
    )
}

/// 429/503 with `Retry-After: 1`: three attempts, each retry waiting at least 1s.
async fn retry_after(p: NetPolicy, url: &str, id: &str, code: &str) -> Row {
    let expected = format!("3 attempts, retry delays >= 1s, {code}");
    let (c, attempts) = match client(p) {
        Ok(c) => c,
        Err(e) => return row(id, expected, e, false),
    };
    let r = c.send(NetRequest::get(url)).await;
    let delays = attempts.delays();
    let got = outcome(&r);
    let passed = attempts.count() == 3
        && delays.len() == 2
        && delays.iter().all(|d| *d >= Duration::from_secs(1))
        && got == code;
    row(
        id,
        expected,
        format!(
            "{} attempts, delays {:?}, {got}",
            attempts.count(),
            delays.iter().map(|d| d.as_millis()).collect::<Vec<_>>()
        ),
        passed,
    )
}

/// Sends one request with a fresh client; the outcome's description.
pub(crate) async fn send(p: NetPolicy, req: NetRequest) -> String {
    match client(p) {
        Ok((c, _)) => outcome(&c.send(req).await),
        Err(e) => e,
    }
}

/// The body of a 2xx GET, or the outcome's description.
pub(crate) async fn body_of(p: NetPolicy, url: &str) -> Result<String, String> {
    let (c, _) = client(p)?;
    let res = c.send(NetRequest::get(url)).await.map_err(|e| error(&e))?;
    if !res.status.is_success() {
        return Err(format!("status {}", res.status.as_u16()));
    }
    res.text().await.map_err(|e| error(&e))
}

/// The body length of a 2xx GET with a fresh client, or the outcome's description.
async fn bytes_of(p: NetPolicy, url: &str) -> Result<usize, String> {
    body_len(&client(p)?.0, url).await
}

/// The body length of a 2xx GET, or the outcome's description.
pub(crate) async fn body_len(c: &Client, url: &str) -> Result<usize, String> {
    let res = c.send(NetRequest::get(url)).await.map_err(|e| error(&e))?;
    if !res.status.is_success() {
        return Err(format!("status {}", res.status.as_u16()));
    }
    res.bytes().await.map(|b| b.len()).map_err(|e| error(&e))
}

/// `N bytes` or the error.
pub(crate) fn len(r: &Result<usize, String>) -> String {
    r.as_ref()
        .map_or_else(Clone::clone, |n| format!("{n} bytes"))
}

/// A body (first line) or the error.
pub(crate) fn show(r: &Result<String, String>) -> String {
    match r {
        Ok(b) => format!("200 {}", b.lines().next().unwrap_or_default()),
        Err(e) => e.clone(),
    }
}
