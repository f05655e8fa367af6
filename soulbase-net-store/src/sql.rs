//! The SQL engines' shared pieces, for stores kept outside this crate on the same engines as
//! the outbox and delay stores (the probe agent's control plane): the [`Dialect`] (the
//! store's clock, placeholders, how a write transaction begins), versioned [`Migration`]s and
//! their runners, and a PostgreSQL pool whose errors never show the URL's credentials.
//!
//! One copy of each: the statements' clock, the migration runner and the connection code are
//! the outbox's own, re-exported here rather than written again elsewhere.

use soulbase_net_core::{ErrorKind, NetError};

use crate::outbox::sql::Versions;
pub use crate::outbox::sql::{Dialect, Migration};

/// Applies the versions of `migrations` not yet recorded in `{table}_migrations` (creating
/// it), up to `up_to`, in one `BEGIN IMMEDIATE` transaction: processes opening one file
/// together apply each version once. `{t}` in a statement is replaced by `table`.
///
/// # Errors
/// `Io` saying that `what`'s store failed to migrate, with the failing version's error as the
/// source.
pub async fn migrate_sqlite(
    pool: &sqlx::SqlitePool,
    what: &str,
    table: &str,
    migrations: &[Migration],
    up_to: i64,
) -> Result<(), NetError> {
    let versions = Versions::new(table, Dialect::Sqlite);
    crate::outbox::sql::migrate_sqlite(pool, &versions, table, migrations, up_to)
        .await
        .map_err(|e| migrating(what, e))
}

/// As [`migrate_sqlite`], on PostgreSQL: instances starting together take turns on an
/// advisory lock keyed by `table`, so each version is applied once.
///
/// # Errors
/// As [`migrate_sqlite`].
#[cfg(feature = "postgres")]
pub async fn migrate_postgres(
    pool: &sqlx::PgPool,
    what: &str,
    table: &str,
    migrations: &[Migration],
    up_to: i64,
) -> Result<(), NetError> {
    let versions = Versions::new(table, Dialect::Postgres);
    crate::outbox::sql::migrate_postgres(pool, &versions, table, migrations, up_to)
        .await
        .map_err(|e| migrating(what, e))
}

/// A pool of at most `max` connections to the PostgreSQL at `url`
/// (`postgres://user[:password]@host[:port]/database`), each acquired within `acquire`.
///
/// # Errors
/// `Io` naming `what`'s store when the URL is not valid or the server cannot be reached —
/// never with the URL's credentials in the message.
#[cfg(feature = "postgres")]
pub async fn connect_postgres(
    url: &str,
    max: u32,
    acquire: std::time::Duration,
    what: &str,
) -> Result<sqlx::PgPool, NetError> {
    crate::outbox::postgres::pool(url, max, acquire, what).await
}

fn migrating(what: &str, e: NetError) -> NetError {
    NetError::new(ErrorKind::Io)
        .with_message(format!("{what} store: migrating the schema"))
        .with_source(e)
}
