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
/// let v: serde_json::Value = client.get_json("https://api.example.com/u/1").await?;
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

#[async_trait::async_trait]
impl<T: NetClient + ?Sized> NetClient for &T {
    async fn send(&self, req: NetRequest) -> Result<NetResponse, NetError> {
        (**self).send(req).await
    }
}

/// Conveniences over any [`NetClient`], implemented for every client.
///
/// Each one treats an error status as an error, with the code of
/// [`status_code`](crate::status_code), and a body that does not decode as
/// [`ErrorKind::Decode`](crate::ErrorKind::Decode). A request that needs more — a named
/// policy key, headers, a timeout, an idempotency key — is a [`NetRequest`] given to
/// [`NetClient::send`]; a tenant needs only [`for_tenant`](Self::for_tenant).
///
/// # Examples
/// ```no_run
/// use soulbase_net_core::{NetClient, NetClientExt, NetError, NetRequest};
///
/// # async fn run(client: &dyn NetClient) -> Result<(), NetError> {
/// let user: serde_json::Value = client.get_json("https://api.example.com/u/1").await?;
/// let order: serde_json::Value = client
///     .for_tenant("t1")
///     .post_json("https://orders.example.com/orders", &serde_json::json!({"sku": 7}))
///     .await?;
/// // With a named policy (the document's `[keys.bulk]`): a request builder option.
/// let report = client
///     .send(NetRequest::get("https://api.example.com/report").policy_key("bulk"))
///     .await?
///     .error_for_status()?
///     .bytes()
///     .await?;
/// # let _ = (user, order, report); Ok(()) }
/// ```
pub trait NetClientExt: NetClient {
    /// GETs `url` and decodes the JSON body.
    ///
    /// # Errors
    /// As [`NetClient::send`], plus error statuses and decoding.
    fn get_json<T>(&self, url: &str) -> impl Future<Output = Result<T, NetError>> + Send
    where
        T: DeserializeOwned + Send;

    /// POSTs `body` as JSON to `url` and decodes the JSON answer. The POST is not marked
    /// idempotent, so it is never retried; build a [`NetRequest`] with
    /// [`idempotency_key`](NetRequest::idempotency_key) to opt in.
    ///
    /// # Errors
    /// As [`NetClient::send`], plus serialisation, error statuses and decoding.
    fn post_json<B, T>(
        &self,
        url: &str,
        body: &B,
    ) -> impl Future<Output = Result<T, NetError>> + Send
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned + Send;

    /// GETs `url` and returns the whole body.
    ///
    /// # Errors
    /// As [`NetClient::send`], plus error statuses.
    fn get_bytes(&self, url: &str) -> impl Future<Output = Result<Bytes, NetError>> + Send;

    /// This client on behalf of `tenant`: a light handle (a reference and the tenant's name)
    /// whose requests carry the tenant — for its policy overrides, limits and quotas — unless
    /// they name one themselves. It is a [`NetClient`] too, so every convenience works on it.
    ///
    /// # Examples
    /// ```
    /// # use soulbase_net_core::{NetClient, NetClientExt, NetError, NetRequest, NetResponse};
    /// struct EchoTenant;
    ///
    /// #[async_trait::async_trait]
    /// impl NetClient for EchoTenant {
    ///     async fn send(&self, req: NetRequest) -> Result<NetResponse, NetError> {
    ///         let body = format!(r#"{{"tenant":"{}"}}"#, req.tenant.unwrap_or_default());
    ///         Ok(NetResponse::from_bytes(http::StatusCode::OK, body))
    ///     }
    /// }
    ///
    /// # async fn run() -> Result<(), NetError> {
    /// let client = EchoTenant;
    /// let v: serde_json::Value = client.for_tenant("t1").get_json("https://api.example.com/").await?;
    /// assert_eq!(v["tenant"], "t1");
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
    /// ```
    fn for_tenant(&self, tenant: impl Into<String>) -> ForTenant<&Self> {
        ForTenant::new(self, tenant)
    }
}

impl<C: NetClient + ?Sized> NetClientExt for C {
    fn get_json<T>(&self, url: &str) -> impl Future<Output = Result<T, NetError>> + Send
    where
        T: DeserializeOwned + Send,
    {
        let req = NetRequest::get(url);
        async move { self.send(req).await?.error_for_status()?.json().await }
    }

    fn post_json<B, T>(
        &self,
        url: &str,
        body: &B,
    ) -> impl Future<Output = Result<T, NetError>> + Send
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned + Send,
    {
        let req = NetRequest::post(url).json(body);
        async move { self.send(req?).await?.error_for_status()?.json().await }
    }

    fn get_bytes(&self, url: &str) -> impl Future<Output = Result<Bytes, NetError>> + Send {
        let req = NetRequest::get(url);
        async move { self.send(req).await?.error_for_status()?.bytes().await }
    }
}

/// A client acting for one tenant: every request sent through it carries the tenant, unless
/// it names one itself. Made by [`NetClientExt::for_tenant`] (borrowing the client) or
/// [`ForTenant::new`] (holding any client, e.g. a clone or an `Arc`, for as long as needed).
///
/// # Examples
/// ```no_run
/// use soulbase_net_core::{ForTenant, NetClient, NetClientExt, NetError};
/// use std::sync::Arc;
///
/// # async fn run(client: Arc<dyn NetClient>) -> Result<(), NetError> {
/// let acme = ForTenant::new(client, "acme");
/// let prices: serde_json::Value = acme.get_json("https://pricing.example.com/v1/prices").await?;
/// # let _ = prices; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ForTenant<C> {
    client: C,
    tenant: String,
}

// === impl ForTenant ===

impl<C: NetClient> ForTenant<C> {
    /// `client`, acting for `tenant`.
    pub fn new(client: C, tenant: impl Into<String>) -> Self {
        Self {
            client,
            tenant: tenant.into(),
        }
    }

    /// The tenant requests are sent for.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The client underneath.
    pub fn client(&self) -> &C {
        &self.client
    }
}

#[async_trait::async_trait]
impl<C: NetClient> NetClient for ForTenant<C> {
    async fn send(&self, mut req: NetRequest) -> Result<NetResponse, NetError> {
        if req.tenant.is_none() {
            req.tenant = Some(self.tenant.clone());
        }
        self.client.send(req).await
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::*;
    use crate::{ErrorCode, ErrorKind};

    /// Method, URL, tenant and body of a request the recorder was sent.
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
                req.tenant.clone(),
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
    async fn get_json_sends_a_plain_get() {
        let c = recorder(200, r#"{"n":1}"#);
        let v: serde_json::Value = c.get_json("http://h.example/a").await.unwrap();
        assert_eq!(v["n"], 1);
        let seen = c.seen.lock();
        assert_eq!(seen[0].0, http::Method::GET);
        assert_eq!(seen[0].1, "http://h.example/a");
        assert_eq!(seen[0].2, None);
    }

    #[tokio::test]
    async fn for_tenant_sends_for_the_tenant_unless_the_request_names_one() {
        let c = recorder(200, r#"{"n":1}"#);
        let t1 = c.for_tenant("t1");
        assert_eq!(t1.tenant(), "t1");
        let _: serde_json::Value = t1.get_json("http://h.example/a").await.unwrap();
        t1.get_bytes("http://h.example/b").await.unwrap();
        let _: serde_json::Value = t1
            .post_json("http://h.example/c", &serde_json::json!({}))
            .await
            .unwrap();
        t1.send(NetRequest::get("http://h.example/d").tenant("t2"))
            .await
            .unwrap();
        // An owning handle over a shared client acts the same way.
        let shared = Arc::new(recorder(200, "{}"));
        let owned = ForTenant::new(shared.clone(), "t3");
        owned.get_bytes("http://h.example/e").await.unwrap();
        assert_eq!(shared.seen.lock()[0].2.as_deref(), Some("t3"));
        let seen = c.seen.lock();
        let tenants: Vec<_> = seen.iter().map(|s| s.2.as_deref()).collect();
        assert_eq!(tenants, [Some("t1"), Some("t1"), Some("t1"), Some("t2")]);
        assert_eq!(seen[2].0, http::Method::POST);
    }

    #[tokio::test]
    async fn post_json_serialises_the_body() {
        let c = recorder(201, r#"{"ok":true}"#);
        let v: serde_json::Value = c
            .post_json("http://h.example/p", &serde_json::json!({"a": 1}))
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
            let err = c.get_bytes("http://h.example/").await.unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::Status(http::StatusCode::from_u16(status).unwrap())
            );
            assert_eq!(err.code(), code);
            let err = c
                .get_json::<serde_json::Value>("http://h.example/")
                .await
                .unwrap_err();
            assert_eq!(err.code(), code);
        }
    }

    #[tokio::test]
    async fn trait_objects_and_arcs_are_clients() {
        let c: Arc<dyn NetClient> = Arc::new(recorder(200, "raw"));
        assert_eq!(c.get_bytes("http://h.example/").await.unwrap(), "raw");
        let boxed: Box<dyn NetClient> = Box::new(recorder(200, "x"));
        assert_eq!(boxed.get_bytes("http://h.example/").await.unwrap(), "x");
    }
}
