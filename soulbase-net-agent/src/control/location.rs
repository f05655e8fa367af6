//! Where the control plane's store lives: [`ControlConfig::database`](super::ControlConfig::database)
//! read as a SQLite path or a database URL, and shown without its credentials.

use std::path::{Path, PathBuf};

use soulbase_net_core::NetError;

/// Where the store lives, as [`ControlConfig::database`](super::ControlConfig::database)
/// names it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// SQLite in memory: gone when the control plane stops.
    Memory,
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL URL.
    Postgres(String),
}

impl Location {
    /// Reads `database`: `postgres://…` or `postgresql://…`, `sqlite:PATH` or
    /// `sqlite://PATH` (`sqlite::memory:` for memory), or a plain path of a SQLite file; none
    /// is memory.
    ///
    /// # Errors
    /// `InvalidRequest` for another `scheme://`.
    pub(crate) fn of(database: Option<&Path>) -> Result<Self, NetError> {
        let Some(path) = database else {
            return Ok(Self::Memory);
        };
        let Some(text) = path.to_str() else {
            return Ok(Self::Sqlite(path.to_path_buf()));
        };
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(Self::Postgres(text.to_owned()));
        }
        if text == "sqlite::memory:" {
            return Ok(Self::Memory);
        }
        if let Some(rest) = text
            .strip_prefix("sqlite://")
            .or_else(|| text.strip_prefix("sqlite:"))
        {
            return Ok(Self::Sqlite(PathBuf::from(rest)));
        }
        if let Some((scheme, _)) = text.split_once("://") {
            return Err(NetError::invalid_request(format!(
                "control plane: `{scheme}://` is not a database this build knows \
                 (a SQLite path, sqlite:PATH, postgres://…)"
            )));
        }
        Ok(Self::Sqlite(path.to_path_buf()))
    }
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Memory => f.write_str("Memory"),
            Self::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            Self::Postgres(url) => f.debug_tuple("Postgres").field(&redacted(url)).finish(),
        }
    }
}

/// `url` with its credentials (between `://` and `@`) left out.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://<credentials>@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}
