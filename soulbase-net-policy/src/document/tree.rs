//! Value-tree helpers: deep merge, paths in the document's shape, and repair of bad fields.

use serde_json::{Map, Value};
use serde_path_to_error::{Path, Segment};

/// Merges `overlay` into `base`: objects merge key by key; scalars, arrays and `null` replace.
pub(crate) fn merge(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => merge_maps(b, o),
        (b, o) => *b = o.clone(),
    }
}

pub(crate) fn merge_maps(base: &mut Map<String, Value>, overlay: &Map<String, Value>) {
    for (k, v) in overlay {
        match base.get_mut(k) {
            Some(slot) => merge(slot, v),
            None => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Writes a key the way TOML would: bare when it can be, quoted otherwise
/// (`t1`, `"*.example.com"`).
pub(crate) fn quote_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        key.to_owned()
    } else {
        // JSON string escaping is also valid TOML basic-string escaping for these keys.
        serde_json::to_string(key).unwrap_or_else(|_| format!("\"{key}\""))
    }
}

/// Appends a serde path to `prefix` in the document's shape: `prefix.a.b[2]."c.d"`.
pub(crate) fn join_path(prefix: &str, path: &Path) -> String {
    let mut out = prefix.to_owned();
    for seg in path {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&quote_key(key));
            }
            Segment::Enum { variant } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&quote_key(variant));
            }
            Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}

/// Removes the field a deserialisation error points at from `section`: the deepest map key on
/// the error's path before any list index (so `dns.prefetch[3]` removes `dns.prefetch`).
///
/// Returns `false` when nothing could be removed (the error is not inside `section`).
pub(crate) fn remove_at(section: &mut Value, path: &Path) -> bool {
    let keys: Vec<&str> = path
        .iter()
        .map_while(|seg| match seg {
            Segment::Map { key } => Some(key.as_str()),
            _ => None,
        })
        .collect();
    let Some((last, parents)) = keys.split_last() else {
        return false;
    };
    let mut node = section;
    for k in parents {
        match node.get_mut(*k) {
            Some(next) => node = next,
            None => return false,
        }
    }
    node.as_object_mut()
        .is_some_and(|m| m.remove(*last).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_is_deep_for_objects_and_replaces_the_rest() {
        let mut base = json!({"a": {"x": 1, "y": [1, 2]}, "b": 1, "c": null});
        merge(
            &mut base,
            &json!({"a": {"y": [3]}, "c": {"z": true}, "d": "new"}),
        );
        assert_eq!(
            base,
            json!({"a": {"x": 1, "y": [3]}, "b": 1, "c": {"z": true}, "d": "new"})
        );
    }

    #[test]
    fn keys_are_quoted_only_when_needed() {
        assert_eq!(quote_key("t1"), "t1");
        assert_eq!(quote_key("*.example.com"), "\"*.example.com\"");
        assert_eq!(quote_key(""), "\"\"");
    }
}
