//! The client's [`GaugeSource`]: limiter occupancy, AIMD windows, retry budgets,
//! connection pools and the SLO controller's factors, read at scrape time by whatever observer the client was given (`Observer::on_gauges`).
//!
//! Why read and not pushed: the request path pays nothing for these gauges, and a budget's
//! window slides with time, so only a read at the moment of the scrape is exact.

use std::{fmt, sync::Arc};

use soulbase_net_core::{GaugeReading, GaugeSource};
use tokio::time::Instant;

use crate::resilience::{Limiter, RetryBudgets, SloControllers};
use crate::transport::Transports;

/// Shares the client's limiter and budgets; the client holds the only strong handle given to
/// observers, so their weak handles die with it.
pub(super) struct ClientGauges {
    pub(super) limiter: Arc<Limiter>,
    pub(super) budgets: Arc<RetryBudgets>,
    pub(super) transports: Arc<Transports>,
    pub(super) slo: Arc<SloControllers>,
}

impl GaugeSource for ClientGauges {
    fn read_gauges(&self, visit: &mut dyn FnMut(GaugeReading<'_>)) {
        self.limiter.read_gauges(visit);
        self.budgets.read_gauges(Instant::now(), visit);
        self.transports.read_gauges(visit);
        self.slo.read_gauges(visit);
    }
}

impl fmt::Debug for ClientGauges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientGauges").finish_non_exhaustive()
    }
}
