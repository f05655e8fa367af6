//! A JSON Schema validator for the keywords `schema.rs` writes, so the tests can hold the
//! schema to real documents without a validator dependency: `$ref` (local), `type`, `enum`,
//! `properties`, `additionalProperties`, `required`, `items`, `minItems`, `maxProperties`,
//! `minimum`, `maximum`, `allOf`, `anyOf`. Annotations (`description`, `default`, `title`) and `pattern`
//! are not checked (a regex engine is not worth a dependency here; the patterns only catch
//! the shape of durations and sizes, and `policy check` parses them for real).

use serde_json::Value;

/// Every way `instance` breaks `root`, each as `path: what`.
pub(super) fn validate(root: &Value, instance: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(root, root, instance, "", &mut errors);
    errors
}

fn check(root: &Value, schema: &Value, v: &Value, path: &str, errors: &mut Vec<String>) {
    let at = |what: String| format!("{}: {what}", if path.is_empty() { "(root)" } else { path });
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let target = r
            .strip_prefix('#')
            .and_then(|p| root.pointer(p))
            .unwrap_or_else(|| panic!("unresolved $ref {r}"));
        return check(root, target, v, path, errors);
    }
    for all in schema
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        check(root, all, v, path, errors);
    }
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
        let mut best: Option<Vec<String>> = None;
        for s in any {
            let mut e = Vec::new();
            check(root, s, v, path, &mut e);
            if e.is_empty() {
                best = None;
                break;
            }
            if best.as_ref().is_none_or(|b| e.len() < b.len()) {
                best = Some(e);
            }
        }
        if let Some(b) = best {
            errors.extend(b);
        }
    }
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !types.iter().any(|t| is_type(v, t)) {
            errors.push(at(format!("expected {}, got {v}", types.join(" or "))));
            return;
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.iter().any(|o| same(o, v)) {
            errors.push(at(format!(
                "{v} is not one of {}",
                Value::Array(options.clone())
            )));
        }
    }
    if let Some(n) = v.as_f64() {
        if schema
            .get("minimum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n < m)
        {
            errors.push(at(format!("{n} is below the minimum")));
        }
        if schema
            .get("maximum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n > m)
        {
            errors.push(at(format!("{n} is above the maximum")));
        }
    }
    if let Some(items) = v.as_array() {
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
            if (items.len() as u64) < min {
                errors.push(at(format!("needs at least {min} items")));
            }
        }
        if let Some(item) = schema.get("items") {
            for (i, x) in items.iter().enumerate() {
                check(root, item, x, &format!("{path}[{i}]"), errors);
            }
        }
    }
    if let Some(map) = v.as_object() {
        object(root, schema, map, path, errors);
    }
}

fn object(
    root: &Value,
    schema: &Value,
    map: &serde_json::Map<String, Value>,
    path: &str,
    errors: &mut Vec<String>,
) {
    let at = |what: String| format!("{}: {what}", if path.is_empty() { "(root)" } else { path });
    let props = schema.get("properties").and_then(Value::as_object);
    for (k, x) in map {
        let child = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match (
            props.and_then(|p| p.get(k)),
            schema.get("additionalProperties"),
        ) {
            (Some(s), _) => check(root, s, x, &child, errors),
            (None, Some(Value::Bool(false))) => errors.push(format!("{child}: unknown field")),
            (None, Some(s)) if s.is_object() => check(root, s, x, &child, errors),
            _ => {}
        }
    }
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(r) {
            errors.push(at(format!("`{r}` is required")));
        }
    }
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64) {
        if map.len() as u64 > max {
            errors.push(at(format!("at most {max} keys")));
        }
    }
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

/// JSON equality, numbers compared by value (`1.2` from TOML against `1.2` in the schema).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}
