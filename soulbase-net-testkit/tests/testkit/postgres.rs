//! The throwaway PostgreSQL cluster: it creates databases and answers queries, refuses once
//! stopped, keeps its data across a restart, holds still while paused, flushes only when asked,
//! and is gone once dropped.

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use soulbase_net_testkit::PostgresServer;

fn refuses(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err()
}

/// A protocol-level probe without a driver: PostgreSQL answers an `SSLRequest` with one byte
/// (`N`, no TLS here) as soon as a backend serves the connection.
fn answers_ssl_request(addr: SocketAddr, within: Duration) -> bool {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    // Length 8, then the SSLRequest code 80877103.
    s.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).unwrap();
    let mut answer = [0u8; 1];
    s.read_exact(&mut answer).is_ok() && answer == *b"N"
}

#[test]
fn a_cluster_creates_databases_keeps_data_across_a_restart_and_stops_on_drop() {
    let Some(mut pg) = PostgresServer::start_or_skip(
        "a_cluster_creates_databases_keeps_data_across_a_restart_and_stops_on_drop",
    ) else {
        return;
    };
    let addr = pg.addr();
    assert!(addr.ip().is_loopback());
    assert_eq!(
        pg.url(),
        format!("postgres://soulbase@127.0.0.1:{}/postgres", addr.port())
    );
    let url = pg.create_database("app").unwrap();
    assert_eq!(
        url,
        format!("postgres://soulbase@127.0.0.1:{}/app", addr.port())
    );
    assert_eq!(pg.psql("app", "SELECT 1").unwrap(), "1");
    assert!(pg.create_database("app").is_err(), "it exists already");
    let bad = pg.create_database("a;b").unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidInput);
    pg.psql("app", "CREATE TABLE t (v int); INSERT INTO t VALUES (7)")
        .unwrap();
    assert!(answers_ssl_request(addr, Duration::from_secs(2)));

    pg.stop();
    assert!(refuses(addr));
    assert!(pg.psql("app", "SELECT 1").is_err());
    pg.restart().unwrap();
    assert!(!refuses(addr));
    assert_eq!(
        pg.psql("app", "SELECT v FROM t").unwrap(),
        "7",
        "committed data kept"
    );

    drop(pg);
    assert!(refuses(addr));
}

#[test]
fn a_paused_cluster_holds_connections_without_answering_until_resumed() {
    let Some(mut pg) = PostgresServer::start_or_skip(
        "a_paused_cluster_holds_connections_without_answering_until_resumed",
    ) else {
        return;
    };
    pg.pause().unwrap();
    // The kernel still accepts; no PostgreSQL process answers.
    assert!(!answers_ssl_request(pg.addr(), Duration::from_millis(300)));
    pg.resume().unwrap();
    assert!(answers_ssl_request(pg.addr(), Duration::from_secs(5)));
    assert_eq!(pg.psql("postgres", "SELECT 1").unwrap(), "1");
    // Stopping a paused server thaws it first, so it shuts down at once.
    pg.pause().unwrap();
    let started = tokio::time::Instant::now();
    pg.stop();
    assert!(refuses(pg.addr()));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn fsync_is_off_for_tests_and_on_when_asked() {
    let Some(fast) = PostgresServer::start_or_skip("fsync_is_off_for_tests_and_on_when_asked")
    else {
        return;
    };
    let durable = PostgresServer::builder()
        .fsync(true)
        .start_or_skip("fsync_is_off_for_tests_and_on_when_asked")
        .unwrap();
    let show = "SELECT current_setting('fsync') || ' ' || current_setting('synchronous_commit')";
    assert_eq!(fast.psql("postgres", show).unwrap(), "off on");
    assert_eq!(durable.psql("postgres", show).unwrap(), "on on");
    assert_ne!(fast.addr(), durable.addr());
}
