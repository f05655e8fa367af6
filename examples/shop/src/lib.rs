//! A small shop service: prices from a pricing API, orders placed on an orders API, both
//! through one soulbase-net `Client` whose timeouts, retries, breaker and allow-list come from
//! the shop's policy file (`policy.toml`), with Prometheus metrics as its observer.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use soulbase_net::prelude::*;

/// A price, as the pricing API answers it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Price {
    /// The product.
    pub sku: String,
    /// Minor units (cents).
    pub cents: u64,
}

/// An order to place. Its `id` is the idempotency key: every copy of the POST carries it.
#[derive(Clone, Debug, Serialize)]
pub struct Order {
    /// Chosen by the shop, unique per order.
    pub id: String,
    /// The product.
    pub sku: String,
    /// How many.
    pub qty: u32,
}

/// What the orders API answers for a placed order.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Receipt {
    /// The orders API's reference.
    pub order_ref: String,
}

/// The shop's view of its two upstreams.
#[derive(Debug)]
pub struct Shop {
    client: Client,
    metrics: Arc<Metrics>,
    pricing: String,
    orders: String,
}

// === impl Shop ===

impl Shop {
    /// A shop calling `pricing` and `orders` (base URLs) under the policy document `doc`.
    ///
    /// # Errors
    /// The document is invalid (`SCHEMA.VALIDATION_FAILED`, every problem listed).
    pub fn new(doc: PolicyDocument, pricing: &str, orders: &str) -> Result<Self, NetError> {
        let metrics = Arc::new(Metrics::new());
        let client = Client::builder()
            .policy_document(doc)
            .observer(Arc::clone(&metrics))
            .build()?;
        Ok(Self {
            client,
            metrics,
            pricing: pricing.trim_end_matches('/').to_owned(),
            orders: orders.trim_end_matches('/').to_owned(),
        })
    }

    /// The price of `sku`: a GET, retried on failure as the policy says.
    ///
    /// # Errors
    /// The pricing API failed, timed out, or answered an error status or bad JSON.
    pub async fn price(&self, sku: &str) -> Result<Price, NetError> {
        self.client
            .get_json(&format!("{}/prices/{sku}", self.pricing))
            .await
    }

    /// Places `order` for `tenant`. The POST carries `Idempotency-Key: <order.id>`, so the
    /// client may retry it and the orders API can tell the copies apart from a new order.
    ///
    /// # Errors
    /// The orders API failed (or its circuit is open), or answered an error status.
    pub async fn place_order(&self, tenant: &str, order: &Order) -> Result<Receipt, NetError> {
        let req = NetRequest::post(format!("{}/orders", self.orders))
            .idempotency_key(&order.id)
            .json(order)?;
        let res = self.client.for_tenant(tenant).send(req).await?;
        res.error_for_status()?.json().await
    }

    /// The client's metrics in the Prometheus text format, for a `/metrics` endpoint.
    pub fn metrics_text(&self) -> String {
        self.metrics.encode()
    }
}
