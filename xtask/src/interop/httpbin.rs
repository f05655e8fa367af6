//! httpbin rows (two instances under gunicorn, two origins): status retries, redirect caps,
//! cross-origin credential stripping, redirects to private addresses, slow and sized bodies,
//! delays against timeouts, and the interceptors' headers as httpbin saw them.

use std::time::{Duration, SystemTime};

use serde_json::Value;
use soulbase_net_core::NetRequest;
use soulbase_net_interceptors::{jws_verify, A2aJws, Bearer, IdempotencyKey, Token, TraceUa};

use super::{
    nginx::{body_len, len, send},
    peers::Layout,
    scenario::{client, client_with, error, outcome, policy},
    Setup,
};
use crate::table::{row, Row};

const TOKEN: &str = "tok-interop-7f3a";

/// The httpbin rows.
pub(crate) async fn rows(l: &Layout, s: &Setup) -> Vec<Row> {
    let hb = format!("http://httpbin.interop.test:{}", l.httpbin[0]);
    let hb2 = format!("http://httpbin2.interop.test:{}", l.httpbin[1]);
    let p = || policy(l, s);
    let mut rows = Vec::new();

    for (id, path, attempts, code) in [
        (
            "httpbin.status-503.retried",
            "503",
            3,
            "status 503 (PROVIDER.UNAVAILABLE)",
        ),
        (
            "httpbin.status-400.not-retried",
            "400",
            1,
            "status 400 (SCHEMA.VALIDATION_FAILED)",
        ),
    ] {
        let expected = format!("{attempts} attempt(s), {code}");
        let measured = match client(p()) {
            Ok((c, seen)) => {
                let r = outcome(&c.send(NetRequest::get(format!("{hb}/status/{path}"))).await);
                format!("{} attempt(s), {r}", seen.count())
            }
            Err(e) => e,
        };
        rows.push(row(
            id,
            expected.clone(),
            measured.clone(),
            measured == expected,
        ));
    }

    let (c, _) = match client(p()) {
        Ok(c) => c,
        Err(e) => return vec![row("httpbin.client", "a client", e, false)],
    };
    let r = c.send(NetRequest::get(format!("{hb}/redirect/3"))).await;
    let measured = match &r {
        Ok(res) => format!("{} at {}", outcome(&r), res.url),
        Err(e) => error(e),
    };
    rows.push(row(
        "httpbin.redirect.3-within-cap-5",
        "status 200 at /get",
        measured.clone(),
        measured.starts_with("status 200") && measured.ends_with("/get"),
    ));
    let r = outcome(&c.send(NetRequest::get(format!("{hb}/redirect/7"))).await);
    rows.push(row(
        "httpbin.redirect.7-over-cap-5",
        "redirect_limit PROVIDER.UNAVAILABLE",
        r.clone(),
        r == "redirect_limit PROVIDER.UNAVAILABLE",
    ));

    rows.push(cross_origin(l, s, &hb, &hb2).await);

    if s.isolated {
        for target in [
            "http://10.0.0.1/",
            "http://169.254.169.254/latest/meta-data/",
        ] {
            let req = NetRequest::get(format!("{hb}/redirect-to")).query("url", target);
            let r = send(p(), req).await;
            rows.push(row(
                &format!(
                    "httpbin.redirect-to.{}",
                    target.split('/').nth(2).unwrap_or("?")
                ),
                "blocked AUTH.FORBIDDEN",
                r.clone(),
                r == "blocked AUTH.FORBIDDEN",
            ));
        }
    }

    let started = tokio::time::Instant::now();
    let r = body_len(&c, &format!("{hb}/drip?duration=2&numbytes=4")).await;
    let took = started.elapsed();
    rows.push(row(
        "httpbin.drip.slow-body-within-read",
        "4 bytes over ~2s",
        format!("{}, in {:.1}s", len(&r), took.as_secs_f64()),
        r == Ok(4) && took >= Duration::from_millis(1400),
    ));

    let r = body_len(&c, &format!("{hb}/bytes/102400")).await;
    rows.push(row(
        "httpbin.bytes.102400",
        "102400 bytes",
        len(&r),
        r == Ok(102_400),
    ));

    for (id, secs, ttfb, want) in [
        ("httpbin.delay.1s-within-ttfb-3s", 1, 3, "status 200"),
        (
            "httpbin.delay.3s-over-ttfb-1s",
            3,
            1,
            "timeout_ttfb PROVIDER.TIMEOUT",
        ),
    ] {
        let mut pol = p();
        pol.retry.enabled = false;
        pol.timeout.ttfb = Duration::from_secs(ttfb);
        let r = send(pol, NetRequest::get(format!("{hb}/delay/{secs}"))).await;
        rows.push(row(id, want, r.clone(), r == want));
    }

    rows.push(echo_headers(l, s, &hb).await);
    rows.push(echo_jws(l, s, &hb).await);
    rows
}

/// A redirect from one origin to the other: `Authorization` (from Bearer) and `Cookie` are
/// gone at the second origin, other headers arrive.
async fn cross_origin(l: &Layout, s: &Setup, hb: &str, hb2: &str) -> Row {
    let id = "httpbin.redirect-to.cross-origin-strips-credentials";
    let expected = "no Authorization/Cookie at the other origin; X-Keep kept";
    let bearer = Bearer::new(|| async { Ok(Token::expires_in(TOKEN, Duration::from_secs(600))) });
    let (c, _) = match client_with(policy(l, s), |b| b.interceptor(bearer)) {
        Ok(c) => c,
        Err(e) => return row(id, expected, e, false),
    };
    let req = NetRequest::get(format!("{hb}/redirect-to"))
        .query("url", format!("{hb2}/headers"))
        .header("cookie", "session=s3cret")
        .header("x-keep", "yes");
    let echo = json_of(&c, req).await;
    let measured = match &echo {
        Ok(v) => {
            let h = &v["headers"];
            format!(
                "Authorization {}, Cookie {}, X-Keep {}, Host {}",
                present(h, "Authorization"),
                present(h, "Cookie"),
                present(h, "X-Keep"),
                h["Host"].as_str().unwrap_or("?")
            )
        }
        Err(e) => e.clone(),
    };
    let passed = echo.as_ref().is_ok_and(|v| {
        let h = &v["headers"];
        h.get("Authorization").is_none()
            && h.get("Cookie").is_none()
            && h["X-Keep"] == "yes"
            && h["Host"]
                .as_str()
                .is_some_and(|host| host.starts_with("httpbin2."))
    });
    row(id, expected, measured, passed)
}

/// TraceUa, Bearer and IdempotencyKey as httpbin's `/anything` saw them.
async fn echo_headers(l: &Layout, s: &Setup, hb: &str) -> Row {
    let id = "httpbin.anything.trace-bearer-idempotency";
    let expected = "traceparent, x-request-id, one UA, Bearer, Idempotency-Key";
    let bearer = Bearer::new(|| async { Ok(Token::expires_in(TOKEN, Duration::from_secs(600))) });
    let built = client_with(policy(l, s), |b| {
        b.interceptor(TraceUa::new())
            .interceptor(bearer)
            .interceptor(IdempotencyKey::random())
    });
    let (c, _) = match built {
        Ok(c) => c,
        Err(e) => return row(id, expected, e, false),
    };
    // `show_env` makes httpbin show X-Request-Id, which it hides by default.
    let req = match NetRequest::post(format!("{hb}/anything?show_env=1"))
        .idempotent(true)
        .json(&serde_json::json!({"order": 42}))
    {
        Ok(r) => r,
        Err(e) => return row(id, expected, error(&e), false),
    };
    let echo = match json_of(&c, req).await {
        Ok(v) => v,
        Err(e) => return row(id, expected, e, false),
    };
    let h = &echo["headers"];
    let tp = h["Traceparent"].as_str().unwrap_or_default();
    let tp_ok = {
        let parts: Vec<&str> = tp.split('-').collect();
        parts.len() == 4
            && parts[0] == "00"
            && parts[1].len() == 32
            && parts[2].len() == 16
            && parts
                .iter()
                .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
    };
    let rid = h["X-Request-Id"].as_str().unwrap_or_default();
    let ua = h["User-Agent"].as_str().unwrap_or_default();
    let auth_ok = h["Authorization"].as_str() == Some(&format!("Bearer {TOKEN}"));
    let key = h["Idempotency-Key"].as_str().unwrap_or_default();
    let passed = tp_ok
        && !rid.is_empty()
        && !ua.is_empty()
        && !ua.contains(',')
        && auth_ok
        && key.len() >= 16;
    row(
        id,
        expected,
        format!(
            "traceparent ok {tp_ok}, request id {}, UA '{ua}', bearer {auth_ok}, key {} chars",
            !rid.is_empty(),
            key.len()
        ),
        passed,
    )
}

/// A2aJws: the detached JWS httpbin received verifies against the body it received.
async fn echo_jws(l: &Layout, s: &Setup, hb: &str) -> Row {
    let id = "httpbin.anything.a2a-jws";
    let expected = "Authorization: A2A <jws> verifies over the echoed body";
    let signer = match A2aJws::from_pkcs8(&s.pki.ed25519_pkcs8, "interop-key") {
        Ok(j) => j,
        Err(e) => return row(id, expected, error(&e), false),
    };
    let public = signer.public_key().to_vec();
    let (c, _) = match client_with(policy(l, s), |b| b.interceptor(signer)) {
        Ok(c) => c,
        Err(e) => return row(id, expected, e, false),
    };
    let req = match NetRequest::post(format!("{hb}/anything"))
        .json(&serde_json::json!({"task": "sum", "args": [1, 2]}))
    {
        Ok(r) => r,
        Err(e) => return row(id, expected, error(&e), false),
    };
    let echo = match json_of(&c, req).await {
        Ok(v) => v,
        Err(e) => return row(id, expected, e, false),
    };
    let auth = echo["headers"]["Authorization"]
        .as_str()
        .unwrap_or_default();
    let body = echo["data"].as_str().unwrap_or_default();
    let verdict = jws_verify(
        auth,
        body.as_bytes(),
        &public,
        Duration::from_secs(300),
        SystemTime::now(),
    );
    row(
        id,
        expected,
        match &verdict {
            Ok(_) => format!("A2A jws verified over {} bytes", body.len()),
            Err(e) => format!("{e} (header starts {:?})", auth.get(..8).unwrap_or(auth)),
        },
        auth.starts_with("A2A ") && verdict.is_ok(),
    )
}

fn present(h: &Value, name: &str) -> &'static str {
    if h.get(name).is_some() {
        "present"
    } else {
        "absent"
    }
}

/// The JSON of a 2xx response, or the outcome's description.
pub(crate) async fn json_of(
    c: &soulbase_net_runtime::Client,
    req: NetRequest,
) -> Result<Value, String> {
    let r = c.send(req).await;
    let desc = outcome(&r);
    let res = r.map_err(|e| error(&e))?;
    if !res.status.is_success() {
        return Err(desc);
    }
    res.json().await.map_err(|e| error(&e))
}
