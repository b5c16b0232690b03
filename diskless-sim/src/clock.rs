//! [`SimClock`]: wall-clock time derived from tokio's (paused, virtual) clock.

use std::sync::Arc;

use diskless_coordinator::Clock;
use tokio::time::Instant;

/// The Unix time (ms) at which every simulated run starts: 2025-06-15T15:06:40Z.
pub const SIM_EPOCH_MS: i64 = 1_750_000_000_000;

/// A [`Clock`] that reads tokio's clock: a fixed epoch plus the virtual time elapsed since the
/// run started, plus a constant skew (a broker's clock error).
///
/// Under a paused tokio clock (every simulated run) this is fully deterministic. It must be read
/// on the runtime's thread (tokio's clock is per runtime).
#[derive(Debug, Clone)]
pub struct SimClock {
    start: Instant,
    epoch_ms: i64,
    skew_ms: i64,
}

impl SimClock {
    /// A clock showing `epoch_ms` now, moving with tokio's clock. Call it inside the runtime.
    pub fn new(epoch_ms: i64) -> Arc<SimClock> {
        Arc::new(SimClock {
            start: Instant::now(),
            epoch_ms,
            skew_ms: 0,
        })
    }

    /// The same clock, off by `skew_ms` (positive: ahead).
    pub fn skewed(&self, skew_ms: i64) -> Arc<SimClock> {
        Arc::new(SimClock {
            skew_ms,
            ..self.clone()
        })
    }

    /// Virtual milliseconds since the run started (no skew).
    pub fn elapsed_ms(&self) -> i64 {
        i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// This clock's skew.
    pub fn skew_ms(&self) -> i64 {
        self.skew_ms
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> i64 {
        self.epoch_ms
            .saturating_add(self.elapsed_ms())
            .saturating_add(self.skew_ms)
    }
}
