//! The HTTP face (`http_addr`): a health check, the Prometheus metrics, and tasks scheduled,
//! looked up and cancelled by services that cannot hold a connection.
//!
//! - `GET /health` → `{"status":"ok","pending":N}` (503 when the store does not answer);
//! - `GET /metrics` → the Prometheus text exposition;
//! - `POST /tasks` with a `schedule` line as the body (its `route_key` required) → the `ack`
//!   once stored, or the `error` (400; 403 for a missing or wrong token; 503 when not stored);
//! - `GET /tasks/{id}` → the task (404 when none); `DELETE /tasks/{id}` → cancels it. Both
//!   see HTTP tasks too (a `schedule` with a `target`, waiting in the outbox): looked up with
//!   their `target` (and `fire_at` as the outbox holds it: on the store's clock, within a
//!   millisecond of the scheduled one), cancelled unless a delivery of it is already under way.
//!
//! Tokens: a route named in `tokens` needs its token for all three — in the header
//! `Authorization: Bearer <token>`, or (`POST` only) in the line's `token` field as over TCP.
//! Without it: 403 with an `AUTH.FORBIDDEN` body, and the task is neither stored, shown nor
//! cancelled. A 403 tells that a task of that id exists on a protected route; 404 that none
//! does (nothing else about it).

use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{body::Incoming, Method, Request, Response, StatusCode};
use soulbase_net_core::{ErrorKind, NetError};
use soulbase_net_runtime::serve::Http1Server;
use tokio::{net::TcpListener, sync::watch};

use super::{acked_fire_at, schedule, Answer, Inner};
use crate::protocol::{self, Inbound, Outbound, MAX_LINE};

/// Serves HTTP on `listener` until told to stop, to the peers the configuration allows.
pub(super) async fn serve(
    inner: Arc<Inner>,
    listener: TcpListener,
    mut stopped: watch::Receiver<bool>,
) {
    let allows = inner.clone();
    Http1Server::new(listener)
        .admit(move |peer| allows.config.allows(peer.ip()))
        .serve(
            move |req| {
                let inner = inner.clone();
                async move { handle(&inner, req).await }
            },
            async move {
                let _ = stopped.changed().await;
            },
        )
        .await;
}

fn json(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(body.to_string())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    res
}

/// The stable codes the HTTP face answers with (the project's, as on the wire's error lines).
const INVALID: &str = ErrorKind::InvalidRequest.code().as_str();
const FORBIDDEN: &str = ErrorKind::Blocked.code().as_str();
const UNAVAILABLE: &str = ErrorKind::Io.code().as_str();

/// An error, with the same body as the protocol's error line.
fn error(
    status: StatusCode,
    id: Option<String>,
    code: &'static str,
    message: String,
) -> Response<Full<Bytes>> {
    let line = Outbound::Error { id, code, message };
    json(status, &serde_json::to_value(&line).unwrap_or_default())
}

/// The token of `Authorization: Bearer <token>`, if the request carries one.
fn bearer(req: &Request<Incoming>) -> Option<String> {
    let value = req
        .headers()
        .get(hyper::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}

/// `None` when the request may see the task `id` (no such connection task, or its route
/// needs no token, or `token` is its route's); else the answer: 403, or 503 when the store
/// does not answer.
async fn refuse_without_token(
    inner: &Inner,
    id: &str,
    token: Option<&str>,
) -> Option<Response<Full<Bytes>>> {
    match inner.store.get(id).await {
        Ok(Some(task)) if !inner.config.admits(&task.route_key, token) => Some(error(
            StatusCode::FORBIDDEN,
            Some(id.to_owned()),
            FORBIDDEN,
            format!(
                "route `{}` needs its token (Authorization: Bearer …)",
                task.route_key
            ),
        )),
        Ok(_) => None,
        Err(e) => Some(error(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(id.to_owned()),
            e.code().as_str(),
            e.to_string(),
        )),
    }
}

async fn handle(inner: &Inner, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let token = bearer(&req);
    let id = path
        .strip_prefix("/tasks/")
        .filter(|id| !id.is_empty())
        .map(str::to_owned);
    match (req.method().clone(), path.as_str(), id) {
        (Method::GET, "/health", _) => match inner.store.pending().await {
            Ok(n) => json(
                StatusCode::OK,
                &serde_json::json!({"status": "ok", "pending": n}),
            ),
            Err(e) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({"status": "store unavailable", "message": e.to_string()}),
            ),
        },
        (Method::GET, "/metrics", _) => {
            let text = inner.metrics.render(&inner.gauges().await);
            let mut res = Response::new(Full::new(Bytes::from(text)));
            res.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            res
        }
        (Method::POST, "/tasks", _) => post_task(inner, req, token).await,
        (Method::GET, _, Some(id)) => {
            if let Some(refused) = refuse_without_token(inner, &id, token.as_deref()).await {
                return refused;
            }
            let found = lookup(inner, &id).await;
            about_task(id, found)
        }
        (Method::DELETE, _, Some(id)) => {
            if let Some(refused) = refuse_without_token(inner, &id, token.as_deref()).await {
                return refused;
            }
            let deleted = cancel(inner, &id)
                .await
                .map(|gone| gone.then(|| serde_json::json!({"id": &id, "deleted": true})));
            about_task(id, deleted)
        }
        _ => error(
            StatusCode::NOT_FOUND,
            None,
            INVALID,
            format!(
                "no route {path} (GET /health, GET /metrics, POST /tasks, GET|DELETE /tasks/ID)"
            ),
        ),
    }
}

/// The answer to a request about the task `id` (a lookup, a cancel): `answer` with 200, 404
/// when there was no such task, 503 when a store did not answer — one place, so that both
/// requests fail alike and a client reads their errors the same way.
fn about_task(
    id: String,
    answer: Result<Option<serde_json::Value>, NetError>,
) -> Response<Full<Bytes>> {
    match answer {
        Ok(Some(body)) => json(StatusCode::OK, &body),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            Some(id),
            INVALID,
            "no such task".into(),
        ),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(id),
            e.code().as_str(),
            e.to_string(),
        ),
    }
}

/// The task `id` as JSON: a connection task from the delay store, or else an HTTP task from
/// the outbox (with its `target` instead of a route).
async fn lookup(inner: &Inner, id: &str) -> Result<Option<serde_json::Value>, NetError> {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    if let Some(t) = inner.store.get(id).await? {
        return Ok(Some(serde_json::json!({
            "id": t.id, "route_key": t.route_key, "fire_at": t.fire_at,
            "attempts": t.attempts, "compression": t.compression,
            "payload_base64": b64(&t.payload),
        })));
    }
    let Some(outbox) = &inner.outbox else {
        return Ok(None);
    };
    let Some(item) = outbox.store().find(id).await? else {
        return Ok(None);
    };
    let fire_at = item
        .deliver_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let headers: serde_json::Map<String, serde_json::Value> = item
        .headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                serde_json::Value::from(String::from_utf8_lossy(v.as_bytes()).into_owned()),
            )
        })
        .collect();
    Ok(Some(serde_json::json!({
        "id": id, "fire_at": fire_at, "attempts": item.attempts, "compression": "none",
        "payload_base64": b64(&item.body),
        "target": {"method": item.method.as_str(), "url": item.url, "headers": headers},
    })))
}

/// Cancels the task `id`, a connection task or an HTTP task; whether there was one.
async fn cancel(inner: &Inner, id: &str) -> Result<bool, NetError> {
    if inner.store.ack(id, 0).await? {
        return Ok(true);
    }
    match &inner.outbox {
        Some(outbox) => outbox.store().cancel(id).await,
        None => Ok(false),
    }
}

/// `POST /tasks`: the body is a `schedule` line; the route's token is the line's `token`, or
/// else the `Authorization: Bearer` one (`bearer`).
async fn post_task(
    inner: &Inner,
    req: Request<Incoming>,
    bearer: Option<String>,
) -> Response<Full<Bytes>> {
    let body = match Limited::new(req.into_body(), MAX_LINE).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                INVALID,
                format!("the body is over {MAX_LINE} bytes"),
            )
        }
    };
    let s = match protocol::parse(&body) {
        Ok(Inbound::Schedule(s)) => s,
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                None,
                INVALID,
                "the body must be a `schedule` line".into(),
            )
        }
        Err(bad) => return error(StatusCode::BAD_REQUEST, bad.id, bad.code, bad.message),
    };
    let Some(route) = s.route_key.clone() else {
        return error(
            StatusCode::BAD_REQUEST,
            s.id,
            INVALID,
            "`route_key` is required over HTTP".into(),
        );
    };
    if !inner
        .config
        .admits(&route, s.token.as_deref().or(bearer.as_deref()))
    {
        return error(
            StatusCode::FORBIDDEN,
            s.id,
            FORBIDDEN,
            format!("route `{route}` needs its token"),
        );
    }
    match schedule(inner, s, &route).await {
        Answer::Now(Outbound::Error { id, code, message }) => {
            error(StatusCode::BAD_REQUEST, id, code, message)
        }
        Answer::Now(other) => json(
            StatusCode::OK,
            &serde_json::to_value(&other).unwrap_or_default(),
        ),
        Answer::Stored { id, fire_at, done } => match done.await {
            Ok(Ok(done)) => {
                let fire_at = acked_fire_at(&*inner.store, &id, done, fire_at).await;
                json(
                    StatusCode::OK,
                    &serde_json::json!({"kind": "ack", "id": id, "fire_at": fire_at}),
                )
            }
            Ok(Err((code, message))) => {
                error(StatusCode::SERVICE_UNAVAILABLE, Some(id), code, message)
            }
            Err(_) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                Some(id),
                UNAVAILABLE,
                "the server is stopping".into(),
            ),
        },
    }
}
