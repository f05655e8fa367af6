//! `QosBytes`: bytes out and in per tenant and host, and byte budgets per tenant and per
//! tenant + host, for the interceptor's life or per time window.

use std::{collections::HashMap, fmt, sync::Arc, time::Duration};

use parking_lot::Mutex;
use soulbase_net_core::{
    bytes::Bytes,
    http::{header, StatusCode},
    url::Url,
    Body, ErrorKind, Hooks, Interceptor, NetError, NetRequest, NetResponse, RespBody,
};
use tokio::time::Instant;

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
/// tenant and per tenant + host.
///
/// Out is the request body size; in is the response `Content-Length`, or the size of the body
/// once buffered (a streamed response without a length is buffered to be counted). Requests
/// without a tenant are counted under the tenant `""`.
///
/// With a budget for a tenant ([`budget`](QosBytes::budget),
/// [`tenant_budget`](QosBytes::tenant_budget)) or for a tenant's calls to one host
/// ([`host_budget`](QosBytes::host_budget)) — bytes out plus in, for the interceptor's life
/// or [per window](ByteBudget::per) — `before` [reserves](QosBytes::reserve_for) the request
/// body size against every budget that applies, and `after` settles the reservation with the
/// real out + in size. A request whose reservation would take any of them past its limit is
/// refused with [`ErrorKind::QuotaExceeded`] (`QUOTA.RATE_LIMITED`, visible to the caller) and
/// not sent. A request that fails is not charged.
///
/// A windowed budget refills when its window rolls over: windows follow one another from
/// when the budget was set, and each starts with nothing used. Bytes reserved by requests
/// still in flight stay held across the roll, and are charged to the window in which they
/// settle.
///
/// # Bounded memory
/// The counts are kept for at most [`max_keys`](QosBytes::max_keys) (tenant, host) pairs
/// (10 000 by default). When a new pair would go past that, the pairs not counted for
/// [`idle_evict`](QosBytes::idle_evict) (10 minutes by default) are forgotten, and if that
/// is not enough, the least recently counted eighth of them: [`counts`](QosBytes::counts)
/// and [`tenant_counts`](QosBytes::tenant_counts) then cover what was counted since.
///
/// Eviction never touches a budget. Budgets are kept apart from the counts, one account per
/// budget given to the builder (so as many as were configured, whatever the traffic), and
/// are never dropped: a tenant calling many distinct hosts cannot push its own account out,
/// and so cannot reset a window or a lifetime budget and go past its limit.
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

/// Pairs counted, at most by default.
const MAX_KEYS: usize = 10_000;
/// A pair not counted for this long may be forgotten, by default.
const IDLE_EVICT: Duration = Duration::from_secs(600);

/// How many bytes a budget allows, and whether it refills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteBudget {
    bytes: u64,
    window: Option<Duration>,
}

#[derive(Default)]
struct State {
    counts: Mutex<Counts>,
    budgets: Mutex<HashMap<String, TenantBudgets>>,
}

/// The counts per (tenant, host), bounded (see "Bounded memory" on [`QosBytes`]).
#[derive(Debug)]
struct Counts {
    map: HashMap<(String, String), Counted>,
    max_keys: usize,
    idle: Duration,
}

/// One pair's count and when it was last counted.
#[derive(Clone, Copy, Debug)]
struct Counted {
    count: ByteCount,
    last: Instant,
}

/// A tenant's budgets: over all hosts, and per host.
#[derive(Debug, Default)]
struct TenantBudgets {
    all: Option<Budget>,
    hosts: HashMap<String, Budget>,
}

/// One budget's account in its current window.
#[derive(Clone, Copy, Debug)]
struct Budget {
    limit: u64,
    used: u64,
    reserved: u64,
    window: Option<Duration>,
    /// When the current window began.
    started: Instant,
}

/// Bytes held against a tenant's budgets until [settled](Reservation::settle); dropping it
/// unsettled releases the bytes without charging them.
pub struct Reservation {
    state: Arc<State>,
    tenant: String,
    host: Option<String>,
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

    /// Gives `tenant` a budget of `bytes` (out plus in, over all hosts) for the life of the
    /// interceptor: `tenant_budget(tenant, ByteBudget::total(bytes))`. Default is no budget.
    pub fn budget(self, tenant: impl Into<String>, bytes: u64) -> Self {
        self.tenant_budget(tenant, ByteBudget::total(bytes))
    }

    /// Gives `tenant` a budget over all hosts, replacing any other. Default is none.
    pub fn tenant_budget(self, tenant: impl Into<String>, budget: ByteBudget) -> Self {
        self.set_budget(tenant.into(), None, budget)
    }

    /// Gives `tenant`'s calls to `host` a budget of their own (besides any over all hosts),
    /// replacing any other. `tenant` is `""` for requests without one; `host` as in the URL
    /// (IPv6 in brackets). Default is none.
    pub fn host_budget(
        self,
        tenant: impl Into<String>,
        host: impl Into<String>,
        budget: ByteBudget,
    ) -> Self {
        self.set_budget(tenant.into(), Some(host.into()), budget)
    }

    fn set_budget(self, tenant: String, host: Option<String>, budget: ByteBudget) -> Self {
        let account = Budget::new(budget, Instant::now());
        let mut budgets = self.state.budgets.lock();
        let t = budgets.entry(tenant).or_default();
        match host {
            Some(host) => {
                t.hosts.insert(host, account);
            }
            None => t.all = Some(account),
        }
        drop(budgets);
        self
    }

    /// Keeps counts for at most `n` (tenant, host) pairs (at least 1); default 10 000. Budgets
    /// are not counted in this bound and never evicted (see "Bounded memory" above).
    pub fn max_keys(self, n: usize) -> Self {
        self.state.counts.lock().max_keys = n.max(1);
        self
    }

    /// A pair not counted for `idle` is the first to be forgotten when the counts are full;
    /// default 10 minutes.
    pub fn idle_evict(self, idle: Duration) -> Self {
        self.state.counts.lock().idle = idle;
        self
    }

    /// The bytes counted for `tenant` (`""` for none) and `host` (since the pair was last
    /// evicted, if it was).
    pub fn counts(&self, tenant: &str, host: &str) -> ByteCount {
        self.state
            .counts
            .lock()
            .map
            .get(&(tenant.to_owned(), host.to_owned()))
            .map(|c| c.count)
            .unwrap_or_default()
    }

    /// The bytes counted for `tenant` over all hosts (of the pairs still kept).
    pub fn tenant_counts(&self, tenant: &str) -> ByteCount {
        self.state
            .counts
            .lock()
            .map
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .fold(ByteCount::default(), |acc, (_, c)| ByteCount {
                bytes_out: acc.bytes_out.saturating_add(c.count.bytes_out),
                bytes_in: acc.bytes_in.saturating_add(c.count.bytes_in),
            })
    }

    /// What is left of `tenant`'s budget over all hosts (limit minus used and reserved, in
    /// the current window); `None` without one.
    pub fn remaining(&self, tenant: &str) -> Option<u64> {
        let now = Instant::now();
        let budgets = self.state.budgets.lock();
        Some(budgets.get(tenant)?.all.as_ref()?.remaining(now))
    }

    /// What is left of the budget of `tenant`'s calls to `host`; `None` without one.
    pub fn host_remaining(&self, tenant: &str, host: &str) -> Option<u64> {
        let now = Instant::now();
        let budgets = self.state.budgets.lock();
        Some(budgets.get(tenant)?.hosts.get(host)?.remaining(now))
    }

    /// Holds `bytes` of `tenant`'s budget over all hosts; a tenant without a budget always
    /// gets its reservation.
    ///
    /// # Errors
    /// As [`QosBytes::reserve_for`].
    pub fn reserve(&self, tenant: &str, bytes: u64) -> Result<Reservation, NetError> {
        self.reserve_at(tenant, None, bytes, Instant::now())
    }

    /// Holds `bytes` of every budget that applies to a call of `tenant` to `host`: the
    /// tenant's over all hosts and the one for that host; none applying, the reservation is
    /// always granted.
    ///
    /// # Errors
    /// [`ErrorKind::QuotaExceeded`] (quota visible) when a budget has fewer than `bytes`
    /// left, or nothing left at all; then nothing is held.
    pub fn reserve_for(
        &self,
        tenant: &str,
        host: &str,
        bytes: u64,
    ) -> Result<Reservation, NetError> {
        self.reserve_at(tenant, Some(host), bytes, Instant::now())
    }

    fn reserve_at(
        &self,
        tenant: &str,
        host: Option<&str>,
        bytes: u64,
        now: Instant,
    ) -> Result<Reservation, NetError> {
        let mut budgets = self.state.budgets.lock();
        if let Some(t) = budgets.get_mut(tenant) {
            let mut fits = true;
            t.each(host, |b| {
                b.roll(now);
                fits &= b.fits(bytes);
            });
            if !fits {
                return Err(NetError::new(ErrorKind::QuotaExceeded)
                    .with_message("the tenant's byte budget is exhausted")
                    .with_quota_visible(true));
            }
            t.each(host, |b| b.reserved = b.reserved.saturating_add(bytes));
        }
        Ok(Reservation {
            state: self.state.clone(),
            tenant: tenant.to_owned(),
            host: host.map(str::to_owned),
            bytes,
            settled: false,
        })
    }

    fn record(&self, tenant: &str, host: &str, count: ByteCount) {
        self.state
            .counts
            .lock()
            .add(tenant, host, count, Instant::now());
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
        self.before_now(req)
    }

    /// What `before` does: the reservation waits for nothing, so the client calls it in
    /// place (see [`Hooks::BEFORE_NOW`]).
    fn before_now(&self, req: &mut NetRequest) -> Result<(), NetError> {
        let tenant = req.tenant.clone().unwrap_or_default();
        let host = Url::parse(&req.url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        let bytes_out = match &req.body {
            Body::Stream(s) => s.exact_len().unwrap_or(0),
            other => other.to_bytes()?.map_or(0, |b| b.len() as u64),
        };
        let reservation = self.reserve_for(&tenant, &host, bytes_out)?;
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

    fn hooks(&self) -> Hooks {
        Hooks::BEFORE_NOW | Hooks::AFTER | Hooks::ON_ERROR
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

    /// Releases the reservation and charges `actual` bytes to the budgets it held (in their
    /// current windows).
    pub fn settle(mut self, actual: u64) {
        self.settled = true;
        self.release(actual, Instant::now());
    }

    /// Gives the held bytes back and charges `actual`.
    fn release(&self, actual: u64, now: Instant) {
        if let Some(t) = self.state.budgets.lock().get_mut(&self.tenant) {
            t.each(self.host.as_deref(), |b| {
                b.roll(now);
                b.reserved = b.reserved.saturating_sub(self.bytes);
                b.used = b.used.saturating_add(actual);
            });
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            self.release(0, Instant::now());
        }
    }
}

// === impl Counts ===

impl Default for Counts {
    fn default() -> Self {
        Counts {
            map: HashMap::new(),
            max_keys: MAX_KEYS,
            idle: IDLE_EVICT,
        }
    }
}

impl Counts {
    /// Adds `count` to the pair's, making room first when the pair is new and the map full.
    fn add(&mut self, tenant: &str, host: &str, count: ByteCount, now: Instant) {
        let key = (tenant.to_owned(), host.to_owned());
        if !self.map.contains_key(&key) && self.map.len() >= self.max_keys {
            self.evict(now);
        }
        let c = self.map.entry(key).or_insert(Counted {
            count: ByteCount::default(),
            last: now,
        });
        c.count.bytes_out = c.count.bytes_out.saturating_add(count.bytes_out);
        c.count.bytes_in = c.count.bytes_in.saturating_add(count.bytes_in);
        c.last = now;
    }

    /// Forgets the pairs idle for `idle` and, when that leaves the map full, the least
    /// recently counted eighth (at least one): one pass over the map every `max_keys / 8`
    /// new pairs, so a constant cost per pair on average.
    fn evict(&mut self, now: Instant) {
        let idle = self.idle;
        self.map
            .retain(|_, c| now.saturating_duration_since(c.last) < idle);
        if self.map.len() < self.max_keys {
            return;
        }
        let mut lasts: Vec<Instant> = self.map.values().map(|c| c.last).collect();
        let cut = (lasts.len() / 8).max(1);
        let (_, &mut threshold, _) = lasts.select_nth_unstable(cut - 1);
        let mut dropped = 0;
        // Ties at the threshold go only while fewer than `cut` are gone, so a map of equal
        // times is not emptied.
        self.map.retain(|_, c| {
            let go = c.last < threshold || (c.last == threshold && dropped < cut);
            dropped += usize::from(go);
            !go
        });
    }
}

// === impl ByteBudget ===

impl ByteBudget {
    /// `bytes` for the life of the interceptor.
    pub fn total(bytes: u64) -> Self {
        ByteBudget {
            bytes,
            window: None,
        }
    }

    /// `bytes` per `window` (e.g. per minute), refilled when the window rolls over; a
    /// window shorter than a millisecond is taken as one millisecond.
    pub fn per(bytes: u64, window: Duration) -> Self {
        ByteBudget {
            bytes,
            window: Some(window.max(Duration::from_millis(1))),
        }
    }
}

// === impl TenantBudgets ===

impl TenantBudgets {
    /// Applies `f` to the budget over all hosts and to `host`'s, those that exist.
    fn each(&mut self, host: Option<&str>, mut f: impl FnMut(&mut Budget)) {
        if let Some(b) = &mut self.all {
            f(b);
        }
        if let Some(b) = host.and_then(|h| self.hosts.get_mut(h)) {
            f(b);
        }
    }
}

// === impl Budget ===

impl Budget {
    fn new(budget: ByteBudget, now: Instant) -> Self {
        Budget {
            limit: budget.bytes,
            used: 0,
            reserved: 0,
            window: budget.window,
            started: now,
        }
    }

    /// The start of the window `now` falls in, when it is not the current one.
    fn next_start(&self, now: Instant) -> Option<Instant> {
        let window = self.window?;
        let elapsed = now.checked_duration_since(self.started)?;
        if elapsed < window {
            return None;
        }
        let into = elapsed.as_nanos() % window.as_nanos().max(1);
        Some(now - Duration::from_nanos(u64::try_from(into).unwrap_or(u64::MAX)))
    }

    /// Starts the window `now` falls in, with nothing used, when it is a new one.
    fn roll(&mut self, now: Instant) {
        if let Some(start) = self.next_start(now) {
            self.started = start;
            self.used = 0;
        }
    }

    /// What is left at `now`, without changing anything.
    fn remaining(&self, now: Instant) -> u64 {
        let used = if self.next_start(now).is_some() {
            0
        } else {
            self.used
        };
        self.limit
            .saturating_sub(used)
            .saturating_sub(self.reserved)
    }

    /// Whether `bytes` more may be held (never when nothing is left).
    fn fits(&self, bytes: u64) -> bool {
        let committed = self.used.saturating_add(self.reserved);
        committed < self.limit && committed.saturating_add(bytes) <= self.limit
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("tenant", &self.tenant)
            .field("host", &self.host)
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

    fn settle_at(mut r: Reservation, actual: u64, now: Instant) {
        r.settled = true;
        r.release(actual, now);
    }

    fn started(qos: &QosBytes, tenant: &str) -> Instant {
        let budgets = qos.state.budgets.lock();
        budgets[tenant].all.as_ref().unwrap().started
    }

    fn remaining_at(qos: &QosBytes, tenant: &str, now: Instant) -> u64 {
        qos.state.budgets.lock()[tenant]
            .all
            .as_ref()
            .unwrap()
            .remaining(now)
    }

    #[test]
    fn a_windowed_budget_refills_when_the_window_rolls_over() {
        let qos = QosBytes::new().tenant_budget("t", ByteBudget::per(100, Duration::from_secs(60)));
        let t0 = started(&qos, "t");
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let r = qos.reserve_at("t", None, 60, at(1)).unwrap();
        settle_at(r, 70, at(2));
        assert_eq!(remaining_at(&qos, "t", at(59)), 30);
        let err = qos.reserve_at("t", None, 31, at(59)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::QuotaExceeded);
        // The next window starts with nothing used.
        assert_eq!(remaining_at(&qos, "t", at(60)), 100);
        let held = qos.reserve_at("t", None, 100, at(61)).unwrap();
        assert_eq!(started(&qos, "t"), at(60));
        // Held bytes stay held across a roll, and are charged where they settle.
        assert!(qos.reserve_at("t", None, 0, at(125)).is_err());
        assert_eq!(started(&qos, "t"), at(120), "windows stay aligned");
        settle_at(held, 90, at(126));
        assert_eq!(remaining_at(&qos, "t", at(179)), 10);
        assert_eq!(remaining_at(&qos, "t", at(180)), 100);
        // A lifetime budget never refills.
        let total = QosBytes::new().budget("t", 10);
        let t0 = started(&total, "t");
        settle_at(total.reserve_at("t", None, 10, t0).unwrap(), 10, t0);
        let much_later = t0 + Duration::from_secs(365 * 24 * 3600);
        assert!(total.reserve_at("t", None, 0, much_later).is_err());
    }

    #[test]
    fn host_budgets_apply_beside_the_tenant_budget() {
        let per_min = |b| ByteBudget::per(b, Duration::from_secs(60));
        let qos = QosBytes::new()
            .budget("t", 1_000)
            .host_budget("t", "a.example", per_min(50));
        let a = qos.reserve_for("t", "a.example", 40).unwrap();
        let b = qos.reserve_for("t", "b.example", 40).unwrap();
        assert_eq!(qos.host_remaining("t", "a.example"), Some(10));
        assert_eq!(qos.host_remaining("t", "b.example"), None);
        assert_eq!(qos.remaining("t"), Some(920));
        let err = qos.reserve_for("t", "a.example", 20).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::QuotaExceeded);
        assert_eq!(qos.remaining("t"), Some(920), "a refusal holds nothing");
        a.settle(45);
        drop(b);
        assert_eq!(qos.host_remaining("t", "a.example"), Some(5));
        assert_eq!(qos.remaining("t"), Some(955));
        // Another tenant's calls to the same host are not under t's host budget.
        assert!(qos.reserve_for("u", "a.example", 1_000).is_ok());
    }

    fn one_out() -> ByteCount {
        ByteCount {
            bytes_out: 1,
            bytes_in: 0,
        }
    }

    #[test]
    fn many_hosts_keep_the_counts_at_or_under_max_keys() {
        let qos = QosBytes::new().max_keys(1_000);
        let mut most = 0;
        for i in 0..100_000u32 {
            qos.record("t", &format!("h{i}.example"), one_out());
            if i % 97 == 0 {
                most = most.max(qos.state.counts.lock().map.len());
            }
            if i % 10 == 0 {
                // A pair counted often is among the most recent, and is kept.
                qos.record("t", "hot.example", one_out());
            }
        }
        let len = qos.state.counts.lock().map.len();
        assert!(len <= 1_000 && most <= 1_000, "{len} / {most} pairs kept");
        assert!(len >= 800, "evicts an eighth at a time, not all: {len}");
        assert_eq!(qos.counts("t", "hot.example").bytes_out, 10_000);
        assert_eq!(qos.counts("t", "h99999.example").bytes_out, 1);
        assert_eq!(qos.counts("t", "h0.example").bytes_out, 0, "evicted");
    }

    #[test]
    fn idle_pairs_go_first() {
        let qos = QosBytes::new()
            .max_keys(3)
            .idle_evict(Duration::from_secs(60));
        let t0 = Instant::now();
        let mut counts = qos.state.counts.lock();
        counts.add("t", "old", one_out(), t0);
        counts.add("t", "a", one_out(), t0 + Duration::from_secs(100));
        counts.add("t", "b", one_out(), t0 + Duration::from_secs(101));
        counts.add("t", "c", one_out(), t0 + Duration::from_secs(120));
        let mut kept: Vec<&str> = counts.map.keys().map(|(_, h)| h.as_str()).collect();
        kept.sort_unstable();
        // "old" was idle past 60s at 120s; "a" (20s idle) is kept as there is then room.
        assert_eq!(kept, ["a", "b", "c"]);
    }

    #[test]
    fn an_active_budget_is_still_enforced_after_churn() {
        let per_min = ByteBudget::per(100, Duration::from_secs(60));
        let qos = QosBytes::new()
            .max_keys(100)
            .tenant_budget("t", per_min)
            .host_budget("t", "a.example", ByteBudget::total(50));
        qos.reserve_for("t", "a.example", 40).unwrap().settle(45);
        // The tenant calls 100 000 other hosts (nothing more charged) and is counted for
        // each: the counts churn through their bound many times over.
        for i in 0..100_000u32 {
            let host = format!("h{i}.example");
            qos.reserve_for("t", &host, 0).unwrap().settle(0);
            qos.record("t", &host, ByteCount::default());
        }
        assert!(qos.state.counts.lock().map.len() <= 100);
        // Both accounts are as they were: nothing reset by the churn.
        assert_eq!(qos.remaining("t"), Some(55));
        assert_eq!(qos.host_remaining("t", "a.example"), Some(5));
        let err = qos.reserve_for("t", "a.example", 6).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::QuotaExceeded);
        let err = qos.reserve_for("t", "b.example", 56).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::QuotaExceeded);
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
