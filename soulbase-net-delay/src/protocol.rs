//! The wire protocol: JSON, one object per line, over a long-lived TCP connection — exactly
//! as seed 003's protocol section gives it.
//!
//! Client to server: `register`, `schedule`, `ack` (of a delivery). Server to client:
//! `registered`, `ack` (of a schedule, once the task is durable), `delivery`, `error`.
//!
//! Where the seed's examples disagree with its protocol section, the protocol section rules:
//! deliveries are `{"kind":"delivery",…}` (the Java example reads `"ready"`), and `fire_at` is
//! a number everywhere the server writes it (the protocol's delivery sample shows a string;
//! the Go example reads an `int64`). Every disagreement of the seed with itself, and what the
//! server does about it, is listed in the crate's docs.
//!
//! Order: a connection's answers (`registered`, `ack`, `error`) come in the order of its lines;
//! a delivery may come between them — a task due at once can be delivered to a connection of
//! its route before its schedule's `ack` reaches the client that sent it.

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The longest line read, newline excluded: the seed's Java client frames at 64 KiB. A longer
/// line gets an error line and is skipped; the connection goes on.
pub const MAX_LINE: usize = 64 * 1024;

/// A line a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// Deliveries for `route_key` may come to this connection.
    Register {
        /// The route.
        route_key: String,
        /// The route's token, when the server asks for one.
        token: Option<String>,
    },
    /// A task to deliver at `fire_at`.
    Schedule(Schedule),
    /// The delivery `id` was received.
    Ack {
        /// The delivered task's id.
        id: String,
    },
}

/// A `schedule` line, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The client's id, if it gave one.
    pub id: Option<String>,
    /// The route, if given (else the connection's own, `conn-<n>`).
    pub route_key: Option<String>,
    /// When it fires, ms since the epoch.
    pub fire_at: i64,
    /// The payload's compression, as named: `none`, `lz4` (frame format) or `zstd`.
    pub compression: String,
    /// The payload, decoded from base64 (still compressed, if it was).
    pub payload: Bytes,
    /// The route's token, when the server asks for one.
    pub token: Option<String>,
    /// An HTTP call to make when it fires, instead of a delivery to a connection (a server
    /// with HTTP tasks enabled only): the payload is the request's body.
    pub target: Option<Target>,
}

/// The HTTP call an HTTP task makes when it fires: `{"method":"POST","url":"https://…",
/// "headers":{"content-type":"application/json"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// The method (default `POST`).
    #[serde(default = "post")]
    pub method: String,
    /// The absolute http(s) URL.
    pub url: String,
    /// Headers to send.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
}

fn post() -> String {
    "POST".to_owned()
}

/// A line the server sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outbound {
    /// The answer to `register`.
    Registered {
        /// The route.
        route_key: String,
    },
    /// The answer to `schedule`, once the task is durable.
    Ack {
        /// The task's id (the client's, or the one the server made).
        id: String,
        /// When it fires.
        fire_at: i64,
    },
    /// A task that fired.
    Delivery {
        /// The task's id: the same on every delivery of it.
        id: String,
        /// Its route.
        route_key: String,
        /// When it was due.
        fire_at: i64,
        /// The payload as it was sent, base64.
        payload_base64: String,
        /// The payload's compression, as the client named it.
        compression: String,
    },
    /// A line that could not be served.
    Error {
        /// The task's id, when the line named one.
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// The project's stable error code (`SCHEMA.VALIDATION_FAILED`, …).
        code: &'static str,
        /// What was wrong, and where.
        message: String,
    },
}

impl Outbound {
    /// The line, newline included.
    pub fn line(&self) -> String {
        // Serialising these types cannot fail: plain strings and integers.
        let mut s = serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"kind":"error","code":"UNKNOWN.INTERNAL","message":"unserialisable"}"#.to_owned()
        });
        s.push('\n');
        s
    }

    /// A delivery of `task`.
    pub fn delivery(task: &soulbase_net_store::delay::DelayTask) -> Self {
        Outbound::Delivery {
            id: task.id.clone(),
            route_key: task.route_key.clone(),
            fire_at: task.fire_at,
            payload_base64: base64::engine::general_purpose::STANDARD.encode(&task.payload),
            compression: task.compression.clone(),
        }
    }
}

/// A line that could not be read: what to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    /// The id the line named, if it could be read.
    pub id: Option<String>,
    /// The stable code.
    pub code: &'static str,
    /// What was wrong.
    pub message: String,
}

impl BadLine {
    fn new(id: Option<String>, message: impl Into<String>) -> Self {
        Self {
            id,
            code: soulbase_net_core::ErrorKind::InvalidRequest.code().as_str(),
            message: message.into(),
        }
    }

    /// The error line.
    pub fn reply(self) -> Outbound {
        Outbound::Error {
            id: self.id,
            code: self.code,
            message: self.message,
        }
    }
}

/// What any line holds, read loosely so that an error can name the id.
#[derive(Deserialize)]
struct Raw {
    kind: Option<serde_json::Value>,
    id: Option<serde_json::Value>,
    route_key: Option<serde_json::Value>,
    fire_at: Option<serde_json::Value>,
    compression: Option<serde_json::Value>,
    payload_base64: Option<serde_json::Value>,
    token: Option<serde_json::Value>,
    target: Option<serde_json::Value>,
}

/// Reads one line (without its newline).
///
/// # Errors
/// A [`BadLine`] for anything that is not one of the client's three objects, well formed.
pub fn parse(line: &[u8]) -> Result<Inbound, BadLine> {
    let raw: Raw = serde_json::from_slice(line)
        .map_err(|e| BadLine::new(None, format!("not a JSON object: {e}")))?;
    let id = match &raw.id {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) if !s.is_empty() && s.len() <= 256 => Some(s.clone()),
        Some(_) => {
            return Err(BadLine::new(
                None,
                "`id` must be a string of 1 to 256 characters",
            ))
        }
    };
    let text = |name: &str, v: &Option<serde_json::Value>| -> Result<Option<String>, BadLine> {
        match v {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(BadLine::new(
                id.clone(),
                format!("`{name}` must be a string"),
            )),
        }
    };
    let kind = match &raw.kind {
        Some(serde_json::Value::String(k)) => k.as_str(),
        _ => return Err(BadLine::new(id, "`kind` is missing or not a string")),
    };
    let token = text("token", &raw.token)?;
    match kind {
        "register" => {
            let route_key = text("route_key", &raw.route_key)?
                .filter(|r| !r.is_empty())
                .ok_or_else(|| BadLine::new(id.clone(), "`register` needs a `route_key`"))?;
            check_route(&route_key).map_err(|m| BadLine::new(id.clone(), m))?;
            Ok(Inbound::Register { route_key, token })
        }
        "ack" => {
            let id = id.ok_or_else(|| BadLine::new(None, "`ack` needs the delivery's `id`"))?;
            Ok(Inbound::Ack { id })
        }
        "schedule" => {
            let route_key = text("route_key", &raw.route_key)?.filter(|r| !r.is_empty());
            if let Some(r) = &route_key {
                check_route(r).map_err(|m| BadLine::new(id.clone(), m))?;
            }
            let fire_at = match &raw.fire_at {
                Some(serde_json::Value::Number(n)) => n.as_i64().filter(|t| *t >= 0),
                // A string of digits is read too (the protocol's own delivery sample quotes it).
                Some(serde_json::Value::String(s)) => s.parse::<i64>().ok().filter(|t| *t >= 0),
                _ => None,
            }
            .ok_or_else(|| {
                BadLine::new(
                    id.clone(),
                    "`fire_at` must be a non-negative number of ms since the epoch",
                )
            })?;
            let compression =
                text("compression", &raw.compression)?.unwrap_or_else(|| "none".into());
            if !crate::compress::COMPRESSIONS.contains(&compression.as_str()) {
                return Err(BadLine::new(
                    id,
                    format!(
                        "compression `{compression}` is not supported ({})",
                        crate::compress::COMPRESSIONS.join(", ")
                    ),
                ));
            }
            let encoded = text("payload_base64", &raw.payload_base64)?.unwrap_or_default();
            let payload = base64::engine::general_purpose::STANDARD
                .decode(encoded.as_bytes())
                .map_err(|e| {
                    BadLine::new(id.clone(), format!("`payload_base64` is not base64: {e}"))
                })?;
            let target = match raw.target {
                None | Some(serde_json::Value::Null) => None,
                Some(v) => Some(serde_json::from_value::<Target>(v).map_err(|e| {
                    BadLine::new(id.clone(), format!("`target` is not an HTTP call: {e}"))
                })?),
            };
            Ok(Inbound::Schedule(Schedule {
                id,
                route_key,
                fire_at,
                compression,
                payload: Bytes::from(payload),
                token,
                target,
            }))
        }
        other => Err(BadLine::new(
            id,
            format!("unknown kind `{other}` (register, schedule, ack)"),
        )),
    }
}

/// A route key: 1 to 256 characters, no control characters.
fn check_route(route: &str) -> Result<(), String> {
    if route.len() > 256 || route.chars().any(char::is_control) {
        return Err("`route_key` must be 1 to 256 characters without control characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_lines_are_read() {
        assert_eq!(
            parse(br#"{"kind":"register","route_key":"service-A"}"#),
            Ok(Inbound::Register {
                route_key: "service-A".into(),
                token: None
            })
        );
        let Ok(Inbound::Schedule(s)) = parse(
            br#"{"kind":"schedule","id":"t-1","route_key":"service-A","fire_at":1732616400000,"compression":"none","payload_base64":"aGVsbG8="}"#,
        ) else {
            panic!("a schedule")
        };
        assert_eq!(
            (s.id.as_deref(), s.fire_at, &s.payload[..]),
            (Some("t-1"), 1_732_616_400_000, &b"hello"[..])
        );
        assert_eq!(
            parse(br#"{"kind":"ack","id":"t-1"}"#),
            Ok(Inbound::Ack { id: "t-1".into() })
        );
    }

    #[test]
    fn bad_lines_say_what_and_keep_the_id() {
        let bad = |line: &[u8]| parse(line).unwrap_err();
        assert!(bad(b"{not json").message.contains("not a JSON object"));
        let e = bad(br#"{"kind":"schedule","id":"t-2","fire_at":1,"payload_base64":"%%%"}"#);
        assert_eq!(e.id.as_deref(), Some("t-2"));
        assert!(e.message.contains("not base64"), "{}", e.message);
        assert!(bad(br#"{"kind":"teleport"}"#)
            .message
            .contains("unknown kind"));
        assert!(bad(br#"{"kind":"schedule","fire_at":-5}"#)
            .message
            .contains("fire_at"));
        assert!(
            bad(br#"{"kind":"schedule","fire_at":1,"compression":"brotli"}"#)
                .message
                .contains("not supported")
        );
        assert_eq!(bad(b"[]").code, "SCHEMA.VALIDATION_FAILED");
    }

    #[test]
    fn fire_at_is_written_as_a_number() {
        let line = Outbound::Ack {
            id: "t".into(),
            fire_at: 42,
        }
        .line();
        assert_eq!(line, "{\"kind\":\"ack\",\"id\":\"t\",\"fire_at\":42}\n");
    }
}
