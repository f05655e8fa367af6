//! The throwaway Redis deployments: a cluster forms and serves every slot where `node_of`
//! says, a sentinel names its master, and both are gone once dropped.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use soulbase_net_testkit::{RedisCluster, RedisSentinel};

/// One inline command; the first line of the answer.
fn ask(addr: SocketAddr, command: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(format!("{command}\r\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    line.trim_end().to_owned()
}

fn refuses(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err()
}

#[test]
fn a_cluster_serves_each_slot_on_its_node_and_stops_on_drop() {
    let Some(cluster) =
        RedisCluster::start_or_skip("a_cluster_serves_each_slot_on_its_node_and_stops_on_drop")
    else {
        return;
    };
    let addrs: Vec<SocketAddr> = cluster.nodes().iter().map(|n| n.addr()).collect();
    assert_eq!(addrs.len(), RedisCluster::MASTERS);
    assert_eq!(cluster.urls()[0], format!("redis://{}/", addrs[0]));
    let owners: BTreeSet<usize> = (0..30)
        .map(|i| cluster.node_of(&format!("k{i}")).unwrap())
        .collect();
    assert_eq!(owners.len(), 3, "30 keys over 3 nodes");
    // Each key is taken by the node `node_of` names and redirected by the others.
    for key in ["k0", "k1", "k2", "k3"] {
        let owner = cluster.node_of(key).unwrap();
        for (i, addr) in addrs.iter().enumerate() {
            let answer = ask(*addr, &format!("SET {key} v"));
            if i == owner {
                assert_eq!(answer, "+OK", "{key} on node {i}");
            } else {
                assert!(answer.starts_with("-MOVED"), "{key} on node {i}: {answer}");
            }
        }
    }
    let counts = cluster.key_counts().unwrap();
    assert_eq!(counts.iter().sum::<u64>(), 4, "{counts:?}");
    drop(cluster);
    assert!(addrs.iter().all(|a| refuses(*a)));
}

#[test]
fn a_sentinel_names_its_master_and_both_stop_on_drop() {
    let Some(sentinel) =
        RedisSentinel::start_or_skip("a_sentinel_names_its_master_and_both_stop_on_drop")
    else {
        return;
    };
    let (s, m) = (sentinel.sentinel().addr(), sentinel.master().addr());
    assert_eq!(sentinel.url(), format!("redis://{s}/"));
    let mut s_conn = TcpStream::connect(s).unwrap();
    s_conn
        .write_all(
            format!(
                "SENTINEL get-master-addr-by-name {}\r\n",
                RedisSentinel::MASTER_NAME
            )
            .as_bytes(),
        )
        .unwrap();
    let mut lines = BufReader::new(s_conn).lines();
    let answer: Vec<String> = (0..5).map(|_| lines.next().unwrap().unwrap()).collect();
    assert_eq!(
        answer,
        [
            "*2",
            "$9",
            "127.0.0.1",
            &format!("${}", m.port().to_string().len()),
            &m.port().to_string()
        ]
    );
    assert_eq!(ask(m, "PING"), "+PONG");
    drop(sentinel);
    assert!(refuses(s) && refuses(m));
}
