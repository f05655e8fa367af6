//! The client traits: [`NetClient`] (one method) and [`NetClientExt`] (the conveniences).

use std::{future::Future, sync::Arc};

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};

use crate::{error::NetError, request::NetRequest, response::NetResponse};

/// Sends [`NetRequest`]s. Object-safe, so services hold an `Arc<dyn NetClient>` and tests
/// swap in a double that implements this one method.
///
/// # Examples
/// A test double:
/// ```
/// use soulbase_net_core::{NetClient, NetClientExt, NetError, NetRequest, NetResponse};
///
/// struct Canned;
///
/// #[async_trait::async_trait]
/// impl NetClient for Canned {
///     async fn send(&self, req: NetRequest) -> Result<NetResponse, NetError> {
///         Ok(NetResponse::from_bytes(http::StatusCode::OK, format!(r#"{{"url":"{}"}}"#, req.url)))
///     }
/// }
///
/// # async fn run() -> Result<(), NetError> {
/// let client: std::sync::Arc<dyn NetClient> = std::sync::Arc::new(Canned);
/// let v: serde_json::Value = client.get_json("https://api.example.com/u/1", None).await?;
/// assert_eq!(v["url"], "https://api.example.com/u/1");
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
/// ```
#[async_trait::async_trait]
pub trait NetClient: Send + Sync {
    /// Sends the request under its policy and returns the response, whatever its status.
    ///
    /// # Errors
    /// A [`NetError`] whose [`kind`](NetError::kind) says what failed.
    async fn send(&self, req: NetRequest) -> Result<NetResponse, NetError>;
}

#[async_trait::async_trait]
impl<T: NetClient + ?Sized> NetClient for Arc<T> {
    async fn send(&self, req: NetRequest) -> Result<NetResponse, NetError> {
        (**self).send(req).await
    }
}

#[async_trait::async_trait]
impl<T: NetClient + ?Sized> NetClient for Box<T> {
    async fn send(&self, req: NetRequest) -> Result<NetResponse, NetError> {
        (**self).send(req).await
    }
}

/// Conveniences over any [`NetClient`] (seed 000 §4.1), implemented for every client.
///
/// Each one treats an error status as an error, with the code of
/// [`status_code`](crate::status_code), and a body that does not decode as
/// [`ErrorKind::Decode`](crate::ErrorKind::Decode).
pub trait NetClientExt: NetClient {
    /// GETs `url` and decodes the JSON body.
    ///
    /// # Errors
    /// As [`NetClient::send`], plus error statuses and decoding.
    fn get_json<T>(
        &self,
        url: &str,
        policy_key: Option<&str>,
    ) -> impl Future<Output = Result<T, NetError>> + Send
    where
        T: DeserializeOwned + Send;

    /// POSTs `body` as JSON to `url` and decodes the JSON answer. The POST is not marked
    /// idempotent, so it is never retried; build a [`NetRequest`] to opt in.
    ///
    /// # Errors
    /// As [`NetClient::send`], plus serialisation, error statuses and decoding.
    fn post_json<B, T>(
        &self,
        url: &str,
        body: &B,
        policy_key: Option<&str>,
    ) -> impl Future<Output = Result<T, NetError>> + Send
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned + Send;

    /// GETs `url` and returns the whole body.
    ///
    /// # Errors
    /// As [`NetClient::send`], plus error statuses.
    fn get_bytes(
        &self,
        url: &str,
        policy_key: Option<&str>,
    ) -> impl Future<Output = Result<Bytes, NetError>> + Send;
}

impl<C: NetClient + ?Sized> NetClientExt for C {
    fn get_json<T>(
        &self,
        url: &str,
        policy_key: Option<&str>,
    ) -> impl Future<Output = Result<T, NetError>> + Send
    where
        T: DeserializeOwned + Send,
    {
        let req = with_key(NetRequest::get(url), policy_key);
        async move { self.send(req).await?.error_for_status()?.json().await }
    }

    fn post_json<B, T>(
        &self,
        url: &str,
        body: &B,
        policy_key: Option<&str>,
    ) -> impl Future<Output = Result<T, NetError>> + Send
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned + Send,
    {
        let req = NetRequest::post(url)
            .json(body)
            .map(|r| with_key(r, policy_key));
        async move { self.send(req?).await?.error_for_status()?.json().await }
    }

    fn get_bytes(
        &self,
        url: &str,
        policy_key: Option<&str>,
    ) -> impl Future<Output = Result<Bytes, NetError>> + Send {
        let req = with_key(NetRequest::get(url), policy_key);
        async move { self.send(req).await?.error_for_status()?.bytes().await }
    }
}

fn with_key(req: NetRequest, key: Option<&str>) -> NetRequest {
    match key {
        Some(k) => req.policy_key(k),
        None => req,
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::*;
    use crate::{ErrorCode, ErrorKind};

    /// Method, URL, policy key and body of a request the recorder was sent.
    type Seen = (http::Method, String, Option<String>, Option<Bytes>);

    /// Answers with a fixed status and body and records what it was sent.
    struct Recorder {
        status: u16,
        body: &'static str,
        seen: Mutex<Vec<Seen>>,
    }

    #[async_trait::async_trait]
    impl NetClient for Recorder {
        async fn send(&self, req: NetRequest) -> Result<NetResponse, NetError> {
            let body = req.body_bytes()?;
            self.seen.lock().push((
                req.method.clone(),
                req.url.clone(),
                req.policy_key.clone(),
                body,
            ));
            Ok(NetResponse::from_bytes(
                http::StatusCode::from_u16(self.status).unwrap(),
                self.body,
            ))
        }
    }

    fn recorder(status: u16, body: &'static str) -> Recorder {
        Recorder {
            status,
            body,
            seen: Mutex::new(Vec::new()),
        }
    }

    #[tokio::test]
    async fn get_json_sends_a_get_with_the_policy_key() {
        let c = recorder(200, r#"{"n":1}"#);
        let v: serde_json::Value = c.get_json("http://h.example/a", Some("pk")).await.unwrap();
        assert_eq!(v["n"], 1);
        let seen = c.seen.lock();
        assert_eq!(seen[0].0, http::Method::GET);
        assert_eq!(seen[0].1, "http://h.example/a");
        assert_eq!(seen[0].2.as_deref(), Some("pk"));
    }

    #[tokio::test]
    async fn post_json_serialises_the_body() {
        let c = recorder(201, r#"{"ok":true}"#);
        let v: serde_json::Value = c
            .post_json("http://h.example/p", &serde_json::json!({"a": 1}), None)
            .await
            .unwrap();
        assert_eq!(v["ok"], true);
        let seen = c.seen.lock();
        assert_eq!(seen[0].0, http::Method::POST);
        assert_eq!(seen[0].3.as_deref(), Some(&br#"{"a":1}"#[..]));
    }

    #[tokio::test]
    async fn helpers_turn_error_statuses_into_errors() {
        for (status, code) in [
            (503, ErrorCode::ProviderUnavailable),
            (429, ErrorCode::QuotaRateLimited),
            (403, ErrorCode::AuthForbidden),
            (404, ErrorCode::SchemaValidationFailed),
        ] {
            let c = recorder(status, "{}");
            let err = c.get_bytes("http://h.example/", None).await.unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::Status(http::StatusCode::from_u16(status).unwrap())
            );
            assert_eq!(err.code(), code);
            let err = c
                .get_json::<serde_json::Value>("http://h.example/", None)
                .await
                .unwrap_err();
            assert_eq!(err.code(), code);
        }
    }

    #[tokio::test]
    async fn trait_objects_and_arcs_are_clients() {
        let c: Arc<dyn NetClient> = Arc::new(recorder(200, "raw"));
        assert_eq!(c.get_bytes("http://h.example/", None).await.unwrap(), "raw");
        let boxed: Box<dyn NetClient> = Box::new(recorder(200, "x"));
        assert_eq!(
            boxed.get_bytes("http://h.example/", None).await.unwrap(),
            "x"
        );
    }
}
