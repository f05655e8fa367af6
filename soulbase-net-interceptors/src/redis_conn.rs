//! The connection to Redis that the fleet's stores share: parsed once, connected on first
//! use inside the runtime, and remade by `redis`' connection manager after Redis went away.

use std::{sync::OnceLock, time::Duration};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use soulbase_net_core::NetError;

/// A lazily connected Redis, shown by its address only (never its credentials).
pub(crate) struct RedisConn {
    client: redis::Client,
    manager: OnceLock<ConnectionManager>,
    shown: String,
}

impl RedisConn {
    /// Parses `url`.
    ///
    /// # Errors
    /// `InvalidRequest` when `url` is not a Redis URL (without repeating it).
    pub(crate) fn new(url: &str) -> Result<Self, NetError> {
        let client = redis::Client::open(url).map_err(|e| {
            NetError::invalid_request(format!("not a valid redis url: {:?}", e.kind()))
        })?;
        let shown = format!("{}", client.get_connection_info().addr());
        Ok(Self {
            client,
            manager: OnceLock::new(),
            shown,
        })
    }

    /// Where it points: host and port, or the socket path.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// The connection, made (lazily) on first use; `None` outside a runtime.
    pub(crate) fn manager(&self) -> Option<ConnectionManager> {
        if let Some(m) = self.manager.get() {
            return Some(m.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(500))
            .set_number_of_retries(usize::MAX);
        let made = ConnectionManager::new_lazy_with_config(self.client.clone(), config).ok()?;
        Some(self.manager.get_or_init(|| made).clone())
    }
}
