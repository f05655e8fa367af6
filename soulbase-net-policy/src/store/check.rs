//! What the `[store]` section's URLs must be, and how they are shown: by scheme, host and port,
//! never with credentials (a problem never repeats a URL).

use super::{RedisSentinel, RedisTarget};
use crate::validate::Problem;

/// A node of a list (a cluster's seeds, the sentinels), as far as the list must agree.
#[derive(PartialEq, Eq)]
struct Node {
    scheme: String,
    /// User and password: compared, never shown.
    credentials: (String, Option<String>),
    /// The database of the URL's path, when it names one.
    db: Option<i64>,
}

/// The problems of `target`, at the paths of the `[store]` section.
pub(super) fn target(target: &RedisTarget) -> Result<(), Vec<Problem>> {
    let mut problems = Vec::new();
    match target {
        RedisTarget::Server(url) => {
            if let Err(reason) = server(url) {
                problems.push(Problem::new("store.redis", reason));
            }
        }
        RedisTarget::Cluster(nodes) => cluster(nodes, &mut problems),
        RedisTarget::Sentinel(s) => sentinel(s, &mut problems),
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Whether the client can speak to the Redis at `url`.
fn server(url: &str) -> Result<(), String> {
    // Never repeat the URL: it may hold a password.
    let parsed = url::Url::parse(url).map_err(|e| format!("not an absolute URL: {e}"))?;
    match parsed.scheme() {
        "redis" | "rediss" if parsed.host_str().is_some_and(|h| !h.is_empty()) => Ok(()),
        "redis" | "rediss" => Err("a redis:// or rediss:// URL needs a host".to_owned()),
        "redis+unix" | "unix" if !parsed.path().is_empty() && parsed.path() != "/" => Ok(()),
        "redis+unix" | "unix" => Err("a Unix-socket URL needs the socket's path".to_owned()),
        other => Err(format!(
            "scheme `{other}` is not redis://, rediss://, redis+unix:// or unix://"
        )),
    }
}

/// The seed nodes of a cluster: a list of nodes, on database 0.
fn cluster(nodes: &[String], problems: &mut Vec<Problem>) {
    node_list("store.redis_cluster", nodes, problems, |node| {
        non_zero(node).then_some("Redis Cluster has only database 0")
    });
}

/// A master's name, its sentinels (a list of nodes, without a database) and its database.
fn sentinel(s: &RedisSentinel, problems: &mut Vec<Problem>) {
    let path = "store.redis_sentinel";
    if s.master.trim().is_empty() {
        problems.push(Problem::new(
            format!("{path}.master"),
            "needs the name the sentinels know the master by",
        ));
    }
    node_list(&format!("{path}.nodes"), &s.nodes, problems, |node| {
        non_zero(node).then_some("a sentinel has no databases; `db` sets the master's")
    });
    if s.db < 0 {
        problems.push(Problem::new(format!("{path}.db"), "must be ≥ 0"));
    }
}

/// Whether a node's URL names a database other than 0.
fn non_zero(node: &Node) -> bool {
    node.db.is_some_and(|db| db != 0)
}

/// The problems of a list of nodes: of each node that does not parse, of an empty list, of a
/// node whose scheme or credentials differ from the first node's (the client reaches every
/// node alike), and what `extra` finds wrong with a node.
fn node_list(
    path: &str,
    urls: &[String],
    problems: &mut Vec<Problem>,
    extra: impl Fn(&Node) -> Option<&'static str>,
) {
    if urls.is_empty() {
        problems.push(Problem::new(path, "needs at least one node"));
    }
    let mut nodes: Vec<Node> = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let node = match node(url) {
            Ok(node) => node,
            Err(reason) => {
                problems.push(Problem::new(at, reason));
                continue;
            }
        };
        if let Some(first) = nodes.first() {
            if first.scheme != node.scheme {
                problems.push(Problem::new(
                    &at,
                    format!(
                        "uses {}:// and an earlier node {}://; one scheme for all nodes",
                        node.scheme, first.scheme
                    ),
                ));
            }
            if first.credentials != node.credentials {
                problems.push(Problem::new(
                    &at,
                    "has other credentials than an earlier node; one username and password for all nodes",
                ));
            }
        }
        if let Some(reason) = extra(&node) {
            problems.push(Problem::new(&at, reason));
        }
        nodes.push(node);
    }
}

/// A node reached by host and port (`redis://` or `rediss://`).
fn node(url: &str) -> Result<Node, String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("not an absolute URL: {e}"))?;
    match parsed.scheme() {
        "redis" | "rediss" if parsed.host_str().is_some_and(|h| !h.is_empty()) => {}
        "redis" | "rediss" => return Err("a redis:// or rediss:// URL needs a host".to_owned()),
        other => {
            return Err(format!(
                "scheme `{other}` is not redis:// or rediss:// (nodes are reached by host and port)"
            ))
        }
    }
    let db = match parsed.path().trim_start_matches('/') {
        "" => None,
        n => Some(
            n.parse::<i64>()
                .map_err(|_| "the URL's path must be a database number".to_owned())?,
        ),
    };
    Ok(Node {
        scheme: parsed.scheme().to_owned(),
        credentials: (
            parsed.username().to_owned(),
            parsed.password().map(str::to_owned),
        ),
        db,
    })
}

/// Scheme, host and port of `url`, without credentials, path or query.
pub(super) fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => match (u.host_str(), u.port()) {
            (Some(host), Some(port)) => format!("{}://{host}:{port}", u.scheme()),
            (Some(host), None) => format!("{}://{host}", u.scheme()),
            (None, _) => format!("{}://…", u.scheme()),
        },
        Err(_) => "(not a URL)".to_owned(),
    }
}

/// Each of `urls` [`shown`], separated by spaces.
pub(super) fn shown_all(urls: &[String]) -> String {
    let shown: Vec<String> = urls.iter().map(|u| shown(u)).collect();
    shown.join(" ")
}
