//! dnsmasq rows: names resolved through it (the client's name server set explicitly), TTLs
//! respected (counted in its query log), names that resolve to private addresses refused, and
//! a rebinding name whose answer is switched mid-test refused at connect time.

use std::{net::Ipv4Addr, time::Duration};

use soulbase_net_core::NetRequest;

use super::{
    nginx::send,
    peers::{dig, hosts_file, signal, Layout, DNS_TTL_SECS},
    scenario::{client_with, eventually, log_lines, outcome, policy},
    Setup,
};
use crate::table::{row, Row};

/// The dnsmasq rows.
pub(crate) async fn rows(l: &Layout, s: &Setup) -> Vec<Row> {
    let mut rows = Vec::new();
    let queries = |name: &str| {
        let needle = format!("query[A] {name} ");
        log_lines(&l.dns_log)
            .iter()
            .filter(|line| line.contains(&needle))
            .count()
    };
    let hb = l.httpbin[0];

    let r = send(
        policy(l, s),
        NetRequest::get(format!("http://httpbin.interop.test:{hb}/get")),
    )
    .await;
    let asked = eventually(Duration::from_secs(2), || {
        queries("httpbin.interop.test") > 0
    })
    .await;
    rows.push(row(
        "dnsmasq.resolve",
        "status 200, dnsmasq logged the query",
        format!("{r}; queried {asked}"),
        r == "status 200" && asked,
    ));

    rows.push(ttl(l, s, hb, &queries).await);

    if s.isolated {
        for name in ["private.interop.test", "metadata.interop.test"] {
            let r = send(
                policy(l, s),
                NetRequest::get(format!("http://{name}:{hb}/get")),
            )
            .await;
            rows.push(row(
                &format!(
                    "dnsmasq.{}-name-refused",
                    name.split('.').next().unwrap_or("?")
                ),
                "blocked AUTH.FORBIDDEN",
                r.clone(),
                r == "blocked AUTH.FORBIDDEN",
            ));
        }
        rows.push(rebinding(l, s, hb).await);
    }
    rows
}

/// With a 2s TTL: two requests in a row ask once, a third after the TTL asks again.
async fn ttl(l: &Layout, s: &Setup, hb: u16, queries: &dyn Fn(&str) -> usize) -> Row {
    let id = "dnsmasq.ttl-respected";
    let expected = format!("1 query for 2 requests within {DNS_TTL_SECS}s, 2 after it");
    // No pooled connections, so every request needs an address.
    let (c, _) = match client_with(policy(l, s), |b| b.pool_max_idle_per_host(0)) {
        Ok(c) => c,
        Err(e) => return row(id, expected, e, false),
    };
    let url = format!("http://ttl.interop.test:{hb}/get");
    let mut outcomes = Vec::new();
    outcomes.push(outcome(&c.send(NetRequest::get(&url)).await));
    outcomes.push(outcome(&c.send(NetRequest::get(&url)).await));
    eventually(Duration::from_secs(1), || queries("ttl.interop.test") > 0).await;
    let within = queries("ttl.interop.test");
    tokio::time::sleep(Duration::from_millis(DNS_TTL_SECS * 1000 + 500)).await;
    outcomes.push(outcome(&c.send(NetRequest::get(&url)).await));
    eventually(Duration::from_secs(1), || {
        queries("ttl.interop.test") > within
    })
    .await;
    let after = queries("ttl.interop.test");
    let ok = outcomes.iter().all(|o| o == "status 200");
    row(
        id,
        expected,
        format!("{within} query within, {after} after; all 200 {ok}"),
        ok && within == 1 && after == 2,
    )
}

/// `rebind.interop.test` answers 127.0.0.1, then (hosts file rewritten, dnsmasq reloaded)
/// 10.0.0.2: the first request passes, the one after the TTL is refused before dialling.
async fn rebinding(l: &Layout, s: &Setup, hb: u16) -> Row {
    let id = "dnsmasq.rebinding-refused";
    let expected = "first 200; after the switch to 10.0.0.2: blocked AUTH.FORBIDDEN";
    let (c, _) = match client_with(policy(l, s), |b| b.pool_max_idle_per_host(0)) {
        Ok(c) => c,
        Err(e) => return row(id, expected, e, false),
    };
    let url = format!("http://rebind.interop.test:{hb}/get");
    let first = outcome(&c.send(NetRequest::get(&url)).await);
    let switched = std::fs::write(
        &l.dns_hosts,
        hosts_file(Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::LOCALHOST),
    )
    .map_err(|e| e.to_string())
    .and_then(|()| signal(l.dnsmasq_pid, "HUP"));
    if let Err(e) = switched {
        return row(id, expected, format!("switching the answer: {e}"), false);
    }
    let dns = l.dns;
    let now_private = eventually(Duration::from_secs(3), || {
        dig(dns, "rebind.interop.test").as_deref() == Some("10.0.0.2")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(DNS_TTL_SECS * 1000 + 500)).await;
    let second = outcome(&c.send(NetRequest::get(&url)).await);
    // Restore, so a re-run of the rows inside one run starts from the same answer.
    let _ = std::fs::write(
        &l.dns_hosts,
        hosts_file(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST),
    );
    let _ = signal(l.dnsmasq_pid, "HUP");
    row(
        id,
        expected,
        format!("first {first}; dnsmasq switched {now_private}; then {second}"),
        first == "status 200" && now_private && second == "blocked AUTH.FORBIDDEN",
    )
}
