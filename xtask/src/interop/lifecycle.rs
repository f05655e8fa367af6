//! Lifecycle rows: the ordinary life of a real server's connections, under load, with retries
//! off and the breaker on — none of it may fail a call or move the breaker. nginx sends an
//! HTTP/2 GOAWAY every `keepalive_requests` (100 here); dnsmasq moves a name from one address
//! to another (the client follows within the TTL + 1 s); and one port of a host failing does
//! not open the circuit of another port of it.
//!
//! The same load while nginx reloads every 500 ms is a row too. An exiting worker closes a
//! connection it finds idle between streams with a GOAWAY and a reset (our next requests were
//! unread); the client reads the GOAWAY past its failed write and sends the unprocessed
//! streams again (see `connect/io.rs`, `Watched`). `XTASK_INTEROP_RELOAD=N` runs that row N
//! times (0 skips it), to measure how often it fails.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use parking_lot::Mutex;
use soulbase_net_core::{NetClient, NetEvent, NetRequest, Observer};
use soulbase_net_policy::NetPolicy;
use soulbase_net_runtime::Client;

use super::{
    peers::{hosts_file, signal, Layout, DNS_TTL_SECS},
    scenario::{error, policy},
    Setup,
};
use crate::table::{row, Row};

/// Concurrent callers of the load rows.
const CALLERS: usize = 64;
/// Requests of each load row, over all callers.
const REQUESTS: usize = 20_000;

/// The lifecycle rows.
pub(crate) async fn rows(l: &Layout, s: &Setup) -> Vec<Row> {
    let mut rows = Vec::new();
    let goaway = format!("https://nginx.interop.test:{}/ok", l.lifecycle.goaway);
    rows.push(
        load_row(
            "nginx.h2.goaway-every-100-requests",
            "0 failed, 0 breaker transitions, GOAWAYs met",
            strict(l, s),
            &goaway,
            None,
        )
        .await,
    );
    let runs: usize = std::env::var("XTASK_INTEROP_RELOAD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for _ in 0..runs {
        let reload = format!("https://nginx.interop.test:{}/ok", l.lifecycle.reload);
        rows.push(
            load_row(
                "nginx.h2.reload-every-500ms",
                "0 failed, 0 breaker transitions, reloads under load",
                strict(l, s),
                &reload,
                Some(l.nginx_pid),
            )
            .await,
        );
    }
    rows.push(dns_move(l, s).await);
    rows.push(breaker_isolation(l, s).await);
    rows
}

/// Retries off, the breaker on with its defaults: a failure would show.
fn strict(l: &Layout, s: &Setup) -> NetPolicy {
    let mut p = policy(l, s);
    p.retry.enabled = false;
    p.cbreaker.enabled = true;
    p
}

/// What the lifecycle rows count of a client's events.
#[derive(Debug, Default)]
struct Seen {
    transitions: AtomicUsize,
    resent: AtomicUsize,
    retired: Mutex<BTreeMap<&'static str, usize>>,
}

impl Observer for Seen {
    fn on_event(&self, ev: &NetEvent<'_>) {
        match ev {
            NetEvent::BreakerTransition { .. } => {
                self.transitions.fetch_add(1, Ordering::Relaxed);
            }
            NetEvent::Resent { .. } => {
                self.resent.fetch_add(1, Ordering::Relaxed);
            }
            NetEvent::ConnectionRetired { reason, .. } => {
                *self.retired.lock().entry(reason.as_str()).or_default() += 1;
            }
            _ => {}
        }
    }
}

fn client_seen(p: NetPolicy) -> Result<(Arc<Client>, Arc<Seen>), String> {
    let seen = Arc::new(Seen::default());
    let client = Client::builder()
        .policy(p)
        .observer(seen.clone())
        .build()
        .map_err(|e| format!("building the client: {e}"))?;
    Ok((Arc::new(client), seen))
}

/// `REQUESTS` POSTs (a body each: non-idempotent, so only what the server did not process
/// may go again) from `CALLERS` callers to `url`; with `reload`, nginx's master is sent HUP
/// every 500 ms meanwhile.
async fn load_row(id: &str, expected: &str, p: NetPolicy, url: &str, reload: Option<u32>) -> Row {
    let (client, seen) = match client_seen(p) {
        Ok(c) => c,
        Err(e) => return row(id, expected, e, false),
    };
    let started = tokio::time::Instant::now();
    let reloads = Arc::new(AtomicUsize::new(0));
    let reloader = reload.map(|pid| {
        let reloads = reloads.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if signal(pid, "HUP").is_ok() {
                    reloads.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    });
    let next = Arc::new(AtomicUsize::new(0));
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..CALLERS {
        let (client, next, url) = (client.clone(), next.clone(), url.to_owned());
        callers.spawn(async move {
            let mut failed: BTreeMap<String, usize> = BTreeMap::new();
            let mut first: BTreeMap<String, String> = BTreeMap::new();
            while next.fetch_add(1, Ordering::Relaxed) < REQUESTS {
                let req = NetRequest::post(&url).body("order");
                let outcome = match client.send(req).await {
                    Ok(res) if res.status == 200 => res.bytes().await.err().map(|e| explained(&e)),
                    Ok(res) => Some((format!("status {}", res.status.as_u16()), String::new())),
                    Err(e) => Some(explained(&e)),
                };
                if let Some((what, why)) = outcome {
                    *failed.entry(what.clone()).or_default() += 1;
                    first.entry(what).or_insert(why);
                }
            }
            (failed, first)
        });
    }
    let mut failed: BTreeMap<String, usize> = BTreeMap::new();
    let mut first: BTreeMap<String, String> = BTreeMap::new();
    while let Some(done) = callers.join_next().await {
        let (counts, whys) = done.unwrap_or_default();
        for (what, n) in counts {
            *failed.entry(what).or_default() += n;
        }
        for (what, why) in whys {
            first.entry(what).or_insert(why);
        }
    }
    if let Some(task) = reloader {
        task.abort();
    }
    let secs = started.elapsed().as_secs_f64();
    let failures: usize = failed.values().sum();
    let transitions = seen.transitions.load(Ordering::Relaxed);
    let retired = seen.retired.lock().clone();
    let goaways = retired.get("goaway").copied().unwrap_or(0);
    let reloads = reloads.load(Ordering::Relaxed);
    let measured = format!(
        "{failures} failed of {REQUESTS} {failed:?} in {secs:.1}s; {transitions} transitions; \
         {goaways} GOAWAYs, {} resent{}",
        seen.resent.load(Ordering::Relaxed),
        reload.map_or(String::new(), |_| format!("; {reloads} reloads")),
    );
    // What each kind of failure said, the first time: the row's evidence when it fails.
    let measured = if first.is_empty() {
        measured
    } else {
        format!("{measured}; first of each: {first:?}")
    };
    let exercised = goaways > 0 && (reload.is_none() || reloads >= 2);
    row(
        id,
        expected,
        measured,
        failures == 0 && transitions == 0 && exercised,
    )
}

/// A failure's kind and code (as [`error`] gives them), and its whole chain of causes.
fn explained(e: &soulbase_net_core::NetError) -> (String, String) {
    let chain: Vec<String> = e.chain().map(ToString::to_string).collect();
    (error(e), chain.join(": "))
}

/// `moved.interop.test` answers 127.0.0.1, then (hosts file rewritten, dnsmasq reloaded)
/// 127.0.0.2, where nginx listens on the same port: a client calling it all along is on the
/// new address within the TTL + 1 s, with one connection before the move.
async fn dns_move(l: &Layout, s: &Setup) -> Row {
    let id = "dnsmasq.move-followed";
    let limit = Duration::from_secs(DNS_TTL_SECS + 1);
    let expected = format!("all 200; on 127.0.0.2 within {limit:?} (+0.5 s)");
    let (client, seen) = match client_seen(policy(l, s)) {
        Ok(c) => c,
        Err(e) => return row(id, expected, e, false),
    };
    let url = format!("http://moved.interop.test:{}/addr", l.lifecycle.moved);
    let mut failures = Vec::new();
    let mut answered_by = |body: Result<String, String>| match body {
        Ok(b) => Some(b.trim().to_owned()),
        Err(e) => {
            failures.push(e);
            None
        }
    };
    let get = || async {
        match client.send(NetRequest::get(&url)).await {
            Ok(res) if res.status == 200 => res.text().await.map_err(|e| error(&e)),
            Ok(res) => Err(format!("status {}", res.status.as_u16())),
            Err(e) => Err(error(&e)),
        }
    };
    // A second of calls on the first address.
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    let mut before = Vec::new();
    while tokio::time::Instant::now() < until {
        before.extend(answered_by(get().await));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let switched = std::fs::write(
        &l.dns_hosts,
        hosts_file(Ipv4Addr::LOCALHOST, Ipv4Addr::new(127, 0, 0, 2)),
    )
    .map_err(|e| e.to_string())
    .and_then(|()| signal(l.dnsmasq_pid, "HUP"));
    if let Err(e) = switched {
        return row(id, expected, format!("switching the answer: {e}"), false);
    }
    let moved = tokio::time::Instant::now();
    let mut followed = None;
    while moved.elapsed() < limit * 3 {
        if answered_by(get().await).as_deref() == Some("127.0.0.2") {
            followed = Some(moved.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Restore, so a re-run of the rows inside one run starts from the same answer.
    let _ = std::fs::write(
        &l.dns_hosts,
        hosts_file(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST),
    );
    let _ = signal(l.dnsmasq_pid, "HUP");
    let first_ok = !before.is_empty() && before.iter().all(|a| a == "127.0.0.1");
    let retired = seen.retired.lock().get("dns_moved").copied().unwrap_or(0);
    let measured = format!(
        "{} calls on 127.0.0.1 first ({first_ok}); followed after {}; {} failed {failures:?}; \
         {retired} retired for the move",
        before.len(),
        followed.map_or("never".to_owned(), |d| format!("{d:.2?}")),
        failures.len(),
    );
    let in_time = followed.is_some_and(|d| d <= limit + Duration::from_millis(500));
    row(
        id,
        expected,
        measured,
        first_ok && in_time && failures.is_empty(),
    )
}

/// nginx answers 503 on one port and 200 on another of the same host: three failures open
/// the first port's circuit, and the second port's calls all go through.
async fn breaker_isolation(l: &Layout, s: &Setup) -> Row {
    let id = "nginx.breaker.per-origin";
    let expected = "down port: circuit_open after 3; up port: 20/20 200";
    let mut p = strict(l, s);
    p.cbreaker.consecutive_failures = 3;
    p.cbreaker.cooldown = Duration::from_secs(60);
    let (client, _) = match client_seen(p) {
        Ok(c) => c,
        Err(e) => return row(id, expected, e, false),
    };
    let down = format!("http://nginx.interop.test:{}/x", l.lifecycle.down);
    let up = format!("http://nginx.interop.test:{}/x", l.lifecycle.up);
    let mut open_at = None;
    for i in 1..=10 {
        if let Err(e) = client.send(NetRequest::get(&down)).await {
            if e.kind() == soulbase_net_core::ErrorKind::CircuitOpen {
                open_at = Some(i);
                break;
            }
        }
    }
    let mut ok = 0;
    for _ in 0..20 {
        if matches!(client.send(NetRequest::get(&up)).await, Ok(r) if r.status == 200) {
            ok += 1;
        }
    }
    row(
        id,
        expected,
        format!(
            "down port: circuit_open at call {}; up port: {ok}/20 200",
            open_at.map_or("-".to_owned(), |n| n.to_string())
        ),
        open_at == Some(4) && ok == 20,
    )
}
