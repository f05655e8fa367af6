//! The `[store]` section read from and written to a document's value tree.

use serde_json::{Map, Value};

use super::{check, RedisSentinel, RedisTarget, StoreConfig};
use crate::validate::Problem;

/// The keys that name a Redis deployment; a section names one at most.
const TARGETS: [&str; 3] = ["redis", "redis_cluster", "redis_sentinel"];

impl StoreConfig {
    /// Reads a `[store]` section; every problem at once, with its path.
    pub(crate) fn from_value(v: &Value) -> Result<Self, Vec<Problem>> {
        let Value::Object(map) = v else {
            return Err(vec![Problem::new("store", "expected a table")]);
        };
        let mut problems = Vec::new();
        let mut out = Self::default();
        let named: Vec<&str> = TARGETS
            .into_iter()
            .filter(|k| map.contains_key(*k))
            .collect();
        if named.len() > 1 {
            problems.push(Problem::new(
                "store",
                format!(
                    "names {}; name one Redis deployment: `redis`, `redis_cluster` or `redis_sentinel`",
                    named.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(" and ")
                ),
            ));
        }
        for (k, v) in map {
            let target = match k.as_str() {
                "redis" => match v {
                    Value::String(url) => Ok(RedisTarget::Server(url.clone())),
                    _ => Err(vec![Problem::new("store.redis", "expected a URL string")]),
                },
                "redis_cluster" => urls("store.redis_cluster", v).map(RedisTarget::Cluster),
                "redis_sentinel" => sentinel(v).map(RedisTarget::Sentinel),
                other => Err(vec![Problem::new(
                    format!("store.{other}"),
                    "unknown field, expected `redis`, `redis_cluster` or `redis_sentinel`",
                )]),
            };
            match target.and_then(|t| check::target(&t).map(|()| t)) {
                Ok(t) => out.redis = Some(t),
                Err(found) => problems.extend(found),
            }
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems)
        }
    }

    /// The section as a value tree (URLs as written).
    pub(crate) fn to_value(&self) -> Value {
        let mut map = Map::new();
        match &self.redis {
            Some(RedisTarget::Server(url)) => {
                map.insert("redis".into(), Value::String(url.clone()));
            }
            Some(RedisTarget::Cluster(nodes)) => {
                map.insert("redis_cluster".into(), strings(nodes));
            }
            Some(RedisTarget::Sentinel(s)) => {
                let mut t = Map::new();
                t.insert("master".into(), Value::String(s.master.clone()));
                t.insert("nodes".into(), strings(&s.nodes));
                if let Some(u) = &s.username {
                    t.insert("username".into(), Value::String(u.clone()));
                }
                if let Some(p) = &s.password {
                    t.insert("password".into(), Value::String(p.clone()));
                }
                if s.db != 0 {
                    t.insert("db".into(), Value::from(s.db));
                }
                map.insert("redis_sentinel".into(), Value::Object(t));
            }
            None => {}
        }
        Value::Object(map)
    }
}

/// A list of URL strings at `path`.
fn urls(path: &str, v: &Value) -> Result<Vec<String>, Vec<Problem>> {
    let Value::Array(items) = v else {
        return Err(vec![Problem::new(path, "expected a list of URL strings")]);
    };
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::String(url) => out.push(url.clone()),
            _ => problems.push(Problem::new(
                format!("{path}[{i}]"),
                "expected a URL string",
            )),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// A `redis_sentinel` table: `master`, `nodes`, and optionally `username`, `password`, `db`.
fn sentinel(v: &Value) -> Result<RedisSentinel, Vec<Problem>> {
    const PATH: &str = "store.redis_sentinel";
    let Value::Object(map) = v else {
        return Err(vec![Problem::new(
            PATH,
            "expected a table: { master = \"…\", nodes = [\"redis://…\"] }",
        )]);
    };
    let mut problems = Vec::new();
    let mut out = RedisSentinel::new(String::new(), Vec::<String>::new());
    let mut has_master = false;
    for (k, v) in map {
        let at = format!("{PATH}.{k}");
        match (k.as_str(), v) {
            ("master", Value::String(name)) => {
                out.master = name.clone();
                has_master = true;
            }
            ("nodes", nodes) => match urls(&at, nodes) {
                Ok(nodes) => out.nodes = nodes,
                Err(found) => problems.extend(found),
            },
            ("username", Value::String(u)) => out.username = Some(u.clone()),
            ("password", Value::String(p)) => out.password = Some(p.clone()),
            ("db", db) => match db.as_i64() {
                Some(db) => out.db = db,
                None => problems.push(Problem::new(at, "expected an integer")),
            },
            ("master" | "username" | "password", _) => {
                problems.push(Problem::new(at, "expected a string"));
            }
            _ => problems.push(Problem::new(
                at,
                "unknown field, expected `master`, `nodes`, `username`, `password` or `db`",
            )),
        }
    }
    if !has_master {
        problems.push(Problem::new(
            format!("{PATH}.master"),
            "missing: the name the sentinels know the master by",
        ));
    }
    if !map.contains_key("nodes") {
        problems.push(Problem::new(
            format!("{PATH}.nodes"),
            "missing: the sentinels' URLs",
        ));
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

fn strings(items: &[String]) -> Value {
    Value::Array(items.iter().cloned().map(Value::String).collect())
}
