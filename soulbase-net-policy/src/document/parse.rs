//! Reading documents: TOML and JSON text, files by extension, and the split of a value tree
//! into sections (the sections themselves are checked when the document is compiled).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::tree::quote_key;
use super::{PolicyDocument, TenantSection};
use crate::store::StoreConfig;
use crate::validate::{PolicyError, Problem};

const SECTIONS: &str = "expected one of `default`, `overrides`, `tenants`, `keys`, `store`";

impl PolicyDocument {
    pub(crate) fn parse_toml(s: &str) -> Result<Self, PolicyError> {
        let value: Value = toml::from_str(s).map_err(|e| syntax_error("TOML", s, &e))?;
        Self::parse_value(value)
    }

    pub(crate) fn parse_json(s: &str) -> Result<Self, PolicyError> {
        let value: Value = serde_json::from_str(s)
            .map_err(|e| PolicyError::single("", format!("invalid JSON: {e}")))?;
        Self::parse_value(value)
    }

    pub(crate) fn parse_path(path: &Path) -> Result<Self, PolicyError> {
        let shown = path.display().to_string();
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let read = || {
            std::fs::read_to_string(path)
                .map_err(|e| PolicyError::single(&shown, format!("cannot read the file: {e}")))
        };
        match ext.as_deref() {
            Some("toml") => Self::parse_toml(&read()?),
            Some("json") => Self::parse_json(&read()?),
            _ => Err(PolicyError::single(
                &shown,
                "unknown file type: the name must end in .toml or .json",
            )),
        }
    }

    /// Splits a value tree into sections; sections themselves are checked by `validate`.
    pub(crate) fn parse_value(value: Value) -> Result<Self, PolicyError> {
        let Value::Object(top) = value else {
            return Err(PolicyError::single("", "a policy document must be a table"));
        };
        let mut doc = Self::default();
        let mut problems = Vec::new();
        for (key, v) in top {
            match key.as_str() {
                "default" => doc.default = v,
                "overrides" => doc.overrides = table_of("overrides", v, &mut problems),
                "keys" => doc.keys = table_of("keys", v, &mut problems),
                "store" => match StoreConfig::from_value(&v) {
                    Ok(store) => doc.store = Some(store),
                    Err(found) => problems.extend(found),
                },
                "tenants" => {
                    for (tenant, t) in table_of("tenants", v, &mut problems) {
                        let section = tenant_section(&tenant, t, &mut problems);
                        doc.tenants.insert(tenant, section);
                    }
                }
                other => problems.push(Problem::new(
                    quote_key(other),
                    format!("unknown section, {SECTIONS}"),
                )),
            }
        }
        PolicyError::check(problems)?;
        Ok(doc)
    }
}

fn table_of(path: &str, v: Value, problems: &mut Vec<Problem>) -> BTreeMap<String, Value> {
    match v {
        Value::Object(m) => m.into_iter().collect(),
        _ => {
            problems.push(Problem::new(path, "expected a table"));
            BTreeMap::new()
        }
    }
}

fn tenant_section(tenant: &str, v: Value, problems: &mut Vec<Problem>) -> TenantSection {
    let Value::Object(mut m) = v else {
        // Kept as is: `validate` reports it with the tenant's path.
        return TenantSection {
            policy: v,
            overrides: BTreeMap::new(),
        };
    };
    let overrides = match m.remove("overrides") {
        Some(o) => {
            let path = format!("tenants.{}.overrides", quote_key(tenant));
            table_of(&path, o, problems)
        }
        None => BTreeMap::new(),
    };
    TenantSection {
        policy: Value::Object(m),
        overrides,
    }
}

pub(super) fn syntax_error(kind: &str, src: &str, e: &toml::de::Error) -> PolicyError {
    let at = e
        .span()
        .map(|span| {
            let before = src.get(..span.start).unwrap_or(src);
            let line = before.matches('\n').count() + 1;
            let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!(" at line {line}, column {col}")
        })
        .unwrap_or_default();
    PolicyError::single("", format!("invalid {kind}{at}: {}", e.message().trim()))
}
