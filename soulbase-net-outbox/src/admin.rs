//! Dead-letter administration: what the `soulbase-outbox` command runs (installed with the
//! crate: `cargo install soulbase-net-outbox --features postgres`), and what a service can
//! call itself.
//!
//! `soulbase-outbox --db STORE [--table NAME] list | requeue ID | purge`, where `STORE` is a
//! SQLite path (`sqlite:PATH` too) or a `postgres://` URL, and `NAME` the outbox's table
//! (default `outbox`). Dead letters stay sealed (see [`StoreOptions::seal_key`]): the list
//! shows no secret, and a requeued item is opened only by a store with the key.

use crate::{open_store, StoreOptions};

/// How to call the command.
pub const USAGE: &str = "usage: soulbase-outbox --db STORE [--table NAME] list | requeue ID | purge
  STORE  a SQLite file (PATH or sqlite:PATH) or a postgres:// URL
  NAME   the outbox's table (default: outbox)
  list   the pending count and every dead letter (id, method, URL without its query, attempts, reason)
  requeue ID  puts dead letter ID back in the queue, due now, its attempts reset
  purge  forgets every dead letter";

/// Runs one administration command (the words after the program's name) and returns the lines
/// it prints.
///
/// # Errors
/// The usage, or what failed (the store could not be opened, an id that is not a number).
///
/// # Examples
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let dir = std::env::temp_dir().join(format!("outbox-admin-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let db = dir.join("outbox.db").display().to_string();
/// let lines = soulbase_net_outbox::admin::run(&["--db", &db, "list"]).await.unwrap();
/// assert_eq!(lines, ["0 pending, 0 dead"]);
/// assert!(soulbase_net_outbox::admin::run(&["list"]).await.is_err());
/// # });
/// ```
pub async fn run(args: &[&str]) -> Result<Vec<String>, String> {
    let (mut db, mut table, mut command) = (None, None, Vec::new());
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match *arg {
            "--db" => db = Some(*it.next().ok_or("--db needs a store")?),
            "--table" => table = Some(*it.next().ok_or("--table needs a name")?),
            "-h" | "--help" => return Ok(USAGE.lines().map(str::to_owned).collect()),
            word => command.push(word),
        }
    }
    let db = db.ok_or_else(|| format!("--db is missing\n{USAGE}"))?;
    let mut options = StoreOptions::default();
    if let Some(name) = table {
        options = options.table(name).map_err(|e| e.to_string())?;
    }
    let fail = |e: soulbase_net_core::NetError| e.to_string();
    let run = async {
        let store = open_store(db, options).await.map_err(fail)?;
        Ok(match command.as_slice() {
            ["list"] => {
                let dead = store.dead_letters().await.map_err(fail)?;
                let pending = store.pending().await.map_err(fail)?;
                let mut lines = vec![format!("{pending} pending, {} dead", dead.len())];
                for d in dead {
                    lines.push(format!(
                        "{:>6}  {} {}  attempts {}  {}",
                        d.item.id,
                        d.item.method,
                        soulbase_net_core::redact_url(&d.item.url),
                        d.item.attempts,
                        d.reason
                    ));
                }
                lines
            }
            ["requeue", id] => {
                let id: i64 = id.parse().map_err(|e| format!("requeue {id}: {e}"))?;
                let moved = store.requeue(id).await.map_err(fail)?;
                vec![if moved {
                    format!("{id} requeued, due now")
                } else {
                    format!("no dead letter {id}")
                }]
            }
            ["purge"] => {
                let n = store.purge_dead().await.map_err(fail)?;
                vec![format!("{n} dead letters purged")]
            }
            _ => return Err(USAGE.to_owned()),
        })
    };
    run.await
}
