//! [`LoopbackDialer`]: the dialer every xtask client uses, so that no command can reach past
//! loopback whatever the code under test decides.

use std::net::SocketAddr;

use parking_lot::Mutex;
use soulbase_net_runtime::{DialFuture, Dialer, TcpDialer};

/// Records every address it is asked to dial and refuses — without dialling — any that is
/// not loopback. The record is what a run asserts on: a guard that let a private or metadata
/// address through shows up here, and the connection still never leaves the machine.
#[derive(Debug, Default)]
pub(crate) struct LoopbackDialer {
    dialled: Mutex<Vec<SocketAddr>>,
}

impl LoopbackDialer {
    /// Every address asked for, in order.
    pub(crate) fn dialled(&self) -> Vec<SocketAddr> {
        self.dialled.lock().clone()
    }

    /// The addresses asked for that are not loopback (each one refused).
    pub(crate) fn off_loopback(&self) -> Vec<SocketAddr> {
        self.dialled
            .lock()
            .iter()
            .copied()
            .filter(|a| !a.ip().is_loopback())
            .collect()
    }
}

impl Dialer for LoopbackDialer {
    fn dial(&self, addr: SocketAddr) -> DialFuture {
        self.dialled.lock().push(addr);
        if addr.ip().is_loopback() {
            return TcpDialer.dial(addr);
        }
        Box::pin(async move {
            Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("xtask dials loopback only, not {addr}"),
            ))
        })
    }
}
