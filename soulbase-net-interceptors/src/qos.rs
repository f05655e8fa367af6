//! `QosBytes`: bytes out and in per tenant and host, and byte budgets per tenant.

use std::{collections::HashMap, fmt, sync::Arc};

use parking_lot::Mutex;
use soulbase_net_core::{
    bytes::Bytes,
    http::{header, StatusCode},
    url::Url,
    Body, ErrorKind, Interceptor, NetError, NetRequest, NetResponse, RespBody,
};

/// Bytes sent and received.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByteCount {
    /// Request body bytes sent.
    pub bytes_out: u64,
    /// Response body bytes received.
    pub bytes_in: u64,
}

impl ByteCount {
    /// `bytes_out + bytes_in`.
    pub fn total(&self) -> u64 {
        self.bytes_out.saturating_add(self.bytes_in)
    }
}

/// Counts request and response body bytes per tenant and host, and enforces byte budgets per
/// tenant.
///
/// Out is the request body size; in is the response `Content-Length`, or the size of the body
/// once buffered (a streamed response without a length is buffered to be counted). Requests
/// without a tenant are counted under the tenant `""`.
///
/// With a [budget](QosBytes::budget) for a tenant (total bytes, out plus in), `before`
/// [reserves](QosBytes::reserve) the request body size and `after` settles the reservation
/// with the real out + in size. A request whose reservation would take the tenant past its
/// budget is refused with [`ErrorKind::QuotaExceeded`] (`QUOTA.RATE_LIMITED`, visible to the
/// caller) and not sent. A request that fails is not charged.
///
/// # Examples
/// ```
/// use soulbase_net_core::{ErrorKind, Interceptor, NetRequest};
/// use soulbase_net_interceptors::QosBytes;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let qos = QosBytes::new().budget("t1", 10);
/// let mut big = NetRequest::post("https://api.example.com/").tenant("t1").body("more than ten bytes");
/// assert_eq!(qos.before(&mut big).await.unwrap_err().kind(), ErrorKind::QuotaExceeded);
/// # });
/// ```
#[derive(Default)]
pub struct QosBytes {
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    counts: Mutex<HashMap<(String, String), ByteCount>>,
    budgets: Mutex<HashMap<String, Budget>>,
}

#[derive(Clone, Copy, Debug)]
struct Budget {
    limit: u64,
    used: u64,
    reserved: u64,
}

/// Bytes held against a tenant's budget until [settled](Reservation::settle); dropping it
/// unsettled releases the bytes without charging them.
pub struct Reservation {
    state: Arc<State>,
    tenant: String,
    bytes: u64,
    settled: bool,
}

/// What `before` noted for `after`, in the request's extensions.
#[derive(Clone)]
struct Noted {
    tenant: String,
    host: String,
    bytes_out: u64,
    reservation: Arc<Mutex<Option<Reservation>>>,
}

// === impl QosBytes ===

impl QosBytes {
    /// Counting only, no budgets.
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives `tenant` a budget of `bytes` (out plus in) for the life of the interceptor.
    /// Default is no budget.
    pub fn budget(self, tenant: impl Into<String>, bytes: u64) -> Self {
        self.state.budgets.lock().insert(
            tenant.into(),
            Budget {
                limit: bytes,
                used: 0,
                reserved: 0,
            },
        );
        self
    }

    /// The bytes counted for `tenant` (`""` for none) and `host`.
    pub fn counts(&self, tenant: &str, host: &str) -> ByteCount {
        self.state
            .counts
            .lock()
            .get(&(tenant.to_owned(), host.to_owned()))
            .copied()
            .unwrap_or_default()
    }

    /// The bytes counted for `tenant` over all hosts.
    pub fn tenant_counts(&self, tenant: &str) -> ByteCount {
        self.state
            .counts
            .lock()
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .fold(ByteCount::default(), |acc, (_, c)| ByteCount {
                bytes_out: acc.bytes_out.saturating_add(c.bytes_out),
                bytes_in: acc.bytes_in.saturating_add(c.bytes_in),
            })
    }

    /// What is left of `tenant`'s budget (limit minus used and reserved); `None` without one.
    pub fn remaining(&self, tenant: &str) -> Option<u64> {
        self.state
            .budgets
            .lock()
            .get(tenant)
            .map(|b| b.limit.saturating_sub(b.used).saturating_sub(b.reserved))
    }

    /// Holds `bytes` of `tenant`'s budget; a tenant without a budget always gets its
    /// reservation.
    ///
    /// # Errors
    /// [`ErrorKind::QuotaExceeded`] (quota visible) when the budget has fewer than `bytes`
    /// left, or nothing left at all.
    pub fn reserve(&self, tenant: &str, bytes: u64) -> Result<Reservation, NetError> {
        if let Some(b) = self.state.budgets.lock().get_mut(tenant) {
            let committed = b.used.saturating_add(b.reserved);
            if committed >= b.limit || committed.saturating_add(bytes) > b.limit {
                return Err(NetError::new(ErrorKind::QuotaExceeded)
                    .with_message("the tenant's byte budget is exhausted")
                    .with_quota_visible(true));
            }
            b.reserved = b.reserved.saturating_add(bytes);
        }
        Ok(Reservation {
            state: self.state.clone(),
            tenant: tenant.to_owned(),
            bytes,
            settled: false,
        })
    }

    fn record(&self, tenant: &str, host: &str, count: ByteCount) {
        let mut counts = self.state.counts.lock();
        let c = counts
            .entry((tenant.to_owned(), host.to_owned()))
            .or_default();
        c.bytes_out = c.bytes_out.saturating_add(count.bytes_out);
        c.bytes_in = c.bytes_in.saturating_add(count.bytes_in);
    }
}

impl fmt::Debug for QosBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QosBytes")
            .field("budgets", &*self.state.budgets.lock())
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Interceptor for QosBytes {
    async fn before(&self, req: &mut NetRequest) -> Result<(), NetError> {
        let tenant = req.tenant.clone().unwrap_or_default();
        let host = Url::parse(&req.url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        let bytes_out = match &req.body {
            Body::Stream(s) => s.exact_len().unwrap_or(0),
            other => other.to_bytes()?.map_or(0, |b| b.len() as u64),
        };
        let reservation = self.reserve(&tenant, bytes_out)?;
        req.extensions.insert(Noted {
            tenant,
            host,
            bytes_out,
            reservation: Arc::new(Mutex::new(Some(reservation))),
        });
        Ok(())
    }

    async fn after(&self, req: &NetRequest, res: &mut NetResponse) -> Result<(), NetError> {
        let Some(noted) = req.extensions.get::<Noted>() else {
            return Ok(());
        };
        let bytes_in = match content_length(res) {
            Some(n) => n,
            None => buffer(res).await?,
        };
        let count = ByteCount {
            bytes_out: noted.bytes_out,
            bytes_in,
        };
        self.record(&noted.tenant, &noted.host, count);
        let reservation = noted.reservation.lock().take();
        if let Some(r) = reservation {
            r.settle(count.total());
        }
        Ok(())
    }

    async fn on_error(&self, req: &NetRequest, _err: &NetError) {
        if let Some(noted) = req.extensions.get::<Noted>() {
            // Released without charge.
            drop(noted.reservation.lock().take());
        }
    }

    fn name(&self) -> &'static str {
        "qos_bytes"
    }
}

/// The response's `Content-Length`, if it is a number.
fn content_length(res: &NetResponse) -> Option<u64> {
    res.headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Buffers the response body (if still streaming) and returns its size.
async fn buffer(res: &mut NetResponse) -> Result<u64, NetError> {
    let body = match std::mem::replace(&mut res.body, RespBody::Bytes(Bytes::new())) {
        RespBody::Bytes(b) => b,
        stream => {
            let mut tmp = NetResponse::from_bytes(StatusCode::OK, Bytes::new());
            tmp.body = stream;
            tmp.bytes().await?
        }
    };
    let len = body.len() as u64;
    res.body = RespBody::Bytes(body);
    Ok(len)
}

// === impl Reservation ===

impl Reservation {
    /// The bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Releases the reservation and charges `actual` bytes to the tenant's budget.
    pub fn settle(mut self, actual: u64) {
        self.settled = true;
        if let Some(b) = self.state.budgets.lock().get_mut(&self.tenant) {
            b.reserved = b.reserved.saturating_sub(self.bytes);
            b.used = b.used.saturating_add(actual);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Some(b) = self.state.budgets.lock().get_mut(&self.tenant) {
            b.reserved = b.reserved.saturating_sub(self.bytes);
        }
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("tenant", &self.tenant)
            .field("bytes", &self.bytes)
            .field("settled", &self.settled)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_and_settle() {
        let qos = QosBytes::new().budget("t", 100);
        let r = qos.reserve("t", 60).unwrap();
        assert_eq!(qos.remaining("t"), Some(40));
        assert_eq!(
            qos.reserve("t", 41).unwrap_err().kind(),
            ErrorKind::QuotaExceeded
        );
        r.settle(70);
        assert_eq!(qos.remaining("t"), Some(30));
        drop(qos.reserve("t", 30).unwrap());
        assert_eq!(qos.remaining("t"), Some(30));
        qos.reserve("t", 30).unwrap().settle(30);
        let err = qos.reserve("t", 0).unwrap_err();
        assert_eq!(err.code().as_str(), "QUOTA.RATE_LIMITED");
        assert!(qos.reserve("other", u64::MAX).is_ok());
        assert_eq!(qos.remaining("other"), None);
    }

    #[tokio::test]
    async fn counts_a_buffered_response() {
        let qos = QosBytes::new();
        let mut req = NetRequest::post("http://h.example:8080/x").body("12345");
        qos.before(&mut req).await.unwrap();
        let mut res = NetResponse::from_bytes(StatusCode::OK, "abc");
        qos.after(&req, &mut res).await.unwrap();
        let c = qos.counts("", "h.example");
        assert_eq!(
            c,
            ByteCount {
                bytes_out: 5,
                bytes_in: 3
            }
        );
        assert_eq!(qos.tenant_counts(""), c);
    }
}
