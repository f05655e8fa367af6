//! The control plane's HTTP face: the routes of [`control`](super), served on hyper's
//! HTTP/1.1 connections by the runtime's server loop (`Http1Server`, the delay server's too:
//! one task per connection, all aborted at shutdown).

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use soulbase_net_core::{ErrorKind, NetError};
use soulbase_net_runtime::serve::Http1Server;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::agents::AgentList;
use super::metrics::Metrics;
use super::store::{Registered, Reported};
use super::{create_task, token_hash, Inner};
use crate::protocol::{
    ClaimRequest, ClaimResponse, CreateTask, CreateTaskResponse, ErrorBody, ExtendRequest,
    ExtendResponse, HeartbeatRequest, HeartbeatResponse, RegisterRequest, RegisterResponse,
    ReportRequest, ReportResponse, TaskResults, AGENT_ID_HEADER, AGENT_TOKEN_HEADER,
};

/// The largest request body taken.
const MAX_BODY: usize = 1 << 20;

/// How long a client has to send a request's head.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The most results one `GET …/results` returns.
const MAX_RESULTS: u32 = 1000;

type Answer = Response<Full<Bytes>>;

/// Serves HTTP on `listener` until told to stop.
pub(super) async fn serve(
    inner: Arc<Inner>,
    listener: TcpListener,
    mut stopped: watch::Receiver<bool>,
) {
    // A client that never finishes its request head does not hold a connection for ever.
    Http1Server::new(listener)
        .header_read_timeout(HEADER_READ_TIMEOUT)
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

fn json<T: Serialize>(status: StatusCode, body: &T) -> Answer {
    let text = serde_json::to_vec(body).unwrap_or_default();
    let mut res = Response::new(Full::new(Bytes::from(text)));
    *res.status_mut() = status;
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    res
}

fn error(status: StatusCode, kind: ErrorKind, message: impl Into<String>) -> Answer {
    json(
        status,
        &ErrorBody {
            code: kind.code().as_str().to_owned(),
            message: message.into(),
        },
    )
}

/// The answer for a store (or validation) error.
fn failed(e: &NetError) -> Answer {
    let status = match e.kind() {
        ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    let message = e.message().map_or_else(|| e.to_string(), str::to_owned);
    error(status, e.kind(), message)
}

fn header<'a>(req: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    req.headers().get(name)?.to_str().ok()
}

/// The body of `req` as `T`, or the answer refusing it.
async fn body<T: DeserializeOwned>(req: Request<Incoming>) -> Result<T, Answer> {
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorKind::InvalidRequest,
                format!("the body is over {MAX_BODY} bytes, or was cut"),
            ))
        }
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            ErrorKind::InvalidRequest,
            format!("the body does not read: {e}"),
        )
    })
}

/// The agent the request comes from, once its token is checked; or the refusal.
async fn agent(inner: &Inner, req: &Request<Incoming>) -> Result<String, Answer> {
    let (Some(id), Some(token)) = (
        header(req, AGENT_ID_HEADER),
        header(req, AGENT_TOKEN_HEADER),
    ) else {
        Metrics::add(&inner.metrics.unauthorized);
        return Err(error(
            StatusCode::UNAUTHORIZED,
            ErrorKind::Blocked,
            "X-Agent-Id and X-Agent-Token are required",
        ));
    };
    match inner.store.authenticate(id, &token_hash(token)).await {
        Ok(true) => Ok(id.to_owned()),
        Ok(false) => {
            Metrics::add(&inner.metrics.unauthorized);
            Err(error(
                StatusCode::FORBIDDEN,
                ErrorKind::Blocked,
                "unknown agent or wrong token (register first)",
            ))
        }
        Err(e) => Err(failed(&e)),
    }
}

/// `None` when the request may use the operator endpoints; else the refusal.
fn refuse_admin(inner: &Inner, req: &Request<Incoming>) -> Option<Answer> {
    let want = inner.config.admin_token.as_deref()?;
    let given = header(req, "authorization")
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    if given == Some(want) {
        return None;
    }
    Metrics::add(&inner.metrics.unauthorized);
    Some(error(
        StatusCode::FORBIDDEN,
        ErrorKind::Blocked,
        "the operator endpoints need Authorization: Bearer <admin token>",
    ))
}

async fn handle(inner: &Inner, req: Request<Incoming>) -> Answer {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["health"]) => match inner.store.counts(inner.config.stale_after()).await {
            Ok(_) => json(StatusCode::OK, &serde_json::json!({"status": "ok"})),
            Err(e) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({"status": "store unavailable", "message": e.to_string()}),
            ),
        },
        (&Method::GET, ["metrics"]) => {
            let counts = inner.store.counts(inner.config.stale_after()).await.ok();
            let mut res = Response::new(Full::new(Bytes::from(inner.metrics.render(counts))));
            res.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            res
        }
        (&Method::POST, ["v1", "agents", "register"]) => register(inner, req).await,
        (&Method::POST, ["v1", "agents", "heartbeat"]) => heartbeat(inner, req).await,
        (&Method::POST, ["v1", "leases", "claim"]) => claim(inner, req).await,
        (&Method::POST, ["v1", "leases", "extend"]) => extend(inner, req).await,
        (&Method::POST, ["v1", "leases", "report"]) => report(inner, req).await,
        (&Method::POST, ["v1", "leases", lease, "revoke"]) => {
            if let Some(refused) = refuse_admin(inner, &req) {
                return refused;
            }
            match inner.store.revoke(lease).await {
                Ok(true) => {
                    Metrics::add(&inner.metrics.revoked);
                    json(StatusCode::OK, &serde_json::json!({"revoked": true}))
                }
                Ok(false) => error(
                    StatusCode::NOT_FOUND,
                    ErrorKind::InvalidRequest,
                    "no such lease",
                ),
                Err(e) => failed(&e),
            }
        }
        (&Method::GET, ["v1", "agents"]) => {
            if let Some(refused) = refuse_admin(inner, &req) {
                return refused;
            }
            match inner.store.agents(inner.config.stale_after()).await {
                Ok(agents) => json(StatusCode::OK, &AgentList { agents }),
                Err(e) => failed(&e),
            }
        }
        (&Method::POST, ["v1", "tasks"]) => {
            if let Some(refused) = refuse_admin(inner, &req) {
                return refused;
            }
            let task: CreateTask = match body(req).await {
                Ok(t) => t,
                Err(refused) => return refused,
            };
            match create_task(inner, task).await {
                Ok(task_id) => json(StatusCode::CREATED, &CreateTaskResponse { task_id }),
                Err(e) => failed(&e),
            }
        }
        (&Method::GET, ["v1", "tasks", id]) => {
            if let Some(refused) = refuse_admin(inner, &req) {
                return refused;
            }
            match inner.store.task(id).await {
                Ok(Some(view)) => json(StatusCode::OK, &view),
                Ok(None) => error(
                    StatusCode::NOT_FOUND,
                    ErrorKind::InvalidRequest,
                    "no such task",
                ),
                Err(e) => failed(&e),
            }
        }
        (&Method::DELETE, ["v1", "tasks", id]) => {
            if let Some(refused) = refuse_admin(inner, &req) {
                return refused;
            }
            match inner.store.cancel(id).await {
                Ok(true) => json(StatusCode::OK, &serde_json::json!({"cancelled": true})),
                Ok(false) => error(
                    StatusCode::NOT_FOUND,
                    ErrorKind::InvalidRequest,
                    "no such task (or cancelled)",
                ),
                Err(e) => failed(&e),
            }
        }
        (&Method::GET, ["v1", "tasks", id, "results"]) => {
            if let Some(refused) = refuse_admin(inner, &req) {
                return refused;
            }
            let limit = req
                .uri()
                .query()
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("limit=")))
                .and_then(|n| n.parse::<u32>().ok())
                .unwrap_or(100)
                .min(MAX_RESULTS);
            match inner.store.results(id, limit).await {
                Ok(results) => json(StatusCode::OK, &TaskResults { results }),
                Err(e) => failed(&e),
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            ErrorKind::InvalidRequest,
            format!("no route {method} {path}"),
        ),
    }
}

async fn register(inner: &Inner, req: Request<Incoming>) -> Answer {
    let (Some(id), Some(token)) = (
        header(&req, AGENT_ID_HEADER).map(str::to_owned),
        header(&req, AGENT_TOKEN_HEADER).map(str::to_owned),
    ) else {
        Metrics::add(&inner.metrics.unauthorized);
        return error(
            StatusCode::UNAUTHORIZED,
            ErrorKind::Blocked,
            "X-Agent-Id and X-Agent-Token are required",
        );
    };
    if id.is_empty() || id.len() > 200 || token.len() < 8 {
        return error(
            StatusCode::BAD_REQUEST,
            ErrorKind::InvalidRequest,
            "an agent id is 1 to 200 bytes and a token at least 8",
        );
    }
    let request: RegisterRequest = match body(req).await {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    let info = serde_json::to_string(&request).unwrap_or_default();
    match inner.store.register(&id, &token_hash(&token), &info).await {
        Ok(Registered::Yes { session, resumed }) => {
            Metrics::add(&inner.metrics.registered);
            tracing::info!(agent = %id, session, resumed, "agent registered");
            json(
                StatusCode::OK,
                &RegisterResponse {
                    agent_id: id,
                    session,
                    resumed,
                    heartbeat_ms: u64::try_from(inner.config.heartbeat_every.as_millis())
                        .unwrap_or(u64::MAX),
                    lease_ms: inner.store.lease_ms(),
                },
            )
        }
        Ok(Registered::WrongToken) => {
            Metrics::add(&inner.metrics.unauthorized);
            error(
                StatusCode::FORBIDDEN,
                ErrorKind::Blocked,
                "this agent id is registered with another token",
            )
        }
        Err(e) => failed(&e),
    }
}

async fn heartbeat(inner: &Inner, req: Request<Incoming>) -> Answer {
    let id = match agent(inner, &req).await {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    let beat: HeartbeatRequest = match body(req).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    tracing::debug!(agent = %id, inflight = beat.inflight, queued = beat.queued, "heartbeat");
    Metrics::add(&inner.metrics.heartbeats);
    match inner.store.heartbeat(&id).await {
        Ok(session) => json(StatusCode::OK, &HeartbeatResponse { session }),
        Err(e) => failed(&e),
    }
}

async fn claim(inner: &Inner, req: Request<Incoming>) -> Answer {
    let id = match agent(inner, &req).await {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    let request: ClaimRequest = match body(req).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    Metrics::add(&inner.metrics.claims);
    let mut leases = Vec::new();
    for (kind, n) in request.capacity {
        match inner
            .store
            .claim(&id, kind, n.min(1000), inner.config.stale_after())
            .await
        {
            Ok(mut got) => leases.append(&mut got),
            // Leases taken already stay in the answer; they would otherwise be held for
            // nothing until they ran out.
            Err(e) if leases.is_empty() => return failed(&e),
            Err(e) => {
                tracing::warn!(error = %e, "claim cut short");
                break;
            }
        }
    }
    Metrics::add_n(&inner.metrics.leased, leases.len());
    json(StatusCode::OK, &ClaimResponse { leases })
}

async fn extend(inner: &Inner, req: Request<Incoming>) -> Answer {
    let id = match agent(inner, &req).await {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    let request: ExtendRequest = match body(req).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    match inner.store.extend(&id, &request.lease_ids).await {
        Ok(extended) => {
            let lost: Vec<String> = request
                .lease_ids
                .into_iter()
                .filter(|l| !extended.contains(l))
                .collect();
            Metrics::add_n(&inner.metrics.extended, extended.len());
            Metrics::add_n(&inner.metrics.lost, lost.len());
            json(
                StatusCode::OK,
                &ExtendResponse {
                    extended,
                    lost,
                    lease_ms: inner.store.lease_ms(),
                },
            )
        }
        Err(e) => failed(&e),
    }
}

async fn report(inner: &Inner, req: Request<Incoming>) -> Answer {
    let id = match agent(inner, &req).await {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    let request: ReportRequest = match body(req).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let mut answer = ReportResponse {
        acknowledged: true,
        ..ReportResponse::default()
    };
    for report in &request.reports {
        match inner.store.report(&id, report).await {
            Ok(Reported::Recorded) => {
                Metrics::add(&inner.metrics.reported);
                answer.accepted.push(report.lease_id.clone());
            }
            Ok(Reported::Duplicate) => {
                Metrics::add(&inner.metrics.duplicates);
                answer.accepted.push(report.lease_id.clone());
            }
            Ok(Reported::Refused) => {
                Metrics::add(&inner.metrics.refused);
                tracing::info!(agent = %id, lease = %report.lease_id, "stale or foreign report refused");
                answer.refused.push(report.lease_id.clone());
            }
            // Nothing is acknowledged: the agent sends the whole request again, and what was
            // recorded already comes back as a duplicate.
            Err(e) => return failed(&e),
        }
    }
    json(StatusCode::OK, &answer)
}
