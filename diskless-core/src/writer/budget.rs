//! The writer's two memory bounds — pending bytes (buffered or uploading) and uncommitted bytes
//! (not yet answered) — as semaphores of bytes, each mirrored in a gauge.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use super::config::Backpressure;

/// A bound on bytes: a semaphore of `bound` permits, one per byte, whose use a gauge mirrors.
pub(super) struct Budget {
    semaphore: Arc<Semaphore>,
    bound: u32,
    /// The gauge (a `diskless_common::metrics` name) that follows the bytes held.
    gauge: &'static str,
}

/// The outcome of taking bytes from a [`Budget`].
pub(super) enum Acquired {
    Got(Held),
    /// Fail-fast mode and not enough bytes free now.
    Full,
    /// The writer is closed.
    Closed,
}

/// Bytes held from a [`Budget`]; they go back (and the gauge goes down) on drop.
pub(super) struct Held {
    _permit: OwnedSemaphorePermit,
    _gauge: GaugeGuard,
}

impl Budget {
    /// A budget of `bound` bytes (validated by `WalWriterConfig::validate`: at least 1).
    pub(super) fn new(bound: u32, gauge: &'static str) -> Self {
        Budget {
            semaphore: Arc::new(Semaphore::new(bound as usize)),
            bound,
            gauge,
        }
    }

    /// Takes `bytes` from the budget, waiting or not by `mode`.
    ///
    /// The one normalisation of the writer: a request is counted as at least 1 byte and at most
    /// the whole bound. A request larger than the bound is not refused here (Kafka's
    /// `message.max.bytes` / `max.request.size` limit request sizes before); it takes the whole
    /// bound, i.e. it waits until everything before it has left the budget, and runs alone.
    pub(super) async fn acquire(&self, bytes: usize, mode: Backpressure) -> Acquired {
        let want = u32::try_from(bytes)
            .unwrap_or(u32::MAX)
            .clamp(1, self.bound);
        let permit = match mode {
            Backpressure::Wait => match self.semaphore.clone().acquire_many_owned(want).await {
                Ok(p) => p,
                Err(_) => return Acquired::Closed,
            },
            Backpressure::FailFast => match self.semaphore.clone().try_acquire_many_owned(want) {
                Ok(p) => p,
                Err(TryAcquireError::NoPermits) => return Acquired::Full,
                Err(TryAcquireError::Closed) => return Acquired::Closed,
            },
        };
        Acquired::Got(Held {
            _permit: permit,
            _gauge: GaugeGuard::new(self.gauge, f64::from(want)),
        })
    }

    /// Bytes held now.
    pub(super) fn used(&self) -> u64 {
        u64::from(self.bound).saturating_sub(self.semaphore.available_permits() as u64)
    }

    /// Refuses every later `acquire` (they answer [`Acquired::Closed`]).
    pub(super) fn close(&self) {
        self.semaphore.close();
    }
}

/// Adds `amount` to a gauge now and takes it away on drop, so that the gauge follows what is
/// held, whichever way it is released (answered, failed, aborted). Gauges move by increments, not
/// `set`, so that the writers of one process add up.
pub(super) struct GaugeGuard {
    name: &'static str,
    amount: f64,
}

impl GaugeGuard {
    pub(super) fn new(name: &'static str, amount: f64) -> Self {
        metrics::gauge!(name).increment(amount);
        GaugeGuard { name, amount }
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        metrics::gauge!(self.name).decrement(self.amount);
    }
}
