//! [`Columns`]: a row of either engine read by column name, for the readers that turn rows
//! into outbox items, dead letters and delay tasks.

/// The column types the store's readers decode, on a row of either engine. sqlx's
/// `Row::try_get` wants a `Decode + Type` bound for every type it decodes; stated once here
/// (on the blanket implementation), the generic readers (`item_from`, `dead_from`,
/// `task_from`) need only `R: Columns` instead of repeating that list each.
pub(crate) trait Columns {
    /// A `TEXT` column.
    fn text(&self, name: &str) -> Result<String, sqlx::Error>;
    /// A nullable `TEXT` column.
    fn opt_text(&self, name: &str) -> Result<Option<String>, sqlx::Error>;
    /// A byte-string column (`BLOB`, `BYTEA`).
    fn bytes(&self, name: &str) -> Result<Vec<u8>, sqlx::Error>;
    /// A 64-bit integer column.
    fn int(&self, name: &str) -> Result<i64, sqlx::Error>;
    /// A nullable 64-bit integer column.
    fn opt_int(&self, name: &str) -> Result<Option<i64>, sqlx::Error>;
}

/// Every sqlx row whose engine decodes those types: SQLite's and PostgreSQL's alike, so one
/// reader serves both stores.
impl<R> Columns for R
where
    R: sqlx::Row,
    for<'n> &'n str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn text(&self, name: &str) -> Result<String, sqlx::Error> {
        self.try_get(name)
    }

    fn opt_text(&self, name: &str) -> Result<Option<String>, sqlx::Error> {
        self.try_get(name)
    }

    fn bytes(&self, name: &str) -> Result<Vec<u8>, sqlx::Error> {
        self.try_get(name)
    }

    fn int(&self, name: &str) -> Result<i64, sqlx::Error> {
        self.try_get(name)
    }

    fn opt_int(&self, name: &str) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(name)
    }
}
