//! [`open_store`]: a store from a URL, for tools and configuration files.

use std::sync::Arc;

use soulbase_net_core::NetError;

use super::{OutboxStore, SqliteStore, StoreOptions};

/// Opens the store `url` names, with `options`:
/// - `postgres://…` or `postgresql://…`: a `PostgresStore` (cargo
///   feature `postgres`);
/// - `sqlite:PATH`, `sqlite://PATH`, or a plain file path: a [`SqliteStore`].
///
/// # Errors
/// `SCHEMA.VALIDATION_FAILED` for a scheme this build does not know (saying which feature
/// would add it); `Io` when the store cannot be opened.
///
/// # Examples
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use soulbase_net_store::outbox::{open_store, StoreOptions};
///
/// let dir = std::env::temp_dir().join(format!("outbox-open-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let url = format!("sqlite:{}", dir.join("outbox.db").display());
/// let store = open_store(&url, StoreOptions::default()).await.unwrap();
/// assert_eq!(store.pending().await.unwrap(), 0);
/// assert!(open_store("mysql://db/app", StoreOptions::default()).await.is_err());
/// # });
/// ```
pub async fn open_store(
    url: &str,
    options: StoreOptions,
) -> Result<Arc<dyn OutboxStore>, NetError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            let store = crate::outbox::PostgresStore::builder(url)
                .options(options)
                .connect()
                .await?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = "postgres"))]
        return Err(NetError::invalid_request(
            "outbox store: PostgreSQL needs the cargo feature `postgres` of soulbase-net-outbox",
        ));
    }
    let path = if let Some(rest) = url.strip_prefix("sqlite://") {
        rest
    } else if let Some(rest) = url.strip_prefix("sqlite:") {
        rest
    } else if url.contains("://") {
        let scheme = url.split("://").next().unwrap_or_default();
        return Err(NetError::invalid_request(format!(
            "outbox store: `{scheme}://` is not a store this build knows (sqlite:PATH, postgres://…)"
        )));
    } else {
        url
    };
    let store = SqliteStore::builder(path).options(options).open().await?;
    Ok(Arc::new(store))
}
