//! [`OutboxItem`]: one call to deliver, with when and how persistently.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Method};
use soulbase_net_core::NetError;

use super::StoredItem;

/// A call to deliver durably.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use soulbase_net_store::outbox::OutboxItem;
///
/// let item = OutboxItem::post("https://partner.example/webhook", r#"{"order":42}"#)
///     .header("content-type", "application/json")
///     .delay(Duration::from_secs(5))
///     .max_attempts(8)
///     .id("order-42-webhook")
///     .tenant("shop");
/// assert_eq!(item.max_attempts_value(), 8);
/// ```
#[derive(Clone, Debug)]
pub struct OutboxItem {
    pub(crate) method: Method,
    pub(crate) url: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) tenant: Option<String>,
    pub(crate) deliver_at: Option<SystemTime>,
    pub(crate) delay: Duration,
    pub(crate) deadline: Option<Duration>,
    pub(crate) max_attempts: u32,
    pub(crate) id: Option<String>,
    pub(crate) ordering_key: Option<String>,
    pub(crate) invalid: Option<String>,
}

impl OutboxItem {
    /// A call of `method` to `url` with `body`.
    pub fn new(method: Method, url: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self {
            method,
            url: url.into(),
            headers: HeaderMap::new(),
            body: body.into(),
            tenant: None,
            deliver_at: None,
            delay: Duration::ZERO,
            deadline: None,
            max_attempts: 10,
            id: None,
            ordering_key: None,
            invalid: None,
        }
    }

    /// A POST of `body` to `url`.
    pub fn post(url: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self::new(Method::POST, url, body)
    }

    /// Adds a header; an invalid name or value makes `enqueue` fail with
    /// `SCHEMA.VALIDATION_FAILED`, naming the header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        match (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            (Ok(n), Ok(v)) => {
                self.headers.append(n, v);
            }
            _ => {
                self.invalid
                    .get_or_insert_with(|| format!("header `{name}` is not a valid header"));
            }
        }
        self
    }

    /// The tenant the call is made for.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Delivers at `at` (wall clock) rather than at once.
    pub fn deliver_at(mut self, at: SystemTime) -> Self {
        self.deliver_at = Some(at);
        self
    }

    /// Delivers `delay` after enqueue rather than at once.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Gives up (dead letter) when not delivered within `deadline` of enqueue. Default: never.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Delivery attempts at most before the dead letter. Default is 10.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// The attempts allowed.
    pub fn max_attempts_value(&self) -> u32 {
        self.max_attempts
    }

    /// A caller-chosen id: enqueueing an item with an id already stored stores nothing more.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Delivers this item in order with the other items of `key`: items with the same
    /// ordering key go one at a time, in enqueue order (the store's id order) — the next is
    /// claimable only once the one before it was acknowledged (delivered) or moved to the
    /// dead letters. Items of different keys, and items without a key, are delivered in
    /// parallel as ever. Default: no key.
    ///
    /// - **A retried item keeps the head of its key**: rescheduled with backoff after a failed
    ///   attempt, it stays first, and the later items of its key wait for it (however long
    ///   its retries take, up to its `max_attempts` or deadline).
    /// - **A dead-lettered item is skipped**: once it is moved to the dead letters the next
    ///   item of its key becomes deliverable. Requeued, a dead letter keeps its id, so it goes
    ///   before the items of its key still waiting (after the one in flight, if any).
    /// - Never two items of one key in flight at once, across every instance sharing the
    ///   store; a worker that crashes holding the head keeps the rest of its key waiting until
    ///   its lease ends, then the head is delivered again (at least once) before the others.
    /// - Enqueue order is the order of the store's ids. On PostgreSQL an id is drawn at the
    ///   insert, not at the commit: items of one key enqueued by concurrent transactions are
    ///   ordered by their ids (still one at a time); enqueue a key's items one transaction
    ///   after another for the order to be the commit order.
    ///
    /// # Examples
    /// ```
    /// use soulbase_net_store::outbox::OutboxItem;
    ///
    /// let item = OutboxItem::post("https://partner.example/orders", r#"{"order":42}"#)
    ///     .ordering_key("order-42");
    /// assert_eq!(item.ordering_key_value(), Some("order-42"));
    /// ```
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// The ordering key, if any (see [`ordering_key`](Self::ordering_key)).
    pub fn ordering_key_value(&self) -> Option<&str> {
        self.ordering_key.as_deref()
    }

    /// Checks what `enqueue` needs: an absolute http(s) URL and valid headers.
    fn check(&self) -> Result<(), NetError> {
        if let Some(problem) = &self.invalid {
            return Err(NetError::invalid_request(problem.clone()));
        }
        soulbase_net_core::check_url(None, &self.url).map(drop)
    }

    /// The item as stored when enqueued at `now`: checked, with its `Idempotency-Key` (the
    /// caller's, or one drawn from the OS CSPRNG), its due time and its deadline — what an
    /// outbox hands its store's `enqueue`.
    ///
    /// # Errors
    /// `SCHEMA.VALIDATION_FAILED` when the URL is not an absolute http(s) URL or a header is
    /// invalid; an error of the OS CSPRNG when a key cannot be drawn.
    pub fn into_stored(self, now: SystemTime) -> Result<StoredItem, NetError> {
        self.check()?;
        let key = match self
            .headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
        {
            Some(k) => k.to_owned(),
            None => soulbase_net_core::new_idempotency_key()?,
        };
        Ok(StoredItem {
            id: 0,
            dedup_id: self.id,
            method: self.method,
            url: self.url,
            headers: self.headers,
            body: self.body,
            tenant: self.tenant,
            idempotency_key: key,
            deliver_at: self.deliver_at.unwrap_or(now + self.delay),
            deadline: self.deadline.map(|d| now + d),
            attempts: 0,
            max_attempts: self.max_attempts,
            claim: 0,
            ordering_key: self.ordering_key,
        })
    }
}
