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
        Ok(Self::with_client(client))
    }

    /// Parses the `rediss://` `url`, trusting the CA certificates of `root_pem`.
    ///
    /// # Errors
    /// `InvalidRequest` when `url` is not a Redis URL or `root_pem` holds no certificate.
    pub(crate) fn with_root_pem(url: &str, root_pem: &[u8]) -> Result<Self, NetError> {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_pem.to_vec()),
        };
        let client = redis::Client::build_with_tls(url, certs).map_err(|e| {
            NetError::invalid_request(format!("not a valid redis TLS setup: {:?}", e.kind()))
        })?;
        Ok(Self::with_client(client))
    }

    fn with_client(client: redis::Client) -> Self {
        let shown = format!("{}", client.get_connection_info().addr());
        Self {
            client,
            manager: OnceLock::new(),
            shown,
        }
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
