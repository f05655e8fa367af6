//! The cache on disk (seed 004): JSON of name → addresses + wall-clock expiry, written
//! atomically (a temporary file in the same directory, synced, then renamed over the old one),
//! so a crash mid-write leaves either the old file or the new one, never half of one.
//!
//! ```json
//! {"version":1,"entries":[{"name":"api.example.com","addrs":["192.0.2.1"],"expires_unix_ms":1767225600000}]}
//! ```

use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use soulbase_net_core::{ErrorKind, NetError};

use super::cache::Saved;

const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct File {
    version: u32,
    entries: Vec<FileEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct FileEntry {
    name: String,
    addrs: Vec<IpAddr>,
    expires_unix_ms: u64,
}

fn to_unix_ms(t: SystemTime) -> u64 {
    let ms = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

fn from_unix_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_millis(ms))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

fn io_error(what: &str, which: &str, path: &Path, e: io::Error) -> NetError {
    NetError::new(ErrorKind::Io)
        .with_message(format!("cannot {what} {which} {}", path.display()))
        .with_source(e)
}

/// Writes `value` as JSON to `path` atomically (a temporary file in the same directory,
/// synced, then renamed over the old one). Blocking.
fn write_json<T: Serialize>(path: &Path, value: &T, which: &str) -> Result<(), NetError> {
    let json = serde_json::to_vec(value).map_err(|e| {
        NetError::new(ErrorKind::Io)
            .with_message(format!("cannot encode {which}"))
            .with_source(e)
    })?;
    if is_special(path) {
        // A FIFO or a device (`/dev/null` to discard): written in place, since a rename would
        // replace it with a regular file. Not atomic, and nothing to sync.
        return write_in_place(path, &json).map_err(|e| io_error("write", which, path, e));
    }
    let tmp = temp_path(path);
    let written = write_synced(&tmp, &json).and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = written {
        // Best effort: a leftover temporary file is harmless but untidy.
        let _ = fs::remove_file(&tmp);
        return Err(io_error("write", which, path, e));
    }
    Ok(())
}

/// Reads JSON from `path`; `None` when the file does not exist.
fn read_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    which: &str,
) -> Result<Option<T>, NetError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("read", which, path, e)),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        NetError::new(ErrorKind::Io)
            .with_message(format!("{which} {} is not valid", path.display()))
            .with_source(e)
    })
}

/// Writes `entries` to `path` atomically. Blocking: call it off the async threads.
///
/// # Errors
/// `Io` when the temporary file cannot be written or renamed over `path`.
pub(crate) fn save(path: &Path, entries: &[Saved]) -> Result<(), NetError> {
    let file = File {
        version: VERSION,
        entries: entries
            .iter()
            .map(|e| FileEntry {
                name: e.name.clone(),
                addrs: e.addrs.to_vec(),
                expires_unix_ms: to_unix_ms(e.expires),
            })
            .collect(),
    };
    write_json(path, &file, "the dns cache file")
}

/// Whether `path` exists and is neither a regular file nor a directory (a FIFO, a device).
fn is_special(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

fn write_in_place(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(bytes)
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// A temporary name next to `path`, unique per process and call, so concurrent saves never
/// write the same temporary file.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "dns-cache".to_owned());
    let tmp = format!(
        ".{name}.{}.{:016x}.tmp",
        std::process::id(),
        fastrand::u64(..)
    );
    path.with_file_name(tmp)
}

/// Reads the entries saved in `path`. A missing file is an empty cache.
///
/// # Errors
/// `Io` when the file exists but cannot be read or is not a cache file of this version.
pub(crate) fn load(path: &Path) -> Result<Vec<Saved>, NetError> {
    let Some(file) = read_json::<File>(path, "the dns cache file")? else {
        return Ok(Vec::new());
    };
    if file.version != VERSION {
        return Err(NetError::new(ErrorKind::Io).with_message(format!(
            "the dns cache file {} has version {}, expected {VERSION}",
            path.display(),
            file.version
        )));
    }
    Ok(file
        .entries
        .into_iter()
        .map(|e| Saved {
            name: e.name,
            addrs: e.addrs.into(),
            expires: from_unix_ms(e.expires_unix_ms),
        })
        .collect())
}

/// The frozen base URLs on disk, next to the DNS cache: origin + wall-clock thaw time.
///
/// ```json
/// {"version":1,"frozen":[{"origin":"https://a.example.com","thaws_unix_ms":1767225600000}]}
/// ```
#[derive(Debug, Serialize, Deserialize)]
struct FrozenFile {
    version: u32,
    frozen: Vec<FrozenEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct FrozenEntry {
    origin: String,
    thaws_unix_ms: u64,
}

/// Where the frozen base URLs are kept for a DNS cache file: `<file>.frozen`.
pub(crate) fn frozen_path(dns_file: &Path) -> PathBuf {
    let mut name = dns_file.as_os_str().to_owned();
    name.push(".frozen");
    PathBuf::from(name)
}

/// Writes the frozen origins to `path` atomically. Blocking.
///
/// # Errors
/// `Io` when the file cannot be written.
pub(crate) fn save_frozen(path: &Path, entries: &[(String, SystemTime)]) -> Result<(), NetError> {
    let file = FrozenFile {
        version: VERSION,
        frozen: entries
            .iter()
            .map(|(origin, thaws)| FrozenEntry {
                origin: origin.clone(),
                thaws_unix_ms: to_unix_ms(*thaws),
            })
            .collect(),
    };
    write_json(path, &file, "the frozen endpoints file")
}

/// Reads the frozen origins saved in `path`. A missing file is none.
///
/// # Errors
/// `Io` when the file exists but cannot be read or is not a frozen-endpoints file.
pub(crate) fn load_frozen(path: &Path) -> Result<Vec<(String, SystemTime)>, NetError> {
    let Some(file) = read_json::<FrozenFile>(path, "the frozen endpoints file")? else {
        return Ok(Vec::new());
    };
    Ok(file
        .frozen
        .into_iter()
        .map(|e| (e.origin, from_unix_ms(e.thaws_unix_ms)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "soulbase-dns-persist-{}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn round_trip_and_atomic_replace() {
        let d = dir();
        let path = d.join("dns.json");
        assert!(load(&path).unwrap().is_empty());
        let entries = vec![Saved {
            name: "api.example.test".into(),
            addrs: vec!["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()].into(),
            expires: from_unix_ms(1_767_225_600_123),
        }];
        save(&path, &entries).unwrap();
        assert_eq!(load(&path).unwrap(), entries);
        save(&path, &[]).unwrap();
        assert!(load(&path).unwrap().is_empty());
        // No temporary files are left behind.
        let names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["dns.json"]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn bad_files_are_errors() {
        let d = dir();
        let path = d.join("dns.json");
        fs::write(&path, b"{not json").unwrap();
        assert_eq!(load(&path).unwrap_err().kind(), ErrorKind::Io);
        fs::write(&path, br#"{"version":9,"entries":[]}"#).unwrap();
        assert_eq!(load(&path).unwrap_err().kind(), ErrorKind::Io);
        let missing_dir = d.join("no-such-dir").join("dns.json");
        assert_eq!(save(&missing_dir, &[]).unwrap_err().kind(), ErrorKind::Io);
        fs::remove_dir_all(&d).unwrap();
    }
}
