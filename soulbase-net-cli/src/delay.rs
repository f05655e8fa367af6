//! `soulbase-net delay --store STORE [--table NAME] pending | get ID | cancel ID`: a delay
//! server's tasks, read and cancelled in its store (a SQLite file, or a `postgres://` URL with
//! the `postgres` feature) — while the servers run, or when none does.

use soulbase_net_store::delay::{open_delay_store, DelayStoreOptions};

/// How to call the command.
pub const USAGE: &str = "\
usage: soulbase-net delay --store STORE [--table NAME] pending | get ID | cancel ID
  STORE   the delay server's store: a SQLite file (PATH or sqlite:PATH) or a postgres:// URL
  NAME    its table (default: delay_tasks)
  pending how many tasks wait (claimed or not)
  get ID  the task ID: its route, fire_at (ms since the epoch), attempts, payload size
  cancel ID  deletes the task ID; a delivery under way may still arrive
";

/// Runs `delay ARGS`.
///
/// # Errors
/// The usage, or what failed (the store could not be opened, no such task).
pub async fn run(args: &[String]) -> Result<String, String> {
    let (mut store, mut table, mut command) = (None, None, Vec::new());
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--store" => store = it.next().cloned(),
            "--table" => table = it.next().cloned(),
            "help" | "-h" | "--help" => return Ok(USAGE.to_owned()),
            other => command.push(other.to_owned()),
        }
    }
    let store = store.ok_or_else(|| format!("delay needs --store STORE\n\n{USAGE}"))?;
    let mut options = DelayStoreOptions::default();
    if let Some(table) = table {
        options = options.table(&table).map_err(|e| e.to_string())?;
    }
    let is_url = store.starts_with("postgres://") || store.starts_with("postgresql://");
    let path = store.strip_prefix("sqlite:").unwrap_or(&store);
    if !is_url && !std::path::Path::new(path).exists() {
        // Opening would make an empty store: say there is none instead.
        return Err(format!("no delay store at {path}"));
    }
    let open = || async {
        open_delay_store(&store, options.clone())
            .await
            .map_err(|e| e.to_string())
    };
    match command.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["pending"] => {
            let n = open().await?.pending().await.map_err(|e| e.to_string())?;
            Ok(format!("{n} pending\n"))
        }
        ["get", id] => match open().await?.get(id).await.map_err(|e| e.to_string())? {
            Some(t) => Ok(format!(
                "{} route={} fire_at={} attempts={} compression={} payload={} bytes\n",
                t.id,
                t.route_key,
                t.fire_at,
                t.attempts,
                t.compression,
                t.payload.len()
            )),
            None => Err(format!("no task `{id}`")),
        },
        ["cancel", id] => {
            if open().await?.ack(id, 0).await.map_err(|e| e.to_string())? {
                Ok(format!("cancelled {id}\n"))
            } else {
                Err(format!("no task `{id}`"))
            }
        }
        _ => Err(USAGE.to_owned()),
    }
}
