use serde_json::json;

use super::*;

fn problems_of(v: serde_json::Value) -> Vec<String> {
    StoreConfig::from_value(&v)
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn urls_are_checked_and_never_shown_with_credentials() {
    let ok = StoreConfig::redis("redis://user:s3cret@10.0.0.5:6379/0").unwrap();
    assert_eq!(ok.redis_url(), Some("redis://user:s3cret@10.0.0.5:6379/0"));
    let shown = format!("{ok:?}");
    assert!(
        !shown.contains("s3cret") && !shown.contains("user"),
        "{shown}"
    );
    assert!(shown.contains("redis://10.0.0.5:6379"), "{shown}");
    assert!(StoreConfig::redis("redis+unix:///run/redis.sock").is_ok());
    assert!(StoreConfig::redis("rediss://cache.internal:6380/").is_ok());
    for bad in ["rediss://", "http://h/", "redis://", "unix:///", "nope"] {
        let problems = StoreConfig::redis(bad).unwrap_err();
        assert_eq!(problems[0].path, "store.redis", "{bad}");
    }
}

#[test]
fn a_cluster_is_a_list_of_nodes_alike() {
    let c = StoreConfig::redis_cluster(["redis://:pw@10.0.0.5:7000", "redis://:pw@10.0.0.6:7000/"])
        .unwrap();
    assert_eq!(c.redis_url(), None, "not a single server");
    let shown = format!("{c:?}");
    assert!(!shown.contains("pw"), "{shown}");
    assert!(shown.contains("redis://10.0.0.6:7000"), "{shown}");
    assert_eq!(
        c.redis_target().unwrap().shown(),
        "cluster redis://10.0.0.5:7000 redis://10.0.0.6:7000"
    );
    let problems = problems_of(json!({"redis_cluster": [
        "redis://:pw@a:7000",
        "rediss://:pw@b:7000",
        "redis://:other@c:7000",
        "redis+unix:///run/r.sock",
        "redis://:pw@d:7000/2",
        7,
    ]}));
    assert_eq!(
        problems,
        ["store.redis_cluster[5]: expected a URL string"],
        "types first"
    );
    let problems: Vec<String> = StoreConfig::redis_cluster([
        "redis://:pw@a:7000",
        "rediss://:pw@b:7000",
        "redis://:other@c:7000",
        "redis+unix:///run/r.sock",
        "redis://:pw@d:7000/2",
    ])
    .unwrap_err()
    .iter()
    .map(ToString::to_string)
    .collect();
    assert_eq!(
        problems,
        [
            "store.redis_cluster[1]: uses rediss:// and an earlier node redis://; one scheme for all nodes",
            "store.redis_cluster[2]: has other credentials than an earlier node; one username and password for all nodes",
            "store.redis_cluster[3]: scheme `redis+unix` is not redis:// or rediss:// (nodes are reached by host and port)",
            "store.redis_cluster[4]: Redis Cluster has only database 0",
        ]
    );
    assert!(problems
        .iter()
        .all(|p| !p.contains("other") || p.contains("other credentials")));
    assert_eq!(
        problems_of(json!({"redis_cluster": []})),
        ["store.redis_cluster: needs at least one node"]
    );
}

#[test]
fn a_sentinel_names_a_master_and_its_sentinels() {
    let s = RedisSentinel::new("mymaster", ["redis://:spw@10.0.0.7:26379"])
        .username("app")
        .password("mpw")
        .db(2);
    let c = StoreConfig::redis_sentinel(s.clone()).unwrap();
    let shown = format!("{c:?}");
    for secret in ["spw", "mpw", "app"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert_eq!(
        c.redis_target().unwrap().shown(),
        "sentinel master mymaster via redis://10.0.0.7:26379"
    );
    // Read back from its own value tree.
    assert_eq!(StoreConfig::from_value(&c.to_value()).unwrap(), c);
    assert_eq!(
        problems_of(json!({"redis_sentinel": {"nodes": "redis://s:26379", "port": 1}})),
        [
            "store.redis_sentinel.nodes: expected a list of URL strings",
            "store.redis_sentinel.port: unknown field, expected `master`, `nodes`, `username`, `password` or `db`",
            "store.redis_sentinel.master: missing: the name the sentinels know the master by",
        ]
    );
    assert_eq!(
        problems_of(json!({"redis_sentinel": {
            "master": " ", "nodes": ["redis://s:26379/1", "http://t/"], "db": -1
        }})),
        [
            "store.redis_sentinel.master: needs the name the sentinels know the master by",
            "store.redis_sentinel.nodes[0]: a sentinel has no databases; `db` sets the master's",
            "store.redis_sentinel.nodes[1]: scheme `http` is not redis:// or rediss:// (nodes are reached by host and port)",
            "store.redis_sentinel.db: must be ≥ 0",
        ]
    );
}

#[test]
fn a_section_names_one_deployment_at_most() {
    let problems = problems_of(json!({
        "redis": "redis://:pw@a:6379",
        "redis_cluster": ["redis://:pw@b:7000"],
    }));
    assert_eq!(
        problems,
        ["store: names `redis` and `redis_cluster`; name one Redis deployment: `redis`, `redis_cluster` or `redis_sentinel`"]
    );
    assert_eq!(
        StoreConfig::from_value(&json!({})).unwrap(),
        StoreConfig::default()
    );
}
