//! [`StoreConfig`]: the policy document's `[store]` section — where a fleet's shared state
//! (rate limits, dedup window, HTTP cache) lives.

use std::fmt;

use serde_json::Value;

use crate::validate::Problem;

/// Where a fleet's shared state lives: the document's `[store]` section.
///
/// ```toml
/// [store]
/// redis = "redis://:secret@10.0.0.5:6379/0"   # or redis+unix:///run/redis.sock
/// ```
///
/// The URL is checked when the document is loaded (a scheme the client can speak, a host or a
/// socket path); its credentials are never shown by `Debug` — only the scheme and the host.
/// `rediss://` is TLS to Redis, verified against the system's trust roots (a private CA:
/// `RedisRateStore::with_root_pem` and the stores' `with_root_pem`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StoreConfig {
    redis: Option<String>,
}

impl StoreConfig {
    /// A configuration naming the Redis at `url`.
    ///
    /// # Errors
    /// The problems of `url`, at the path `store.redis`.
    pub fn redis(url: &str) -> Result<Self, Vec<Problem>> {
        check_redis(url).map_err(|reason| vec![Problem::new("store.redis", reason)])?;
        Ok(Self {
            redis: Some(url.to_owned()),
        })
    }

    /// The Redis URL, credentials included: for connecting, never for showing.
    pub fn redis_url(&self) -> Option<&str> {
        self.redis.as_deref()
    }

    /// Reads a `[store]` section; every problem at once, with its path.
    pub(crate) fn from_value(v: &Value) -> Result<Self, Vec<Problem>> {
        let Value::Object(map) = v else {
            return Err(vec![Problem::new("store", "expected a table")]);
        };
        let mut problems = Vec::new();
        let mut out = Self::default();
        for (k, v) in map {
            match (k.as_str(), v) {
                ("redis", Value::String(url)) => match check_redis(url) {
                    Ok(()) => out.redis = Some(url.clone()),
                    Err(reason) => problems.push(Problem::new("store.redis", reason)),
                },
                ("redis", _) => problems.push(Problem::new("store.redis", "expected a URL string")),
                (other, _) => problems.push(Problem::new(
                    format!("store.{other}"),
                    "unknown field, expected `redis`",
                )),
            }
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems)
        }
    }

    /// The section as a value tree (the URL as written).
    pub(crate) fn to_value(&self) -> Value {
        let mut map = serde_json::Map::new();
        if let Some(url) = &self.redis {
            map.insert("redis".into(), Value::String(url.clone()));
        }
        Value::Object(map)
    }
}

/// Scheme and host of `url`, without credentials, path or query.
fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => match u.host_str() {
            Some(host) => format!("{}://{host}", u.scheme()),
            None => format!("{}://…", u.scheme()),
        },
        Err(_) => "(not a URL)".to_owned(),
    }
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("redis", &self.redis.as_deref().map(shown))
            .finish()
    }
}

/// Whether the client can speak to the Redis at `url`.
fn check_redis(url: &str) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_never_shown_with_credentials() {
        let ok = StoreConfig::redis("redis://user:s3cret@10.0.0.5:6379/0").unwrap();
        assert_eq!(ok.redis_url(), Some("redis://user:s3cret@10.0.0.5:6379/0"));
        let shown = format!("{ok:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("user"),
            "{shown}"
        );
        assert!(shown.contains("redis://10.0.0.5"), "{shown}");
        assert!(StoreConfig::redis("redis+unix:///run/redis.sock").is_ok());
        assert!(StoreConfig::redis("rediss://cache.internal:6380/").is_ok());
        for bad in ["rediss://", "http://h/", "redis://", "unix:///", "nope"] {
            let problems = StoreConfig::redis(bad).unwrap_err();
            assert_eq!(problems[0].path, "store.redis", "{bad}");
        }
    }
}
