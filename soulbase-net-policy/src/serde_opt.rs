//! Serde for optional durations whose default is *on*: `None` is written `"off"`.
//!
//! Why: TOML has no null, so an `Option<Duration>` field that defaults to `Some(30m)` could not
//! be switched off in a TOML document, and a `None` skipped on output would come back as the
//! default. Writing `None` as `"off"` makes both directions exact in TOML and JSON.
//! On input `"off"`, `"none"`, `"never"`, `"disabled"` and JSON `null` all mean `None`.

use std::time::Duration;

use serde::{de, Deserialize, Deserializer, Serializer};

const OFF: [&str; 4] = ["off", "none", "never", "disabled"];

pub(crate) fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(d) => s.collect_str(&humantime::format_duration(*d)),
        None => s.serialize_str("off"),
    }
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let Some(s) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let t = s.trim();
    if OFF.iter().any(|o| o.eq_ignore_ascii_case(t)) {
        return Ok(None);
    }
    humantime::parse_duration(t)
        .map(Some)
        .map_err(|e| de::Error::custom(format!("expected a duration like \"30m\" or \"off\": {e}")))
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};
    use std::time::Duration;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct T {
        #[serde(with = "super")]
        every: Option<Duration>,
    }

    #[test]
    fn off_round_trips_in_toml_and_json() {
        for v in [None, Some(Duration::from_secs(1800))] {
            let t = T { every: v };
            let toml_s = toml::to_string(&t).unwrap();
            assert_eq!(toml::from_str::<T>(&toml_s).unwrap(), t, "{toml_s}");
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(serde_json::from_str::<T>(&json).unwrap(), t, "{json}");
        }
        let t: T = serde_json::from_str(r#"{"every": null}"#).unwrap();
        assert_eq!(t.every, None);
        let t: T = toml::from_str(r#"every = "Never""#).unwrap();
        assert_eq!(t.every, None);
        assert!(toml::from_str::<T>(r#"every = "soon""#).is_err());
    }
}
