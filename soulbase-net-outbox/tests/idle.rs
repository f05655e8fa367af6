//! The idle loop is cheap: with nothing due, the outbox looks at the store once per poll
//! interval (one `next_due`), claims nothing, and reads its gauges rarely; an item stored
//! meanwhile is still delivered at once (woken by the enqueue, not found by the poll).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use soulbase_net_core::NetError;
use soulbase_net_outbox::{
    DeadLetter, Enqueued, Outbox, OutboxItem, OutboxStore, SqliteStore, StoredItem,
};
use soulbase_net_testkit::{FaultServer, Reply, Script};
use tokio::{sync::Notify, time::Instant};

mod support;

use support::{client, db, run};

/// Calls per method, of the ones the run loop makes on its own.
#[derive(Debug, Default)]
struct Calls {
    claim_due: AtomicU64,
    next_due: AtomicU64,
    pending: AtomicU64,
    sweep: AtomicU64,
    other: AtomicU64,
}

impl Calls {
    fn total(&self) -> u64 {
        [
            &self.claim_due,
            &self.next_due,
            &self.pending,
            &self.sweep,
            &self.other,
        ]
        .iter()
        .map(|c| c.load(Ordering::SeqCst))
        .sum()
    }
}

/// A SQLite store that counts the calls made to it.
#[derive(Debug)]
struct Counting {
    inner: SqliteStore,
    calls: Arc<Calls>,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::SeqCst);
}

/// The boxed future `#[async_trait]` methods return (the crate is not a dependency here).
type Fut<'a, T> = Pin<Box<dyn Future<Output = Result<T, NetError>> + Send + 'a>>;

/// Delegates one `OutboxStore` method to the SQLite store, counting the call.
macro_rules! delegate {
    ($name:ident, $counter:ident, ($($arg:ident : $ty:ty),*) -> $out:ty) => {
        fn $name<'s, 'a>(&'s self, $($arg: $ty),*) -> Fut<'a, $out>
        where
            's: 'a,
            Self: 'a,
        {
            bump(&self.calls.$counter);
            Box::pin(self.inner.$name($($arg),*))
        }
    };
}

macro_rules! delegate_ref {
    ($name:ident, $counter:ident, ($($arg:ident : $ty:ty),*) -> $out:ty) => {
        fn $name<'s, 'r, 'a>(&'s self, $($arg: &'r $ty),*) -> Fut<'a, $out>
        where
            's: 'a,
            'r: 'a,
            Self: 'a,
        {
            bump(&self.calls.$counter);
            Box::pin(self.inner.$name($($arg),*))
        }
    };
}

impl OutboxStore for Counting {
    delegate!(enqueue, other, (item: StoredItem) -> Enqueued);
    delegate!(enqueue_batch, other, (items: Vec<StoredItem>) -> Vec<Enqueued>);
    delegate!(claim_due, claim_due, (now: SystemTime, limit: u32, lease: Duration) -> Vec<StoredItem>);
    delegate!(next_due, next_due, () -> Option<SystemTime>);
    delegate_ref!(ack, other, (item: StoredItem) -> bool);
    delegate_ref!(ack_batch, other, (items: [StoredItem]) -> Vec<bool>);
    delegate!(dead_letters, other, () -> Vec<DeadLetter>);
    delegate!(requeue, other, (id: i64) -> bool);
    delegate!(purge_dead, other, () -> u64);
    delegate!(pending, pending, () -> u64);
    delegate_ref!(find, other, (dedup_id: str) -> Option<StoredItem>);
    delegate_ref!(cancel, other, (dedup_id: str) -> bool);
    delegate!(sweep, sweep, (now: SystemTime) -> u64);

    fn extend<'s, 'r, 'a>(&'s self, items: &'r [(i64, i64)], lease: Duration) -> Fut<'a, Vec<bool>>
    where
        's: 'a,
        'r: 'a,
        Self: 'a,
    {
        bump(&self.calls.other);
        Box::pin(self.inner.extend(items, lease))
    }

    fn reschedule<'s, 'r, 'a>(
        &'s self,
        item: &'r StoredItem,
        at: SystemTime,
        attempts: u32,
    ) -> Fut<'a, bool>
    where
        's: 'a,
        'r: 'a,
        Self: 'a,
    {
        bump(&self.calls.other);
        Box::pin(self.inner.reschedule(item, at, attempts))
    }

    fn dead<'s, 'r, 'm, 'a>(
        &'s self,
        item: &'r StoredItem,
        attempts: u32,
        reason: &'m str,
        status: Option<u16>,
    ) -> Fut<'a, bool>
    where
        's: 'a,
        'r: 'a,
        'm: 'a,
        Self: 'a,
    {
        bump(&self.calls.other);
        Box::pin(self.inner.dead(item, attempts, reason, status))
    }

    fn wakeups(&self) -> Option<Arc<Notify>> {
        self.inner.wakeups()
    }
}

async fn counted(name: &str, poll: Duration) -> (Arc<Outbox>, Arc<Calls>) {
    let calls = Arc::new(Calls::default());
    let store = Counting {
        inner: SqliteStore::open(&db(name)).await.unwrap(),
        calls: calls.clone(),
    };
    let o = Outbox::builder()
        .store(Arc::new(store))
        .client(client())
        .poll(poll)
        .build()
        .unwrap();
    (Arc::new(o), calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_outbox_makes_one_query_per_poll_interval() {
    let poll = Duration::from_millis(100);
    let (o, calls) = counted("idle-queries", poll).await;
    let started = Instant::now();
    let running = run(&o);
    // Idle for a while (the time passing is what is measured, not a synchronisation).
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    drop(running);
    let elapsed = started.elapsed();
    let polls = u64::try_from(elapsed.as_millis() / poll.as_millis()).unwrap() + 1;
    let (claims, next_due, pending, sweeps) = (
        calls.claim_due.load(Ordering::SeqCst),
        calls.next_due.load(Ordering::SeqCst),
        calls.pending.load(Ordering::SeqCst),
        calls.sweep.load(Ordering::SeqCst),
    );
    eprintln!(
        "idle {elapsed:?}, poll {poll:?}: claim_due {claims}, next_due {next_due}, \
         pending {pending}, sweep {sweeps}, total {}",
        calls.total()
    );
    // At start: one claim (short), one next_due after it, one gauges reading (pending +
    // next_due) and one sweep; then one next_due per poll interval, nothing else.
    assert_eq!(claims, 1, "no claim while nothing is due");
    assert!(pending <= 1, "gauges read at start only: {pending}");
    assert!(sweeps <= 1, "{sweeps}");
    assert!(
        next_due <= 2 + polls,
        "{next_due} next_due over {polls} polls"
    );
    assert!(calls.total() <= 5 + polls, "{} queries", calls.total());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_stored_while_idle_is_delivered_at_once_and_a_delayed_one_when_due() {
    let srv = FaultServer::http1()
        .route("/hook", Script::reply(Reply::ok("ok")))
        .start()
        .await
        .unwrap();
    // A poll far longer than the test: only the enqueue's wake, or the due time learnt from
    // the store, can start a delivery.
    let (o, calls) = counted("idle-wake", Duration::from_secs(60)).await;
    let _run = run(&o);
    // Let the loop reach its idle sleep: its first claim and next_due are made.
    support::until("the first look at the store", async || {
        calls.next_due.load(Ordering::SeqCst) >= 1
    })
    .await;
    let t0 = Instant::now();
    o.enqueue(OutboxItem::post(srv.url("/hook"), "now"))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/hook", 1))
        .await
        .unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "delivered after {took:?}");
    let t1 = Instant::now();
    o.enqueue(OutboxItem::post(srv.url("/hook"), "later").delay(Duration::from_millis(300)))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), srv.wait_for_hits("/hook", 2))
        .await
        .unwrap();
    let took = t1.elapsed();
    assert!(took >= Duration::from_millis(300), "early: {took:?}");
    assert!(took < Duration::from_secs(3), "delivered after {took:?}");
}
