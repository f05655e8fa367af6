//! Types, stable error codes and traits of soulbase-net, the governed outbound HTTP layer.
//!
//! This crate has no I/O. It defines what every other crate and every service speaks:
//!
//! - [`NetRequest`] (with a builder), [`Body`], [`TimeoutCfg`]; [`NetResponse`],
//!   [`RespBody`], [`Elapsed`];
//! - [`NetError`]: one opaque error, one pointer wide, with its [`ErrorKind`], the stable
//!   SB-02 [`ErrorCode`] and its public view, the attempts made, and the source chain; the
//!   HTTP status and [`GrpcCode`] a service answers its caller with when an outbound call
//!   failed ([`NetError::http_status`], [`NetError::grpc_code`]);
//! - [`NetClient`] (one object-safe method) and [`NetClientExt`] (`get_json`, `post_json`,
//!   `get_bytes` and `for_tenant` → [`ForTenant`], for every client); [`Interceptor`]; [`Observer`] and [`NetEvent`]; [`GaugeSource`];
//! - conversions to and from the `http` crate's types: `NetRequest: TryFrom<http::Request<B>>`,
//!   `http::Response<RespBody>: From<NetResponse>`, and [`RespBody`] as an `http_body::Body`
//!   (what the runtime's `tower::Service` face is made of).
//!
//! A service that only needs to call a client, or to provide a test double, depends on this
//! crate alone; `soulbase-net-runtime` provides the real client.
//!
//! Features (all off by default): `tonic` adds `From<NetError> for tonic::Status` and
//! `NetError::from_status`, so a failure crosses a gRPC boundary with its code and kind.
//!
//! ```
//! use soulbase_net_core::{ErrorCode, ErrorKind, NetRequest};
//!
//! let req = NetRequest::get("http://user:pw@api.example.com/");
//! let err = req.validate(1 << 20).unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::InvalidRequest);
//! assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
//! assert_eq!(err.code().as_str(), "SCHEMA.VALIDATION_FAILED");
//! ```

mod body;
mod client;
mod deadline;
mod error;
mod event;
mod fanout;
mod interceptor;
mod interop;
mod key;
pub mod recent;
mod request;
mod response;
mod timeout;

pub use crate::body::{Body, BodyStream};
pub use crate::client::{ForTenant, NetClient, NetClientExt};
pub use crate::deadline::{parallel_deadline, serial_deadline};
pub use crate::error::{
    redact_url, status_code, BoxError, ErrorCode, ErrorKind, GrpcCode, NetError, Phase,
    ERROR_CODE_HEADER, ERROR_KIND_HEADER,
};
pub use crate::event::{
    BreakerState, Direction, DnsSource, GaugeReading, GaugeSource, LimitScope, NetEvent,
    NoopObserver, Observer, OutboxStep, Outcome, RequestInfo, RetireReason, Takes,
};
pub use crate::fanout::Fanout;
pub use crate::interceptor::{Hooks, Interceptor};
pub use crate::key::new_idempotency_key;
pub use crate::request::{check_url, NetRequest};
pub use crate::response::{parse_retry_after, Elapsed, NetResponse, RespBody};
pub use crate::timeout::TimeoutCfg;

/// Re-exported so that users need not depend on these crates to name their types.
pub use {bytes, http, url};
