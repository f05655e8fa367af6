//! A tonic gRPC client whose channel is the client: HTTP/2 prior knowledge (h2c) to a tonic
//! service on loopback — for the whole client, or for one host by its policy — with the
//! address guard, the interceptors, the observer and the timeouts of the client's policy
//! applying to each gRPC call, and a call whose stream the server refused sent again.

use std::{
    error::Error as _,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use http::Version;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use prost::Message as _;
use soulbase_net_core::{
    ErrorCode, ErrorKind, NetError, NetEvent, NetRequest, Observer, Outcome, Phase,
};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;
use tokio::{net::TcpListener, task::JoinSet};
use tonic::{codegen::tokio_stream, Request, Response, Status};

use super::{
    bounded,
    echo::{
        echo_client::EchoClient,
        echo_server::{Echo, EchoServer},
        CountRequest, SayReply, SayRequest,
    },
    loopback_policy, LoopbackDialer,
};

/// The service: echoes, naming the `x-through` header it got; counts up; or never answers
/// (`"stall"`).
struct Echoer;

#[tonic::async_trait]
impl Echo for Echoer {
    async fn say(&self, request: Request<SayRequest>) -> Result<Response<SayReply>, Status> {
        let through = request
            .metadata()
            .get("x-through")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        let text = request.into_inner().text;
        if text == "stall" {
            std::future::pending::<()>().await;
        }
        Ok(Response::new(SayReply {
            text: format!("{text} via {through}"),
        }))
    }

    type CountStream = tokio_stream::Iter<std::vec::IntoIter<Result<SayReply, Status>>>;

    async fn count(
        &self,
        request: Request<CountRequest>,
    ) -> Result<Response<Self::CountStream>, Status> {
        let replies: Vec<_> = (1..=request.into_inner().count)
            .map(|n| {
                Ok(SayReply {
                    text: n.to_string(),
                })
            })
            .collect();
        Ok(Response::new(tokio_stream::iter(replies)))
    }
}

/// The tonic service served by hyper's HTTP/2 server on a loopback port, counting the
/// connections it accepts and the HTTP/2 requests it gets.
struct GrpcServer {
    addr: SocketAddr,
    connections: Arc<AtomicU64>,
    h2_requests: Arc<AtomicU64>,
    tasks: JoinSet<()>,
}

impl GrpcServer {
    async fn start() -> GrpcServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicU64::new(0));
        let h2_requests = Arc::new(AtomicU64::new(0));
        let mut tasks = JoinSet::new();
        let (accepted, seen) = (connections.clone(), h2_requests.clone());
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                accepted.fetch_add(1, Ordering::SeqCst);
                let seen = seen.clone();
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    if req.version() == Version::HTTP_2 {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                    let mut echo = EchoServer::new(Echoer);
                    tower::Service::call(&mut echo, req)
                });
                conns.spawn(async move {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        GrpcServer {
            addr,
            connections,
            h2_requests,
            tasks,
        }
    }

    fn origin(&self) -> http::Uri {
        format!("http://{}", self.addr).parse().unwrap()
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// Adds `x-through: soulbase` to every request: an interceptor of the client, run on gRPC
/// calls as on any other.
struct Through;

#[async_trait::async_trait]
impl soulbase_net_core::Interceptor for Through {
    async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
        req.headers
            .insert("x-through", http::HeaderValue::from_static("soulbase"));
        Ok(())
    }
}

/// Counts calls started and calls finished with a 200 response.
#[derive(Debug, Default)]
struct Calls {
    started: AtomicU64,
    ok: AtomicU64,
}

impl Observer for Calls {
    fn on_event(&self, ev: &NetEvent<'_>) {
        match ev {
            NetEvent::RequestStarted { .. } => {
                self.started.fetch_add(1, Ordering::SeqCst);
            }
            NetEvent::RequestFinished {
                outcome: Outcome::Response(http::StatusCode::OK),
                ..
            } => {
                self.ok.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }
}

fn grpc_client(policy: NetPolicy, calls: Arc<Calls>) -> Client {
    Client::builder()
        .policy(policy)
        .http2_prior_knowledge(true)
        .dialer(Arc::new(LoopbackDialer::default()))
        .interceptor(Through)
        .observer(calls)
        .build()
        .unwrap()
}

/// The client's error inside a tonic `Status`.
fn net_error(status: &Status) -> &NetError {
    status
        .source()
        .and_then(|e| e.downcast_ref::<NetError>())
        .unwrap_or_else(|| panic!("no NetError under {status:?}"))
}

#[tokio::test]
async fn a_tonic_client_calls_through_the_client_over_h2c() {
    let server = GrpcServer::start().await;
    let calls = Arc::new(Calls::default());
    let client = grpc_client(loopback_policy(), calls.clone());
    let mut grpc = EchoClient::with_origin(client, server.origin());

    let reply = bounded(grpc.say(SayRequest {
        text: "hello".into(),
    }))
    .await
    .unwrap();
    assert_eq!(reply.into_inner().text, "hello via soulbase");

    // A server stream: messages as they come, then the trailers' grpc-status.
    let mut stream = bounded(grpc.count(CountRequest { count: 3 }))
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    while let Some(reply) = bounded(stream.message()).await.unwrap() {
        got.push(reply.text);
    }
    assert_eq!(got, ["1", "2", "3"]);

    // Both calls went through the client's pipeline, as HTTP/2 on one connection.
    assert_eq!(calls.started.load(Ordering::SeqCst), 2);
    assert_eq!(calls.ok.load(Ordering::SeqCst), 2);
    assert_eq!(server.h2_requests.load(Ordering::SeqCst), 2);
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_address_guard_refuses_a_grpc_call_before_any_connection() {
    let server = GrpcServer::start().await;
    // The default policy: loopback is not granted.
    let mut policy = NetPolicy::default();
    policy.dns.nameservers = vec!["127.0.0.1:9".parse().unwrap()];
    let mut grpc = EchoClient::with_origin(grpc_client(policy, Arc::default()), server.origin());

    let status = bounded(grpc.say(SayRequest { text: "x".into() }))
        .await
        .unwrap_err();
    let err = net_error(&status);
    assert_eq!(err.kind(), ErrorKind::Blocked);
    assert_eq!(err.code(), ErrorCode::AuthForbidden);
    assert_eq!(server.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_policys_first_byte_timeout_ends_a_stalled_grpc_call() {
    let server = GrpcServer::start().await;
    let mut policy = loopback_policy();
    let t = &mut policy.timeout;
    (t.connect, t.read, t.write) = (Duration::from_millis(200), t.attempt, t.attempt);
    t.ttfb = Duration::from_millis(200);
    let mut grpc = EchoClient::with_origin(grpc_client(policy, Arc::default()), server.origin());

    let status = bounded(grpc.say(SayRequest {
        text: "stall".into(),
    }))
    .await
    .unwrap_err();
    assert_eq!(net_error(&status).kind(), ErrorKind::Timeout(Phase::Ttfb));
    assert_eq!(server.h2_requests.load(Ordering::SeqCst), 1);
}

/// An HTTP/2 server answering `Echo/Say` as [`Echoer`] does (with ` via h2`), that refuses
/// its first `refuse` streams with `REFUSED_STREAM` (RFC 9113 §8.7: not processed). Served by
/// the h2 crate: hyper's server cannot refuse a stream. Counts the streams opened and keeps
/// the bodies of the calls it answered.
struct RefusingGrpc {
    addr: SocketAddr,
    streams: Arc<AtomicU64>,
    answered: Arc<Mutex<Vec<Bytes>>>,
    tasks: JoinSet<()>,
}

impl RefusingGrpc {
    async fn start(refuse: u64) -> RefusingGrpc {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let streams = Arc::new(AtomicU64::new(0));
        let answered = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = JoinSet::new();
        let (opened, kept) = (streams.clone(), answered.clone());
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (opened, kept) = (opened.clone(), kept.clone());
                conns.spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(tcp).await else {
                        return;
                    };
                    let mut calls = JoinSet::new();
                    while let Some(Ok((req, mut respond))) = conn.accept().await {
                        if opened.fetch_add(1, Ordering::SeqCst) < refuse {
                            respond.send_reset(h2::Reason::REFUSED_STREAM);
                        } else {
                            calls.spawn(answer_say(req.into_body(), respond, kept.clone()));
                        }
                    }
                });
            }
        });
        RefusingGrpc {
            addr,
            streams,
            answered,
            tasks,
        }
    }

    fn origin(&self) -> http::Uri {
        format!("http://{}", self.addr).parse().unwrap()
    }
}

impl Drop for RefusingGrpc {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// Reads a `Say` call's body and answers it: the reply message, then `grpc-status: 0` in the
/// trailers.
async fn answer_say(
    mut body: h2::RecvStream,
    mut respond: h2::server::SendResponse<Bytes>,
    kept: Arc<Mutex<Vec<Bytes>>>,
) {
    let mut got = BytesMut::new();
    while let Some(Ok(data)) = body.data().await {
        got.extend_from_slice(&data);
        let _ = body.flow_control().release_capacity(data.len());
    }
    let got = got.freeze();
    kept.lock().push(got.clone());
    let say = SayRequest::decode(&got[5..]).unwrap();
    let reply = SayReply {
        text: format!("{} via h2", say.text),
    };
    let head = http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let mut send = respond.send_response(head, false).unwrap();
    send.send_data(grpc_frame(&reply.encode_to_vec()), false)
        .unwrap();
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    send.send_trailers(trailers).unwrap();
}

/// One gRPC message, length-prefixed and uncompressed.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(message);
    Bytes::from(frame)
}

#[tokio::test]
async fn a_tonic_call_whose_stream_was_refused_goes_again_and_succeeds() {
    let server = RefusingGrpc::start(1).await;
    let calls = Arc::new(Calls::default());
    let mut grpc = EchoClient::with_origin(
        grpc_client(loopback_policy(), calls.clone()),
        server.origin(),
    );

    let reply = bounded(grpc.say(SayRequest {
        text: "quote".into(),
    }))
    .await
    .unwrap();

    assert_eq!(reply.into_inner().text, "quote via h2");
    // Two attempts reached the server: the refused stream, then the answered one, which
    // carried tonic's whole message (kept by the client, since the refused stream took it).
    assert_eq!(server.streams.load(Ordering::SeqCst), 2);
    let answered = server.answered.lock().clone();
    let sent = SayRequest {
        text: "quote".into(),
    };
    assert_eq!(answered, [grpc_frame(&sent.encode_to_vec())]);
    // One call, answered.
    assert_eq!(calls.started.load(Ordering::SeqCst), 1);
    assert_eq!(calls.ok.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_policy_override_speaks_h2c_to_the_grpc_host_only() {
    // The builder's default (HTTP/1.1 on `http`) for every host but `grpc.test`, whose
    // override asks for HTTP/2 prior knowledge: a tonic service that speaks nothing else.
    let server = GrpcServer::start().await;
    let web = soulbase_net_testkit::FaultServer::http1()
        .route("/", soulbase_net_testkit::Reply::ok("page"))
        .start()
        .await
        .unwrap();
    let mut base = loopback_policy();
    for name in ["grpc.test", "web.test"] {
        let loopback = vec![std::net::IpAddr::from([127, 0, 0, 1])];
        base.dns.static_hosts.insert(name.to_owned(), loopback);
    }
    let mut doc = soulbase_net_policy::PolicyDocument::from_policy(&base);
    doc.set_override(
        "grpc.test",
        serde_json::json!({ "pool": { "http2_prior_knowledge": true } }),
    );
    let resolver = soulbase_net_policy::SnapshotResolver::new(doc).unwrap();
    let client = Client::builder()
        .policy_resolver(Arc::new(resolver))
        .dialer(Arc::new(LoopbackDialer::default()))
        .build()
        .unwrap();

    let origin = format!("http://grpc.test:{}", server.addr.port());
    let mut grpc = EchoClient::with_origin(client.clone(), origin.parse().unwrap());
    let reply = bounded(grpc.say(SayRequest { text: "hi".into() }))
        .await
        .unwrap();
    assert_eq!(reply.into_inner().text, "hi via -");
    assert_eq!(server.h2_requests.load(Ordering::SeqCst), 1);

    let url = format!("http://web.test:{}/", web.addr().port());
    let page = bounded(client.send(NetRequest::get(url))).await.unwrap();
    assert_eq!(page.status, 200);
    assert_eq!(web.received_requests()[0].version, Version::HTTP_11);
    web.join().await;
}
